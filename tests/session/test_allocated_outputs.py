"""``PyStepIO(..., allocate_outputs=True)`` and torch tensor inputs (lite extensions of the step
IO, dataflow.py; issue 17: the anchor output path).

The run allocates each anchor's host tensor, or hands the device's result tensor over when
nothing else holds it. A returned tensor must never change afterwards: neither in the next run
nor when the device's weights or the user's inputs change. The reference is the classic path
(``initAnchorArrays`` + numpy inputs) and the affine formula of ``session_models``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.device import stream_io

from .session_models import SAMPLE_SHAPE, affine_ref, make_session, step_input


def _run_allocated(session, x):
    stepio = popart.PyStepIO({"x": x}, {}, allocate_outputs=True)
    session.run(stepio)
    return stepio.outputs


def _copies(monkeypatch) -> list:
    """Records the anchors the run copied instead of handing over."""
    copied = []
    original = stream_io.HandOver.copy_

    def copy_(self, value):
        copied.append(self.anchor_id)
        original(self, value)

    monkeypatch.setattr(stream_io.HandOver, "copy_", copy_)
    return copied


def test_consecutive_runs_return_independent_tensors(monkeypatch):
    copied = _copies(monkeypatch)
    session = make_session({"y": popart.AnchorReturnType("All")})
    x1, x2 = step_input(1, seed=1)[0], step_input(1, seed=2)[0]
    first = _run_allocated(session, x1)["y"]
    second = _run_allocated(session, x2)["y"]
    assert isinstance(first, torch.Tensor) and first.shape == SAMPLE_SHAPE
    assert first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
    np.testing.assert_allclose(first.numpy(), affine_ref(x1), rtol=1e-6)
    np.testing.assert_allclose(second.numpy(), affine_ref(x2), rtol=1e-6)
    assert copied == []  # the op's result tensor was handed over both times, not copied


def test_results_equal_the_init_anchor_arrays_path():
    anchors = {"y": popart.AnchorReturnType("All"), "xw": popart.AnchorReturnType("Final")}
    session = make_session(anchors, bps=3)
    x = step_input(3, seed=4)
    classic = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, classic))
    allocated = _run_allocated(session, x)
    for name, array in classic.items():
        assert tuple(allocated[name].shape) == array.shape
        np.testing.assert_array_equal(allocated[name].numpy(), array)


def test_anchored_input_and_constant_are_copied_and_stay_valid(monkeypatch):
    """An anchored stream input and a folded constant are device-held values: copied, and
    the device keeps them (a second run still works and sees its own input)."""
    copied = _copies(monkeypatch)
    anchors = {a: popart.AnchorReturnType("All") for a in ("x", "w", "y")}
    session = make_session(anchors)
    x1 = step_input(1, seed=5)[0]
    x1_tensor = torch.from_numpy(x1.copy())
    first = _run_allocated(session, x1_tensor)
    x1_tensor.add_(100.0)  # the caller changes its input after the run
    x2 = step_input(1, seed=6)[0]
    second = _run_allocated(session, x2)
    assert sorted(copied) == ["w", "w", "x", "x"]
    np.testing.assert_array_equal(first["x"].numpy(), x1)
    np.testing.assert_array_equal(second["x"].numpy(), x2)
    np.testing.assert_array_equal(first["w"].numpy(), np.full(SAMPLE_SHAPE, 2.0, np.float32))
    np.testing.assert_allclose(first["y"].numpy(), affine_ref(x1), rtol=1e-6)
    np.testing.assert_allclose(second["y"].numpy(), affine_ref(x2), rtol=1e-6)


def test_a_result_the_user_holds_elsewhere_is_not_reused():
    """Handing over clears the device slot: holding the result must not let the next run write
    into it, also when the user keeps only a view of it."""
    session = make_session({"y": popart.AnchorReturnType("All")})
    x1, x2 = step_input(1, seed=7)[0], step_input(1, seed=8)[0]
    row = _run_allocated(session, x1)["y"][0]  # only a view survives
    _run_allocated(session, x2)
    np.testing.assert_allclose(row.numpy(), affine_ref(x1)[0], rtol=1e-6)


def test_torch_inputs_match_numpy_inputs():
    session = make_session({"y": popart.AnchorReturnType("All")}, bps=2)
    x = step_input(2, seed=9)
    from_numpy = _run_allocated(session, x)["y"]
    from_torch = _run_allocated(session, torch.from_numpy(x.copy()))["y"]  # 2 chunks: numpy path
    np.testing.assert_array_equal(from_torch.numpy(), from_numpy.numpy())
    np.testing.assert_allclose(from_torch.numpy(), affine_ref(x), rtol=1e-6)


def test_torch_input_of_another_dtype_is_refused_like_numpy():
    session = make_session({"y": popart.AnchorReturnType("All")})
    x = torch.zeros(SAMPLE_SHAPE, dtype=torch.float64)
    with pytest.raises(popart.popart_exception, match="Type discrepancy for tensor 'x'"):
        _run_allocated(session, x)


def test_allocate_outputs_needs_an_empty_outputs_dict():
    with pytest.raises(popart.popart_exception, match="pass an empty outputs dict"):
        popart.PyStepIO({}, {"y": np.zeros(2, np.float32)}, allocate_outputs=True)


def test_torch_int64_inputs_are_range_checked_like_numpy():
    """enableSupportedDataTypeCasting (default on) refuses int64 values outside int32 also for
    a torch input; in-range values give numpy's result."""
    b = popart.Builder(opsets={"ai.onnx": 11})
    idx = b.addInputTensor(popart.TensorInfo("INT64", [3]), "idx")
    out = b.aiOnnx.cast([b.aiOnnx.mul([idx, idx])], "FLOAT")
    session = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, [out]),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    good = torch.tensor([5, 0, 2], dtype=torch.int64)
    stepio = popart.PyStepIO({idx: good}, {}, allocate_outputs=True)
    session.run(stepio)
    np.testing.assert_array_equal(np.asarray(stepio.outputs[out]),
                                  (good.numpy() * good.numpy()).astype(np.float32))
    bad = torch.tensor([0, 2 ** 40, 1], dtype=torch.int64)
    with pytest.raises(popart.popart_exception, match=f"holds {2 ** 40}, outside the INT32"):
        session.run(popart.PyStepIO({idx: bad}, {}, allocate_outputs=True))


def test_anchor_also_viewed_by_a_reshape_is_handed_over(monkeypatch):
    """An anchor another op reads through a view (Reshape, as a loss reads the LM logits) is
    still a fresh result of each run: handed over, not copied, and independent across runs."""
    from onnx import TensorProto, helper, numpy_helper

    shape = list(SAMPLE_SHAPE)
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"]),
             helper.make_node("Reshape", ["y", "flat"], ["r"]),
             helper.make_node("ReduceSum", ["r"], ["s"], keepdims=0)]
    inits = [numpy_helper.from_array(np.full(shape, 2.0, np.float32), "w"),
             numpy_helper.from_array(np.array([-1], np.int64), "flat")]
    graph = helper.make_graph(
        nodes, "viewed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    copied = _copies(monkeypatch)
    session = make_session({"y": popart.AnchorReturnType("All"),
                            "s": popart.AnchorReturnType("All")}, model=model)
    x1, x2 = step_input(1, seed=7)[0], step_input(1, seed=8)[0]
    first = _run_allocated(session, x1)
    second = _run_allocated(session, x2)
    assert "y" not in copied
    np.testing.assert_allclose(first["y"].numpy(), x1 * 2.0, rtol=1e-6)
    np.testing.assert_allclose(second["y"].numpy(), x2 * 2.0, rtol=1e-6)
    np.testing.assert_allclose(first["s"].numpy(), (x1 * 2.0).sum(), rtol=1e-5)
