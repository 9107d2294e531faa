"""Indexing ops: Gather, GatherElements, GatherND, Scatter, ScatterElements, ScatterND, OneHot,
TopK, NonZero and Compress, at every ONNX since-version up to opset 28 (CumSum and CumProd are
in ``cumulative.py``).

Index tensors may hold negative values (counted from the end of the indexed axis); kernels map
them into range with one ``torch.where`` and let torch's bounds checks (or an explicit one when
indices are linearised) reject the rest. NonZero and Compress have data-dependent output shapes,
which the simulated IPU cannot hold: they are supported only when folded at compile time.

Gradients: what a gather reads, its gradient adds back into zeros (GatherGrad,
GatherElementsGrad, GatherNDGrad in the ai.graphcore domain; repeated indices accumulate), and
what a scatter writes, its gradient gathers. TopK and Compress reuse the gather grad ops, and
OneHot differentiates its ``values`` input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..dtypes import DataType
from ..errors import ModelError, ShapeError, UnsupportedOpError, popart_runtime_error
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import UInt64, check_dtypes, normalize_axis
from .registry import AI_GRAPHCORE, register_op

# uint32 too: Graphcore's BERT gathers embeddings with uint32 ids. Held as int64 on the
# simulator (never negative), range-checked like the others.
_INDEX_DTYPES = (DataType.INT32, DataType.INT64, DataType.UINT32)

# ONNX reduction name -> torch scatter_reduce name, and the opset that introduced it.
_REDUCTIONS = {"add": ("sum", 16), "mul": ("prod", 16), "max": ("amax", 18), "min": ("amin", 18)}


def _check_index_dtype(op: Op, info: TensorInfo, what: str = "indices") -> None:
    if info.dtype not in _INDEX_DTYPES:
        raise ShapeError(
            f"{op.debug_name}: {what} must be int32, int64 or uint32, got {info}. Cast them "
            f"first."
        )


def _check_reduction(op: Op, reduction: str) -> str | None:
    """torch's name for ``reduction`` (None for 'none'); rejects names this version lacks."""
    if reduction == "none":
        return None
    known = _REDUCTIONS.get(reduction)
    if known is None or known[1] > op.version:
        allowed = ["none"] + [k for k, (_, v) in _REDUCTIONS.items() if v <= op.version]
        raise ModelError(
            f"{op.debug_name}: reduction '{reduction}' is not defined for "
            f"{op.op_type}-{op.version}; it accepts {allowed}."
        )
    return known[0]


def _wrap_negative(index: torch.Tensor, size) -> torch.Tensor:
    """Negative indices count from the end (ONNX); int64 because torch's scatter/gather need it."""
    index = index.long()
    return torch.where(index < 0, index + size, index)


def _check_grad_shape(op: Op, dy: TensorInfo, expected) -> None:
    if dy.shape != tuple(expected):
        raise ShapeError(
            f"{op.debug_name}: gradient {dy} does not have the forward output's shape "
            f"{list(expected)} (forward input shape {list(op.attrs.shape)}).")


def _gather_grad(g, grad_type: str, dy: str, indices: str, **attrs) -> None:
    """d data of a gather: ``dy`` added back into zeros of the data's shape at ``indices``."""
    g.set_input_grad(0, g.op(grad_type, dy, indices, domain=AI_GRAPHCORE,
                             shape=g.input_info(0).shape, **attrs))


class _AxisGatherGrad(Op):
    """Base of GatherGrad and GatherElementsGrad: zeros of the gathered data's ``shape`` with
    dy added back along ``axis``."""

    @dataclass(frozen=True)
    class Attrs:
        axis: int
        shape: tuple[int, ...]  # of the gathered data

    def setup(self, dy: TensorInfo, indices: TensorInfo, gathered_shape) -> TensorInfo:
        """Checks dy against the forward output's shape ``gathered_shape``; returns d data."""
        _check_index_dtype(self, indices)
        _check_grad_shape(self, dy, gathered_shape)
        self.size = self.attrs.shape[self.attrs.axis]
        return dy.with_shape(self.attrs.shape)


def _scatter_grad(op: Op, g, scatter_type: str, gather_type: str, **attrs) -> None:
    """Gradients of a scatter: ``data`` gets dy with the overwritten positions zeroed (or dy
    itself for reduction 'add'); ``updates`` gets dy gathered at the indices."""
    reduction = getattr(op.attrs, "reduction", "none")
    if reduction not in ("none", "add"):
        raise UnsupportedOpError(
            f"{op.debug_name}: the gradient of reduction '{reduction}' is not implemented (only "
            f"'none' and 'add' are). Detach the path through this op, or express the update "
            f"with differentiable ops (e.g. Mul of a gathered mask).")
    dy = g.output_grad(0)
    if g.needs_input_grad(0):
        if reduction == "none":
            info = g.input_info(2)
            zeros = g.const(np.zeros(info.shape, info.dtype.numpy), "zeros")
            g.set_input_grad(0, g.op(scatter_type, dy, g.input(1), zeros, **attrs))
        else:
            g.set_input_grad(0, dy)
    if g.needs_input_grad(2):
        g.set_input_grad(2, g.op(gather_type, dy, g.input(1), **attrs))


# --- Gather family ----------------------------------------------------------------------------


@register_op("Gather", versions=(1, 11, 13))
class Gather(Op):
    """out = data.take(indices, axis): indices of any rank replace the axis."""

    moves_elements = True
    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @dataclass(frozen=True)
    class Attrs:
        axis: int = 0

    def infer(self, data, indices):
        _check_index_dtype(self, indices)
        self.axis = normalize_axis(self, self.attrs.axis, data.rank)
        self.size = data.shape[self.axis]
        self.out_shape = data.shape[: self.axis] + indices.shape + data.shape[self.axis + 1 :]
        return data.with_shape(self.out_shape)

    # The static memory plan (device/arena.py): the indices are integers, the output takes
    # the data's dtype.
    writes_into = True

    def kernel(self, data, indices):
        index = torch.where(indices < 0, indices + self.size, indices).reshape(-1)
        # index_select rejects out-of-range indices; the plan re-raises naming this op.
        return torch.index_select(data, self.axis, index).reshape(self.out_shape)

    def kernel_into(self, out, data, indices):
        rows = out.view(data.shape[:self.axis] + (indices.numel(),) + data.shape[self.axis + 1:])
        try:  # no wrapped copy of the indices while none is negative (the usual case)
            torch.index_select(data, self.axis, indices.reshape(-1), out=rows)
        except (IndexError, RuntimeError):  # a negative or an out-of-range index
            index = torch.where(indices < 0, indices + self.size, indices).reshape(-1)
            torch.index_select(data, self.axis, index, out=rows)
        return out

    def grad(self, g):
        _gather_grad(g, "GatherGrad", g.output_grad(0), g.input(1), axis=self.axis)


@register_op("GatherGrad", versions=1, domain=AI_GRAPHCORE)
class GatherGrad(_AxisGatherGrad):
    """d data = zeros with each gathered slice of dy added back at its index along ``axis``."""

    def infer(self, dy, indices):
        shape, axis = self.attrs.shape, self.attrs.axis
        self.rows_shape = shape[:axis] + (indices.nelms,) + shape[axis + 1 :]
        return self.setup(dy, indices, shape[:axis] + indices.shape + shape[axis + 1 :])

    writes_into = True  # the static memory plan (device/arena.py); indices are integers

    def kernel(self, dy, indices):
        return self._add_into(dy.new_zeros(self.attrs.shape), dy, indices)

    def kernel_into(self, out, dy, indices):
        try:  # no wrapped copy of the indices while none is negative (the usual case)
            rows = dy.reshape(self.rows_shape)
            return out.zero_().index_add_(self.attrs.axis, indices.reshape(-1), rows)
        except (IndexError, RuntimeError):  # a negative or an out-of-range index: start over
            return self._add_into(out.zero_(), dy, indices)

    def _add_into(self, dx, dy, indices):
        index = _wrap_negative(indices, self.size).reshape(-1)
        return dx.index_add_(self.attrs.axis, index, dy.reshape(self.rows_shape))


@register_op("GatherGradAdd", versions=1, domain=AI_GRAPHCORE)
class GatherGradAdd(GatherGrad):
    """acc + GatherGrad(dy, indices), adding dy's slices into ``acc``'s own storage (it is the
    output): a tied embedding's weight gradient with no zero-filled table and no extra sum.
    transforms/fuse_grad_sum.py makes it where nothing else reads ``acc``."""

    modifies_inputs = (2,)
    public = False  # made by a fusion only; not a builder op

    def infer(self, dy, indices, acc):
        out = super().infer(dy, indices)
        if acc != out:
            raise ShapeError(f"{self.debug_name}: the accumulated gradient {acc} must be "
                             f"{out}, the gathered data's shape and dtype.")
        return out

    def kernel(self, dy, indices, acc):
        index = _wrap_negative(indices, self.size).reshape(-1)
        return acc.index_add_(self.attrs.axis, index, dy.reshape(self.rows_shape))

    def scratch_infos(self):  # device/arena.py: which indices are negative, and if any is
        return tuple(TensorInfo(DataType.BOOL, s) for s in ((self.inputs[1].info.nelms,), ()))

    def kernel_scratch(self, out, negative, any_negative, dy, indices, acc):
        flat = indices.reshape(-1)  # wrapped (a copy) only when an index is negative
        if bool(torch.any(torch.lt(flat, 0, out=negative), 0, out=any_negative)):
            return self.kernel(dy, indices, acc)
        return acc.index_add_(self.attrs.axis, flat, dy.reshape(self.rows_shape))


@register_op("GatherElements", versions=(11, 13))
class GatherElements(Op):
    """out[i][j][k] = data[index[i][j][k]][j][k] (for axis 0): torch.gather."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @dataclass(frozen=True)
    class Attrs:
        axis: int = 0

    def infer(self, data, indices):
        _check_index_dtype(self, indices)
        if indices.rank != data.rank:
            raise ShapeError(
                f"{self.debug_name}: indices {indices} must have the rank of data {data}."
            )
        self.axis = normalize_axis(self, self.attrs.axis, data.rank)
        for d, (n, m) in enumerate(zip(indices.shape, data.shape)):
            if d != self.axis and n > m:
                raise ShapeError(
                    f"{self.debug_name}: indices {indices} exceed data {data} on axis {d}."
                )
        self.size = data.shape[self.axis]
        return data.with_shape(indices.shape)

    def kernel(self, data, indices):
        return torch.gather(data, self.axis, _wrap_negative(indices, self.size))

    def grad(self, g):
        _gather_grad(g, "GatherElementsGrad", g.output_grad(0), g.input(1), axis=self.axis)


@register_op("GatherElementsGrad", versions=1, domain=AI_GRAPHCORE)
class GatherElementsGrad(_AxisGatherGrad):
    """d data = zeros with dy added at the gathered elements (also TopK's values gradient)."""

    def infer(self, dy, indices):
        return self.setup(dy, indices, indices.shape)

    def kernel(self, dy, indices):
        dx = dy.new_zeros(self.attrs.shape)
        return dx.scatter_add_(self.attrs.axis, _wrap_negative(indices, self.size), dy)


class _LinearIndex:
    """Turns the last dimension of GatherND/ScatterND indices into one flat row index.

    Indices address data[b..., i0, ..., ik-1, :]; with strides of the addressed dims precomputed,
    the kernel needs one multiply-sum, and an explicit bounds check (linearising would otherwise
    let an out-of-range coordinate silently address another row).
    """

    def __init__(self, op: Op, data: TensorInfo, indices: TensorInfo, batch_dims: int):
        _check_index_dtype(op, indices)
        b = batch_dims
        if indices.rank < 1 or data.rank < 1:
            raise ShapeError(f"{op.debug_name}: data {data} and indices {indices} need rank >= 1.")
        k = indices.shape[-1]
        if not 0 <= b < min(data.rank, indices.rank):
            raise ShapeError(
                f"{op.debug_name}: batch_dims {b} must be below the ranks of data {data} and "
                f"indices {indices}."
            )
        if data.shape[:b] != indices.shape[:b]:
            raise ShapeError(
                f"{op.debug_name}: the first batch_dims={b} dims of data {data} and indices "
                f"{indices} must be equal."
            )
        if b + k > data.rank:
            raise ShapeError(
                f"{op.debug_name}: indices {indices} address {k} dims after {b} batch dims, but "
                f"data {data} has rank {data.rank}."
            )
        self.op = op
        addressed = data.shape[b : b + k]
        self.batch = math.prod(data.shape[:b])
        self.rows = math.prod(addressed)
        self.row_shape = data.shape[b + k :]
        self.row_size = math.prod(self.row_shape)
        self.count = math.prod(indices.shape[b:-1])
        self.dims = torch.tensor(addressed, dtype=torch.int64)
        self.strides = torch.tensor(
            [math.prod(addressed[i + 1 :]) for i in range(k)], dtype=torch.int64
        )
        # Row offset of each batch in the flattened (batch * rows) data.
        self.batch_offset = (torch.arange(self.batch, dtype=torch.int64) * self.rows).reshape(-1, 1)
        self.out_shape = indices.shape[:-1] + self.row_shape

    def __call__(self, indices: torch.Tensor) -> torch.Tensor:
        """Flat row indices of shape (batch, count) into data viewed as (batch * rows, row_size)."""
        index = _wrap_negative(indices, self.dims)
        bad = (index < 0) | (index >= self.dims)
        if bool(bad.any()):
            position = tuple(int(i) for i in bad.nonzero()[0])
            raise popart_runtime_error(
                f"{self.op.debug_name}: index {indices[position[:-1]].tolist()} at "
                f"{list(position[:-1])} is out of range for the addressed dims "
                f"{self.dims.tolist()}."
            )
        flat = (index * self.strides).sum(-1).reshape(self.batch, self.count)
        return flat + self.batch_offset


@register_op("GatherND", versions=(11, 12, 13))
class GatherND(Op):
    """Gathers slices data[b..., i0..ik-1] addressed by the last dim of ``indices``."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @dataclass(frozen=True)
    class Attrs:
        batch_dims: int = 0

    @dataclass(frozen=True)
    class Attrs11:
        pass

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs11 if version < 12 else cls.Attrs

    def infer(self, data, indices):
        self.linear = _LinearIndex(self, data, indices, getattr(self.attrs, "batch_dims", 0))
        return data.with_shape(self.linear.out_shape)

    def kernel(self, data, indices):
        lin = self.linear
        flat = data.reshape(lin.batch * lin.rows, lin.row_size)
        return flat.index_select(0, lin(indices).reshape(-1)).reshape(lin.out_shape)

    def grad(self, g):
        _gather_grad(g, "GatherNDGrad", g.output_grad(0), g.input(1),
                     batch_dims=getattr(self.attrs, "batch_dims", 0))


@register_op("GatherNDGrad", versions=1, domain=AI_GRAPHCORE)
class GatherNDGrad(Op):
    """d data = zeros with each gathered row of dy added back at its addressed position."""

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...]  # of the gathered data
        batch_dims: int = 0

    def infer(self, dy, indices):
        data = dy.with_shape(self.attrs.shape)
        self.linear = _LinearIndex(self, data, indices, self.attrs.batch_dims)
        _check_grad_shape(self, dy, self.linear.out_shape)
        return data

    def kernel(self, dy, indices):
        lin = self.linear
        dx = dy.new_zeros(lin.batch * lin.rows, lin.row_size)
        rows = dy.reshape(lin.batch * lin.count, lin.row_size)
        return dx.index_add_(0, lin(indices).reshape(-1), rows).reshape(self.attrs.shape)


# --- Scatter family ---------------------------------------------------------------------------


@register_op("ScatterElements", versions=(11, 13, 16, 18))
class ScatterElements(Op):
    """out = copy of data with out[index[i][j]][j] (reduce)= updates[i][j] (for axis 0)."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @dataclass(frozen=True)
    class Attrs:
        axis: int = 0
        reduction: str = "none"

    @dataclass(frozen=True)
    class AttrsNoReduction:
        axis: int = 0

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs if version >= 16 else cls.AttrsNoReduction

    def infer(self, data, indices, updates):
        _check_index_dtype(self, indices)
        if indices.shape != updates.shape or indices.rank != data.rank:
            raise ShapeError(
                f"{self.debug_name}: indices {indices} and updates {updates} must have the same "
                f"shape, of the rank of data {data}."
            )
        if updates.dtype != data.dtype:
            raise ShapeError(f"{self.debug_name}: updates {updates} must match data {data} dtype.")
        self.axis = normalize_axis(self, self.attrs.axis, data.rank)
        self.size = data.shape[self.axis]
        self.reduce = _check_reduction(self, getattr(self.attrs, "reduction", "none"))
        return data

    def kernel(self, data, indices, updates):
        index = _wrap_negative(indices, self.size)
        if self.reduce is None:
            return torch.scatter(data, self.axis, index, updates)
        return torch.scatter_reduce(data, self.axis, index, updates, self.reduce, include_self=True)

    def grad(self, g):
        # With repeated indices and reduction 'none' ONNX leaves the written value undefined;
        # every repeated update then receives the gradient of that position.
        _scatter_grad(self, g, "ScatterElements", "GatherElements", axis=self.axis)


@register_op("Scatter", versions=(9, 11))
class Scatter(ScatterElements):
    """Scatter-9, renamed ScatterElements in opset 11 (Scatter-11 is the deprecated alias)."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @classmethod
    def attrs_type(cls, version):
        return cls.AttrsNoReduction


@register_op("ScatterND", versions=(11, 13, 16, 18))
class ScatterND(Op):
    """out = copy of data with the slices addressed by ``indices`` (reduce)= ``updates``."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @dataclass(frozen=True)
    class Attrs:
        reduction: str = "none"

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs if version >= 16 else ScatterND._NoAttrs

    @dataclass(frozen=True)
    class _NoAttrs:
        pass

    def infer(self, data, indices, updates):
        self.linear = _LinearIndex(self, data, indices, 0)
        if updates.shape != self.linear.out_shape or updates.dtype != data.dtype:
            raise ShapeError(
                f"{self.debug_name}: updates {updates} must be "
                f"{data.with_shape(self.linear.out_shape)} for data {data} and indices {indices}."
            )
        self.reduce = _check_reduction(self, getattr(self.attrs, "reduction", "none"))
        return data

    def kernel(self, data, indices, updates):
        lin = self.linear
        flat = data.reshape(lin.rows, lin.row_size)
        rows = lin(indices).reshape(-1, 1).expand(lin.count, lin.row_size)
        values = updates.reshape(lin.count, lin.row_size)
        if self.reduce is None:
            out = torch.scatter(flat, 0, rows, values)
        else:
            out = torch.scatter_reduce(flat, 0, rows, values, self.reduce, include_self=True)
        return out.reshape(data.shape)

    def grad(self, g):
        _scatter_grad(self, g, "ScatterND", "GatherND")


# --- OneHot, TopK --------------------------------------------------------------------------


@register_op("OneHot", versions=(9, 11, 28))
class OneHot(Op):
    """out = values[1] where the inserted ``axis`` equals the index, values[0] elsewhere.

    ``depth`` sets the output shape, so it must be a compile-time constant.
    """

    const_inputs = (1,)

    @dataclass(frozen=True)
    class Attrs:
        axis: int = -1

    def infer(self, indices, depth, values):
        depth_value = self.const_input(1)
        if depth_value.size != 1:
            raise ShapeError(f"{self.debug_name}: depth must hold one value, got {depth}.")
        self.depth = int(np.asarray(depth_value).reshape(-1)[0])
        if self.depth < 1:
            raise ShapeError(f"{self.debug_name}: depth must be positive, got {self.depth}.")
        if values.shape != (2,):
            raise ShapeError(
                f"{self.debug_name}: values must be [off, on] of shape [2], got {values}."
            )
        rank = indices.rank + 1
        axis = self.attrs.axis
        if not -rank <= axis < rank:
            raise ShapeError(
                f"{self.debug_name}: axis {axis} is out of range for output rank {rank}."
            )
        self.axis = axis % rank
        self.positions = torch.arange(self.depth, dtype=torch.int64).reshape(
            (self.depth,) + (1,) * (rank - 1 - self.axis)
        )
        shape = indices.shape[: self.axis] + (self.depth,) + indices.shape[self.axis :]
        return values.with_shape(shape)

    def kernel(self, indices, depth, values):
        # Compared in the indices' own dtype: like onnxruntime, a fractional float index matches
        # no position, and neither does an out-of-range one.
        index = torch.where(indices < 0, indices + self.depth, indices).unsqueeze(self.axis)
        return torch.where(index == self.positions, values[1], values[0])

    def grad(self, g):
        # Only ``values`` is differentiable; indices and depth select positions.
        if not g.needs_input_grad(2):
            return
        g.set_input_grad(2, g.op("OneHotGrad", g.output_grad(0), g.input(0), domain=AI_GRAPHCORE,
                                 depth=self.depth, axis=self.axis))


@register_op("OneHotGrad", versions=1, domain=AI_GRAPHCORE)
class OneHotGrad(Op):
    """d values = [sum of dy off the hot positions, sum of dy on them]."""

    @dataclass(frozen=True)
    class Attrs:
        depth: int
        axis: int  # in [0, output rank)

    def infer(self, dy, indices):
        a = self.attrs
        expected = indices.shape[: a.axis] + (a.depth,) + indices.shape[a.axis :]
        if dy.shape != expected:
            raise ShapeError(
                f"{self.debug_name}: gradient {dy} does not match indices {indices} one-hot "
                f"encoded with depth {a.depth} on axis {a.axis}.")
        self.positions = torch.arange(a.depth, dtype=torch.int64).reshape(
            (a.depth,) + (1,) * (dy.rank - 1 - a.axis))
        return dy.with_shape((2,))

    def kernel(self, dy, indices):
        index = torch.where(indices < 0, indices + self.attrs.depth, indices)
        hot = index.unsqueeze(self.attrs.axis) == self.positions
        zero = dy.new_zeros(())
        return torch.stack([torch.where(hot, zero, dy).sum(), torch.where(hot, dy, zero).sum()])


@register_op("TopK", versions=(1, 10, 11, 24))
class TopK(Op):
    """The k largest (or smallest) values along ``axis`` and their int64 indices.

    Equal values keep their input order (lower index first), as onnxruntime does; a stable sort
    gives that, which torch.topk does not promise.
    """

    @dataclass(frozen=True)
    class Attrs:
        axis: int = -1
        largest: int = 1
        sorted: int = 1

    @dataclass(frozen=True)
    class Attrs1:
        k: int
        axis: int = -1

    @dataclass(frozen=True)
    class Attrs10:
        axis: int = -1

    @classmethod
    def attrs_type(cls, version):
        return {1: cls.Attrs1, 10: cls.Attrs10}.get(version, cls.Attrs)

    const_inputs = (1,)  # K, from version 10
    uint64 = UInt64.ORDER

    def infer(self, x, k=None):
        check_dtypes(self, x, k)
        self.axis = normalize_axis(self, self.attrs.axis, x.rank)
        if self.version < 10:
            self.k = self.attrs.k
        else:
            if k is None:
                raise ShapeError(f"{self.debug_name}: input K is required.")
            self.k = int(np.asarray(self.const_input(1)).reshape(-1)[0])
        if not 0 <= self.k <= x.shape[self.axis]:
            raise ShapeError(
                f"{self.debug_name}: k={self.k} must be in [0, {x.shape[self.axis]}] for {x} "
                f"axis {self.axis}."
            )
        self.descending = bool(getattr(self.attrs, "largest", 1))
        shape = list(x.shape)
        shape[self.axis] = self.k
        return x.with_shape(shape), TensorInfo(DataType.INT64, tuple(shape))

    def kernel(self, x, k=None):
        values, indices = torch.sort(x, dim=self.axis, descending=self.descending, stable=True)
        return values.narrow(self.axis, 0, self.k), indices.narrow(self.axis, 0, self.k)

    def grad(self, g):
        # The values were gathered from x at the returned indices.
        _gather_grad(g, "GatherElementsGrad", g.output_grad(0), g.output(1), axis=self.axis)


# --- data-dependent shapes: only at compile time -------------------------------------------------


def _static_only(op: Op, index: int, what: str) -> np.ndarray:
    tensor = op.inputs[index]
    if not tensor.is_const:
        raise UnsupportedOpError(
            f"{op.debug_name}: the output shape depends on the values of {what} '{tensor.id}' "
            f"({tensor.info}, {tensor.kind.value}), but tensor shapes on the simulated IPU are "
            f"fixed at compile time. Make '{tensor.id}' a constant (so the op folds), or replace "
            f"the op by a fixed-size equivalent (e.g. a mask with Where)."
        )
    return tensor.data


@register_op("NonZero", versions=(9, 13))
class NonZero(Op):
    """Indices of the non-zero elements, shape [rank, count]: the count sets the output shape, so
    the input must be constant (``const_inputs``) and the op folds."""

    const_inputs = (0,)

    def infer(self, x):
        count = int(np.count_nonzero(_static_only(self, 0, "input")))
        return TensorInfo(DataType.INT64, (x.rank, count))

    def kernel(self, x):
        return torch.nonzero(x).t().contiguous()


@register_op("Compress", versions=(9, 11, 28))
class Compress(Op):
    """Slices of the input where ``condition`` is true (flattened input without ``axis``).

    The condition sets the output shape, so it must be constant (declared in ``const_inputs``,
    so getSupportedOperationsDefinition reports it); the selected indices are computed once
    here and the kernel is one index_select.
    """

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)
    const_inputs = (1,)

    @dataclass(frozen=True)
    class Attrs:
        axis: int | None = None

    def infer(self, x, condition):
        cond = np.asarray(_static_only(self, 1, "condition"))
        if condition.rank != 1:
            raise ShapeError(f"{self.debug_name}: condition must be 1-D, got {condition}.")
        axis = self.attrs.axis
        self.axis = None if axis is None else normalize_axis(self, axis, x.rank)
        length = x.nelms if self.axis is None else x.shape[self.axis]
        selected = np.nonzero(cond.astype(bool))[0]
        if selected.size and selected[-1] >= length:
            raise ShapeError(
                f"{self.debug_name}: condition {condition} selects index {int(selected[-1])}, "
                f"beyond the {length} elements of the compressed axis of {x}."
            )
        self.index = torch.from_numpy(selected.astype(np.int64))
        if self.axis is None:
            return x.with_shape((selected.size,))
        shape = list(x.shape)
        shape[self.axis] = selected.size
        return x.with_shape(shape)

    def kernel(self, x, condition):
        if self.axis is None:
            return x.reshape(-1).index_select(0, self.index)
        return x.index_select(self.axis, self.index)

    def grad(self, g):
        # Compress is a Gather of the selected indices (of the flattened input without axis).
        shape = g.input_info(0).shape
        index = g.const(self.index.numpy().copy(), "index")
        if self.axis is not None:
            dx = g.op("GatherGrad", g.output_grad(0), index, domain=AI_GRAPHCORE, axis=self.axis,
                      shape=shape)
        else:
            flat = g.op("GatherGrad", g.output_grad(0), index, domain=AI_GRAPHCORE, axis=0,
                        shape=(math.prod(shape),))
            dx = g.op("Reshape", flat, g.const(np.array(shape, np.int64), "shape"), allowzero=1)
        g.set_input_grad(0, dx)


__all__: list[str] = []
