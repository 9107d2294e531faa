"""Unary math: Abs, Neg, Exp, Log, Sqrt, Reciprocal, rounding, Sign, trigonometric and
hyperbolic functions, Erf, IsNaN and IsInf, with their gradients.

Versions follow the rules in ``elementwise``'s docstring. Gradients: one-op derivatives compose
forward ops (Neg, Exp, Log); the others are one fused ai.graphcore ``<Op>Grad`` kernel computing
dy * f'(x) (or from the output y where that is cheaper). Floor, Ceil, Round and Sign are
piecewise constant: their gradient is zero, so their ``grad()`` sets nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..dtypes import DataType
from .base import ElementwiseGrad, FloatFormulaUnary, LegacyConsumedInputs, Unary, check_dtypes
from .registry import AI_GRAPHCORE, register_op

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


@register_op("Abs", versions=(6, 13))
class Abs(Unary):
    def kernel(self, x):
        return torch.abs(x)

    def grad(self, g):
        self.fused_grad(g, "AbsGrad")


@register_op("AbsGrad", versions=1, domain=AI_GRAPHCORE)
class AbsGrad(ElementwiseGrad):
    # sign(0) = 0: the subgradient torch picks at the kink.
    def kernel(self, dy, x):
        return dy * torch.sign(x)


@register_op("Neg", versions=(6, 13))
class Neg(Unary):
    def kernel(self, x):
        return torch.neg(x)

    def grad(self, g):
        g.set_input_grad(0, g.op("Neg", g.output_grad(0)))


@register_op("Exp", versions=(6, 13))
class Exp(Unary):
    def kernel(self, x):
        return torch.exp(x)

    def grad(self, g):
        g.set_input_grad(0, g.op("Mul", g.output_grad(0), g.output(0)))


@register_op("Log", versions=(6, 13))
class Log(Unary):
    def kernel(self, x):
        return torch.log(x)

    def grad(self, g):
        g.set_input_grad(0, g.op("Div", g.output_grad(0), g.input(0)))


@register_op("Sqrt", versions=(6, 13))
class Sqrt(Unary):
    def kernel(self, x):
        return torch.sqrt(x)

    def grad(self, g):
        self.fused_grad(g, "SqrtGrad", from_output=True)


@register_op("SqrtGrad", versions=1, domain=AI_GRAPHCORE)
class SqrtGrad(ElementwiseGrad):
    def kernel(self, dy, y):
        return dy / (2 * y)


@register_op("Reciprocal", versions=(6, 13))
class Reciprocal(Unary):
    def kernel(self, x):
        return torch.reciprocal(x)

    def grad(self, g):
        self.fused_grad(g, "ReciprocalGrad", from_output=True)


@register_op("ReciprocalGrad", versions=1, domain=AI_GRAPHCORE)
class ReciprocalGrad(ElementwiseGrad):
    def kernel(self, dy, y):
        return -dy * y * y


@register_op("Floor", versions=(1, 6, 13))
class Floor(LegacyConsumedInputs, Unary):
    def kernel(self, x):
        return torch.floor(x)

    def grad(self, g):
        """Piecewise constant: zero gradient, so nothing flows back."""


@register_op("Ceil", versions=(1, 6, 13))
class Ceil(LegacyConsumedInputs, Unary):
    def kernel(self, x):
        return torch.ceil(x)

    def grad(self, g):
        """Piecewise constant: zero gradient, so nothing flows back."""


@register_op("Round", versions=(11, 22))
class Round(Unary):
    # torch.round rounds halves to even, as ONNX asks.
    def kernel(self, x):
        return torch.round(x)

    def grad(self, g):
        """Piecewise constant: zero gradient, so nothing flows back."""


@register_op("Sign", versions=(9, 13))
class Sign(Unary):
    def infer(self, x):
        check_dtypes(self, x)
        self._is_float = x.dtype.is_float
        return x

    def kernel(self, x):
        # torch.sign(nan) is 0; ONNX runtimes (and numpy) propagate the NaN.
        if self._is_float:
            return torch.where(torch.isnan(x), x, torch.sign(x))
        return torch.sign(x)

    def grad(self, g):
        """Piecewise constant: zero gradient, so nothing flows back."""


# --- trigonometric and hyperbolic -----------------------------------------------------------------


@register_op("Sin", versions=(7, 22))
class Sin(Unary):
    def kernel(self, x):
        return torch.sin(x)

    def grad(self, g):
        self.fused_grad(g, "SinGrad")


@register_op("SinGrad", versions=1, domain=AI_GRAPHCORE)
class SinGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return dy * torch.cos(x)


@register_op("Cos", versions=(7, 22))
class Cos(Unary):
    def kernel(self, x):
        return torch.cos(x)

    def grad(self, g):
        self.fused_grad(g, "CosGrad")


@register_op("CosGrad", versions=1, domain=AI_GRAPHCORE)
class CosGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return -dy * torch.sin(x)


@register_op("Tan", versions=(7, 22))
class Tan(Unary):
    def kernel(self, x):
        return torch.tan(x)

    def grad(self, g):
        self.fused_grad(g, "TanGrad", from_output=True)


@register_op("TanGrad", versions=1, domain=AI_GRAPHCORE)
class TanGrad(ElementwiseGrad):
    def kernel(self, dy, y):
        return dy * (1 + y * y)


@register_op("Asin", versions=(7, 22))
class Asin(Unary):
    def kernel(self, x):
        return torch.asin(x)

    def grad(self, g):
        self.fused_grad(g, "AsinGrad")


@register_op("AsinGrad", versions=1, domain=AI_GRAPHCORE)
class AsinGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return dy * torch.rsqrt(1 - x * x)


@register_op("Acos", versions=(7, 22))
class Acos(Unary):
    def kernel(self, x):
        return torch.acos(x)

    def grad(self, g):
        self.fused_grad(g, "AcosGrad")


@register_op("AcosGrad", versions=1, domain=AI_GRAPHCORE)
class AcosGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return -dy * torch.rsqrt(1 - x * x)


@register_op("Atan", versions=(7, 22))
class Atan(Unary):
    def kernel(self, x):
        return torch.atan(x)

    def grad(self, g):
        self.fused_grad(g, "AtanGrad")


@register_op("AtanGrad", versions=1, domain=AI_GRAPHCORE)
class AtanGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return dy / (1 + x * x)


@register_op("Sinh", versions=(9, 22))
class Sinh(Unary):
    def kernel(self, x):
        return torch.sinh(x)

    def grad(self, g):
        self.fused_grad(g, "SinhGrad")


@register_op("SinhGrad", versions=1, domain=AI_GRAPHCORE)
class SinhGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return dy * torch.cosh(x)


@register_op("Cosh", versions=(9, 22))
class Cosh(Unary):
    def kernel(self, x):
        return torch.cosh(x)

    def grad(self, g):
        self.fused_grad(g, "CoshGrad")


@register_op("CoshGrad", versions=1, domain=AI_GRAPHCORE)
class CoshGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return dy * torch.sinh(x)


@register_op("Asinh", versions=(9, 22))
class Asinh(Unary):
    def kernel(self, x):
        return torch.asinh(x)

    def grad(self, g):
        self.fused_grad(g, "AsinhGrad")


@register_op("AsinhGrad", versions=1, domain=AI_GRAPHCORE)
class AsinhGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return dy * torch.rsqrt(x * x + 1)


@register_op("Acosh", versions=(9, 22))
class Acosh(Unary):
    def kernel(self, x):
        return torch.acosh(x)

    def grad(self, g):
        self.fused_grad(g, "AcoshGrad")


@register_op("AcoshGrad", versions=1, domain=AI_GRAPHCORE)
class AcoshGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return dy * torch.rsqrt(x * x - 1)


@register_op("Atanh", versions=(9, 22))
class Atanh(Unary):
    def kernel(self, x):
        return torch.atanh(x)

    def grad(self, g):
        self.fused_grad(g, "AtanhGrad")


@register_op("AtanhGrad", versions=1, domain=AI_GRAPHCORE)
class AtanhGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return dy / (1 - x * x)


@register_op("Erf", versions=(9, 13))
class Erf(FloatFormulaUnary):
    # Erf-9 also admits integer inputs; their result is the truncated float erf.
    def formula(self, x):
        return torch.erf(x)

    def grad(self, g):
        self.fused_grad(g, "ErfGrad")


@register_op("ErfGrad", versions=1, domain=AI_GRAPHCORE)
class ErfGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return dy * (_TWO_OVER_SQRT_PI * torch.exp(-x * x))


# --- predicates ---------------------------------------------------------------------------------


@register_op("IsNaN", versions=(9, 13, 20))
class IsNaN(Unary):
    def infer(self, x):
        check_dtypes(self, x)
        return x.with_dtype(DataType.BOOL)

    def kernel(self, x):
        return torch.isnan(x)


@register_op("IsInf", versions=(10, 20))
class IsInf(Unary):
    @dataclass(frozen=True)
    class Attrs:
        detect_negative: int = 1
        detect_positive: int = 1

    def infer(self, x):
        check_dtypes(self, x)
        pos, neg = bool(self.attrs.detect_positive), bool(self.attrs.detect_negative)
        self._test = (
            torch.isinf if pos and neg
            else torch.isposinf if pos
            else torch.isneginf if neg
            else None
        )
        return x.with_dtype(DataType.BOOL)

    def kernel(self, x):
        if self._test is None:
            return torch.zeros(x.shape, dtype=torch.bool)
        return self._test(x)
