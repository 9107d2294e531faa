"""Gradients of the reductions (issue #3 item 2; F78 ops) against torch.autograd: every Reduce*
op with axes as attribute and as input, keepdims 0/1, single/multiple/negative/all axes and
noop_with_empty_axes; ties of ReduceMax/Min split evenly (torch.amax/amin), zeros in ReduceProd.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import check_grad

SHAPE = (2, 3, 4)


def _prod(x, dims, keepdim):
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=True)
    return x if keepdim else x.reshape([n for d, n in enumerate(x.shape) if d not in dims])


# op -> torch reduction over (dims, keepdim); input range
REDUCE = {
    "ReduceSum": (lambda x, d, k: x.sum(d, keepdim=k), (-1, 1)),
    "ReduceMean": (lambda x, d, k: x.mean(d, keepdim=k), (-1, 1)),
    "ReduceMax": (lambda x, d, k: x.amax(d, keepdim=k), (-1, 1)),
    "ReduceMin": (lambda x, d, k: x.amin(d, keepdim=k), (-1, 1)),
    "ReduceProd": (_prod, (0.5, 1.5)),
    "ReduceL1": (lambda x, d, k: x.abs().sum(d, keepdim=k), (0.1, 1)),
    "ReduceL2": (lambda x, d, k: torch.linalg.vector_norm(x, 2, d, keepdim=k), (-1, 1)),
    "ReduceLogSum": (lambda x, d, k: x.sum(d, keepdim=k).log(), (0.5, 2)),
    "ReduceLogSumExp": (lambda x, d, k: torch.logsumexp(x, d, keepdim=k), (-2, 2)),
    "ReduceSumSquare": (lambda x, d, k: (x * x).sum(d, keepdim=k), (-1, 1)),
}


def reference(op_type: str, axes: list[int] | None, keepdims: int, noop: bool = False):
    """torch version of the ONNX reduction; reducing no axis applies only the elementwise part,
    written (as ONNX's reference does) as reducing a new leading axis of size 1."""
    fn = REDUCE[op_type][0]
    if noop:
        return lambda x, *_: fn(x.unsqueeze(0), (0,), False)
    dims = tuple(range(len(SHAPE))) if axes is None else tuple(a % len(SHAPE) for a in axes)
    return lambda x, *_: fn(x, dims, bool(keepdims))


def inputs_for(op_type: str, seed: int) -> np.ndarray:
    low, high = REDUCE[op_type][1]
    x = np.random.default_rng(seed).uniform(low, high, SHAPE)
    if op_type == "ReduceL1":
        x *= np.where(np.random.default_rng(seed + 1).random(SHAPE) > 0.5, 1, -1)
    return x.astype(np.float32)


# (op, attribute version, input version): ReduceSum moved its axes to an input at 13.
VERSIONS = [(op, 11 if op == "ReduceSum" else 13, 13 if op == "ReduceSum" else 18)
            for op in REDUCE]
AXES = [[1], [0, 2], [-1], None]


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op_type, attr_version, input_version", VERSIONS,
                         ids=[v[0] for v in VERSIONS])
def test_reduce_grad(op_type, attr_version, input_version, keepdims):
    """Axes as attribute and as constant input, for every axes case and keepdims."""
    for n, axes in enumerate(AXES):
        x = inputs_for(op_type, seed=n)
        ref = reference(op_type, axes, keepdims)
        attrs = {"keepdims": keepdims} | ({} if axes is None else {"axes": axes})
        check_grad(op_type, [x], attrs, opset=attr_version, ref=ref)
        inputs = [x] if axes is None else [x, np.array(axes, np.int64)]
        check_grad(op_type, inputs, {"keepdims": keepdims}, opset=input_version,
                   const_inputs=[1], ref=ref)


@pytest.mark.parametrize("op_type, input_version", [(v[0], v[2]) for v in VERSIONS],
                         ids=[v[0] for v in VERSIONS])
def test_reduce_grad_empty_axes(op_type, input_version):
    """An empty axes input reduces all axes, or nothing with noop_with_empty_axes=1 (then only
    the elementwise part is differentiated: |x|, x², log x ...)."""
    x = inputs_for(op_type, seed=7)
    empty = np.array([], np.int64)
    check_grad(op_type, [x, empty], {"keepdims": 0}, opset=input_version, const_inputs=[1],
               ref=reference(op_type, None, 0))
    check_grad(op_type, [x, empty], {"noop_with_empty_axes": 1}, opset=input_version,
               const_inputs=[1], ref=reference(op_type, None, 1, noop=True))


@pytest.mark.parametrize("op_type", ["ReduceMax", "ReduceMin"])
def test_reduce_extremum_ties_split_evenly(op_type):
    """Tied extremes share the gradient equally, as torch.amax/amin."""
    x = np.array([[1.0, 3.0, 3.0, 0.5], [-2.0, -2.0, -2.0, 0.0], [4.0, 4.0, 4.0, 4.0]],
                 np.float32)
    for axes in ([1], [0, 1]):
        check_grad(op_type, [x], {"axes": axes, "keepdims": 0}, opset=13,
                   ref=lambda t: REDUCE[op_type][0](t, tuple(axes), False))


def test_reduce_prod_grad_with_zeros():
    """Products of the other elements, exact where the input holds one or several zeros."""
    x = np.array([[[0.0, 2.0, 3.0], [0.0, 0.0, 5.0]], [[1.5, -2.0, 0.5], [4.0, 0.0, 1.0]]],
                 np.float32)
    for axes in ([2], [1, 2], [0]):
        check_grad("ReduceProd", [x], {"axes": axes, "keepdims": 1}, opset=13,
                   ref=lambda t: _prod(t, tuple(axes), True))


def test_reduce_l2_grad_at_zero_norm():
    """A zero slice has norm 0 and gradient 0 (torch's choice), not NaN."""
    x = np.array([[0.0, 0.0, 0.0], [3.0, -4.0, 1.0]], np.float32)
    check_grad("ReduceL2", [x], {"axes": [1], "keepdims": 0}, opset=13,
               ref=lambda t: torch.linalg.vector_norm(t, 2, 1))
