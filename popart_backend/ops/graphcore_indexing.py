"""ai.graphcore indexing ops: Slice (starts/ends/axes as attributes), GroupedGather
and GroupedScatterReduce (a gather / scatter per group along the leading group axis), Bucketize
and Sort, with the gradients of those that have one.

Grouped ops: with ``group_size`` G > 1, data (and indices) have a leading group axis of size G
and group g gathers (scatters) only within data[g] with indices[g]; ``axis`` counts the axes of
the whole tensor, so it is >= 1. ``group_size=1`` is the ungrouped op (Gather, ScatterReduce):
no group axis. Indices may be int32, int64 or uint32; negative ones count from the end, out of
range ones fail at run time naming the op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.signature import INT, INTS, REQUIRED, STRING, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from .base import normalize_axis
from .graphcore_common import GC, scatter_reduction
from .graphcore_reduce import ScatterReduce, ScatterReduceGrad
from .registry import register_op
from .slicing import Slice as OnnxSlice

_INDEX_DTYPES = (DataType.INT32, DataType.INT64, DataType.UINT32)


def _check_indices(op: Op, info: TensorInfo) -> None:
    if info.dtype not in _INDEX_DTYPES:
        raise ShapeError(
            f"{op.debug_name}: indices {info} must be int32, int64 or uint32. Cast them first."
        )


@register_op("Slice", versions=1, domain=GC)
class Slice(OnnxSlice):
    """ai.onnx Slice-1: ``starts``, ``ends`` and (optional) ``axes`` are attributes."""

    builder_method = BuilderMethod(
        "slice",
        1,
        1,
        (
            AttrSpec("ends", INTS, REQUIRED),
            AttrSpec("starts", INTS, REQUIRED),
            AttrSpec("axes", INTS, None),
        ),
    )

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs1


# --- grouped gather ---------------------------------------------------------------------------


class _Grouped(Op):
    """Shared shape checks of GroupedGather and its gradient: ``_axis`` is the gather axis in
    the grouped view (group axis first, so >= 1), ``_groups`` the group count."""

    def setup_groups(self, data: TensorInfo, indices: TensorInfo) -> None:
        _check_indices(self, indices)
        groups = self.attrs.group_size
        if groups < 1:
            raise ShapeError(f"{self.debug_name}: group_size={groups} must be >= 1.")
        self._grouped = groups > 1
        axis = normalize_axis(self, self.attrs.axis, data.rank)
        if self._grouped:
            if data.rank < 2 or data.shape[0] != groups or indices.rank < 1 or (
                    indices.shape[0] != groups):
                raise ShapeError(
                    f"{self.debug_name}: with group_size={groups}, data {data} and indices "
                    f"{indices} must both have a leading group axis of size {groups}."
                )
            if axis == 0:
                raise ShapeError(
                    f"{self.debug_name}: axis {self.attrs.axis} is the group axis; with "
                    f"group_size={groups} gather along an axis >= 1 of data {data}."
                )
        group_shape = tuple(data.shape) if self._grouped else (1, *data.shape)
        index_shape = tuple(indices.shape) if self._grouped else (1, *indices.shape)
        self._axis = axis if self._grouped else axis + 1
        a = self._axis
        self._groups = group_shape[0]
        self._size = group_shape[a]
        self._data_shape = group_shape
        self._out_shape = group_shape[:a] + index_shape[1:] + group_shape[a + 1:]
        self._rows = group_shape[1:a] + (math.prod(index_shape[1:]),) + group_shape[a + 1:]
        lead = 0 if self._grouped else 1
        self._public_out = self._out_shape[lead:]

    def group_indices(self, indices: torch.Tensor) -> torch.Tensor:
        index = indices.long().reshape(self._groups, -1)
        return torch.where(index < 0, index + self._size, index)


@register_op("GroupedGather", versions=1, domain=GC)
class GroupedGather(_Grouped):
    """out[g] = data[g].take(indices[g], axis - 1) for each group g (Gather when group_size=1)."""

    builder_method = BuilderMethod(
        "groupedgather", 2, 1, (AttrSpec("axis", INT, 0), AttrSpec("group_size", INT, 1))
    )

    @dataclass(frozen=True)
    class Attrs:
        axis: int = 0
        group_size: int = 1

    def infer(self, data, indices):
        self.setup_groups(data, indices)
        return data.with_shape(self._public_out)

    def kernel(self, data, indices):
        data = data.reshape(self._data_shape)
        index = self.group_indices(indices)
        # index_select rejects out-of-range indices; the plan re-raises naming this op.
        out = torch.stack([torch.index_select(data[g], self._axis - 1, index[g])
                           for g in range(self._groups)])
        return out.reshape(self._public_out)

    def grad(self, g):
        g.set_input_grad(0, g.op("GroupedGatherGrad", g.output_grad(0), g.input(1), domain=GC,
                                 axis=self.attrs.axis, group_size=self.attrs.group_size,
                                 shape=g.input_info(0).shape))


@register_op("GroupedGatherGrad", versions=1, domain=GC)
class GroupedGatherGrad(_Grouped):
    """d data: zeros of the data's ``shape``, each group's gathered slices of dy added back at
    their indices (repeated indices accumulate). Inputs (dy, indices)."""

    @dataclass(frozen=True)
    class Attrs:
        axis: int
        group_size: int
        shape: tuple[int, ...]

    def infer(self, dy, indices):
        data = dy.with_shape(tuple(self.attrs.shape))
        self.setup_groups(data, indices)
        if dy.shape != self._public_out:
            raise ShapeError(f"{self.debug_name}: gradient {dy} does not have the gather's "
                             f"output shape {list(self._public_out)}.")
        return data

    def kernel(self, dy, indices):
        index = self.group_indices(indices)
        dy = dy.reshape((self._groups, *self._rows))
        dx = dy.new_zeros(self._data_shape)
        for group in range(self._groups):
            dx[group].index_add_(self._axis - 1, index[group], dy[group])
        return dx.reshape(self.attrs.shape)


# --- grouped scatter-reduce -------------------------------------------------------------------


_GROUPED_SCATTER_ATTRS = (
    AttrSpec("axis_size", INT, REQUIRED),
    AttrSpec("axis", INT, -1),
    AttrSpec("reduction", STRING, "sum", convert=scatter_reduction),
    AttrSpec("group_size", INT, 1),
    AttrSpec("enable_index_broadcast", INT, 1),
)


@register_op("GroupedScatterReduce", versions=1, domain=GC)
class GroupedScatterReduce(ScatterReduce):
    """ScatterReduce within each group: out[g] is the scatter of src[g] at index[g] along
    ``axis`` (>= 1, counted on the whole tensor) into ``axis_size`` slots. ``index`` has src's
    shape or, with ``enable_index_broadcast``, the shape [G, src.shape[axis]], broadcast over
    the other axes. group_size=1 is plain ScatterReduce."""

    builder_method = BuilderMethod("groupedscatterreduce", 2, 1, _GROUPED_SCATTER_ATTRS)

    @dataclass(frozen=True)
    class Attrs:
        axis_size: int
        axis: int = -1
        reduction: str = "sum"
        group_size: int = 1
        enable_index_broadcast: int = 1

    def infer(self, src, index):
        groups = self.attrs.group_size
        if groups < 1:
            raise ShapeError(f"{self.debug_name}: group_size={groups} must be >= 1.")
        if groups == 1:
            return super().infer(src, index)
        axis = normalize_axis(self, self.attrs.axis, src.rank)
        if src.rank < 2 or src.shape[0] != groups or axis == 0:
            raise ShapeError(
                f"{self.debug_name}: with group_size={groups}, src {src} must have a leading "
                f"group axis of size {groups} and axis {self.attrs.axis} must not be it."
            )
        _check_indices(self, index)
        # The base checks src and axis_size; the index (checked above) is viewed per group.
        info = super().infer(src, TensorInfo(DataType.INT32, tuple(src.shape)))
        if index.shape == src.shape:
            return info
        if self.attrs.enable_index_broadcast and index.shape == (groups, src.shape[axis]):
            self._index_view = tuple(groups if a == 0 else (-1 if a == axis else 1)
                                     for a in range(src.rank))
            return info
        raise ShapeError(
            f"{self.debug_name}: index {index} must have src's shape {list(src.shape)}"
            + (f" or be [{groups}, {src.shape[axis]}] (one index row per group)."
               if self.attrs.enable_index_broadcast else " (enable_index_broadcast=0).")
        )

    def grad(self, g):
        a = self.attrs
        g.set_input_grad(0, g.op("GroupedScatterReduceGrad", g.output_grad(0), g.input(0),
                                 g.input(1), g.output(0), domain=GC, axis_size=a.axis_size,
                                 axis=a.axis, reduction=a.reduction, group_size=a.group_size,
                                 enable_index_broadcast=a.enable_index_broadcast))


@register_op("GroupedScatterReduceGrad", versions=1, domain=GC)
class GroupedScatterReduceGrad(GroupedScatterReduce):
    """dsrc of GroupedScatterReduce, as ScatterReduceGrad computes it. Inputs (dy, src, index,
    out)."""

    def infer(self, dy, src, index, out):
        GroupedScatterReduce.infer(self, src, index)
        return src

    kernel = ScatterReduceGrad.kernel
    grad = Op.grad


# --- bucketize and sort -------------------------------------------------------------------


@register_op("Bucketize", versions=1, domain=GC)
class Bucketize(Op):
    """The index (INT32) of the bucket of each input value among the sorted 1-D ``boundaries``
    (torch.bucketize): boundaries[i-1] < x <= boundaries[i], or with ``right``
    boundaries[i-1] <= x < boundaries[i]. Inputs (x, boundaries)."""

    builder_method = BuilderMethod("bucketize", 2, 1, (AttrSpec("right", INT, 0),))

    @dataclass(frozen=True)
    class Attrs:
        right: int = 0

    def infer(self, x, boundaries):
        if boundaries.rank != 1:
            raise ShapeError(f"{self.debug_name}: boundaries {boundaries} must be 1-D (sorted).")
        if x.dtype != boundaries.dtype:
            raise ShapeError(f"{self.debug_name}: input {x} and boundaries {boundaries} must "
                             f"share one dtype.")
        return TensorInfo(DataType.INT32, x.shape)

    def kernel(self, x, boundaries):
        return torch.bucketize(x, boundaries, right=bool(self.attrs.right)).to(torch.int32)


@register_op("Sort", versions=1, domain=GC)
class Sort(Op):
    """The values of ``x`` sorted along ``axis`` (descending with ``descending``; equal values
    keep their order with ``stable``) and their indices (INT32) into ``x``."""

    builder_method = BuilderMethod(
        "sort",
        1,
        2,
        (AttrSpec("axis", INT, -1), AttrSpec("descending", INT, 0), AttrSpec("stable", INT, 0)),
    )

    @dataclass(frozen=True)
    class Attrs:
        axis: int = -1
        descending: int = 0
        stable: int = 0

    def infer(self, x):
        self._axis = normalize_axis(self, self.attrs.axis, x.rank)
        return [x, TensorInfo(DataType.INT32, x.shape)]

    def kernel(self, x):
        values, indices = torch.sort(x, dim=self._axis, descending=bool(self.attrs.descending),
                                     stable=bool(self.attrs.stable))
        return values, indices.to(torch.int32)

    def grad(self, g):
        # Each sorted value's gradient goes back to the position it came from.
        g.set_input_grad(0, g.op("GatherElementsGrad", g.output_grad(0), g.output(1), domain=GC,
                                 axis=self._axis, shape=g.input_info(0).shape))
