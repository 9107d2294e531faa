"""Elementwise arithmetic: broadcasting Add, Sub, Mul, Div, Pow, Mod; variadic Sum, Mean, Max,
Min; Where; with their gradients. Sibling modules hold the other elementwise families: ``unary``
(math), ``activations``, ``logic`` (comparisons, logic, bitwise) and ``cast``.

Versions: each op registers every ONNX since-version from the first one PopART 2.3 lists or, where
that is later, from the version in force at opset 6 (the oldest opset the
importer accepts); ops PopART lacks start at their first ONNX version. Since-versions that only
widened the type list share one class. Inputs are checked against the ONNX type constraints of
the resolved version (``base.check_dtypes``), so every kernel sees the dtypes its version allows.

Integer results follow onnxruntime: Div truncates toward zero, and integer ops that go through
a float formula (Pow with an integer base, Shrink, Erf) truncate the float result.

Gradients are computed at the output's (broadcast) shape and summed back to each input's shape
(``unbroadcast``). Ties of Max/Min split the gradient evenly between the tied inputs, which is
what torch.maximum does for two inputs and torch.amax over the stacked inputs does for more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import UnsupportedOpError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import Binary, UInt64, VariadicOp, broadcast_shapes, check_dtypes
from .registry import AI_GRAPHCORE, register_op

# --- binary arithmetic --------------------------------------------------------------------------


@register_op("Add", versions=(6, 7, 13, 14))
class Add(Binary):
    uint64 = UInt64.BITS
    strided_inputs = True  # any layout in, torch's propagation out (device/layout.py)

    def kernel(self, a, b):
        return torch.add(a, self.legacy_align(a, b))

    writes_into = True

    def kernel_into(self, out, a, b):
        return torch.add(a, self.legacy_align(a, b), out=out)

    def grad(self, g):
        dy = g.output_grad(0)
        self.unbroadcast(g, dy, 0)
        self.unbroadcast(g, dy, 1)


@register_op("Sub", versions=(6, 7, 13, 14))
class Sub(Binary):
    uint64 = UInt64.BITS

    def kernel(self, a, b):
        return torch.sub(a, self.legacy_align(a, b))

    writes_into = True

    def kernel_into(self, out, a, b):
        return torch.sub(a, self.legacy_align(a, b), out=out)

    def grad(self, g):
        dy = g.output_grad(0)
        self.unbroadcast(g, dy, 0)
        if g.needs_input_grad(1):
            self.unbroadcast(g, g.op("Neg", dy), 1)


@register_op("Mul", versions=(6, 7, 13, 14))
class Mul(Binary):
    uint64 = UInt64.BITS

    def kernel(self, a, b):
        return torch.mul(a, self.legacy_align(a, b))

    writes_into = True

    def kernel_into(self, out, a, b):
        return torch.mul(a, self.legacy_align(a, b), out=out)

    def grad(self, g):
        dy = g.output_grad(0)
        if g.needs_input_grad(0):
            self.unbroadcast(g, g.op("Mul", dy, self.aligned_input(g, 1)), 0)
        if g.needs_input_grad(1):
            self.unbroadcast(g, g.op("Mul", dy, g.input(0)), 1)


@register_op("Div", versions=(6, 7, 13, 14))
class Div(Binary):
    """Integer division truncates toward zero, as onnxruntime does (C++ ``/``)."""

    uint64 = UInt64.QUOTIENT

    def infer(self, a, b):
        info = super().infer(a, b)
        self._rounding = "trunc" if a.dtype.is_int else None
        return info

    def kernel(self, a, b):
        return torch.div(a, self.legacy_align(a, b), rounding_mode=self._rounding)

    writes_into = True

    def kernel_into(self, out, a, b):
        return torch.div(a, self.legacy_align(a, b), rounding_mode=self._rounding, out=out)

    def grad(self, g):
        dy, b = g.output_grad(0), self.aligned_input(g, 1)
        if g.needs_input_grad(0):
            self.unbroadcast(g, g.op("Div", dy, b), 0)
        if g.needs_input_grad(1):
            db = g.op("DivArg1Grad", dy, g.output(0), b, domain=AI_GRAPHCORE)
            self.unbroadcast(g, db, 1)


@register_op("DivArg1Grad", versions=1, domain=AI_GRAPHCORE)
class DivArg1Grad(Op):
    """d(a / b)/db * dy = -dy * y / b, at the output's shape."""

    def infer(self, dy, y, b):
        return dy

    def kernel(self, dy, y, b):
        return -dy * y / b


@register_op("Pow", versions=(1, 7, 12, 13, 15))
class Pow(Binary):
    """Base and exponent may differ in dtype (opset 12+); the result has the base's dtype.

    An integer base goes through float64 and truncates, which is what onnxruntime's
    ``std::pow`` does (so 2 ** -1 == 0).
    """

    uint64 = UInt64.AS_FLOAT  # only the exponent can be unsigned

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

    def grad(self, g):
        dy, a, b = g.output_grad(0), g.input(0), self.aligned_input(g, 1)
        if g.needs_input_grad(0):
            self.unbroadcast(g, g.op("PowArg0Grad", dy, a, b, domain=AI_GRAPHCORE), 0)
        if g.needs_input_grad(1):
            db = g.op("PowArg1Grad", dy, a, b, g.output(0), domain=AI_GRAPHCORE)
            self.unbroadcast(g, db, 1)


@register_op("PowArg0Grad", versions=1, domain=AI_GRAPHCORE)
class PowArg0Grad(Op):
    """dy * b * a^(b-1), and 0 where b == 0 (torch's convention, so 0^0 has no NaN)."""

    def infer(self, dy, a, b):
        return dy

    def kernel(self, dy, a, b):
        grad = torch.where(b == 0, 0, dy * b * torch.pow(a, b - 1))
        return grad.to(dy.dtype)


@register_op("PowArg1Grad", versions=1, domain=AI_GRAPHCORE)
class PowArg1Grad(Op):
    """dy * y * log(a) in the exponent's dtype, and 0 where a == 0 and b >= 0 (as torch)."""

    def infer(self, dy, a, b, y):
        return dy.with_dtype(b.dtype)

    def kernel(self, dy, a, b, y):
        grad = torch.where((a == 0) & (b >= 0), 0, dy * y * torch.log(a))
        return grad.to(b.dtype)


@register_op("Mod", versions=(10, 13, 28))
class Mod(Binary):
    """fmod=0: a - floor(a / b) * b, the divisor's sign (integers; floats too from version 28);
    fmod=1: a - trunc(a / b) * b, the dividend's sign."""

    uint64 = UInt64.REMAINDER

    @dataclass(frozen=True)
    class Attrs:
        fmod: int = 0

    def infer(self, a, b):
        info = super().infer(a, b)
        if not self.attrs.fmod and a.dtype.is_float and self.version < 28:
            raise UnsupportedOpError(
                f"{self.debug_name}: fmod=0 on {a.dtype.name.lower()} inputs; ONNX before "
                f"opset 28 requires fmod=1 for floating-point Mod (import the model at opset "
                f"28 or set fmod=1)."
            )
        self.floored_float = not self.attrs.fmod and a.dtype.is_float
        return info

    def kernel(self, a, b):
        if self.attrs.fmod:
            return torch.fmod(a, b)
        if not self.floored_float:
            return torch.remainder(a, b)
        result = torch.remainder(a, b)
        # Mod-28's special cases: a finite non-zero a over an infinite b is a when the signs
        # agree and b otherwise; a zero a keeps b's sign; inf a or zero b give NaN (already).
        finite_a = torch.isfinite(a) & (a != 0)
        same_sign = torch.signbit(a) == torch.signbit(b)
        result = torch.where(torch.isinf(b) & finite_a, torch.where(same_sign, a, b), result)
        zero = torch.copysign(torch.zeros_like(result), b)
        return torch.where((a == 0) & (b != 0) & ~torch.isnan(b), zero, result)

    def grad(self, g):
        # d/da = 1; d/db = -floor(a / b) (fmod=0) or -trunc(a / b) (fmod=1).
        dy = g.output_grad(0)
        self.unbroadcast(g, dy, 0)
        if g.needs_input_grad(1):
            db = g.op("ModArg1Grad", dy, g.input(0), g.input(1), domain=AI_GRAPHCORE,
                      floor=int(self.floored_float))
            self.unbroadcast(g, db, 1)


@register_op("ModArg1Grad", versions=1, domain=AI_GRAPHCORE)
class ModArg1Grad(Op):
    """d mod(a, b)/db * dy = -dy * round(a / b), at the output's shape; the rounding is floor
    for Mod's fmod=0 and trunc for fmod=1."""

    @dataclass(frozen=True)
    class Attrs:
        floor: int = 0

    def infer(self, dy, a, b):
        return dy

    def kernel(self, dy, a, b):
        return -dy * torch.div(a, b, rounding_mode="floor" if self.attrs.floor else "trunc")


# --- variadic -----------------------------------------------------------------------------------


@register_op("Sum", versions=(6, 8, 13))
class Sum(VariadicOp):
    uint64 = UInt64.BITS
    strided_inputs = True  # any layout in, torch's propagation out (device/layout.py)

    def infer(self, *xs):
        info = super().infer(*xs)
        self._out_shape = torch.Size(info.shape)
        return info

    def kernel(self, *xs):
        if len(xs) == 1:
            return xs[0].clone()
        out = torch.add(xs[0], xs[1])
        for x in xs[2:]:
            # Accumulate into the fresh result when broadcasting does not grow it.
            out = out.add_(x) if out.shape == self._out_shape else torch.add(out, x)
        return out

    writes_into = True

    def kernel_into(self, out, *xs):
        # A gradient sum (autodiff's, e.g. at a residual fork) into its arena buffer; the
        # same additions in the same order as ``kernel``.
        if len(xs) < 2 or xs[0].shape != self._out_shape or xs[1].shape != self._out_shape:
            return self.kernel(*xs)
        torch.add(xs[0], xs[1], out=out)
        for x in xs[2:]:
            out.add_(x)
        return out

    def grad(self, g):
        dy = g.output_grad(0)
        self.unbroadcast(g, [dy] * len(self.inputs))


@register_op("Mean", versions=(6, 8, 13))
class Mean(VariadicOp):
    def kernel(self, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = torch.add(out, x)
        return torch.div(out, len(xs))

    def grad(self, g):
        scaled = g.op("MeanArgGrad", g.output_grad(0), domain=AI_GRAPHCORE,
                      scale=1.0 / len(self.inputs))
        self.unbroadcast(g, [scaled] * len(self.inputs))


@register_op("MeanArgGrad", versions=1, domain=AI_GRAPHCORE)
class MeanArgGrad(Op):
    """dy * scale, the share of each of Mean's inputs before un-broadcasting."""

    @dataclass(frozen=True)
    class Attrs:
        scale: float

    def infer(self, dy):
        return dy

    def kernel(self, dy):
        return dy * self.attrs.scale


class Extremum(VariadicOp):
    """Max and Min: the gradient goes to the input(s) equal to the output, split among ties."""

    grad_type: ClassVar[str]
    uint64 = UInt64.ORDER

    def grad(self, g):
        inputs = [g.input(i) for i in range(len(self.inputs))]
        grads = g.op(self.grad_type, g.output_grad(0), g.output(0), *inputs,
                     domain=AI_GRAPHCORE, num_outputs=len(inputs))
        self.unbroadcast(g, grads if isinstance(grads, list) else [grads])


@register_op("Max", versions=(6, 8, 12, 13))
class Max(Extremum):
    grad_type = "MaxGrad"

    def kernel(self, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = torch.maximum(out, x)
        return out.clone() if len(xs) == 1 else out


@register_op("MaxGrad", versions=1, domain=AI_GRAPHCORE)
class MaxGrad(Op):
    """One output per input x_i: dy * (x_i == y) / (number of inputs equal to y)."""

    def infer(self, dy, y, *xs):
        return [dy] * len(xs)

    def kernel(self, dy, y, *xs):
        selected = [x == y for x in xs]
        ties = selected[0].to(dy.dtype)
        for mask in selected[1:]:
            ties = ties + mask
        share = dy / ties
        grads = tuple(torch.where(mask, share, 0) for mask in selected)
        return grads if len(grads) > 1 else grads[0]


@register_op("Min", versions=(6, 8, 12, 13))
class Min(Extremum):
    grad_type = "MinGrad"

    def kernel(self, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = torch.minimum(out, x)
        return out.clone() if len(xs) == 1 else out


@register_op("MinGrad", versions=1, domain=AI_GRAPHCORE)
class MinGrad(MaxGrad):
    """Same rule as MaxGrad: the selected inputs are those equal to the output."""


# --- Where --------------------------------------------------------------------------------------


@register_op("Where", versions=(9, 16))
class Where(Op):
    """out = condition ? x : y, broadcasting all three."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)
    uint64 = UInt64.BITS

    def infer(self, cond, x, y):
        check_dtypes(self, cond, x, y)
        return TensorInfo(x.dtype, broadcast_shapes(self, cond.shape, x.shape, y.shape))

    def kernel(self, cond, x, y):
        return torch.where(cond, x, y)

    def grad(self, g):
        dy, cond = g.output_grad(0), g.input(0)
        for index, grad_type in ((1, "WhereXGrad"), (2, "WhereYGrad")):
            if g.needs_input_grad(index):
                grad = g.op(grad_type, dy, cond, domain=AI_GRAPHCORE)
                g.set_input_grad(index, g.reduce_to_shape(grad, g.input_info(index).shape))


@register_op("WhereXGrad", versions=1, domain=AI_GRAPHCORE)
class WhereXGrad(Op):
    """dy where the condition picked x, else 0 (at the output's shape)."""

    def infer(self, dy, cond):
        return dy

    def kernel(self, dy, cond):
        return torch.where(cond, dy, 0)


@register_op("WhereYGrad", versions=1, domain=AI_GRAPHCORE)
class WhereYGrad(Op):
    """dy where the condition picked y, else 0 (at the output's shape)."""

    def infer(self, dy, cond):
        return dy

    def kernel(self, dy, cond):
        return torch.where(cond, 0, dy)

