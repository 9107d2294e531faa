"""ai.graphcore reductions and scatter: ReduceMedian and ScatterReduce, each with its
gradient op. ``ScatterReduction`` arrives as the lower-case name the builder writes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.signature import INT, INTS, REQUIRED, STRING, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from .base import normalize_axis
from .graphcore_common import _INT_DTYPES, GC, _output_or_none, scatter_reduction
from .registry import register_op


@register_op("ReduceMedian", versions=1, domain=GC)
class ReduceMedian(Op):
    """Median over ``axes`` (all when unset) and, as output 1, its index (INT32) into the
    flattened reduced axes. For an even count it is the lower of the two middle values."""

    builder_method = BuilderMethod(
        "reducemedian", 1, 2, (AttrSpec("axes", INTS, None), AttrSpec("keepdims", INT, 1))
    )

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

    builder_method = BuilderMethod(
        "scatterreduce",
        2,
        1,
        (
            AttrSpec("axis_size", INT, REQUIRED),
            AttrSpec("axis", INT, -1),
            AttrSpec("reduction", STRING, "sum", convert=scatter_reduction),
            AttrSpec("enable_index_broadcast", INT, 1),
        ),
    )

    @dataclass(frozen=True)
    class Attrs:
        axis_size: int
        axis: int = -1
        reduction: str = "sum"
        enable_index_broadcast: int = 1  # 0: index must have src's shape

    def infer(self, src, index):
        if self.attrs.reduction not in _SCATTER_REDUCE:
            raise ShapeError(f"{self.debug_name}: reduction '{self.attrs.reduction}' must be one "
                             f"of {list(_SCATTER_REDUCE)}.")
        axis = normalize_axis(self, self.attrs.axis, src.rank)
        if index.dtype not in _INT_DTYPES:
            raise ShapeError(f"{self.debug_name}: index {index} must be integer.")
        broadcast = self.attrs.enable_index_broadcast
        if index.shape == (src.shape[axis],) and src.rank > 1 and broadcast:
            self._index_view = tuple(-1 if a == axis else 1 for a in range(src.rank))
        elif index.shape == src.shape:
            self._index_view = None
        else:
            raise ShapeError(f"{self.debug_name}: index {index} must have src's shape "
                             f"{list(src.shape)}" + (f" or be 1-D of length {src.shape[axis]}."
                                                     if broadcast else
                                                     " (enable_index_broadcast=0)."))
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
                                 axis=self.attrs.axis, reduction=self.attrs.reduction,
                                 enable_index_broadcast=self.attrs.enable_index_broadcast))


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
