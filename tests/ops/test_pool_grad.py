"""Gradients of MaxPool, AveragePool, LpPool and the global pools against torch.autograd
(issue #3 item 2, F49)."""

import numpy as np
import pytest
import torch.nn.functional as F

from tests.helpers import check_grad, rand

TOL = dict(rtol=1e-4, atol=1e-5)
MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _distinct(*shape):
    """Values without ties, so every window has one maximum."""
    n = int(np.prod(shape))
    return (np.random.default_rng(3).permutation(n).reshape(shape) / n).astype(np.float32)


def _pad(begin, end, value=0.0):
    def apply(x):
        pad = []
        for b, e in zip(reversed(begin), reversed(end)):
            pad += [b, e]
        return F.pad(x, pad, value=value)
    return apply


@pytest.mark.parametrize("n,kernel,strides,pads,dilations,ceil", [
    (2, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 0),
    (2, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 0),
    (2, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),     # ceil mode
    (2, (2, 3), (1, 2), (0, 1, 1, 0), (1, 1), 0),     # asymmetric pads: pre-padded path
    (2, (2, 2), (1, 1), (1, 1, 1, 1), (2, 2), 0),     # dilation
    (1, (3,), (2,), (1, 1), (1,), 0),
    (3, (2, 2, 2), (2, 1, 2), (0, 0, 0, 0, 0, 0), (1, 1, 1), 1),
])
def test_maxpool_grad(n, kernel, strides, pads, dilations, ceil):
    spatial = {1: (11,), 2: (7, 8), 3: (5, 4, 5)}[n]
    x = _distinct(2, 3, *spatial)
    begin, end = pads[:n], pads[n:]
    if begin == end:
        ref = lambda x: MAX[n](x, kernel, strides, begin, dilations, bool(ceil))  # noqa: E731
    else:
        ref = lambda x: MAX[n](_pad(begin, end, -np.inf)(x), kernel, strides, 0, dilations)  # noqa
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads),
             "dilations": list(dilations), "ceil_mode": ceil}
    check_grad("MaxPool", [x], attrs, ref=ref, **TOL)


def test_maxpool_grad_ties_follow_torch():
    """A constant input: every window ties; torch sends each window's gradient to its first
    element, and so do we."""
    x = np.ones((1, 1, 4, 4), np.float32)
    check_grad("MaxPool", [x], {"kernel_shape": [2, 2], "strides": [1, 1]},
               ref=lambda x: F.max_pool2d(x, 2, 1), **TOL)


def test_maxpool_grad_with_indices_output():
    x = _distinct(1, 2, 5, 5)
    check_grad("MaxPool", [x], {"kernel_shape": [2, 2], "strides": [2, 2]}, num_outputs=2,
               ref=lambda x: [F.max_pool2d(x, 2, 2)], **TOL)


@pytest.mark.parametrize("n,kernel,strides,pads,include,ceil,dilations", [
    (2, (2, 2), (2, 2), (0, 0, 0, 0), 0, 0, None),
    (2, (3, 3), (2, 2), (1, 1, 1, 1), 0, 0, None),
    (2, (3, 3), (2, 2), (1, 1, 1, 1), 1, 0, None),
    (2, (3, 3), (2, 2), (1, 1, 1, 1), 0, 1, None),   # ceil mode
    (1, (3,), (2,), (1, 1), 1, 0, None),
    (3, (2, 2, 2), (1, 2, 2), (1, 1, 1, 1, 1, 1), 1, 0, None),
])
def test_averagepool_grad_torch_path(n, kernel, strides, pads, include, ceil, dilations):
    spatial = {1: (9,), 2: (7, 8), 3: (4, 5, 5)}[n]
    ref = lambda x: AVG[n](x, kernel, strides, pads[:n], bool(ceil), bool(include))  # noqa
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads),
             "count_include_pad": include, "ceil_mode": ceil}
    check_grad("AveragePool", [rand(2, 3, *spatial)], attrs, ref=ref, opset=18, **TOL)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [0, 1, 1, 0], "count_include_pad": 0},
    {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [0, 1, 1, 0], "count_include_pad": 1},
    {"kernel_shape": [2, 2], "strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 0, 0], "ceil_mode": 1,
     "dilations": [1, 2]},
])
def test_averagepool_grad_window_sum_path(attrs):
    """Uneven pads and dilations: the forward sums windows itself; check against the central
    differences of that kernel."""
    check_grad("AveragePool", [rand(1, 2, 6, 7)], attrs, opset=19, **TOL)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lppool_grad(p):
    x = rand(2, 3, 6, 6, low=0.2, high=1.0) * np.sign(rand(2, 3, 6, 6) + 0.01)
    x = x.astype(np.float32)
    ref = lambda x: F.lp_pool2d(x, p, 2, 2) if p != 1 else F.avg_pool2d(x.abs(), 2, 2) * 4  # noqa
    if p == 3:
        ref = lambda x: (F.avg_pool2d(x.abs() ** 3, 2, 2) * 4) ** (1 / 3)  # noqa: E731
    check_grad("LpPool", [x], {"kernel_shape": [2, 2], "strides": [2, 2], "p": p}, ref=ref,
               **TOL)


def test_lppool_grad_padded():
    x = rand(1, 2, 5, 5, low=0.2, high=1.0)
    check_grad("LpPool", [x], {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1],
                               "p": 2}, **TOL)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 3, 2)])
def test_global_pool_grads(shape):
    dims = tuple(range(2, len(shape)))
    check_grad("GlobalAveragePool", [rand(*shape)], ref=lambda x: x.mean(dims, keepdim=True))
    check_grad("GlobalMaxPool", [_distinct(*shape)], ref=lambda x: x.amax(dims, keepdim=True))
