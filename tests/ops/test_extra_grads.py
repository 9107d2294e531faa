"""Gradients of LRN, MeanVarianceNormalization and GlobalLpPool against torch.autograd of their
ONNX formulas (issue #3: every differentiable op has a gradient)."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import check_grad, rand


def _lrn_ref(size, alpha, beta, bias):
    lo = (size - 1) // 2
    hi = size - 1 - lo

    def ref(x):
        n, c = x.shape[:2]
        sq = F.pad((x * x).reshape(n, 1, c, -1), (0, 0, lo, hi))
        mean = F.avg_pool2d(sq, (size, 1), stride=1).reshape(x.shape)
        return x / (bias + alpha * mean) ** beta

    return ref


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("opset", [1, 13])
def test_lrn_grad(size, opset):
    attrs = {"size": size, "alpha": 0.3, "beta": 0.75, "bias": 1.5}
    check_grad("LRN", [rand(2, 5, 3, 2)], attrs, opset=opset,
               ref=_lrn_ref(size, 0.3, 0.75, 1.5))


@pytest.mark.parametrize("axes", [(0, 2, 3), (1,), (2, 3)])
@pytest.mark.parametrize("opset", [9, 13])
def test_mean_variance_normalization_grad(axes, opset):
    def ref(x):
        mean = x.mean(dim=axes, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=axes, keepdim=True)
        return (x - mean) / (var.sqrt() + 1e-9)

    check_grad("MeanVarianceNormalization", [rand(2, 3, 2, 2)], {"axes": list(axes)},
               opset=opset, ref=ref)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("opset", [1, 2])
def test_global_lp_pool_grad(p, opset):
    """GlobalLpPool's gradient (issue #3), against torch.autograd of the p-norm."""
    attrs = {"p": float(p) if opset == 1 else p}
    check_grad("GlobalLpPool", [rand(2, 3, 4, 3)], attrs, opset=opset,
               ref=lambda x: torch.linalg.vector_norm(x, ord=p, dim=(2, 3), keepdim=True))
