"""Cumulative ops along an axis: CumSum (ai.onnx 11, 14) and CumProd (26), with ``exclusive``
(shift by one element) and ``reverse`` (run from the end).

Gradients: CumSum is its own adjoint summed the other way; CumProd's grad op calls torch's
cumprod backward, which stays exact where the input has zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ShapeError
from ..ir.op import Op
from .base import check_dtypes, normalize_axis
from .registry import AI_GRAPHCORE, register_op


@register_op("CumSum", versions=(11, 14))
class CumSum(Op):
    """Cumulative sum along a constant ``axis`` input; ``exclusive`` shifts by one element,
    ``reverse`` sums from the end."""

    const_inputs = (1,)

    @dataclass(frozen=True)
    class Attrs:
        exclusive: int = 0
        reverse: int = 0

    def infer(self, x, axis):
        value = np.asarray(self.const_input(1))
        if value.size != 1:
            raise ShapeError(f"{self.debug_name}: axis must be a scalar, got {axis}.")
        self.axis = normalize_axis(self, int(value.reshape(-1)[0]), x.rank)
        self.length = x.shape[self.axis]
        return x

    def kernel(self, x, axis):
        if self.attrs.reverse:
            x = x.flip(self.axis)
        y = torch.cumsum(x, self.axis, dtype=x.dtype)
        if self.attrs.exclusive:
            # Shift rather than subtract x: the sums then equal onnxruntime's bit for bit.
            zero = torch.zeros_like(y.narrow(self.axis, 0, min(1, self.length)))
            y = torch.cat([zero, y.narrow(self.axis, 0, max(self.length - 1, 0))], self.axis)
        return y.flip(self.axis) if self.attrs.reverse else y

    def grad(self, g):
        # y_i sums x_j over j <= i (j < i exclusive), so dx_j sums dy_i over i >= j (i > j):
        # the same cumulative sum in the other direction.
        g.set_input_grad(0, g.op("CumSum", g.output_grad(0), g.input(1),
                                 exclusive=int(bool(self.attrs.exclusive)),
                                 reverse=int(not self.attrs.reverse)))


def _cumprod_forward(x: torch.Tensor, axis: int, attrs) -> tuple[torch.Tensor, torch.Tensor]:
    """(the factors, the output): ``reverse`` flips, ``exclusive`` shifts a 1 in front, so the
    output is one inclusive cumprod of the factors (flipped back)."""
    if attrs.reverse:
        x = x.flip(axis)
    if attrs.exclusive:
        length = x.shape[axis]
        one = torch.ones_like(x.narrow(axis, 0, min(1, length)))
        x = torch.cat([one, x.narrow(axis, 0, max(length - 1, 0))], axis)
    y = torch.cumprod(x, axis, dtype=x.dtype)  # torch would widen integers to int64
    return x, (y.flip(axis) if attrs.reverse else y)


@register_op("CumProd", versions=26)
class CumProd(Op):
    """Cumulative product along a constant ``axis`` input; ``exclusive`` multiplies the elements
    before each one only (the first becomes 1), ``reverse`` runs from the end."""

    const_inputs = (1,)
    Attrs = CumSum.Attrs

    def infer(self, x, axis):
        check_dtypes(self, x, axis, wide_unsigned_ok=True)
        value = np.asarray(self.const_input(1))
        if value.size != 1:
            raise ShapeError(f"{self.debug_name}: axis must be a scalar, got {axis}.")
        self.axis = normalize_axis(self, int(value.reshape(-1)[0]), x.rank)
        return x

    def kernel(self, x, axis):
        return _cumprod_forward(x, self.axis, self.attrs)[1]

    def grad(self, g):
        g.set_input_grad(0, g.op("CumProdGrad", g.output_grad(0), g.input(0),
                                 domain=AI_GRAPHCORE, axis=self.axis,
                                 exclusive=self.attrs.exclusive, reverse=self.attrs.reverse))


@register_op("CumProdGrad", versions=1, domain=AI_GRAPHCORE)
class CumProdGrad(Op):
    """dx of CumProd from dy and x, through torch's cumprod backward (exact where x has zeros,
    unlike dividing the output by x)."""

    @dataclass(frozen=True)
    class Attrs:
        axis: int  # in [0, rank)
        exclusive: int = 0
        reverse: int = 0

    def infer(self, dy, x):
        if dy.shape != x.shape:
            raise ShapeError(f"{self.debug_name}: gradient {dy} must have the input's shape {x}.")
        return dy

    def kernel(self, dy, x):
        axis, attrs = self.attrs.axis, self.attrs
        factors, y = _cumprod_forward(x, axis, attrs)
        if attrs.reverse:
            dy, y = dy.flip(axis), y.flip(axis)
        dx = torch.ops.aten.cumprod_backward(dy, factors, axis, y)
        if attrs.exclusive:
            # Factor i+1 is x_i; the shifted-in 1 has no input, and the last x is never used.
            length = x.shape[axis]
            zero = torch.zeros_like(dx.narrow(axis, 0, min(1, length)))
            dx = torch.cat([dx.narrow(axis, min(1, length), max(length - 1, 0)), zero], axis)
        return dx.flip(axis) if attrs.reverse else dx
