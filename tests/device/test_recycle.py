"""Large anchors written into the previous run's output storage once the host let it go
(device/recycle.py; issue 17: GPT-2 inference, the 196 MiB logits faulted in every run).

The reference is numpy's product of the same operands. What must hold: a tensor the caller
still holds (or a view, or a numpy array of it) never changes; a dropped one is reused; with
recycling off, every run allocates.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart
from popart_backend.device import recycle, stream_io

ROWS, K, N = 64, 32, 4096  # output 64 x 4096 float32 = 1 MiB: the recycling threshold


def _session(rows: int = ROWS) -> tuple[popart.InferenceSession, np.ndarray]:
    w = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, N])],
        initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    session = popart.InferenceSession(
        model, popart.DataFlow(1, {"y": popart.AnchorReturnType("All")}),
        popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    return session, w


def _x(seed: int, rows: int = ROWS) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((rows, K))
                            .astype(np.float32))


def _run(session, x) -> torch.Tensor:
    stepio = popart.PyStepIO({"x": x}, {}, allocate_outputs=True)
    session.run(stepio)
    return stepio.outputs["y"]


def _check(y: torch.Tensor, x: torch.Tensor, w: np.ndarray) -> None:
    np.testing.assert_allclose(y.clone().numpy(), x.numpy() @ w, rtol=1e-5, atol=1e-4)


def test_dropped_output_storage_is_reused_with_right_values(monkeypatch):
    copied = []
    original = stream_io.HandOver.copy_
    monkeypatch.setattr(stream_io.HandOver, "copy_",
                        lambda self, value: (copied.append(self.anchor_id),
                                             original(self, value)))
    session, w = _session()
    x1, x2 = _x(1), _x(2)
    first = _run(session, x1)
    _check(first, x1, w)
    address = first.data_ptr()
    del first
    gc.collect()
    second = _run(session, x2)
    assert second.data_ptr() == address  # written into the dropped output
    _check(second, x2, w)
    # The remembered storage does not stop the hand-over: the result is never copied.
    third = _run(session, x1)
    assert copied == [] and third.data_ptr() != second.data_ptr()
    _check(third, x1, w)


@pytest.mark.parametrize("hold", ["tensor", "view", "numpy"])
def test_held_output_is_never_overwritten(hold):
    session, w = _session()
    x1, x2 = _x(3), _x(4)
    first = _run(session, x1)
    want = first.clone()
    held = {"tensor": lambda: first, "view": lambda: first[1:],
            "numpy": lambda: first.numpy()}[hold]()
    del first
    second = _run(session, x2)
    _check(second, x2, w)
    back = torch.as_tensor(held)
    assert back.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
    np.testing.assert_array_equal(back.numpy(), (want[1:] if hold == "view" else want).numpy())


def test_small_outputs_and_switch_off_allocate_each_run(monkeypatch):
    session, w = _session(rows=8)  # 128 KiB, under the threshold
    assert not any(isinstance(step[0], recycle.RecycledOutput)
                   for step in session._device.plan.steps)
    monkeypatch.setattr(recycle, "enabled", False)
    session, w = _session()
    assert not any(isinstance(step[0], recycle.RecycledOutput)
                   for step in session._device.plan.steps)
    x = _x(5)
    _check(_run(session, x), x, w)


@pytest.mark.parametrize("hold", ["untyped_storage", "typed_storage"])
def test_held_storage_of_output_is_never_overwritten(hold):
    """A caller holding only the storage of a dropped output (``untyped_storage()`` or the
    deprecated ``storage()``) still reads its values after the next run: torch hands out the
    one Python object per storage, so the storage's use count alone does not see that holder."""
    session, w = _session()
    x1, x2 = _x(6), _x(7)
    first = _run(session, x1)
    want, shape = first.clone(), first.shape
    if hold == "untyped_storage":
        held = first.untyped_storage()
    else:
        with pytest.warns(UserWarning):
            held = first.storage()
    del first
    gc.collect()
    second = _run(session, x2)
    _check(second, x2, w)
    storage = held if hold == "untyped_storage" else held._untyped_storage
    back = torch.empty((0,), dtype=torch.float32).set_(storage, 0, shape)
    assert storage.data_ptr() != second.untyped_storage().data_ptr()
    np.testing.assert_array_equal(back.numpy(), want.numpy())
