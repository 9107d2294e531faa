"""ai.graphcore ops a user can add with ``builder.aiGraphcore`` (spec §6.3), with their gradients.

The losses (IdentityLoss, L1, Nll) live in ``loss.py``, LSTM in ``graphcore_lstm.py``, MultiConv
in ``multiconv.py``, PackedDataBlock in ``packed_data_block.py``, the dynamic slices in
``dynamic_slice.py``, CTC in ``ctc.py`` and ShapedDropout in ``random.py``; the rest of the
builder's ai.graphcore methods resolve here. Semantics follow PopART's op definitions;
where the simulated IPU has to pick a behaviour PopART leaves to the hardware (out-of-range
dynamic offsets, uninitialised ``Init`` memory) the op says which. The builder's
``replicatedallreduce`` resolves to ``collectives.ReplicatedAllReduce``.

PopART enums arrive as ints: ``InitType`` NoInit 0, Zero 1; ``ReductionType`` Sum 0, Mean 1,
NoReduction 2. ``ScatterReduction`` arrives as the lower-case name the builder writes.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np
import torch

from ..dtypes import DataType
from ..errors import ShapeError, popart_runtime_error
from ..ir.op import NoAttrs, Op
from ..ir.tensor import TensorInfo
from .base import ElementwiseBinary, ElementwiseGrad, ElementwiseUnary, normalize_axis
from .registry import AI_GRAPHCORE, AI_ONNX, register_op
from .shape import DepthToSpace as OnnxDepthToSpace

GC = AI_GRAPHCORE
_INT_DTYPES = (DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64, DataType.UINT8)


def _require_float(op: Op, *infos: TensorInfo) -> None:
    for info in infos:
        if not info.dtype.is_float:
            raise ShapeError(f"{op.debug_name}: input {info} must be floating point.")


def _output_or_none(op: Op, index: int) -> str | None:
    """Id of output ``index`` when the node has it."""
    if index < len(op.outputs) and op.outputs[index] is not None:
        return op.outputs[index].id
    return None


# --- elementwise ------------------------------------------------------------------------------


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
    def kernel(self, a, b):
        return torch.bitwise_and(a, b)


@register_op("BitwiseOr", versions=1, domain=GC)
class BitwiseOr(_Bitwise):
    def kernel(self, a, b):
        return torch.bitwise_or(a, b)


@register_op("BitwiseXor", versions=1, domain=GC)
class BitwiseXor(_Bitwise):
    def kernel(self, a, b):
        return torch.bitwise_xor(a, b)


@register_op("BitwiseXnor", versions=1, domain=GC)
class BitwiseXnor(_Bitwise):
    def kernel(self, a, b):
        return torch.bitwise_not(torch.bitwise_xor(a, b))


@register_op("BitwiseNot", versions=1, domain=GC)
class BitwiseNot(ElementwiseUnary):
    def infer(self, x):
        if x.dtype not in _INT_DTYPES:
            raise ShapeError(f"{self.debug_name}: input {x} must be an integer tensor.")
        return x

    def kernel(self, x):
        return torch.bitwise_not(x)


@register_op("Expm1", versions=1, domain=GC)
class Expm1(_GcUnary):
    """exp(x) - 1, exact near 0."""

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

    def kernel(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")

    def grad(self, g):
        self.fused_grad(g, "GeluGrad", approximate="tanh")


@register_op("Swish", versions=1, domain=GC)
class Swish(_GcUnary):
    """x · sigmoid(x)."""

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

    quotient = "Trunc"

    def kernel(self, a, b):
        return torch.fmod(a, b)


@register_op("Remainder", versions=1, domain=GC)
class Remainder(_Modulo):
    """Python's %: the remainder takes the sign of the divisor."""

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

    @dataclass(frozen=True)
    class Attrs:
        scale: float

    def kernel(self, x):
        out = x * self.attrs.scale
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def grad(self, g):
        g.set_input_grad(0, g.op("Scale", g.output_grad(0), domain=GC, scale=self.attrs.scale))


@register_op("ScaledAdd", versions=1, domain=GC)
class ScaledAdd(Op):
    """scale0 · x0 + scale1 · x1; optional scalar inputs 2 and 3 replace the attributes."""

    @dataclass(frozen=True)
    class Attrs:
        scale0: float = 1.0
        scale1: float = 1.0

    def infer(self, x0, x1, scale0=None, scale1=None):
        from .base import broadcast_shapes

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


# --- identities with a purpose ----------------------------------------------------------------


class _Passthrough(Op):
    aliases_inputs = True  # returns its input

    def infer(self, x):
        return x

    def kernel(self, x):
        return x


@register_op("Detach", versions=1, domain=GC)
class Detach(_Passthrough):
    """Identity whose output carries no gradient back to its input."""

    def grad(self, g):
        """Stops the gradient: nothing flows back."""


@register_op("Nop", versions=1, domain=GC)
class Nop(_Passthrough):
    """Identity that graph optimisations must keep (PopART uses it to pin the schedule)."""

    foldable = False

    def grad(self, g):
        g.set_input_grad(0, g.op("Nop", g.output_grad(0), domain=GC))


# ReplicatedAllReduce is a cross-replica collective: ops/collectives.py.


@register_op("PrintTensor", versions=1, domain=GC)
class PrintTensor(_Passthrough):
    """Identity that prints ``<title>: <values>`` to stdout each time it runs (the title defaults
    to the input's id); with print_gradient=1 its gradient is printed too, titled
    ``Gradient___<title>``."""

    foldable = False

    @dataclass(frozen=True)
    class Attrs:
        print_gradient: int = 1
        title: str = ""

    def kernel(self, x):
        title = self.attrs.title or self.inputs[0].id
        sys.stdout.write(f"{title}: {x.tolist()}\n")
        sys.stdout.flush()
        return x

    def grad(self, g):
        if not self.attrs.print_gradient:
            g.set_input_grad(0, g.output_grad(0))
            return
        title = "Gradient___" + (self.attrs.title or g.input(0))
        g.set_input_grad(0, g.op("PrintTensor", g.output_grad(0), domain=GC, print_gradient=0,
                                 title=title))


@register_op("Abort", versions=1, domain=GC)
class Abort(Op):
    """Stops the run with popart_runtime_error when executed: always without an input, only when
    the input (a scalar condition) is non-zero with one."""

    foldable = False

    def infer(self, condition=None):
        if condition is not None and condition.nelms != 1:
            raise ShapeError(f"{self.debug_name}: the condition {condition} must be one value.")
        return []

    def kernel(self, condition=None):
        if condition is None or bool(condition.reshape(()).item()):
            raise popart_runtime_error(
                f"{self.debug_name}: abort executed"
                + ("" if condition is None else f" (condition '{self.inputs[0].id}' is true)")
                + ". The model asked to stop the run here."
            )
        return ()


@register_op("CopyVarUpdate", versions=1, domain=GC)
class CopyVarUpdate(Op):
    """var := updater, in place; the output aliases ``var`` (PopART's variable copy)."""

    foldable = False
    modifies_inputs = (0,)

    def infer(self, var, updater):
        if var != updater:
            raise ShapeError(f"{self.debug_name}: var {var} and updater {updater} must match.")
        return var

    def kernel(self, var, updater):
        return var.copy_(updater)


@register_op("Init", versions=1, domain=GC)
class Init(Op):
    """A new tensor of ``shape`` and ``data_type``: zeros for InitType Zero (1). NoInit (0) means
    "contents undefined" on hardware; the simulator gives zeros so runs stay reproducible."""

    foldable = False  # a fresh buffer per run: in-place updates must not touch a constant

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...]
        data_type: int
        init_type: int
        batch_axis: int = -1

    def infer(self):
        if self.attrs.init_type not in (0, 1):
            raise ShapeError(
                f"{self.debug_name}: init_type {self.attrs.init_type} is not an InitType "
                f"(0 NoInit, 1 Zero)."
            )
        if any(d < 0 for d in self.attrs.shape):
            raise ShapeError(f"{self.debug_name}: shape {list(self.attrs.shape)} is negative.")
        self._info = TensorInfo(DataType.from_onnx(self.attrs.data_type), tuple(self.attrs.shape))
        return self._info

    def kernel(self):
        return torch.zeros(self._info.shape, dtype=self._info.dtype.torch)


# --- shape ------------------------------------------------------------------------------------


@register_op("Reshape", versions=1, domain=GC)
class Reshape(Op):
    """Reshape to the ``shape`` attribute (one dimension may be -1)."""

    aliases_inputs = True  # a view of the input

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...]

    def infer(self, x):
        shape = list(self.attrs.shape)
        if shape.count(-1) > 1 or any(d < -1 for d in shape):
            raise ShapeError(f"{self.debug_name}: shape {shape} may hold one -1 and no other <0.")
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            if known == 0 or x.nelms % known:
                raise ShapeError(f"{self.debug_name}: cannot reshape {x} to {shape}.")
            shape[shape.index(-1)] = x.nelms // known
        if math.prod(shape) != x.nelms:
            raise ShapeError(f"{self.debug_name}: cannot reshape {x} ({x.nelms} elements) to "
                             f"{shape}.")
        self._shape = tuple(shape)
        return x.with_shape(self._shape)

    def kernel(self, x):
        return x.reshape(self._shape)

    def grad(self, g):
        g.set_input_grad(0, g.op("Reshape", g.output_grad(0), domain=GC,
                                 shape=g.input_info(0).shape))


@register_op("Reverse", versions=1, domain=GC)
class Reverse(Op):
    """Reverse the order of elements along each of ``dimensions``."""

    @dataclass(frozen=True)
    class Attrs:
        dimensions: tuple[int, ...]

    def infer(self, x):
        dims = [normalize_axis(self, d, x.rank) for d in self.attrs.dimensions]
        if len(set(dims)) != len(dims):
            raise ShapeError(f"{self.debug_name}: dimensions {list(self.attrs.dimensions)} repeat.")
        self._dims = tuple(dims)
        return x

    def kernel(self, x):
        return torch.flip(x, self._dims) if self._dims else x

    def grad(self, g):
        g.set_input_grad(0, g.op("Reverse", g.output_grad(0), domain=GC,
                                 dimensions=self.attrs.dimensions))


@register_op("Subsample", versions=1, domain=GC)
class Subsample(Op):
    """Every strides[i]-th element along each axis i, starting at 0."""

    @dataclass(frozen=True)
    class Attrs:
        strides: tuple[int, ...]

    def infer(self, x):
        strides = self.attrs.strides
        if len(strides) != x.rank or any(s < 1 for s in strides):
            raise ShapeError(f"{self.debug_name}: strides {list(strides)} must be one positive "
                             f"stride per axis of {x}.")
        self._index = tuple(slice(None, None, s) for s in strides)
        return x.with_shape(tuple(-(-d // s) for d, s in zip(x.shape, strides)))

    def kernel(self, x):
        return x[self._index].contiguous()

    def grad(self, g):
        g.set_input_grad(0, g.op("SubsampleGrad", g.output_grad(0), g.input(0), domain=GC,
                                 strides=self.attrs.strides))


@register_op("SubsampleGrad", versions=1, domain=GC)
class SubsampleGrad(Op):
    """dx: zeros with dy at the sampled positions. Inputs (dy, x) (x for its shape)."""

    Attrs = Subsample.Attrs

    def infer(self, dy, x):
        self._index = tuple(slice(None, None, s) for s in self.attrs.strides)
        return x

    def kernel(self, dy, x):
        out = torch.zeros_like(x)
        out[self._index] = dy
        return out


@register_op("DepthToSpace", versions=1, domain=GC)
class DepthToSpace(OnnxDepthToSpace):
    """The builder's ai.graphcore spelling of ai.onnx DepthToSpace (blocksize, mode)."""

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs


# --- reductions and scatter -------------------------------------------------------------------


@register_op("ReduceMedian", versions=1, domain=GC)
class ReduceMedian(Op):
    """Median over ``axes`` (all when unset) and, as output 1, its index (INT32) into the
    flattened reduced axes. For an even count it is the lower of the two middle values."""

    @dataclass(frozen=True)
    class Attrs:
        axes: tuple[int, ...] | None = None
        keepdims: int = 1

    def infer(self, x):
        axes = range(x.rank) if self.attrs.axes is None else self.attrs.axes
        axes = sorted({normalize_axis(self, a, x.rank) for a in axes})
        kept = [a for a in range(x.rank) if a not in axes]
        self._perm = tuple(kept + axes)
        self._flat = tuple(x.shape[a] for a in kept) + (-1,)
        if math.prod(x.shape[a] for a in axes) == 0:
            raise ShapeError(f"{self.debug_name}: cannot take the median of empty axes of {x}.")
        shape = (tuple(1 if a in axes else d for a, d in enumerate(x.shape))
                 if self.attrs.keepdims else tuple(x.shape[a] for a in kept))
        self._out_shape = shape
        return [x.with_shape(shape), TensorInfo(DataType.INT32, shape)]

    def kernel(self, x):
        values, indices = x.permute(self._perm).reshape(self._flat).median(dim=-1)
        return values.reshape(self._out_shape), indices.to(torch.int32).reshape(self._out_shape)

    def grad(self, g):
        indices = _output_or_none(self, 1)
        if indices is None:  # the node left out its indices output: compute them again
            indices = g.op("ReduceMedian", g.input(0), domain=GC, num_outputs=2,
                           axes=self.attrs.axes, keepdims=self.attrs.keepdims)[1]
        g.set_input_grad(0, g.op("ReduceMedianGrad", g.output_grad(0), indices, g.input(0),
                                 domain=GC, axes=self.attrs.axes, keepdims=self.attrs.keepdims))


@register_op("ReduceMedianGrad", versions=1, domain=GC)
class ReduceMedianGrad(ReduceMedian):
    """dx: dy at each median's position, zero elsewhere. Inputs (dy, indices, x)."""

    def infer(self, dy, indices, x):
        super().infer(x)
        self._permuted = tuple(x.shape[a] for a in self._perm)
        self._inverse = tuple(int(a) for a in np.argsort(self._perm))
        return x

    def kernel(self, dy, indices, x):
        rows = self._flat[:-1]
        out = torch.zeros(rows + (math.prod(self._permuted[len(rows):]),), dtype=dy.dtype)
        out.scatter_(-1, indices.reshape(rows + (1,)).long(), dy.reshape(rows + (1,)))
        return out.reshape(self._permuted).permute(self._inverse).contiguous()

    grad = Op.grad


_SCATTER_REDUCE = {"sum": "sum", "max": "amax", "min": "amin", "none": None}


@register_op("ScatterReduce", versions=1, domain=GC)
class ScatterReduce(Op):
    """out[..., index[..., i, ...], ...] ⊕= src[..., i, ...] along ``axis``, ⊕ = sum, max, min or
    plain assignment ("none"). ``out`` has src's shape with ``axis`` resized to ``axis_size``;
    positions no source element reaches are 0. ``index`` is src-shaped or 1-D along ``axis``."""

    @dataclass(frozen=True)
    class Attrs:
        axis_size: int
        axis: int = -1
        reduction: str = "sum"

    def infer(self, src, index):
        if self.attrs.reduction not in _SCATTER_REDUCE:
            raise ShapeError(f"{self.debug_name}: reduction '{self.attrs.reduction}' must be one "
                             f"of {list(_SCATTER_REDUCE)}.")
        axis = normalize_axis(self, self.attrs.axis, src.rank)
        if index.dtype not in _INT_DTYPES:
            raise ShapeError(f"{self.debug_name}: index {index} must be integer.")
        if index.shape == (src.shape[axis],) and src.rank > 1:
            self._index_view = tuple(-1 if a == axis else 1 for a in range(src.rank))
        elif index.shape == src.shape:
            self._index_view = None
        else:
            raise ShapeError(f"{self.debug_name}: index {index} must have src's shape "
                             f"{list(src.shape)} or be 1-D of length {src.shape[axis]}.")
        if self.attrs.axis_size < 1:
            raise ShapeError(f"{self.debug_name}: axis_size {self.attrs.axis_size} must be >= 1.")
        self._axis = axis
        self._src_shape = src.shape
        shape = list(src.shape)
        shape[axis] = self.attrs.axis_size
        self._out = TensorInfo(src.dtype, tuple(shape))
        return self._out

    def full_index(self, index):
        index = index.long()
        if self._index_view is not None:
            index = index.reshape(self._index_view).expand(self._src_shape)
        return index

    def kernel(self, src, index):
        out = torch.zeros(self._out.shape, dtype=src.dtype)
        index = self.full_index(index)
        reduce = _SCATTER_REDUCE[self.attrs.reduction]
        if reduce is None:
            return out.scatter_(self._axis, index, src)
        return out.scatter_reduce_(self._axis, index, src, reduce, include_self=False)

    def grad(self, g):
        g.set_input_grad(0, g.op("ScatterReduceGrad", g.output_grad(0), g.input(0), g.input(1),
                                 g.output(0), domain=GC, axis_size=self.attrs.axis_size,
                                 axis=self.attrs.axis, reduction=self.attrs.reduction))


@register_op("ScatterReduceGrad", versions=1, domain=GC)
class ScatterReduceGrad(ScatterReduce):
    """dsrc = dy gathered at index; for max/min/none only the elements whose value reached the
    output (ties all receive it). Inputs (dy, src, index, out)."""

    def infer(self, dy, src, index, out):
        super().infer(src, index)
        return src

    def kernel(self, dy, src, index, out):
        index = self.full_index(index)
        grad = dy.gather(self._axis, index)
        if self.attrs.reduction != "sum":
            grad = grad * (out.gather(self._axis, index) == src)
        return grad

    grad = Op.grad


# --- normalisation ----------------------------------------------------------------------------


@register_op("GroupNormalization", versions=1, domain=GC)
class GroupNormalization(Op):
    """PopART's group norm: X [N, C, ...], scale and bias per channel [C]; outputs Y, Mean and
    InvStdDev, the last two [N·num_groups]."""

    @dataclass(frozen=True)
    class Attrs:
        num_groups: int
        epsilon: float = 1e-5

    def infer(self, x, scale, bias):
        groups = self.attrs.num_groups
        if x.rank < 2 or groups < 1 or x.shape[1] % groups:
            raise ShapeError(f"{self.debug_name}: X {x} must be [N, C, ...] with C divisible by "
                             f"num_groups={groups}.")
        n, c = x.shape[:2]
        for name, info in (("scale", scale), ("bias", bias)):
            if info.shape != (c,):
                raise ShapeError(f"{self.debug_name}: {name} {info} must be [{c}] (per channel).")
        _require_float(self, x)
        self._dims = (n, c, math.prod(x.shape[2:]))
        stats = TensorInfo(x.dtype, (n * groups,))
        return [x, stats, stats]

    def kernel(self, x, scale, bias):
        n, c, hw = self._dims
        y, mean, rstd = torch.ops.aten.native_group_norm(
            x.contiguous(), scale, bias, n, c, hw, self.attrs.num_groups, self.attrs.epsilon)
        return y, mean.reshape(-1), rstd.reshape(-1)

    def grad(self, g):
        wrt = tuple(i for i in (0, 1, 2) if g.needs_input_grad(i))
        if not wrt:
            return
        grads = g.op("GroupNormalizationGrad", g.output_grad(0), g.input(0), g.input(1),
                     g.input(2), num_outputs=len(wrt), wrt=wrt, domain=GC,
                     num_groups=self.attrs.num_groups, epsilon=self.attrs.epsilon)
        for i, grad in zip(wrt, grads if isinstance(grads, list) else [grads]):
            g.set_input_grad(i, grad)
