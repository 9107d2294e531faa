"""Gradients of the indexing ops (ops/gather_scatter.py; issue #3 item 2): Gather family,
Scatter family, OneHot (values), TopK, CumSum and Compress, against torch.autograd of the
matching torch call or central differences of the op's own kernel.

Index inputs are fed at run time (streams), with negative and repeated values where the op
allows them, so the grad ops' index handling is exercised on real data.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from popart_backend.errors import UnsupportedOpError
from tests.helpers import check_grad, rand


def i64(*values):
    return np.array(values, dtype=np.int64)


def x(*shape, seed=0):
    return rand(*shape, seed=seed)


def wrap(index, size):
    return torch.where(index < 0, index + size, index).long()


# --- Gather family ------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis, index", [
    (0, i64(2, 0, 2, -1, 2)),  # repeated and negative indices accumulate
    (-1, np.array([[1, -4], [3, 1], [1, 1]], np.int32)),
    (1, i64(-2)),  # 0-d indices drop the axis
])
def test_gather(opset, axis, index):
    data = x(4, 4, 2) if axis != -1 else x(3, 4)
    size = data.shape[axis]
    check_grad("Gather", [data, index], {"axis": axis}, opset=opset,
               ref=lambda d, i: torch.index_select(d, axis % d.dim(), wrap(i, size).reshape(-1))
               .reshape(d.shape[:axis % d.dim()] + tuple(i.shape) + d.shape[axis % d.dim() + 1:]))


@pytest.mark.parametrize("axis", [0, -1])
def test_gather_elements(axis):
    data = x(3, 4)
    index = np.array([[0, -1, 2], [2, 2, -3]], np.int64) if axis == -1 else \
        np.array([[0, 2, -1, 1], [2, 2, 0, -3]], np.int64)
    size = data.shape[axis]
    check_grad("GatherElements", [data, index], {"axis": axis}, opset=13,
               ref=lambda d, i: torch.gather(d, axis, wrap(i, size)))


@pytest.mark.parametrize("opset, batch_dims, data, index", [
    (11, 0, x(3, 4, 2), np.array([[0, 1], [2, -1], [0, 1]], np.int64)),  # repeated row
    (12, 0, x(3, 4, 2), np.array([[[1]], [[-1]], [[1]]], np.int64)),
    (13, 1, x(2, 3, 4), np.array([[[0, 1], [2, 3]], [[1, -1], [1, -1]]], np.int64)),
])
def test_gather_nd(opset, batch_dims, data, index):
    check_grad("GatherND", [data, index], {"batch_dims": batch_dims} if opset > 11 else {},
               opset=opset)


# --- Scatter family ------------------------------------------------------------------------------


SCATTER_INDEX = np.array([[1, 0, -1], [0, 2, 1]], np.int64)  # unique per column along axis 0


@pytest.mark.parametrize("op, opset", [("Scatter", 9), ("ScatterElements", 11),
                                       ("ScatterElements", 18)])
def test_scatter_elements(op, opset):
    data, updates = x(3, 3), x(2, 3, seed=1)
    check_grad(op, [data, SCATTER_INDEX, updates], {"axis": 0}, opset=opset,
               ref=lambda d, i, u: torch.scatter(d, 0, wrap(i, 3), u))


def test_scatter_elements_add_accumulates():
    data, updates = x(2, 4), x(2, 3, seed=1)
    index = np.array([[1, 1, -1], [0, 1, 1]], np.int64)  # repeats along axis 1
    check_grad("ScatterElements", [data, index, updates], {"axis": -1, "reduction": "add"},
               opset=16, ref=lambda d, i, u: torch.scatter_add(d, 1, wrap(i, 4), u))


@pytest.mark.parametrize("opset, reduction", [(11, None), (16, "add")])
def test_scatter_nd(opset, reduction):
    data, updates = x(4, 3), x(2, 3, seed=1)
    index = np.array([[-1], [1]], np.int64)
    attrs = {"reduction": reduction} if reduction else {}

    def ref(d, i, u):
        rows = wrap(i[:, 0], 4)
        return d.index_put((rows,), u, accumulate=reduction == "add")

    check_grad("ScatterND", [data, index, updates], attrs, opset=opset, ref=ref)


def test_scatter_nd_element_addressing():
    data, updates = x(2, 3), x(2, seed=1)
    index = np.array([[1, -1], [0, 0]], np.int64)
    check_grad("ScatterND", [data, index, updates], opset=13,
               ref=lambda d, i, u: d.index_put((i[:, 0], wrap(i[:, 1], 3)), u))


@pytest.mark.parametrize("op, opset, reduction", [("ScatterElements", 16, "mul"),
                                                  ("ScatterND", 18, "max")])
def test_scatter_reduction_without_gradient_raises(op, opset, reduction):
    data, updates = x(3, 3), x(2, 3, seed=1)
    index = SCATTER_INDEX if op == "ScatterElements" else np.array([[0], [2]], np.int64)
    with pytest.raises(UnsupportedOpError, match=f"{op} .*'{reduction}' is not implemented"):
        check_grad(op, [data, index, updates], {"reduction": reduction}, opset=opset)


# --- OneHot, TopK, CumSum, Compress --------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, 0])
def test_one_hot_values(axis):
    indices = np.array([[1, -1], [4, 0]], np.int64)  # 4 is out of range: nothing is hot
    values = np.array([0.5, -2.0], np.float32)

    def ref(i, depth, v):
        hot = torch.nn.functional.one_hot(wrap(i, 4).clamp(max=4), 5)[..., :4].bool()
        hot = hot.movedim(-1, axis)
        return torch.where(hot, v[1], v[0])

    check_grad("OneHot", [indices, i64(4), values], {"axis": axis}, opset=11, const_inputs=[1],
               ref=ref)


@pytest.mark.parametrize("opset, attrs", [
    (1, {"k": 2, "axis": 1}),
    (10, {"axis": -1}),
    (11, {"axis": 0, "largest": 0}),
])
def test_topk_values(opset, attrs):
    data = x(4, 5)
    k = attrs.get("k", 3)
    inputs = [data] if opset == 1 else [data, i64(k)]
    axis = attrs["axis"]
    largest = bool(attrs.get("largest", 1))
    check_grad("TopK", inputs, attrs, opset=opset, num_outputs=2,
               const_inputs=[] if opset == 1 else [1],
               ref=lambda d, *kk: list(torch.topk(d, k, axis, largest=largest)))


def cumsum_ref(exclusive, reverse, axis):
    def ref(a, ax):
        if reverse:
            a = a.flip(axis)
        y = torch.cumsum(a, axis)
        if exclusive:
            y = y - a
        return y.flip(axis) if reverse else y
    return ref


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum(exclusive, reverse):
    check_grad("CumSum", [x(3, 4), i64(-1)], {"exclusive": exclusive, "reverse": reverse},
               opset=14, const_inputs=[1], ref=cumsum_ref(exclusive, reverse, -1))


@pytest.mark.parametrize("axis", [None, 1])
def test_compress(axis):
    condition = np.array([True, False, True, True])
    attrs = {} if axis is None else {"axis": axis}
    check_grad("Compress", [x(3, 4), condition], attrs, opset=11, const_inputs=[1])
