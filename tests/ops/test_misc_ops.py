"""Leftover ai.onnx ops (ops/misc.py) against onnxruntime, gradients against torch.autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from popart_backend.errors import UnsupportedOpError
from tests.helpers import check_grad, check_op, one_op_model, rand, run_popart


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, -1])
def test_lp_normalization(p, axis):
    x = rand(3, 4)
    x[1] = 0  # a zero-norm slice stays zero
    check_op("LpNormalization", [x], {"p": p, "axis": axis})
    check_grad("LpNormalization", [rand(3, 4)], {"p": p, "axis": axis},
               ref=lambda a: torch.nn.functional.normalize(a, p=p, dim=axis, eps=0))


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis, time_axis):
    x = rand(4, 4, 2) if batch_axis == 1 else rand(4, 5, 2)
    lens = np.array([4, 1, 2, 3], np.int64)
    attrs = {"batch_axis": batch_axis, "time_axis": time_axis}
    check_op("ReverseSequence", [x, lens], attrs)

    def ref(a, n):
        out = a.clone()
        for b, k in enumerate(n.tolist()):
            if batch_axis == 1:
                out[:k, b] = a[:k, b].flip(0)
            else:
                out[b, :k] = a[b, :k].flip(0)
        return out

    check_grad("ReverseSequence", [x, lens], attrs, ref=ref)


def test_det():
    x = rand(2, 3, 3) + np.eye(3, dtype=np.float32)
    check_op("Det", [x], rtol=1e-4, atol=1e-5)
    check_op("Det", [x[0]], rtol=1e-4, atol=1e-5)
    check_grad("Det", [x], ref=torch.linalg.det, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("opset", [9, 11])
def test_max_unpool(opset):
    x = rand(1, 2, 4, 4)
    pooled, indices = torch.nn.functional.max_pool2d(torch.from_numpy(x), 2, 2,
                                                     return_indices=True)
    flat = indices + torch.arange(2).reshape(1, 2, 1, 1) * 16  # ONNX indices span N·C planes
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    check_op("MaxUnpool", [pooled.numpy(), flat.numpy()], attrs, opset=opset)
    shape = np.array([1, 2, 5, 5], np.int64)
    check_op("MaxUnpool", [pooled.numpy(), flat.numpy(), shape], attrs, opset=opset,
             const_inputs=[2])
    check_grad("MaxUnpool", [pooled.numpy(), flat.numpy()], attrs, opset=opset,
               ref=lambda a, i: torch.nn.functional.max_unpool2d(a, indices, 2, 2))


@pytest.mark.parametrize("attrs", [{}, {"sorted": 0}, {"axis": 0}, {"axis": 1, "sorted": 0}])
def test_unique_folds_a_constant_input(attrs):
    x = np.array([[2, 1, 2], [0, 1, 0], [2, 1, 2]], np.int64)
    check_op("Unique", [x], attrs, num_outputs=4, const_inputs=[0])


def test_unique_of_a_computed_tensor_is_rejected():
    model, feeds = one_op_model("Unique", [rand(4)], {}, num_outputs=4)
    with pytest.raises(UnsupportedOpError, match="Unique.*constant"):
        run_popart(model, feeds)
