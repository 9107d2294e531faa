"""Every crash or blow-up the fuzzer or the security review found, kept as a tiny .onnx file in
regressions/: loading and running each must end in a popart_exception (no raw onnx, numpy,
torch or Python error, no allocation past the guard, no hang)."""

from __future__ import annotations

from pathlib import Path

import pytest

import popart_backend as popart

from .models import load_and_run

REGRESSIONS = sorted((Path(__file__).parent / "regressions").glob("*.onnx"))


@pytest.fixture(autouse=True)
def small_guard(monkeypatch):
    monkeypatch.setenv("POPART_SIM_MAX_BYTES", str(64 << 20))


def test_there_are_regression_files():
    assert len(REGRESSIONS) >= 10


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_regression_model_raises_a_popart_exception(path):
    assert path.stat().st_size < 4096  # tiny files only
    with pytest.raises(popart.popart_exception):
        load_and_run(path.read_bytes())


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_regression_model_from_its_path_raises_a_popart_exception(path):
    with pytest.raises(popart.popart_exception):
        popart.InferenceSession(str(path), popart.DataFlow(1, {}),
                                popart.DeviceManager().createCpuDevice()).prepareDevice()
