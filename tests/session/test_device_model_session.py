"""The simulated IPU's memory and cycle model through the public session API (F47, F54-F56,
F98, F99): out-of-memory at prepareDevice, summary and report objects, cycle counts, DOT files
and the IR dump."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart


def _matmul_model(k: int) -> bytes:
    """y = x @ w with w [k, k] f32: k*k*4 bytes of weights."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, k])
    w = numpy_helper.from_array(np.ones((k, k), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                              "mm", [x], [y], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def _session(model, tiles: int, options=None):
    device = popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": tiles})
    return popart.InferenceSession(model, popart.DataFlow(1, {"y": popart.AnchorReturnType("All")}),
                                   device, userOptions=options or popart.SessionOptions())


def test_out_of_memory_names_ipu_and_numbers():
    """F47: 4 MiB of weights cannot fit in 4 tiles of 624 KiB; 16 tiles hold them."""
    model = _matmul_model(1024)
    with pytest.raises(popart.OutOfMemoryException, match=r"IPU 0.*bytes") as info:
        _session(model, 4).prepareDevice()
    assert "w" in str(info.value)
    assert info.value.getSummaryReport()
    session = _session(model, 16)
    session.prepareDevice()
    session.weightsFromHost()
    x = np.ones((1, 1024), np.float32)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    np.testing.assert_allclose(anchors["y"], np.full((1, 1024), 1024.0, np.float32))


def test_profiling_reports_and_cycle_count():
    """F54-F56: reports only with autoReport.all; cycles only with the instrumentation."""
    plain = _session(_matmul_model(64), 4)
    plain.prepareDevice()
    assert "Execution profiling not enabled" in plain.getSummaryReport()
    with pytest.raises(popart.popart_exception, match="profiling is not enabled"):
        plain.getReport()
    with pytest.raises(popart.popart_exception, match="instrumentWithHardwareCycleCounter"):
        plain.getCycleCount()

    opts = popart.SessionOptions()
    opts.engineOptions = {"autoReport.all": "true"}
    opts.instrumentWithHardwareCycleCounter = True
    session = _session(_matmul_model(64), 4, opts)
    session.prepareDevice()
    with pytest.raises(popart.popart_exception, match="no run"):
        session.getCycleCount()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": np.ones((1, 64), np.float32)}, anchors))
    assert session.getCycleCount() > 0
    text = session.getSummaryReport()
    assert "Execution profiling not enabled" not in text and "IPU" in text
    report = session.getReport()
    assert isinstance(report.to_dict(), dict)


def test_dot_checks_and_ir_dump(tmp_path):
    """F98, F99: POPART_DOT_CHECKS writes DOT files into logDir; POPART_IR_DUMP the IR JSON."""
    model_path = tmp_path / "mm.onnx"
    model_path.write_bytes(_matmul_model(8))
    dump = tmp_path / "ir.json"
    script = (
        "import popart_backend as popart\n"
        "opts = popart.SessionOptions(); opts.logDir = r'%s'\n"
        "s = popart.InferenceSession(r'%s', popart.DataFlow(1, ['y']),"
        " popart.DeviceManager().createCpuDevice(), userOptions=opts)\n"
    ) % (tmp_path, model_path)
    env = dict(os.environ, POPART_DOT_CHECKS="FWD0:FINAL", POPART_IR_DUMP=str(dump),
               PYTHONPATH=os.getcwd())
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)
    dots = sorted(p.name for p in tmp_path.glob("*.dot"))
    assert dots == ["final_r.dot", "fwd0_r.dot"]
    assert (tmp_path / "fwd0_r.dot").read_text().startswith("digraph net {")
    ir = json.loads(dump.read_text())
    (ops,) = ir.values()
    assert [op["type"] for op in ops] == ["MatMul"]
