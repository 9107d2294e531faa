"""The command-line tool (popart_backend/cli.py; issue #6 item 10) run through subprocesses on
small exported ONNX models: the verdict and exit status, per-IPU memory, step time and
throughput (checked against the same session built in-process), the HTML report and DOT
files, training options and usage errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart
from popart_backend.cli import main

_REPO = Path(__file__).resolve().parents[1]


def _mlp(path: Path, k: int = 64, hidden: int = 256, loss: bool = False) -> Path:
    """x[batch, k] -> MatMul w0 [k, hidden] -> Relu -> MatMul w1 [hidden, k] (-> mean loss);
    the batch dim is symbolic, so the tool needs --input-shape."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"], name="mm0"),
             helper.make_node("Relu", ["h0"], ["a0"], name="relu"),
             helper.make_node("MatMul", ["a0", "w1"], ["y"], name="mm1")]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    if loss:
        nodes.append(helper.make_node("ReduceMean", ["y"], ["loss"], keepdims=0, name="mean"))
        out = helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])
    inits = [numpy_helper.from_array(rng.standard_normal((k, hidden)).astype(np.float32), "w0"),
             numpy_helper.from_array(rng.standard_normal((hidden, k)).astype(np.float32), "w1")]
    model = helper.make_model(helper.make_graph(nodes, "mlp", [x], [out], inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _tool(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "popart_backend", *map(str, args)],
                          cwd=_REPO, capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, POPART_PROGRESS="0", **(env or {})))


def _reference(path: Path, tiles: int, ipus: int, bps: int):
    """The report of the same inference session, built through the Python API."""
    opts = popart.SessionOptions()
    opts.engineOptions = {"autoReport.all": "true"}
    if ipus > 1:
        opts.virtualGraphMode = popart.VirtualGraphMode.Auto
    shapes = popart.InputShapeInfo()
    shapes.add("x", popart.TensorInfo("FLOAT", [8, 64]))
    device = popart.DeviceManager().createOfflineIPUDevice({"numIPUs": ipus,
                                                            "tilesPerIPU": tiles})
    session = popart.InferenceSession(
        str(path), popart.DataFlow(bps, {"y": popart.AnchorReturnType("All")}), device,
        inputShapeInfo=shapes, userOptions=opts)
    session.prepareDevice(loadEngine=False)
    return session.getReport()


def test_fits_on_two_ipus_with_reports(tmp_path):
    """F47/F54: the verdict, per-IPU memory, step cycles and throughput equal the Python API's
    report; --html writes the page and --dot-dir the Graphviz files."""
    model = _mlp(tmp_path / "mlp.onnx")
    html, dots = tmp_path / "r.html", tmp_path / "dots"
    result = _tool(model, "--ipus", 2, "--tiles-per-ipu", 16, "--batches-per-step", 3,
                   "--input-shape", "x=8,64", "--html", html, "--dot-dir", dots)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Fits: yes" in out
    ref = _reference(model, tiles=16, ipus=2, bps=3)
    cycles = ref.model.cycles
    assert f"Step: {cycles.step_cycles} cycles" in out
    assert f"Throughput: {cycles.samples_per_second:.1f} samples/s" in out
    assert "batches per step 3" in out
    assert f"-> {3 * 8} samples per step" in out
    for m in ref.model.memory.ipus:
        line = next(x for x in out.splitlines() if x.startswith(f"  IPU {m.ipu}:"))
        assert popart_format(m.total_bytes) in line
    # Auto virtual graphs split the model over both IPUs.
    assert len(re.findall(r"^  IPU \d:", out, re.M)) == 2
    page = html.read_text(encoding="utf-8")
    assert page.count("<svg") == 4
    written = sorted(p.name for p in dots.glob("*.dot"))
    assert written and all(p.stat().st_size > 0 for p in dots.glob("*.dot"))
    assert any(name.startswith("final") for name in written), written


def popart_format(num_bytes: int) -> str:
    from popart_backend.device.memory import format_bytes

    return format_bytes(num_bytes)


def test_out_of_memory_verdict_and_remedies(tmp_path):
    """1 MiB of weights (two 512 KiB matrices) on 1 tile of 624 KiB: exit 1, the IPU and the
    remedies; on 4 tiles it fits."""
    model = _mlp(tmp_path / "big.onnx", k=256, hidden=512)
    result = _tool(model, "--tiles-per-ipu", 1, "--input-shape", "x=4,256")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Fits: NO" in result.stdout and "OUT OF MEMORY" in result.stdout
    assert "Out of memory on IPU 0" in result.stdout
    assert "To fit, try one of" in result.stdout
    assert "Throughput:" in result.stdout  # the estimate is still given
    fits = _tool(model, "--tiles-per-ipu", 4, "--input-shape", "x=4,256", "--ipu-version",
                 "ipu21")
    assert fits.returncode == 0 and "Fits: yes" in fits.stdout, fits.stdout + fits.stderr
    assert "x ipu21" in fits.stdout and "at 1.85 GHz" in fits.stdout


def test_training_options(tmp_path):
    """Training with Adam, accumulation, pipelining over 2 IPUs and recomputation: optimizer
    state (2x weights) and accumulators appear per IPU."""
    model = _mlp(tmp_path / "train.onnx", loss=True)
    result = _tool(model, "--loss", "loss", "--optimizer", "adam", "--accumulation", 4,
                   "--ipus", 2, "--pipeline", "--tiles-per-ipu", 32, "--input-shape", "x=8,64",
                   "--option", "autoRecomputation=Standard")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "accumulation 4" in out and "-> 32 samples per step" in out
    for ipu in (0, 1):
        block = out.split(f"  IPU {ipu}:")[1].split("\n")[1]
        # One 64 KiB weight per IPU: Adam's two moments are 128 KiB, the accumulator 64 KiB.
        assert "weights 64.00 KiB" in block and "optimizer state 128.00 KiB" in block, block
        assert "accumulators 64.00 KiB" in block, block


@pytest.mark.parametrize("args, message", [
    (["--input-shape", "nope=8,64"], "no input 'nope'"),
    (["--input-shape", "x=8,sixty"], "dims must be integers"),
    (["--input-shape", "x=8,64", "--accumulation", "2"], "needs training"),
    (["--input-shape", "x=8,64", "--option", "virtualGraphMode=Sideways"],
     "not a VirtualGraphMode"),
    (["--input-shape", "x=8,64", "--option", "noSuchOption=1"], "no option 'noSuchOption'"),
])
def test_usage_errors(tmp_path, capsys, args, message):
    """Status 2 and a message naming the problem (in-process: same main() as the script)."""
    model = _mlp(tmp_path / "m.onnx")
    assert main([str(model), *args]) == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_missing_file_and_help(tmp_path, capsys):
    assert main([str(tmp_path / "missing.onnx")]) == 2
    assert "no ONNX file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    helped = capsys.readouterr().out
    for flag in ("--ipus", "--tiles-per-ipu", "--ipu-version", "--batches-per-step",
                 "--replicas", "--accumulation", "--input-shape", "--html", "--dot-dir"):
        assert flag in helped


def test_console_script():
    """pyproject.toml installs ``popart-sim``; it is present once the package is installed
    (CI installs it; a development venv may predate the entry)."""
    text = (_REPO / "pyproject.toml").read_text()
    assert 'popart-sim = "popart_backend.cli:main"' in text
    script = Path(sys.executable).parent / "popart-sim"
    if not script.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"the console script {script} was not installed")
        pytest.skip("popart-sim is not installed in this venv (pip install -e . adds it)")
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "popart-sim" in result.stdout
