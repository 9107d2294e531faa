"""Softmax, LogSoftmax and Hardmax.

Versions 1 and 11 coerce the input to 2-D at ``axis`` ([prod(d[:axis]), prod(d[axis:])]) and
normalize each row; version 13 normalizes along the single dim ``axis``.

Gradients read the forward output Y (as torch's backward does): SoftmaxGrad and
LogSoftmaxGrad, which keep the forward's axis semantics (``coerce_2d`` for versions < 13).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import normalize_axis
from .registry import AI_GRAPHCORE, register_op


class _AxisNormalizer(Op):
    """Shared shape logic: ``self._coerced`` is the 2-D shape for versions < 13, else None."""

    # Softmax: max, subtract, exp, sum and divide per element.
    flops_per_element: ClassVar[int] = 5

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        return self.flops_per_element * self.inputs[0].info.nelms, moved

    @dataclass(frozen=True)
    class Attrs:
        axis: int = -1

    @dataclass(frozen=True)
    class LegacyAttrs:
        axis: int = 1

    @classmethod
    def attrs_type(cls, version: int):
        return cls.LegacyAttrs if version < 13 else cls.Attrs

    def infer(self, x: TensorInfo):
        if not x.dtype.torch.is_floating_point:
            raise ShapeError(f"{self.debug_name}: X {x} must be a floating-point tensor.")
        if self.version < 13:
            # axis == rank is allowed here: the 2-D view is then [N, 1].
            axis = self.attrs.axis
            if not -x.rank <= axis <= x.rank:
                raise ShapeError(
                    f"{self.debug_name}: axis {axis} is out of range for rank {x.rank}."
                )
            axis = axis + x.rank if axis < 0 else axis
            self._coerced = (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
            self._dim = 1
        else:
            self._coerced = None
            self._dim = normalize_axis(self, self.attrs.axis, x.rank)
        return x

    def kernel(self, x):
        if self._coerced is None:
            return self.compute(x, self._dim)
        return self.compute(x.reshape(self._coerced), 1).reshape(x.shape)

    def compute(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        raise NotImplementedError

    def kernel_into(self, out, x):
        """The static memory plan (device/arena.py), for the subclasses declaring
        ``writes_into`` and an ``into(out, x, dim)``: ``kernel`` written into ``out``."""
        if self.settings.non_stable:  # the exp/sum form has no out= path: a fresh tensor
            return self.kernel(x)
        if self._coerced is None:
            return self.into(out, x, self._dim)
        self.into(out.view(self._coerced), x.reshape(self._coerced), 1)
        return out



class _AxisNormalizerGrad(_AxisNormalizer):
    """dX from dY and the forward output Y, along the forward's axis."""

    # A product with Y, its sum along the axis, and a multiply-subtract.
    flops_per_element = 3

    @dataclass(frozen=True)
    class Attrs:
        axis: int = -1
        coerce_2d: int = 0

    @classmethod
    def attrs_type(cls, version: int):
        return cls.Attrs

    def infer(self, dy, y):
        # The forward's rule: coerce to 2-D as versions < 13 did, or one axis as 13 does.
        self.version = 1 if self.attrs.coerce_2d else 13
        return _AxisNormalizer.infer(self, y)

    def kernel(self, dy, y):
        if self._coerced is None:
            return self.backward(dy, y, self._dim)
        return self.backward(dy.reshape(self._coerced), y.reshape(self._coerced), 1).reshape(y.shape)

    def backward(self, dy, y, dim):
        raise NotImplementedError

    def kernel_into(self, out, dy, y):
        """``kernel`` written into ``out`` (subclasses declaring ``writes_into`` define
        ``backward_into(out, dy, y, dim)``)."""
        if self._coerced is None:
            return self.backward_into(out, dy, y, self._dim)
        c = self._coerced
        self.backward_into(out.view(c), dy.reshape(c), y.reshape(c), 1)
        return out


def _axis_grad(op: _AxisNormalizer, g, grad_type: str) -> None:
    g.set_input_grad(0, g.op(grad_type, g.output_grad(0), g.output(0), domain=AI_GRAPHCORE,
                             axis=op.attrs.axis, coerce_2d=int(op.version < 13)))


@register_op("Softmax", versions=(1, 11, 13))
class Softmax(_AxisNormalizer):
    supports_non_stable = True  # enableNonStableSoftmax: compute() skips the maximum

    def compute(self, x, dim):
        if self.settings.non_stable:  # SessionOptions.enableNonStableSoftmax
            e = torch.exp(x)
            return e / e.sum(dim, keepdim=True)
        return torch.softmax(x, dim)

    writes_into = True  # the static memory plan (device/arena.py)

    def into(self, out, x, dim):
        return torch._softmax(x, dim, False, out=out)

    def grad(self, g):
        _axis_grad(self, g, "SoftmaxGrad")


@register_op("SoftmaxGrad", versions=1, domain=AI_GRAPHCORE)
class SoftmaxGrad(_AxisNormalizerGrad):
    """dX = Y * (dY - sum(dY * Y))."""

    def backward(self, dy, y, dim):
        return torch._softmax_backward_data(dy, y, dim, y.dtype)

    writes_into = True  # the static memory plan (device/arena.py)

    def backward_into(self, out, dy, y, dim):
        return torch._softmax_backward_data(dy, y, dim, y.dtype, grad_input=out)


@register_op("LogSoftmax", versions=(1, 11, 13))
class LogSoftmax(_AxisNormalizer):
    supports_non_stable = True  # enableNonStableSoftmax: compute() skips the maximum

    def compute(self, x, dim):
        if self.settings.non_stable:  # SessionOptions.enableNonStableSoftmax
            return x - torch.log(torch.exp(x).sum(dim, keepdim=True))
        return torch.log_softmax(x, dim)

    writes_into = True  # the static memory plan (device/arena.py)

    def into(self, out, x, dim):
        return torch._log_softmax(x, dim, False, out=out)

    def grad(self, g):
        _axis_grad(self, g, "LogSoftmaxGrad")


@register_op("LogSoftmaxGrad", versions=1, domain=AI_GRAPHCORE)
class LogSoftmaxGrad(_AxisNormalizerGrad):
    """dX = dY - exp(Y) * sum(dY)."""

    def backward(self, dy, y, dim):
        return torch._log_softmax_backward_data(dy, y, dim, y.dtype)

    writes_into = True  # the static memory plan (device/arena.py)

    def backward_into(self, out, dy, y, dim):
        return torch._log_softmax_backward_data(dy, y, dim, y.dtype, out=out)


@register_op("Hardmax", versions=(1, 11, 13))
class Hardmax(_AxisNormalizer):
    """1 at the first maximum along the axis, 0 elsewhere."""

    flops_per_element = 2  # max along the axis, then a compare

    def compute(self, x, dim):
        index = torch.argmax(x, dim, keepdim=True)
        return torch.zeros_like(x).scatter_(dim, index, 1.0)

    def grad(self, g):
        """Piecewise constant: the gradient is zero, so nothing flows back."""
