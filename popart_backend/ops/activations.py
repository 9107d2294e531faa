"""Activations: Relu, Sigmoid, Tanh, LeakyRelu, HardSigmoid, HardSwish, Elu, Selu, Celu,
ThresholdedRelu, Softplus, Softsign, Gelu, Mish, Shrink, PRelu and Clip, with their gradients.

Versions follow the rules in ``elementwise``'s docstring. Each gradient is one fused
ai.graphcore ``<Op>Grad`` kernel, dx = dy * f'(x) (or from the output y), registered right below
its forward op; where torch has that very backward kernel (``torch.ops.aten.*_backward``) it is
used, so results match torch.autograd bit for bit. At kinks the gradient follows torch: Relu
passes nothing at 0, Clip passes the gradient at the bounds themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ShapeError, UnsupportedOpError
from ..ir.op import Op
from .base import (
    ElementwiseGrad,
    FloatFormulaUnary,
    LegacyConsumedInputs,
    Unary,
    broadcast_shapes,
    check_dtypes,
)
from .registry import AI_GRAPHCORE, register_op

FLT_MAX = float(np.finfo(np.float32).max)
_aten = torch.ops.aten


@register_op("Relu", versions=(6, 13, 14))
class Relu(Unary):
    is_nonlinearity = True
    strided_inputs = True  # any layout in, the same out (device/layout.py)

    def kernel(self, x):
        return torch.relu(x)

    writes_into = True

    def kernel_into(self, out, x):
        return torch.clamp_min(x, 0, out=out)  # torch.relu's own definition, which lacks out=

    def grad(self, g):
        self.fused_grad(g, "ReluGrad", from_output=True)


@register_op("ReluGrad", versions=1, domain=AI_GRAPHCORE)
class ReluGrad(ElementwiseGrad):
    strided_inputs = True  # any layout in, the same out (device/layout.py)
    # Reading y instead of x lets x die early; y > 0 exactly where x > 0.
    def kernel(self, dy, y):
        # One pass, as torch's own ReLU backward (no boolean mask temporary).
        return torch.ops.aten.threshold_backward(dy, y, 0)

    writes_into = True

    def kernel_into(self, out, dy, y):
        return torch.ops.aten.threshold_backward.grad_input(dy, y, 0, grad_input=out)


@register_op("Sigmoid", versions=(6, 13))
class Sigmoid(Unary):
    is_nonlinearity = True

    def kernel(self, x):
        return torch.sigmoid(x)

    writes_into = True

    def kernel_into(self, out, x):
        return torch.sigmoid(x, out=out)

    def grad(self, g):
        self.fused_grad(g, "SigmoidGrad", from_output=True)


@register_op("SigmoidGrad", versions=1, domain=AI_GRAPHCORE)
class SigmoidGrad(ElementwiseGrad):
    def kernel(self, dy, y):
        return _aten.sigmoid_backward(dy, y)

    writes_into = True

    def kernel_into(self, out, dy, y):
        return _aten.sigmoid_backward.grad_input(dy, y, grad_input=out)


@register_op("Tanh", versions=(6, 13))
class Tanh(Unary):
    is_nonlinearity = True

    def kernel(self, x):
        return torch.tanh(x)

    writes_into = True

    def kernel_into(self, out, x):
        return torch.tanh(x, out=out)

    def grad(self, g):
        self.fused_grad(g, "TanhGrad", from_output=True)


@register_op("TanhGrad", versions=1, domain=AI_GRAPHCORE)
class TanhGrad(ElementwiseGrad):
    def kernel(self, dy, y):
        return _aten.tanh_backward(dy, y)

    writes_into = True

    def kernel_into(self, out, dy, y):
        return _aten.tanh_backward.grad_input(dy, y, grad_input=out)


@register_op("LeakyRelu", versions=(1, 6, 16))
class LeakyRelu(LegacyConsumedInputs, Unary):
    is_nonlinearity = True

    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 0.01

    def kernel(self, x):
        return torch.nn.functional.leaky_relu(x, self.attrs.alpha)

    def grad(self, g):
        self.fused_grad(g, "LeakyReluGrad", alpha=self.attrs.alpha)


@register_op("LeakyReluGrad", versions=1, domain=AI_GRAPHCORE)
class LeakyReluGrad(ElementwiseGrad):
    Attrs = LeakyRelu.Attrs

    def kernel(self, dy, x):
        return torch.where(x > 0, dy, dy * self.attrs.alpha)


@register_op("HardSigmoid", versions=(1, 6, 22))
class HardSigmoid(LegacyConsumedInputs, Unary):
    is_nonlinearity = True

    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 0.2
        beta: float = 0.5

    def kernel(self, x):
        return torch.clamp(x * self.attrs.alpha + self.attrs.beta, 0.0, 1.0)

    def grad(self, g):
        self.fused_grad(g, "HardSigmoidGrad", alpha=self.attrs.alpha, beta=self.attrs.beta)


@register_op("HardSigmoidGrad", versions=1, domain=AI_GRAPHCORE)
class HardSigmoidGrad(ElementwiseGrad):
    Attrs = HardSigmoid.Attrs

    def kernel(self, dy, x):
        z = x * self.attrs.alpha + self.attrs.beta
        return torch.where((z > 0) & (z < 1), dy * self.attrs.alpha, 0)


@register_op("HardSwish", versions=(14, 22))
class HardSwish(Unary):
    # ONNX fixes alpha = 1/6, beta = 0.5: exactly torch's hardswish.
    def kernel(self, x):
        return torch.nn.functional.hardswish(x)

    def grad(self, g):
        self.fused_grad(g, "HardSwishGrad")


@register_op("HardSwishGrad", versions=1, domain=AI_GRAPHCORE)
class HardSwishGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return _aten.hardswish_backward(dy, x)


@register_op("Elu", versions=(1, 6, 22))
class Elu(LegacyConsumedInputs, Unary):
    is_nonlinearity = True

    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 1.0

    def kernel(self, x):
        return torch.nn.functional.elu(x, self.attrs.alpha)

    def grad(self, g):
        self.fused_grad(g, "EluGrad", alpha=self.attrs.alpha)


@register_op("EluGrad", versions=1, domain=AI_GRAPHCORE)
class EluGrad(ElementwiseGrad):
    Attrs = Elu.Attrs

    def kernel(self, dy, x):
        return torch.where(x > 0, dy, dy * (self.attrs.alpha * torch.exp(x)))


@register_op("Selu", versions=(1, 6, 22))
class Selu(Unary):
    is_nonlinearity = True

    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 1.67326319217681884765625
        gamma: float = 1.05070102214813232421875

    # Selu-1 rounded its defaults to four decimals.
    @dataclass(frozen=True)
    class AttrsV1:
        alpha: float = 1.6732
        gamma: float = 1.0507
        consumed_inputs: tuple[int, ...] = ()

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return cls.AttrsV1 if version < 6 else cls.Attrs

    def kernel(self, x):
        a, g = self.attrs.alpha, self.attrs.gamma
        return torch.where(x > 0, x * g, torch.expm1(x) * (a * g))

    def grad(self, g):
        self.fused_grad(g, "SeluGrad", alpha=self.attrs.alpha, gamma=self.attrs.gamma)


@register_op("SeluGrad", versions=1, domain=AI_GRAPHCORE)
class SeluGrad(ElementwiseGrad):
    Attrs = Selu.Attrs

    def kernel(self, dy, x):
        a, g = self.attrs.alpha, self.attrs.gamma
        return torch.where(x > 0, dy * g, dy * ((a * g) * torch.exp(x)))


@register_op("Celu", versions=(12, 28))
class Celu(Unary):
    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 1.0

    def kernel(self, x):
        return torch.celu(x, self.attrs.alpha)

    def grad(self, g):
        self.fused_grad(g, "CeluGrad", alpha=self.attrs.alpha)


@register_op("CeluGrad", versions=1, domain=AI_GRAPHCORE)
class CeluGrad(ElementwiseGrad):
    Attrs = Celu.Attrs

    def kernel(self, dy, x):
        return torch.where(x > 0, dy, dy * torch.exp(x / self.attrs.alpha))


@register_op("ThresholdedRelu", versions=(10, 22))
class ThresholdedRelu(Unary):
    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 1.0

    def kernel(self, x):
        return torch.where(x > self.attrs.alpha, x, 0.0)

    def grad(self, g):
        self.fused_grad(g, "ThresholdedReluGrad", alpha=self.attrs.alpha)


@register_op("ThresholdedReluGrad", versions=1, domain=AI_GRAPHCORE)
class ThresholdedReluGrad(ElementwiseGrad):
    Attrs = ThresholdedRelu.Attrs

    def kernel(self, dy, x):
        return torch.where(x > self.attrs.alpha, dy, 0)


@register_op("Softplus", versions=(1, 22))
class Softplus(Unary):
    is_nonlinearity = True

    def kernel(self, x):
        # threshold above which torch returns x itself: log1p(exp(x)) - x < float32 epsilon there
        return torch.nn.functional.softplus(x, beta=1.0, threshold=20.0)

    def grad(self, g):
        self.fused_grad(g, "SoftplusGrad")


@register_op("SoftplusGrad", versions=1, domain=AI_GRAPHCORE)
class SoftplusGrad(ElementwiseGrad):
    # Same beta and threshold as the forward kernel, so the linear region has gradient 1.
    def kernel(self, dy, x):
        return _aten.softplus_backward(dy, x, 1.0, 20.0)


@register_op("Softsign", versions=(1, 22))
class Softsign(Unary):
    def kernel(self, x):
        return torch.nn.functional.softsign(x)

    def grad(self, g):
        self.fused_grad(g, "SoftsignGrad")


@register_op("SoftsignGrad", versions=1, domain=AI_GRAPHCORE)
class SoftsignGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        denominator = 1 + torch.abs(x)
        return dy / (denominator * denominator)


@register_op("Gelu", versions=20)
class Gelu(Unary):
    is_nonlinearity = True

    @dataclass(frozen=True)
    class Attrs:
        approximate: str = "none"

    def infer(self, x):
        if self.attrs.approximate not in ("none", "tanh"):
            raise UnsupportedOpError(
                f"{self.debug_name}: approximate='{self.attrs.approximate}'; ONNX allows 'none' "
                f"or 'tanh'."
            )
        return super().infer(x)

    def kernel(self, x):
        return torch.nn.functional.gelu(x, approximate=self.attrs.approximate)

    writes_into = True

    def kernel_into(self, out, x):
        return torch._C._nn.gelu(x, approximate=self.attrs.approximate, out=out)

    def grad(self, g):
        self.fused_grad(g, "GeluGrad", approximate=self.attrs.approximate)


@register_op("GeluGrad", versions=1, domain=AI_GRAPHCORE)
class GeluGrad(ElementwiseGrad):
    Attrs = Gelu.Attrs

    def kernel(self, dy, x):
        return _aten.gelu_backward(dy, x, approximate=self.attrs.approximate)


@register_op("Mish", versions=(18, 22))
class Mish(Unary):
    is_nonlinearity = True

    def kernel(self, x):
        return torch.nn.functional.mish(x)

    def grad(self, g):
        self.fused_grad(g, "MishGrad")


@register_op("MishGrad", versions=1, domain=AI_GRAPHCORE)
class MishGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return _aten.mish_backward(dy, x)


@register_op("Shrink", versions=9)
class Shrink(FloatFormulaUnary):
    @dataclass(frozen=True)
    class Attrs:
        bias: float = 0.0
        lambd: float = 0.5

    def formula(self, x):
        lambd, bias = self.attrs.lambd, self.attrs.bias
        return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, 0.0))

    def grad(self, g):
        self.fused_grad(g, "ShrinkGrad", lambd=self.attrs.lambd, bias=self.attrs.bias)


@register_op("ShrinkGrad", versions=1, domain=AI_GRAPHCORE)
class ShrinkGrad(ElementwiseGrad):
    Attrs = Shrink.Attrs

    def kernel(self, dy, x):
        lambd = self.attrs.lambd
        return torch.where((x < -lambd) | (x > lambd), dy, 0)


@register_op("PRelu", versions=(6, 7, 9, 16))
class PRelu(Op):
    """y = x < 0 ? slope * x : x, with ``slope`` broadcast to x's shape.

    Before version 7 (no numpy broadcasting in ONNX yet) a 1-D slope of x's channel count that
    does not broadcast from the right is per channel (axis 1), as the PyTorch exporter of that
    time meant it.
    """

    def infer(self, x, slope):
        check_dtypes(self, x, slope)
        self._slope_shape = slope.shape
        if (self.version < 7 and slope.rank == 1 and x.rank > 2
                and slope.shape[0] == x.shape[1] and slope.shape[0] != x.shape[-1]):
            self._slope_shape = (slope.shape[0],) + (1,) * (x.rank - 2)
        if broadcast_shapes(self, x.shape, self._slope_shape) != x.shape:
            raise ShapeError(
                f"{self.debug_name}: slope {list(slope.shape)} does not broadcast to the input "
                f"shape {list(x.shape)} (PRelu broadcasts the slope one way only)."
            )
        return x

    def kernel(self, x, slope):
        return torch.where(x < 0, x * slope.reshape(self._slope_shape), x)

    def grad(self, g):
        slope = g.input(1)
        slope_shape = g.input_info(1).shape
        if self._slope_shape != slope_shape:
            slope = g.op("Reshape", slope, g.const(np.array(self._slope_shape, np.int64), "shape"))
        dx, dslope = g.op("PReluGrad", g.output_grad(0), g.input(0), slope,
                          domain=AI_GRAPHCORE, num_outputs=2)
        g.set_input_grad(0, dx)
        if g.needs_input_grad(1):
            dslope = g.reduce_to_shape(dslope, self._slope_shape)
            if self._slope_shape != slope_shape:
                dslope = g.op("Reshape", dslope, g.const(np.array(slope_shape, np.int64), "shape"))
            g.set_input_grad(1, dslope)


@register_op("PReluGrad", versions=1, domain=AI_GRAPHCORE)
class PReluGrad(Op):
    """(dx, dslope before un-broadcasting), both shaped like x."""

    def infer(self, dy, x, slope):
        return [dy, dy]

    def kernel(self, dy, x, slope):
        negative = x < 0
        return torch.where(negative, dy * slope, dy), torch.where(negative, dy * x, 0)


@register_op("Clip", versions=6)
class ClipAttr(Unary):
    """Clip-6: bounds as attributes."""

    @dataclass(frozen=True)
    class Attrs:
        max: float = FLT_MAX
        min: float = -FLT_MAX

    def infer(self, x):
        check_dtypes(self, x)
        # The bounds convert to the input dtype first (FLT_MAX becomes inf in float16), as in
        # onnxruntime; torch.clamp refuses Python bounds outside the tensor's range.
        bounds = torch.tensor([self.attrs.min, self.attrs.max], dtype=torch.float64)
        self._low, self._high = bounds.to(x.dtype.torch).tolist()
        return x

    def kernel(self, x):
        return torch.clamp(x, self._low, self._high)

    def grad(self, g):
        dtype = g.input_info(0).dtype.numpy
        low = g.const(np.array(self._low, dtype), "min")
        high = g.const(np.array(self._high, dtype), "max")
        g.set_input_grad(0, g.op("ClipGrad", g.output_grad(0), g.input(0), low, high,
                                 domain=AI_GRAPHCORE))


@register_op("Clip", versions=(11, 12, 13))
class Clip(Unary):
    """Clip-11+: optional scalar ``min`` / ``max`` inputs; absent bounds do not clip."""

    def infer(self, x, low=None, high=None):
        check_dtypes(self, x, low, high)
        for name, bound in (("min", low), ("max", high)):
            if bound is not None and bound.nelms != 1:
                raise ShapeError(
                    f"{self.debug_name}: '{name}' must be a scalar, got shape {list(bound.shape)}."
                )
        return x

    def kernel(self, x, low=None, high=None):
        if low is None and high is None:
            return x.clone()
        # Bounds may arrive as [1]-shaped tensors; a 0-d view keeps the output shape of x.
        if low is not None:
            low = low.reshape(())
        if high is not None:
            high = high.reshape(())
        return torch.clamp(x, low, high)

    def grad(self, g):
        dy, x = g.output_grad(0), g.input(0)
        low = g.input(1) if g.has_input(1) else None
        high = g.input(2) if g.has_input(2) else None
        g.set_input_grad(0, g.op("ClipGrad", dy, x, low, high, domain=AI_GRAPHCORE))
        # A bound receives the gradient of the elements it clipped (torch.clamp's rule).
        zero = None
        for index, bound, outside in ((1, low, "Less"), (2, high, "Greater")):
            if bound is None or not g.needs_input_grad(index):
                continue
            if zero is None:
                zero = g.const(np.zeros((), g.input_info(0).dtype.numpy), "zero")
            clipped = g.op("Where", g.op(outside, x, bound), dy, zero)
            g.set_input_grad(index, g.reduce_to_shape(clipped, g.input_info(index).shape))


@register_op("ClipGrad", versions=1, domain=AI_GRAPHCORE)
class ClipGrad(Op):
    """dx of Clip: dy where min <= x <= max, else 0 (absent bounds do not mask)."""

    aliases_inputs = True  # the gradient passes through unchanged where unclipped

    def infer(self, dy, x, low=None, high=None):
        return dy

    def kernel(self, dy, x, low=None, high=None):
        out = dy
        if low is not None:
            out = torch.where(x < low.reshape(()), 0, out)
        if high is not None:
            out = torch.where(x > high.reshape(()), 0, out)
        return out
