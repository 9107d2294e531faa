"""Elementwise ops: unary math and activations, broadcasting arithmetic, comparisons, logic,
variadic Sum/Max/Min/Mean, Where and Cast.

Versions: each op registers every ONNX since-version from the first one PopART 2.3 lists
(spec §6.1) or, where that is later, from the version in force at opset 6 (the oldest opset the
importer accepts); ops PopART lacks start at their first ONNX version. Since-versions that only
widened the type list share one class. Inputs are checked against the ONNX type constraints of
the resolved version (``base.check_dtypes``), so every kernel sees the dtypes its version allows.

Integer results follow onnxruntime: Div truncates toward zero, and integer ops that go through
a float formula (Pow with an integer base, Shrink, Erf) truncate the float result.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import torch

from ..dtypes import DataType
from ..errors import ShapeError, UnsupportedOpError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import (
    WIDE_UNSIGNED,
    Comparison,
    ElementwiseBinary,
    ElementwiseUnary,
    Variadic,
    broadcast_shapes,
    check_dtypes,
)
from .registry import register_op

FLT_MAX = float(np.finfo(np.float32).max)


@functools.cache
def _with_consumed_inputs(attrs_type: type) -> type:
    """``attrs_type`` plus the opset-1 ``consumed_inputs`` attribute.

    consumed_inputs told old runtimes which inputs an op may overwrite; it never changes the
    result, so it is accepted and ignored.
    """
    legacy = dataclasses.make_dataclass(
        attrs_type.__name__ + "V1",
        [("consumed_inputs", tuple, dataclasses.field(default=()))],
        bases=(attrs_type,),
        frozen=True,
    )
    legacy.__module__ = __name__
    return legacy


class LegacyConsumedInputs:
    """Mixin: versions below 6 also accept ``consumed_inputs``."""

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return _with_consumed_inputs(cls.Attrs) if version < 6 else cls.Attrs


# --- family bases (dtype checks on top of the shape rules of base.py) ----------------------------


class Unary(ElementwiseUnary):
    """y = f(x) with ONNX's dtype constraints checked."""

    def infer(self, x):
        check_dtypes(self, x)
        return x


class FloatFormulaUnary(Unary):
    """Unary op whose integer variants compute in float64 and truncate (as onnxruntime)."""

    def infer(self, x):
        check_dtypes(self, x)
        self._is_int = x.dtype.is_int
        return x

    def formula(self, x):
        raise NotImplementedError

    def kernel(self, x):
        if self._is_int:
            return self.formula(x.double()).to(x.dtype)
        return self.formula(x)


def _check_legacy_broadcast(op: ElementwiseBinary, a: TensorInfo, b: TensorInfo) -> None:
    """Before opset 7, broadcast=1 lets B (aligned at ``axis`` or at the end) stretch to A."""
    attrs = op.attrs
    if not isinstance(attrs, ElementwiseBinary.LegacyAttrs) or not attrs.broadcast:
        return
    shape = b.shape
    if attrs.axis is not None and b.rank:
        axis = attrs.axis % max(a.rank, 1)
        shape = shape + (1,) * max(a.rank - axis - b.rank, 0)
    if len(shape) > a.rank or broadcast_shapes(op, a.shape, shape) != a.shape:
        raise ShapeError(
            f"{op.debug_name}: B {list(b.shape)} does not fit A {list(a.shape)} at axis "
            f"{attrs.axis} (opset-{op.version} broadcast=1 stretches B to A's shape only)."
        )


class Binary(ElementwiseBinary):
    """Broadcasting binary op (legacy broadcast/axis below opset 7) with dtype checks."""

    def infer(self, a, b):
        check_dtypes(self, a, b)
        _check_legacy_broadcast(self, a, b)
        return super().infer(a, b)


class Compare(Comparison):
    """Broadcasting comparison returning BOOL, with dtype checks."""

    def infer(self, a, b):
        check_dtypes(self, a, b)
        _check_legacy_broadcast(self, a, b)
        return super().infer(a, b)


class VariadicOp(Variadic):
    """Sum/Max/Min/Mean: versions below 8 require equal shapes, later ones broadcast."""

    def infer(self, *xs):
        check_dtypes(self, *xs)
        if self.version < 8 and len({x.shape for x in xs}) > 1:
            raise ShapeError(
                f"{self.debug_name}: {self.op_type}-{self.version} needs inputs of one shape, got "
                f"{', '.join(str(list(x.shape)) for x in xs)}. Opset 8 and later broadcast."
            )
        return super().infer(*xs)


# --- unary math ------------------------------------------------------------------------------


@register_op("Abs", versions=(6, 13))
class Abs(Unary):
    def kernel(self, x):
        return torch.abs(x)


@register_op("Neg", versions=(6, 13))
class Neg(Unary):
    def kernel(self, x):
        return torch.neg(x)


@register_op("Exp", versions=(6, 13))
class Exp(Unary):
    def kernel(self, x):
        return torch.exp(x)


@register_op("Log", versions=(6, 13))
class Log(Unary):
    def kernel(self, x):
        return torch.log(x)


@register_op("Sqrt", versions=(6, 13))
class Sqrt(Unary):
    def kernel(self, x):
        return torch.sqrt(x)


@register_op("Reciprocal", versions=(6, 13))
class Reciprocal(Unary):
    def kernel(self, x):
        return torch.reciprocal(x)


@register_op("Floor", versions=(1, 6, 13))
class Floor(LegacyConsumedInputs, Unary):
    def kernel(self, x):
        return torch.floor(x)


@register_op("Ceil", versions=(1, 6, 13))
class Ceil(LegacyConsumedInputs, Unary):
    def kernel(self, x):
        return torch.ceil(x)


@register_op("Round", versions=11)
class Round(Unary):
    # torch.round rounds halves to even, as ONNX asks.
    def kernel(self, x):
        return torch.round(x)


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


@register_op("Sin", versions=7)
class Sin(Unary):
    def kernel(self, x):
        return torch.sin(x)


@register_op("Cos", versions=7)
class Cos(Unary):
    def kernel(self, x):
        return torch.cos(x)


@register_op("Tan", versions=7)
class Tan(Unary):
    def kernel(self, x):
        return torch.tan(x)


@register_op("Asin", versions=7)
class Asin(Unary):
    def kernel(self, x):
        return torch.asin(x)


@register_op("Acos", versions=7)
class Acos(Unary):
    def kernel(self, x):
        return torch.acos(x)


@register_op("Atan", versions=7)
class Atan(Unary):
    def kernel(self, x):
        return torch.atan(x)


@register_op("Sinh", versions=9)
class Sinh(Unary):
    def kernel(self, x):
        return torch.sinh(x)


@register_op("Cosh", versions=9)
class Cosh(Unary):
    def kernel(self, x):
        return torch.cosh(x)


@register_op("Asinh", versions=9)
class Asinh(Unary):
    def kernel(self, x):
        return torch.asinh(x)


@register_op("Acosh", versions=9)
class Acosh(Unary):
    def kernel(self, x):
        return torch.acosh(x)


@register_op("Atanh", versions=9)
class Atanh(Unary):
    def kernel(self, x):
        return torch.atanh(x)


@register_op("Erf", versions=(9, 13))
class Erf(FloatFormulaUnary):
    # Erf-9 also admits integer inputs; their result is the truncated float erf.
    def formula(self, x):
        return torch.erf(x)


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


@register_op("Not", versions=1)
class Not(Unary):
    def kernel(self, x):
        return torch.logical_not(x)


@register_op("BitwiseNot", versions=18)
class BitwiseNot(Unary):
    def kernel(self, x):
        return torch.bitwise_not(x)


# --- activations ------------------------------------------------------------------------------


@register_op("Relu", versions=(6, 13, 14))
class Relu(Unary):
    def kernel(self, x):
        return torch.relu(x)


@register_op("Sigmoid", versions=(6, 13))
class Sigmoid(Unary):
    def kernel(self, x):
        return torch.sigmoid(x)


@register_op("Tanh", versions=(6, 13))
class Tanh(Unary):
    def kernel(self, x):
        return torch.tanh(x)


@register_op("LeakyRelu", versions=(1, 6, 16))
class LeakyRelu(LegacyConsumedInputs, Unary):
    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 0.01

    def kernel(self, x):
        return torch.nn.functional.leaky_relu(x, self.attrs.alpha)


@register_op("HardSigmoid", versions=(1, 6))
class HardSigmoid(LegacyConsumedInputs, Unary):
    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 0.2
        beta: float = 0.5

    def kernel(self, x):
        return torch.clamp(x * self.attrs.alpha + self.attrs.beta, 0.0, 1.0)


@register_op("HardSwish", versions=14)
class HardSwish(Unary):
    # ONNX fixes alpha = 1/6, beta = 0.5: exactly torch's hardswish.
    def kernel(self, x):
        return torch.nn.functional.hardswish(x)


@register_op("Elu", versions=(1, 6))
class Elu(LegacyConsumedInputs, Unary):
    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 1.0

    def kernel(self, x):
        return torch.nn.functional.elu(x, self.attrs.alpha)


@register_op("Selu", versions=(1, 6))
class Selu(Unary):
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


@register_op("Celu", versions=12)
class Celu(Unary):
    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 1.0

    def kernel(self, x):
        return torch.celu(x, self.attrs.alpha)


@register_op("ThresholdedRelu", versions=10)
class ThresholdedRelu(Unary):
    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 1.0

    def kernel(self, x):
        return torch.where(x > self.attrs.alpha, x, 0.0)


@register_op("Softplus", versions=1)
class Softplus(Unary):
    def kernel(self, x):
        # threshold above which torch returns x itself: log1p(exp(x)) - x < float32 epsilon there
        return torch.nn.functional.softplus(x, beta=1.0, threshold=20.0)


@register_op("Softsign", versions=1)
class Softsign(Unary):
    def kernel(self, x):
        return torch.nn.functional.softsign(x)


@register_op("Gelu", versions=20)
class Gelu(Unary):
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


@register_op("Mish", versions=18)
class Mish(Unary):
    def kernel(self, x):
        return torch.nn.functional.mish(x)


@register_op("Shrink", versions=9)
class Shrink(FloatFormulaUnary):
    @dataclass(frozen=True)
    class Attrs:
        bias: float = 0.0
        lambd: float = 0.5

    def formula(self, x):
        lambd, bias = self.attrs.lambd, self.attrs.bias
        return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, 0.0))


@register_op("PRelu", versions=(6, 7, 9, 16))
class PRelu(Op):
    """y = x < 0 ? slope * x : x, with ``slope`` broadcast to x's shape."""

    def infer(self, x, slope):
        check_dtypes(self, x, slope)
        if broadcast_shapes(self, x.shape, slope.shape) != x.shape:
            raise ShapeError(
                f"{self.debug_name}: slope {list(slope.shape)} does not broadcast to the input "
                f"shape {list(x.shape)} (PRelu broadcasts the slope one way only)."
            )
        return x

    def kernel(self, x, slope):
        return torch.where(x < 0, x * slope, x)


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


# --- binary arithmetic --------------------------------------------------------------------------


@register_op("Add", versions=(6, 7, 13, 14))
class Add(Binary):
    def kernel(self, a, b):
        return torch.add(a, self.legacy_align(a, b))


@register_op("Sub", versions=(6, 7, 13, 14))
class Sub(Binary):
    def kernel(self, a, b):
        return torch.sub(a, self.legacy_align(a, b))


@register_op("Mul", versions=(6, 7, 13, 14))
class Mul(Binary):
    def kernel(self, a, b):
        return torch.mul(a, self.legacy_align(a, b))


@register_op("Div", versions=(6, 7, 13, 14))
class Div(Binary):
    """Integer division truncates toward zero, as onnxruntime does (C++ ``/``)."""

    def infer(self, a, b):
        info = super().infer(a, b)
        self._rounding = "trunc" if a.dtype.is_int else None
        return info

    def kernel(self, a, b):
        return torch.div(a, self.legacy_align(a, b), rounding_mode=self._rounding)


@register_op("Pow", versions=(1, 7, 12, 13, 15))
class Pow(Binary):
    """Base and exponent may differ in dtype (opset 12+); the result has the base's dtype.

    An integer base goes through float64 and truncates, which is what onnxruntime's
    ``std::pow`` does (so 2 ** -1 == 0).
    """

    def infer(self, a, b):
        info = super().infer(a, b)
        self._int_base = a.dtype.is_int
        self._cast = a.dtype != b.dtype
        return info

    def kernel(self, a, b):
        b = self.legacy_align(a, b)
        if self._int_base:
            return torch.pow(a.double(), b.double()).to(a.dtype)
        if self._cast:
            return torch.pow(a, b).to(a.dtype)
        return torch.pow(a, b)


@register_op("Mod", versions=(10, 13))
class Mod(Binary):
    """fmod=0: result takes the divisor's sign (integers only); fmod=1: the dividend's sign."""

    @dataclass(frozen=True)
    class Attrs:
        fmod: int = 0

    def infer(self, a, b):
        info = super().infer(a, b)
        if not self.attrs.fmod and a.dtype.is_float:
            raise UnsupportedOpError(
                f"{self.debug_name}: fmod=0 on {a.dtype.name.lower()} inputs; ONNX requires "
                f"fmod=1 for floating-point Mod."
            )
        return info

    def kernel(self, a, b):
        if self.attrs.fmod:
            return torch.fmod(a, b)
        return torch.remainder(a, b)


@register_op("BitShift", versions=11)
class BitShift(Binary):
    """uint16/uint32 shift in int64 (torch lacks those kernels) and wrap back; uint64 raises."""

    @dataclass(frozen=True)
    class Attrs:
        direction: str

    def infer(self, a, b):
        check_dtypes(self, a, b, wide_unsigned_ok=True)
        if self.attrs.direction not in ("LEFT", "RIGHT"):
            raise UnsupportedOpError(
                f"{self.debug_name}: direction='{self.attrs.direction}'; use 'LEFT' or 'RIGHT'."
            )
        if a.dtype is DataType.UINT64:
            raise UnsupportedOpError(
                f"{self.debug_name}: uint64 shifts are not implemented by the simulated IPU's "
                f"kernels; use uint8, uint16 or uint32."
            )
        self._widen = a.dtype in WIDE_UNSIGNED
        self._shift = (
            torch.bitwise_left_shift if self.attrs.direction == "LEFT" else torch.bitwise_right_shift
        )
        return TensorInfo(a.dtype, broadcast_shapes(self, a.shape, b.shape))

    def kernel(self, a, b):
        if self._widen:
            return self._shift(a.long(), b.long()).to(a.dtype)
        return self._shift(a, b)


@register_op("BitwiseAnd", versions=18)
class BitwiseAnd(Binary):
    def kernel(self, a, b):
        return torch.bitwise_and(a, b)


@register_op("BitwiseOr", versions=18)
class BitwiseOr(Binary):
    def kernel(self, a, b):
        return torch.bitwise_or(a, b)


@register_op("BitwiseXor", versions=18)
class BitwiseXor(Binary):
    def kernel(self, a, b):
        return torch.bitwise_xor(a, b)


# --- logic and comparisons ----------------------------------------------------------------------


@register_op("And", versions=(1, 7))
class And(Compare):
    def kernel(self, a, b):
        return torch.logical_and(a, self.legacy_align(a, b))


@register_op("Or", versions=(1, 7))
class Or(Compare):
    def kernel(self, a, b):
        return torch.logical_or(a, self.legacy_align(a, b))


@register_op("Xor", versions=(1, 7))
class Xor(Compare):
    def kernel(self, a, b):
        return torch.logical_xor(a, self.legacy_align(a, b))


@register_op("Equal", versions=(1, 7, 11, 13, 19))
class Equal(Compare):
    def kernel(self, a, b):
        return torch.eq(a, self.legacy_align(a, b))


@register_op("Greater", versions=(1, 7, 9, 13))
class Greater(Compare):
    def kernel(self, a, b):
        return torch.gt(a, self.legacy_align(a, b))


@register_op("Less", versions=(1, 7, 9, 13))
class Less(Compare):
    def kernel(self, a, b):
        return torch.lt(a, self.legacy_align(a, b))


@register_op("GreaterOrEqual", versions=(12, 16))
class GreaterOrEqual(Compare):
    def kernel(self, a, b):
        return torch.ge(a, b)


@register_op("LessOrEqual", versions=(12, 16))
class LessOrEqual(Compare):
    def kernel(self, a, b):
        return torch.le(a, b)


# --- variadic -----------------------------------------------------------------------------------


@register_op("Sum", versions=(6, 8, 13))
class Sum(VariadicOp):
    def kernel(self, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = torch.add(out, x)
        return out.clone() if len(xs) == 1 else out


@register_op("Mean", versions=(6, 8, 13))
class Mean(VariadicOp):
    def kernel(self, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = torch.add(out, x)
        return torch.div(out, len(xs))


@register_op("Max", versions=(6, 8, 12, 13))
class Max(VariadicOp):
    def kernel(self, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = torch.maximum(out, x)
        return out.clone() if len(xs) == 1 else out


@register_op("Min", versions=(6, 8, 12, 13))
class Min(VariadicOp):
    def kernel(self, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = torch.minimum(out, x)
        return out.clone() if len(xs) == 1 else out


@register_op("Where", versions=(9, 16))
class Where(Op):
    """out = condition ? x : y, broadcasting all three."""

    def infer(self, cond, x, y):
        check_dtypes(self, cond, x, y)
        return TensorInfo(x.dtype, broadcast_shapes(self, cond.shape, x.shape, y.shape))

    def kernel(self, cond, x, y):
        return torch.where(cond, x, y)


# --- casts --------------------------------------------------------------------------------------


def _cast_target(op, code: int) -> DataType:
    try:
        dtype = DataType(code)
    except ValueError:
        raise UnsupportedOpError(
            f"{op.debug_name}: cast to ONNX element type {code} (float8/int4 family) is not "
            f"supported by the simulated IPU."
        ) from None
    if dtype in (DataType.STRING, DataType.UNDEFINED):
        raise UnsupportedOpError(f"{op.debug_name}: casts to {dtype.name} are not supported.")
    return dtype


class CastBase(Unary):
    """Float -> int truncates toward zero and anything -> bool tests != 0, as torch's ``to``."""

    def _check_source(self, x: TensorInfo) -> None:
        check_dtypes(self, x, wide_unsigned_ok=True)
        if x.dtype is DataType.STRING:
            raise UnsupportedOpError(f"{self.debug_name}: casts from STRING are not supported.")

    def kernel(self, x, *_):
        return x.to(self._target)


@register_op("Cast", versions=(6, 9, 13, 19, 21))
class Cast(CastBase):
    @dataclass(frozen=True)
    class Attrs:
        to: int

    # saturate only changes float8 results, which this backend does not produce.
    @dataclass(frozen=True)
    class AttrsV19:
        to: int
        saturate: int = 1

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return cls.AttrsV19 if version >= 19 else cls.Attrs

    def infer(self, x):
        self._check_source(x)
        target = _cast_target(self, self.attrs.to)
        self._target = target.torch
        return x.with_dtype(target)


@register_op("CastLike", versions=(15, 19, 21))
class CastLike(CastBase):
    @dataclass(frozen=True)
    class Attrs:
        saturate: int = 1

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return cls.Attrs if version >= 19 else NoSaturateAttrs

    def infer(self, x, like):
        self._check_source(x)
        check_dtypes(self, x, like, wide_unsigned_ok=True)
        target = _cast_target(self, like.dtype.value)
        self._target = target.torch
        return x.with_dtype(target)

    def fold_from_infos(self):
        # Only the dtype of ``like`` matters, so a constant ``x`` folds even when ``like`` is
        # computed (the exporters cast every scalar constant like an activation).
        x = self.inputs[0]
        return [x.data] if x is not None and x.is_const else None


@dataclass(frozen=True)
class NoSaturateAttrs:
    """CastLike-15 has no attributes."""

