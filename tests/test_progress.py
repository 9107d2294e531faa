"""Progress bars (popart_backend/progress.py; issue #6 item 9): ``POPART_PROGRESS``, the
micro-batch count of ``run()`` (plain and pipelined), ``compilationProgressLogger`` and the
zero-cost path when off."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

import popart_backend as popart
from popart_backend import progress

from .session.pipeline_models import chain_model, chain_weights, options

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def closed_bars(monkeypatch):
    """(desc, done, total) of every bar closed during the test."""
    seen = []
    close = progress.Progress.close

    def record(self):
        seen.append((self.desc, self.done, self.total))
        close(self)

    monkeypatch.setattr(progress.Progress, "close", record)
    return seen


def _inference(ipus: int = 1, pipelined: bool = False, bps: int = 4):
    proto, _, _ = chain_model(chain_weights(ipus), ipus, stages=pipelined, place=ipus > 1)
    out = next(n for n in reversed(onnx.load_from_string(proto).graph.node)
               if n.op_type == "Tanh").output[0]
    opts = options(ipus, pipelined)
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus, "tilesPerIPU": 4})
    session = popart.InferenceSession(
        proto, popart.DataFlow(bps, {out: popart.AnchorReturnType("All")}), device,
        userOptions=opts)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    x = np.random.default_rng(0).standard_normal((bps, 2, 4)).astype(np.float32)
    session.run(popart.PyStepIO({"x": x}, anchors))
    return anchors[out]


def test_off_and_auto_off_cost_nothing(monkeypatch):
    """Off (or auto without a terminal): no bar object, and counting() returns the function
    itself, so no wrapper runs per micro-batch."""
    monkeypatch.setenv(progress.ENV_VAR, "0")
    assert progress.bar("x", 10, "unit") is None
    fn = len
    assert progress.counting(fn, None) is fn
    monkeypatch.delenv(progress.ENV_VAR)
    monkeypatch.setattr(sys, "stderr", open(os.devnull, "w"))  # not a terminal
    assert progress.bars_enabled()[0] is False
    assert progress.bar("x", 10, "unit") is None


def test_bad_setting_is_rejected(monkeypatch):
    monkeypatch.setenv(progress.ENV_VAR, "sometimes")
    with pytest.raises(popart.popart_exception, match="POPART_PROGRESS='sometimes'"):
        progress.bar("x", 10, "unit")


@pytest.mark.parametrize("ipus, pipelined", [(1, False), (2, True)])
def test_run_counts_every_micro_batch(monkeypatch, closed_bars, ipus, pipelined):
    monkeypatch.setenv(progress.ENV_VAR, "0")
    want = _inference(ipus, pipelined)
    monkeypatch.setenv(progress.ENV_VAR, "1")
    got = _inference(ipus, pipelined)
    np.testing.assert_array_equal(got, want)  # bars do not change results
    bars = {desc.split(":")[-1].strip(): (done, total) for desc, done, total in closed_bars}
    assert bars["run"] == (4, 4)
    assert bars["prepareDevice"] == (3, 3)
    done, total = bars["IR passes"]
    assert done == total > 0


def test_compilation_progress_logger(monkeypatch):
    """PopART's hook is called during prepareDevice, from 0 to compilationProgressTotal, even
    with bars off."""
    monkeypatch.setenv(progress.ENV_VAR, "0")
    calls = []
    proto, _, _ = chain_model(chain_weights(1), 1, place=False)
    opts = popart.SessionOptions()
    opts.compilationProgressLogger = lambda done, total: calls.append((done, total))
    opts.compilationProgressTotal = 30
    session = popart.InferenceSession(
        proto, popart.DataFlow(1, {}), popart.DeviceManager().createCpuDevice(), userOptions=opts)
    assert calls == []
    session.prepareDevice()
    assert calls[0] == (0, 30) and calls[-1] == (30, 30)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert {t for _, t in calls} == {30}


def test_bars_on_stderr_when_forced():
    """POPART_PROGRESS=1 draws the bars on stderr even when it is a pipe."""
    code = (
        "from tests.test_progress import _inference\n"
        "_inference(bps=8)\n"
    )
    env = dict(os.environ, POPART_PROGRESS="1")
    result = subprocess.run([sys.executable, "-c", code], cwd=_REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for text in ("IR passes", "prepareDevice", "0/8", "micro-batch"):
        assert text in result.stderr, result.stderr[-2000:]
    env["POPART_PROGRESS"] = "0"
    result = subprocess.run([sys.executable, "-c", code], cwd=_REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "micro-batch" not in result.stderr, result.stderr
