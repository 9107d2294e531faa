"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare and ArgMax/ArgMin.

The ``Reduce`` base owns the shape rule once: axes come from the ``axes`` attribute up to the
version where ONNX moved them to a second, constant input (ReduceSum at 13, the others at 18);
absent or empty axes reduce every axis, unless ``noop_with_empty_axes`` asks to reduce none.
Reducing no axis still applies the op's elementwise part (ReduceL1 gives |x|, ReduceSumSquare
x², ReduceLogSum log x), as the ONNX reference and onnxruntime do. Versions start at the first
one PopART 2.3 lists.

Integer inputs keep their dtype (torch would widen sums to int64). Where ONNX's formula leaves
the integers (Mean, L2, LogSum, LogSumExp) each step truncates toward zero, as onnxruntime
computes them in the input type.

Gradients: each reduction has one fused ai.graphcore ``<Op>Grad`` kernel (``ReduceGrad`` base)
that broadcasts dy back over the reduced axes and applies the derivative. ReduceMax/ReduceMin
split the gradient evenly between tied extremes (as torch.amax/amin); ReduceProd uses products
of the other elements, so zeros in the input are handled exactly; ReduceL2 gives 0 where the
norm is 0 (as torch). ArgMax/ArgMin have integer outputs and no gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import UInt64, check_dtypes
from .registry import AI_GRAPHCORE, register_op


class Reduce(Op):
    """y = reduce(x) over ``self.dims``; subclasses implement ``reduce(x)``."""

    # First version taking the axes as input 1 instead of an attribute.
    axes_input_since: ClassVar[int] = 18
    const_inputs = (1,)

    @dataclass(frozen=True)
    class Attrs:
        axes: tuple[int, ...] | None = None
        keepdims: int = 1

    @dataclass(frozen=True)
    class AxesInputAttrs:
        keepdims: int = 1
        noop_with_empty_axes: int = 0

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return cls.AxesInputAttrs if version >= cls.axes_input_since else cls.Attrs

    def infer(self, x, axes=None):
        check_dtypes(self, x, axes)
        if self.version >= self.axes_input_since:
            value = self.const_input(1)
            requested = None if value is None or value.size == 0 else value.reshape(-1).tolist()
            noop = requested is None and bool(self.attrs.noop_with_empty_axes)
        else:
            requested = list(self.attrs.axes) if self.attrs.axes else None
            noop = False
        self.keepdims = bool(self.attrs.keepdims)
        self.is_int = x.dtype.is_int
        # Sums of integers must stay in the input dtype; torch defaults them to int64.
        self.sum_dtype = x.dtype.torch if self.is_int else None
        self.dims = () if noop else self._normalize(requested, x)
        self.reduced_dims = self.dims
        self.count = math.prod(x.shape[d] for d in self.dims)
        if self.keepdims:
            shape = tuple(1 if d in self.dims else n for d, n in enumerate(x.shape))
        else:
            shape = tuple(n for d, n in enumerate(x.shape) if d not in self.dims)
        self.out_shape = shape
        # torch reads an empty dim list as "all axes"; reducing no axis is instead done as
        # reducing a new leading axis of size 1.
        self.lift = not self.dims
        if self.lift:
            self.dims, self.keepdims = (0,), False
        return TensorInfo(x.dtype, shape)

    def _normalize(self, requested: list[int] | None, x: TensorInfo) -> tuple[int, ...]:
        if requested is None:
            return tuple(range(x.rank))
        dims = []
        for axis in requested:
            if not -x.rank <= axis < x.rank:
                raise ShapeError(
                    f"{self.debug_name}: axis {axis} is out of range for input {x} of rank "
                    f"{x.rank}; valid axes are {-x.rank}..{x.rank - 1}."
                )
            dims.append(axis % x.rank)
        if len(set(dims)) != len(dims):
            raise ShapeError(f"{self.debug_name}: axes {requested} name an axis twice.")
        return tuple(sorted(dims))

    def kernel(self, x, axes=None):
        if self.lift:
            x = x.unsqueeze(0)
        return self.reduce(x)

    def reduce(self, x):
        raise NotImplementedError(f"{self.op_type} has no reduce()")

    def _sum(self, x):
        return torch.sum(x, self.dims, keepdim=self.keepdims, dtype=self.sum_dtype)

    def fused_grad(self, g, grad_type: str, *saved: str) -> None:
        """dx = ``grad_type``(dy, *saved), told the reduced axes and the input shape."""
        dx = g.op(grad_type, g.output_grad(0), *saved, domain=AI_GRAPHCORE,
                  axes=self.reduced_dims, shape=g.input_info(0).shape)
        g.set_input_grad(0, dx)


class ReduceGrad(Op):
    """Base of the reduction grad ops: (dy, saved forward tensors...) -> dx of shape ``shape``.

    ``axes`` are the reduced axes (normalized, sorted; empty when the reduction was a no-op).
    """

    aliases_inputs = True  # the gradient broadcast back is an expanded view

    @dataclass(frozen=True)
    class Attrs:
        axes: tuple[int, ...]
        shape: tuple[int, ...]

    def infer(self, dy, *saved):
        axes, shape = self.attrs.axes, self.attrs.shape
        # dy (and the forward output) reshaped so it broadcasts against the input.
        self.kept = tuple(1 if d in axes else n for d, n in enumerate(shape))
        self.count = math.prod(shape[d] for d in axes)
        return TensorInfo(dy.dtype, shape)

    def kept_shape(self, t):
        return t.reshape(self.kept)

    def broadcast(self, t):
        """Output-shaped ``t`` repeated over the reduced axes (a view)."""
        return t.reshape(self.kept).expand(self.attrs.shape)


@register_op("ReduceSum", versions=(1, 11, 13))
class ReduceSum(Reduce):
    uint64 = UInt64.BITS

    axes_input_since = 13

    def reduce(self, x):
        return self._sum(x)

    writes_into = True

    def kernel_into(self, out, x, axes=None):
        if self.lift:
            return self.kernel(x, axes)
        return torch.sum(x, self.dims, keepdim=self.keepdims, dtype=self.sum_dtype, out=out)

    def grad(self, g):
        self.fused_grad(g, "ReduceSumGrad")


@register_op("ReduceSumGrad", versions=1, domain=AI_GRAPHCORE)
class ReduceSumGrad(ReduceGrad):
    def kernel(self, dy):
        return self.broadcast(dy)


@register_op("ReduceMean", versions=(1, 11, 13, 18))
class ReduceMean(Reduce):
    strided_inputs = True  # any layout in (device/layout.py)
    def reduce(self, x):
        if self.is_int:
            total = torch.sum(x, self.dims, keepdim=self.keepdims, dtype=torch.int64)
            return torch.div(total, self.count, rounding_mode="trunc").to(x.dtype)
        return torch.mean(x, self.dims, keepdim=self.keepdims)

    writes_into = True

    def kernel_into(self, out, x, axes=None):
        if self.lift or self.is_int:
            return self.kernel(x, axes)
        return torch.mean(x, self.dims, keepdim=self.keepdims, out=out)

    def scratch_infos(self):
        """float32/64 (device/arena.py): the count as a 0-d tensor, which torch.mean(out=)
        would wrap afresh each call; sum then divide is what mean computes for these."""
        info = self.inputs[0].info
        if self.lift or info.dtype.torch not in (torch.float32, torch.float64):
            return ()
        return (info.with_shape(()),)

    def kernel_scratch(self, out, count, x, axes=None):
        if out is None:
            return self.kernel(x, axes)
        torch.sum(x, self.dims, keepdim=self.keepdims, out=out)
        return out.div_(count.fill_(self.count))

    def grad(self, g):
        self.fused_grad(g, "ReduceMeanGrad")


@register_op("ReduceMeanGrad", versions=1, domain=AI_GRAPHCORE)
class ReduceMeanGrad(ReduceGrad):
    strided_inputs = True
    # The quotient is a fresh tensor (its broadcast a view of it, not of dy).
    aliases_inputs = False

    def kernel(self, dy):
        return self.broadcast(dy / self.count)

    # The static memory plan (device/arena.py): the broadcast quotient written into the
    # output's buffer, the count in a 0-d scratch tensor (dy / count would wrap it afresh).
    writes_into = True

    def kernel_into(self, out, dy):
        return torch.div(self.broadcast(dy), self.count, out=out)

    def scratch_infos(self):
        info = self.inputs[0].info
        if info.dtype.torch not in (torch.float32, torch.float64):
            return ()
        return (info.with_shape(()),)

    def kernel_scratch(self, out, count, dy):
        count.fill_(self.count)
        if out is None:
            return self.broadcast(torch.div(dy, count))
        return torch.div(self.broadcast(dy), count, out=out)


def _empty_extreme(dtype: torch.dtype, shape: tuple[int, ...], lowest: bool) -> torch.Tensor:
    """Max (``lowest``) or min over an empty set: ONNX's identity element, -inf / +inf for
    floats, the type's lowest / highest value for integers, False / True for bool."""
    if dtype == torch.bool:
        value = not lowest
    elif dtype.is_floating_point:
        value = -math.inf if lowest else math.inf
    else:
        info = torch.iinfo(dtype)
        value = info.min if lowest else info.max
    return torch.full(shape, value, dtype=dtype)


@register_op("ReduceMax", versions=(1, 11, 12, 13, 18, 20))
class ReduceMax(Reduce):
    uint64 = UInt64.ORDER

    def reduce(self, x):
        if self.count == 0:
            return _empty_extreme(x.dtype, self.out_shape, lowest=True)
        return torch.amax(x, self.dims, keepdim=self.keepdims)

    def grad(self, g):
        self.fused_grad(g, "ReduceMaxGrad", g.input(0), g.output(0))


@register_op("ReduceMaxGrad", versions=1, domain=AI_GRAPHCORE)
class ReduceMaxGrad(ReduceGrad):
    """dy shared evenly by the elements equal to the extreme (torch.amax's rule)."""

    def kernel(self, dy, x, y):
        selected = x == self.kept_shape(y)
        if not self.attrs.axes:
            return torch.where(selected, self.kept_shape(dy), 0)
        ties = torch.sum(selected, self.attrs.axes, keepdim=True, dtype=dy.dtype)
        return torch.where(selected, self.kept_shape(dy) / ties, 0)


@register_op("ReduceMin", versions=(1, 11, 12, 13, 18, 20))
class ReduceMin(Reduce):
    uint64 = UInt64.ORDER

    def reduce(self, x):
        if self.count == 0:
            return _empty_extreme(x.dtype, self.out_shape, lowest=False)
        return torch.amin(x, self.dims, keepdim=self.keepdims)

    def grad(self, g):
        self.fused_grad(g, "ReduceMinGrad", g.input(0), g.output(0))


@register_op("ReduceMinGrad", versions=1, domain=AI_GRAPHCORE)
class ReduceMinGrad(ReduceMaxGrad):
    """Same rule as ReduceMaxGrad: the selected elements are those equal to the output."""


@register_op("ReduceProd", versions=(1, 11, 13, 18))
class ReduceProd(Reduce):
    uint64 = UInt64.BITS

    def reduce(self, x):
        # torch.prod takes one axis at a time.
        for d in reversed(self.dims):
            x = torch.prod(x, d, keepdim=True, dtype=self.sum_dtype)
        return x if self.keepdims else x.reshape(self.out_shape)

    def grad(self, g):
        self.fused_grad(g, "ReduceProdGrad", g.input(0))


@register_op("ReduceProdGrad", versions=1, domain=AI_GRAPHCORE)
class ReduceProdGrad(ReduceGrad):
    """dy times the product of the other reduced elements.

    Computed as exclusive prefix and suffix products rather than y / x, which is exact when
    the input holds zeros.
    """

    def infer(self, dy, x):
        info = super().infer(dy, x)
        axes = self.attrs.axes
        kept_axes = tuple(d for d in range(len(self.attrs.shape)) if d not in axes)
        # The reduced axes move last and flatten into one.
        self.perm = kept_axes + axes
        self.inverse = tuple(sorted(range(len(self.perm)), key=self.perm.__getitem__))
        return info

    def kernel(self, dy, x):
        if not self.attrs.axes:
            return dy.reshape(self.attrs.shape)
        moved = x.permute(self.perm)
        flat = moved.reshape(*moved.shape[: len(self.perm) - len(self.attrs.axes)], self.count)
        ones = torch.ones((*flat.shape[:-1], 1), dtype=x.dtype)
        before = torch.cumprod(torch.cat([ones, flat[..., :-1]], -1), -1)
        after = torch.cumprod(torch.cat([ones, flat.flip(-1)[..., :-1]], -1), -1).flip(-1)
        others = (before * after).reshape(moved.shape).permute(self.inverse)
        return self.broadcast(dy) * others


@register_op("ReduceL1", versions=(1, 11, 13, 18))
class ReduceL1(Reduce):
    def reduce(self, x):
        return self._sum(torch.abs(x))

    def grad(self, g):
        self.fused_grad(g, "ReduceL1Grad", g.input(0))


@register_op("ReduceL1Grad", versions=1, domain=AI_GRAPHCORE)
class ReduceL1Grad(ReduceGrad):
    # sign(0) = 0: the subgradient torch picks.
    def kernel(self, dy, x):
        return self.broadcast(dy) * torch.sign(x)


@register_op("ReduceL2", versions=(1, 11, 13, 18))
class ReduceL2(Reduce):
    def reduce(self, x):
        if self.is_int:
            return torch.sqrt(self._sum(x * x).double()).to(x.dtype)
        return torch.linalg.vector_norm(x, 2, self.dims, keepdim=self.keepdims)

    def grad(self, g):
        self.fused_grad(g, "ReduceL2Grad", g.input(0), g.output(0))


@register_op("ReduceL2Grad", versions=1, domain=AI_GRAPHCORE)
class ReduceL2Grad(ReduceGrad):
    """dy * x / norm, and 0 where the norm is 0 (as torch)."""

    def kernel(self, dy, x, y):
        y = self.kept_shape(y)
        return x * torch.where(y == 0, 0, self.kept_shape(dy) / y)


@register_op("ReduceLogSum", versions=(1, 11, 13, 18, 28))
class ReduceLogSum(Reduce):
    def reduce(self, x):
        if self.is_int:
            return torch.log(self._sum(x).double()).to(x.dtype)
        return torch.log(self._sum(x))

    def grad(self, g):
        self.fused_grad(g, "ReduceLogSumGrad", g.output(0))


@register_op("ReduceLogSumGrad", versions=1, domain=AI_GRAPHCORE)
class ReduceLogSumGrad(ReduceGrad):
    """dy / sum(x), with sum(x) = exp(y), so x need not stay alive."""

    def kernel(self, dy, y):
        return self.broadcast(dy * torch.exp(-y))


@register_op("ReduceLogSumExp", versions=(1, 11, 13, 18, 28))
class ReduceLogSumExp(Reduce):
    def reduce(self, x):
        if self.is_int:
            # max + log(sum(exp(x - max))) with every step truncated to the integer type.
            top = torch.amax(x, self.dims, keepdim=True)
            terms = torch.exp((x - top).double()).to(x.dtype)
            log_sum = torch.log(self._sum(terms).double()).to(x.dtype)
            return log_sum + (top if self.keepdims else top.reshape(self.out_shape))
        return torch.logsumexp(x, self.dims, keepdim=self.keepdims)

    def grad(self, g):
        self.fused_grad(g, "ReduceLogSumExpGrad", g.input(0), g.output(0))


@register_op("ReduceLogSumExpGrad", versions=1, domain=AI_GRAPHCORE)
class ReduceLogSumExpGrad(ReduceGrad):
    """dy * softmax(x) over the reduced axes: exp(x - y)."""

    def kernel(self, dy, x, y):
        return self.kept_shape(dy) * torch.exp(x - self.kept_shape(y))


@register_op("ReduceSumSquare", versions=(1, 11, 13, 18))
class ReduceSumSquare(Reduce):
    uint64 = UInt64.BITS

    def reduce(self, x):
        return self._sum(x * x)

    def grad(self, g):
        self.fused_grad(g, "ReduceSumSquareGrad", g.input(0))


@register_op("ReduceSumSquareGrad", versions=1, domain=AI_GRAPHCORE)
class ReduceSumSquareGrad(ReduceGrad):
    def kernel(self, dy, x):
        return 2 * x * self.kept_shape(dy)


# --- ArgMax / ArgMin ----------------------------------------------------------------------------


class ArgReduce(Op):
    """INT64 index of the max/min along ``axis``; ties pick the first index unless
    ``select_last_index`` (version 12+)."""

    uint64 = UInt64.ORDER

    find: ClassVar = staticmethod(torch.argmax)

    @dataclass(frozen=True)
    class Attrs:
        axis: int = 0
        keepdims: int = 1

    @dataclass(frozen=True)
    class AttrsV12:
        axis: int = 0
        keepdims: int = 1
        select_last_index: int = 0

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return cls.AttrsV12 if version >= 12 else cls.Attrs

    def infer(self, x):
        check_dtypes(self, x)
        axis = self.attrs.axis
        if not -x.rank <= axis < x.rank:
            raise ShapeError(
                f"{self.debug_name}: axis {axis} is out of range for input {x} of rank {x.rank}."
            )
        self.axis = axis % x.rank
        self.keepdims = bool(self.attrs.keepdims)
        self.last = bool(getattr(self.attrs, "select_last_index", 0))
        self.size = x.shape[self.axis]
        if self.keepdims:
            shape = tuple(1 if d == self.axis else n for d, n in enumerate(x.shape))
        else:
            shape = tuple(n for d, n in enumerate(x.shape) if d != self.axis)
        return TensorInfo(DataType.INT64, shape)

    def kernel(self, x):
        if self.last:
            # torch returns the first extreme; searching the flipped axis finds the last one.
            flipped = self.find(torch.flip(x, (self.axis,)), self.axis, keepdim=self.keepdims)
            return (self.size - 1) - flipped
        return self.find(x, self.axis, keepdim=self.keepdims)


@register_op("ArgMax", versions=(1, 11, 12, 13))
class ArgMax(ArgReduce):
    find = staticmethod(torch.argmax)


@register_op("ArgMin", versions=(1, 11, 12, 13))
class ArgMin(ArgReduce):
    find = staticmethod(torch.argmin)
