"""Local normalizations: LRN (across nearby channels) and MeanVarianceNormalization (over given
axes), with their gradients. The other normalizations are in ``norm.py``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from ..ir.op import Op
from .base import normalize_axis
from .norm import _Normalization
from .registry import AI_GRAPHCORE, register_op


@register_op("LRN", versions=(1, 13))
class LRN(Op):
    """Y = X / (bias + alpha / size * sum of X^2 over nearby channels) ^ beta."""

    @dataclass(frozen=True)
    class Attrs:
        size: int
        alpha: float = 1e-4
        beta: float = 0.75
        bias: float = 1.0

    def infer(self, x):
        if x.rank < 3:
            raise ShapeError(f"{self.debug_name}: X {x} must be [N, C, D1..Dn] with n >= 1.")
        size = self.attrs.size
        if size < 1:
            raise ShapeError(f"{self.debug_name}: size={size} must be >= 1.")
        # ONNX's channel window is [c - floor((size-1)/2), c + ceil((size-1)/2)]; torch's
        # local_response_norm centres even sizes the other way, so the sum is built here.
        self._pad = (0, 0, (size - 1) // 2, size - 1 - (size - 1) // 2)
        self._planes = (x.shape[0], 1, x.shape[1], math.prod(x.shape[2:]))
        return x

    def kernel(self, x):
        at = self.attrs
        sq = F.pad((x * x).reshape(self._planes), self._pad)
        mean = F.avg_pool2d(sq, (at.size, 1), stride=1).reshape(x.shape)
        return x / mean.mul_(at.alpha).add_(at.bias).pow_(at.beta)

    def cost(self) -> tuple[int, int]:
        # The square, the window sum of ``size`` values, then scale, power and divide.
        _, moved = super().cost()
        return (self.attrs.size + 4) * self.inputs[0].info.nelms, moved

    def grad(self, g):
        at = self.attrs
        g.set_input_grad(0, g.op("LRNGrad", g.output_grad(0), g.input(0), domain=AI_GRAPHCORE,
                                 size=at.size, alpha=at.alpha, beta=at.beta, bias=at.bias))


@register_op("LRNGrad", versions=1, domain=AI_GRAPHCORE)
class LRNGrad(LRN):
    """dX = dY * d^-beta - 2 beta alpha / size * X * (window-transposed sum of dY X d^(-beta-1)),
    with d = bias + alpha / size * (window sum of X^2)."""

    grad = Op.grad  # no second derivative

    def infer(self, dy, x):
        LRN.infer(self, x)
        lo, hi = self._pad[2], self._pad[3]
        self._pad_t = (0, 0, hi, lo)  # channel c' contributes to j when j is in window(c')
        return x

    def kernel(self, dy, x):
        at = self.attrs
        sq = F.pad((x * x).reshape(self._planes), self._pad)
        d = F.avg_pool2d(sq, (at.size, 1), stride=1).reshape(x.shape).mul_(at.alpha).add_(at.bias)
        t = (dy * x * d.pow(-at.beta - 1.0)).reshape(self._planes)
        back = F.avg_pool2d(F.pad(t, self._pad_t), (at.size, 1), stride=1).reshape(x.shape)
        return dy * d.pow(-at.beta) - (2.0 * at.beta * at.alpha) * x * back


@register_op("MeanVarianceNormalization", versions=(9, 13))
class MeanVarianceNormalization(_Normalization):
    """Y = (X - mean) / (sqrt(variance) + 1e-9) over ``axes`` (ONNX's function body)."""

    @dataclass(frozen=True)
    class Attrs:
        axes: tuple[int, ...] = (0, 2, 3)

    def infer(self, x):
        self._axes = tuple(sorted({normalize_axis(self, a, x.rank) for a in self.attrs.axes}))
        return x

    def kernel(self, x):
        var, mean = torch.var_mean(x, self._axes, correction=0, keepdim=True)
        return (x - mean).div_(var.sqrt_().add_(1e-9))

    def grad(self, g):
        g.set_input_grad(0, g.op("MeanVarianceNormalizationGrad", g.output_grad(0), g.input(0),
                                 domain=AI_GRAPHCORE, axes=self._axes))


@register_op("MeanVarianceNormalizationGrad", versions=1, domain=AI_GRAPHCORE)
class MeanVarianceNormalizationGrad(MeanVarianceNormalization):
    """With k = 1 / (sigma + 1e-9) and xc = X - mean over ``axes`` (n elements):
    dX = k (dY - mean(dY)) - k^2 sum(dY xc) xc / (n sigma); 0 where sigma = 0."""

    grad = Op.grad  # no second derivative

    def infer(self, dy, x):
        MeanVarianceNormalization.infer(self, x)
        self._count = math.prod(x.shape[a] for a in self._axes)
        return x

    def kernel(self, dy, x):
        axes = self._axes
        var, mean = torch.var_mean(x, axes, correction=0, keepdim=True)
        sigma = var.sqrt()
        k = 1.0 / (sigma + 1e-9)
        xc = x - mean
        term = (dy * xc).sum(axes, keepdim=True) * k * k / (self._count * sigma)
        dx = k * (dy - dy.mean(axes, keepdim=True)) - term * xc
        return torch.where(sigma > 0, dx, torch.zeros_like(dx))

