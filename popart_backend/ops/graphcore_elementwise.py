"""ai.graphcore elementwise ops: Atan2, the bitwise ops, Expm1, Log1p, Gelu, Swish,
Round, Fmod / Remainder (with the Trunc helper), Scale and ScaledAdd, with their gradients."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ShapeError
from ..ir.op import NoAttrs, Op
from ..ir.signature import FLOAT, REQUIRED, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from .base import ElementwiseBinary, ElementwiseGrad, ElementwiseUnary, broadcast_shapes
from .graphcore_common import _INT_DTYPES, GC, _require_float
from .registry import AI_ONNX, register_op


class _GcUnary(ElementwiseUnary):
    Attrs = NoAttrs

    def infer(self, x):
        _require_float(self, x)
        return x


class _GcBinary(ElementwiseBinary):
    """Broadcasting binary op of ai.graphcore (no legacy ``broadcast`` attribute at version 1)."""

    Attrs = NoAttrs

    @classmethod
    def attrs_type(cls, version: int):
        return cls.Attrs

    def infer(self, a, b):
        if a.dtype != b.dtype:
            raise ShapeError(f"{self.debug_name}: inputs {a} and {b} must share one dtype.")
        return super().infer(a, b)


@register_op("Atan2", versions=1, domain=GC)
class Atan2(_GcBinary):
    """out = atan2(y, x), the angle of the point (x, y); inputs (y, x)."""

    builder_method = BuilderMethod("atan2", 2)

    def infer(self, y, x):
        _require_float(self, y, x)
        return super().infer(y, x)

    def kernel(self, y, x):
        return torch.atan2(y, x)

    def grad(self, g):
        # d/dy = x / (x² + y²), d/dx = -y / (x² + y²)
        y, x, dout = g.input(0), g.input(1), g.output_grad(0)
        denominator = g.op("Add", g.op("Mul", x, x), g.op("Mul", y, y))
        self.unbroadcast(g, g.op("Div", g.op("Mul", dout, x), denominator), 0)
        self.unbroadcast(g, g.op("Neg", g.op("Div", g.op("Mul", dout, y), denominator)), 1)


class _Bitwise(_GcBinary):
    def infer(self, a, b):
        if a.dtype not in _INT_DTYPES:
            raise ShapeError(f"{self.debug_name}: input {a} must be an integer tensor.")
        return super().infer(a, b)


@register_op("BitwiseAnd", versions=1, domain=GC)
class BitwiseAnd(_Bitwise):
    builder_method = BuilderMethod("bitwiseand", 2)
    def kernel(self, a, b):
        return torch.bitwise_and(a, b)


@register_op("BitwiseOr", versions=1, domain=GC)
class BitwiseOr(_Bitwise):
    builder_method = BuilderMethod("bitwiseor", 2)
    def kernel(self, a, b):
        return torch.bitwise_or(a, b)


@register_op("BitwiseXor", versions=1, domain=GC)
class BitwiseXor(_Bitwise):
    builder_method = BuilderMethod("bitwisexor", 2)
    def kernel(self, a, b):
        return torch.bitwise_xor(a, b)


@register_op("BitwiseXnor", versions=1, domain=GC)
class BitwiseXnor(_Bitwise):
    builder_method = BuilderMethod("bitwisexnor", 2)
    def kernel(self, a, b):
        return torch.bitwise_not(torch.bitwise_xor(a, b))


@register_op("BitwiseNot", versions=1, domain=GC)
class BitwiseNot(ElementwiseUnary):
    builder_method = BuilderMethod("bitwisenot", 1)
    def infer(self, x):
        if x.dtype not in _INT_DTYPES:
            raise ShapeError(f"{self.debug_name}: input {x} must be an integer tensor.")
        return x

    def kernel(self, x):
        return torch.bitwise_not(x)


@register_op("Expm1", versions=1, domain=GC)
class Expm1(_GcUnary):
    """exp(x) - 1, exact near 0."""

    builder_method = BuilderMethod("expm1", 1)

    def kernel(self, x):
        return torch.expm1(x)

    def grad(self, g):
        self.fused_grad(g, "Expm1Grad", from_output=True)


@register_op("Expm1Grad", versions=1, domain=GC)
class Expm1Grad(ElementwiseGrad):
    def kernel(self, dy, y):
        return dy * (y + 1)


@register_op("Log1p", versions=1, domain=GC)
class Log1p(_GcUnary):
    """log(1 + x), exact near 0."""

    builder_method = BuilderMethod("log1p", 1)

    def kernel(self, x):
        return torch.log1p(x)

    def grad(self, g):
        self.fused_grad(g, "Log1pGrad")


@register_op("Log1pGrad", versions=1, domain=GC)
class Log1pGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        return dy / (x + 1)


@register_op("Gelu", versions=1, domain=GC)
class Gelu(_GcUnary):
    """PopART's Gelu is poplibs' GELU non-linearity: the tanh approximation
    0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""

    builder_method = BuilderMethod("gelu", 1)

    is_nonlinearity = True

    def kernel(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")

    def grad(self, g):
        self.fused_grad(g, "GeluGrad", approximate="tanh")


@register_op("GeluErf", versions=1, domain=GC)
class GeluErf(_GcUnary):
    """The exact GELU, x·Φ(x) = 0.5·x·(1 + erf(x/√2)), unlike ai.graphcore Gelu's tanh form."""

    builder_method = BuilderMethod("geluerf", 1)
    is_nonlinearity = True

    def kernel(self, x):
        return torch.nn.functional.gelu(x)

    def grad(self, g):
        self.fused_grad(g, "GeluGrad", approximate="none")


@register_op("Swish", versions=1, domain=GC)
class Swish(_GcUnary):
    """x · sigmoid(x)."""

    builder_method = BuilderMethod("swish", 1)

    is_nonlinearity = True

    def kernel(self, x):
        return torch.nn.functional.silu(x)

    def grad(self, g):
        self.fused_grad(g, "SwishGrad")


@register_op("SwishGrad", versions=1, domain=GC)
class SwishGrad(ElementwiseGrad):
    def kernel(self, dy, x):
        s = torch.sigmoid(x)
        return dy * (s + x * s * (1 - s))


@register_op("Round", versions=1, domain=GC)
class Round(_GcUnary):
    """Round to the nearest integer, halves away from zero (poplar's ROUND, C's round()), unlike
    ai.onnx Round, which rounds halves to even."""

    builder_method = BuilderMethod("round", 1)

    def kernel(self, x):
        return torch.where(x >= 0, torch.floor(x + 0.5), torch.ceil(x - 0.5))

    def grad(self, g):
        """Piecewise constant: zero gradient."""


class _Modulo(_GcBinary):
    """Shared gradient: out = a - b·q(a / b), with q = trunc (Fmod) or floor (Remainder)."""

    quotient = ""

    def grad(self, g):
        dout = g.output_grad(0)
        self.unbroadcast(g, dout, 0)
        if g.needs_input_grad(1):
            domain = GC if self.quotient == "Trunc" else AI_ONNX
            ratio = g.op(self.quotient, g.op("Div", g.input(0), g.input(1)), domain=domain)
            self.unbroadcast(g, g.op("Neg", g.op("Mul", dout, ratio)), 1)


@register_op("Fmod", versions=1, domain=GC)
class Fmod(_Modulo):
    """C's fmod: the remainder takes the sign of the dividend."""

    builder_method = BuilderMethod("fmod", 2)

    quotient = "Trunc"

    def kernel(self, a, b):
        return torch.fmod(a, b)


@register_op("Remainder", versions=1, domain=GC)
class Remainder(_Modulo):
    """Python's %: the remainder takes the sign of the divisor."""

    builder_method = BuilderMethod("remainder", 2)

    quotient = "Floor"

    def kernel(self, a, b):
        return torch.remainder(a, b)


@register_op("Trunc", versions=1, domain=GC)
class Trunc(ElementwiseUnary):
    """Round towards zero (helper of Fmod's gradient)."""

    public = False  # created by Fmod's gradient only (supported_ops.is_public)

    def kernel(self, x):
        return torch.trunc(x)


@register_op("Scale", versions=1, domain=GC)
class Scale(ElementwiseUnary):
    """x · scale."""

    builder_method = BuilderMethod("scale", 1, 1, (AttrSpec("scale", FLOAT, REQUIRED),))

    @dataclass(frozen=True)
    class Attrs:
        scale: float

    def kernel(self, x):
        out = x * self.attrs.scale
        return out if out.dtype == x.dtype else out.to(x.dtype)

    # The static memory plan (device/arena.py): float32/64 write into their arena buffer
    # and multiply by a 0-d scratch tensor holding the factor (x * float would wrap it in a
    # fresh one each call; the product is the same, the factor rounded to x's dtype either way).
    writes_into = True

    def kernel_into(self, out, x):
        if x.dtype not in (torch.float32, torch.float64):
            return self.kernel(x)
        return torch.mul(x, self.attrs.scale, out=out)

    def scratch_infos(self):
        info = self.inputs[0].info
        return (info.with_shape(()),) if info.dtype.torch in (torch.float32, torch.float64) else ()

    def kernel_scratch(self, out, factor, x):
        factor.fill_(self.attrs.scale)
        return torch.mul(x, factor) if out is None else torch.mul(x, factor, out=out)

    def grad(self, g):
        g.set_input_grad(0, g.op("Scale", g.output_grad(0), domain=GC, scale=self.attrs.scale))


@register_op("ScaledAdd", versions=1, domain=GC)
class ScaledAdd(Op):
    """scale0 · x0 + scale1 · x1; optional scalar inputs 2 and 3 replace the attributes."""

    builder_method = BuilderMethod(
        "scaledadd", (2, 4), 1, (AttrSpec("scale0", FLOAT, 1.0), AttrSpec("scale1", FLOAT, 1.0))
    )

    @dataclass(frozen=True)
    class Attrs:
        scale0: float = 1.0
        scale1: float = 1.0

    def infer(self, x0, x1, scale0=None, scale1=None):
        for s in (scale0, scale1):
            if s is not None and s.nelms != 1:
                raise ShapeError(f"{self.debug_name}: scale input {s} must hold one value.")
        if x0.dtype != x1.dtype:
            raise ShapeError(f"{self.debug_name}: inputs {x0} and {x1} must share one dtype.")
        return TensorInfo(x0.dtype, broadcast_shapes(self, x0.shape, x1.shape))

    def kernel(self, x0, x1, scale0=None, scale1=None):
        s0 = self.attrs.scale0 if scale0 is None else scale0.reshape(())
        s1 = self.attrs.scale1 if scale1 is None else scale1.reshape(())
        return (x0 * s0 + x1 * s1).to(x0.dtype)

    def grad(self, g):
        dout = g.output_grad(0)
        for i in (0, 1):
            if not g.needs_input_grad(i):
                continue
            if g.has_input(2 + i):
                scaled = g.op("Mul", dout, g.op("Cast", g.input(2 + i),
                                                to=int(g.output_info(0).dtype.onnx)))
            else:
                scaled = g.op("Scale", dout, domain=GC, scale=(self.attrs.scale0,
                                                                  self.attrs.scale1)[i])
            g.set_input_grad(i, g.reduce_to_shape(scaled, g.input_info(i).shape))
        for i in (2, 3):
            if g.has_input(i) and g.needs_input_grad(i):
                product = g.op("Mul", dout, g.input(i - 2))
                total = g.op("ReduceSum", product, keepdims=0)
                total = g.op("Cast", total, to=int(g.input_info(i).dtype.onnx))
                g.set_input_grad(i, g.reduce_to_shape(total, g.input_info(i).shape))
