"""ai.graphcore slicing at run-time offsets (``builder.aiGraphcore.dynamic*``, ``sequenceslice``):
DynamicSlice/Update/Zero/Add and SequenceSlice, with their gradients."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ShapeError
from ..ir.op import Op
from ..ir.signature import INT, INTS, REQUIRED, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from .base import normalize_axis
from .graphcore_common import _INT_DTYPES
from .multi_grad import pick_grads
from .registry import AI_GRAPHCORE, register_op

GC = AI_GRAPHCORE


# --- dynamic slicing --------------------------------------------------------------------------

# The window every dynamic op's Builder method takes.
_WINDOW = (AttrSpec("axes", INTS, REQUIRED), AttrSpec("sizes", INTS, REQUIRED))


class _Dynamic(Op):
    """Base of DynamicSlice/Update/Zero/Add: a window of ``sizes`` along ``axes`` starting at the
    run-time ``offset`` tensor ([len(axes)] ints). Offsets past the end are clamped so the window
    fits (as XLA's dynamic slices do); hardware leaves that case undefined."""

    @dataclass(frozen=True)
    class Attrs:
        axes: tuple[int, ...]
        sizes: tuple[int, ...]
        noOverlap: int = 0

    def check_window(self, x: TensorInfo, offset: TensorInfo) -> tuple[int, ...]:
        """The window's shape; validates axes, sizes and the offset tensor."""
        axes, sizes = self.attrs.axes, self.attrs.sizes
        if len(axes) != len(sizes):
            raise ShapeError(f"{self.debug_name}: axes {list(axes)} and sizes {list(sizes)} "
                             f"differ in length.")
        if offset.dtype not in _INT_DTYPES or offset.nelms != len(axes):
            raise ShapeError(f"{self.debug_name}: offset {offset} must hold one integer per axis "
                             f"({len(axes)}).")
        self._axes = tuple(normalize_axis(self, a, x.rank) for a in axes)
        shape = list(x.shape)
        for axis, size in zip(self._axes, sizes):
            if not 0 <= size <= shape[axis]:
                raise ShapeError(f"{self.debug_name}: size {size} does not fit axis {axis} of {x}.")
            shape[axis] = size
        self._dims = x.shape
        return tuple(shape)

    def window(self, offset: torch.Tensor) -> tuple:
        index = [slice(None)] * len(self._dims)
        for axis, size, start in zip(self._axes, self.attrs.sizes, offset.reshape(-1).tolist()):
            start = min(max(int(start), 0), self._dims[axis] - size)
            index[axis] = slice(start, start + size)
        return tuple(index)

    def window_attrs(self) -> dict:
        return {"axes": self.attrs.axes, "sizes": self.attrs.sizes}


@register_op("DynamicSlice", versions=1, domain=GC)
class DynamicSlice(_Dynamic):
    """out = tensor[window]."""

    builder_method = BuilderMethod("dynamicslice", 2, 1, (*_WINDOW, AttrSpec("noOverlap", INT, 0)))

    def infer(self, x, offset):
        return x.with_shape(self.check_window(x, offset))

    def kernel(self, x, offset):
        return x[self.window(offset)].clone()

    def grad(self, g):
        info = g.input_info(0)
        zeros = g.const(np.zeros(info.shape, info.dtype.numpy), "zeros")
        g.set_input_grad(0, g.op("DynamicUpdate", zeros, g.input(1), g.output_grad(0), domain=GC,
                                 **self.window_attrs()))


class _DynamicWithSlice(_Dynamic):
    def infer(self, x, offset, update):
        shape = self.check_window(x, offset)
        if update.shape != shape or update.dtype != x.dtype:
            raise ShapeError(f"{self.debug_name}: the slice {update} must be {x.dtype.name} "
                             f"{list(shape)}.")
        return x


@register_op("DynamicUpdate", versions=1, domain=GC)
class DynamicUpdate(_DynamicWithSlice):
    """out = tensor with its window replaced by ``slice``; inputs (tensor, offset, slice)."""

    builder_method = BuilderMethod("dynamicupdate", 3, 1, (*_WINDOW, AttrSpec("noOverlap", INT, 0)))

    def kernel(self, x, offset, update):
        out = x.clone()
        out[self.window(offset)] = update
        return out

    def grad(self, g):
        dout, offset = g.output_grad(0), g.input(1)
        if g.needs_input_grad(0):
            g.set_input_grad(0, g.op("DynamicZero", dout, offset, domain=GC,
                                     **self.window_attrs()))
        if g.needs_input_grad(2):
            g.set_input_grad(2, g.op("DynamicSlice", dout, offset, domain=GC,
                                     **self.window_attrs()))


@register_op("DynamicAdd", versions=1, domain=GC)
class DynamicAdd(_DynamicWithSlice):
    """out = tensor with ``slice`` added to its window; inputs (tensor, offset, slice)."""

    builder_method = BuilderMethod("dynamicadd", 3, 1, _WINDOW)

    def kernel(self, x, offset, update):
        out = x.clone()
        out[self.window(offset)] += update
        return out

    def grad(self, g):
        dout = g.output_grad(0)
        g.set_input_grad(0, dout)
        if g.needs_input_grad(2):
            g.set_input_grad(2, g.op("DynamicSlice", dout, g.input(1), domain=GC,
                                     **self.window_attrs()))


@register_op("DynamicZero", versions=1, domain=GC)
class DynamicZero(_Dynamic):
    """out = tensor with its window set to zero; inputs (tensor, offset)."""

    builder_method = BuilderMethod("dynamiczero", 2, 1, _WINDOW)

    def infer(self, x, offset):
        self.check_window(x, offset)
        return x

    def kernel(self, x, offset):
        out = x.clone()
        out[self.window(offset)] = 0
        return out

    def grad(self, g):
        g.set_input_grad(0, g.op("DynamicZero", g.output_grad(0), g.input(1), domain=GC,
                                 **self.window_attrs()))


@register_op("SequenceSlice", versions=1, domain=GC)
class SequenceSlice(Op):
    """Copy runs of rows (axis 0) from ``source`` into ``destination``.

    Inputs (source, destination, N, sourceOffset, destOffset), the last three [k] ints: for each
    j, destination[destOffset[j] : +N[j]] = source[sourceOffset[j] : +N[j]]. With zeroUnused=1
    the destination rows no run writes become zero. Runs past either end are cut to fit.
    """

    builder_method = BuilderMethod("sequenceslice", 5, 1, (AttrSpec("zeroUnused", INT, 0),))

    @dataclass(frozen=True)
    class Attrs:
        zeroUnused: int = 0

    def infer(self, source, destination, n, source_offset, dest_offset):
        if source.dtype != destination.dtype or source.shape[1:] != destination.shape[1:]:
            raise ShapeError(f"{self.debug_name}: source {source} and destination "
                             f"{destination} must agree beyond axis 0.")
        if not (n.shape == source_offset.shape == dest_offset.shape) or n.rank != 1:
            raise ShapeError(f"{self.debug_name}: N {n}, sourceOffset {source_offset} and "
                             f"destOffset {dest_offset} must be 1-D of one length.")
        return destination

    def runs(self, n, source_offset, dest_offset, rows_source: int, rows_dest: int):
        """(source slice, dest slice) per non-empty run."""
        out = []
        for count, s, d in zip(n.tolist(), source_offset.tolist(), dest_offset.tolist()):
            count = min(count, rows_source - s, rows_dest - d)
            if count > 0 and s >= 0 and d >= 0:
                out.append((slice(s, s + count), slice(d, d + count)))
        return out

    def kernel(self, source, destination, n, source_offset, dest_offset):
        runs = self.runs(n, source_offset, dest_offset, source.shape[0], destination.shape[0])
        out = torch.zeros_like(destination) if self.attrs.zeroUnused else destination.clone()
        for s, d in runs:
            out[d] = source[s]
        return out

    def grad(self, g):
        wrt = tuple(i for i in (0, 1) if g.needs_input_grad(i))
        if not wrt:
            return
        grads = g.op("SequenceSliceGrad", g.output_grad(0), *(g.input(i) for i in range(5)),
                     domain=GC, num_outputs=len(wrt), wrt=wrt, zeroUnused=self.attrs.zeroUnused)
        for i, grad in zip(wrt, grads if isinstance(grads, list) else [grads]):
            g.set_input_grad(i, grad)


@register_op("SequenceSliceGrad", versions=1, domain=GC)
class SequenceSliceGrad(SequenceSlice):
    """d source (rows summed from where they were copied to) and d destination (zero where
    overwritten, or everywhere with zeroUnused). Inputs (dy, source, destination, N, offsets)."""

    @dataclass(frozen=True)
    class Attrs:
        wrt: tuple[int, ...]
        zeroUnused: int = 0

    def infer(self, dy, source, destination, n, source_offset, dest_offset):
        return [(source, destination)[i] for i in self.attrs.wrt]

    def kernel(self, dy, source, destination, n, source_offset, dest_offset):
        runs = self.runs(n, source_offset, dest_offset, source.shape[0], destination.shape[0])
        dsource = torch.zeros_like(source)
        ddest = torch.zeros_like(dy) if self.attrs.zeroUnused else dy.clone()
        for s, d in runs:
            dsource[s] += dy[d]
            ddest[d] = 0
        return pick_grads((dsource, ddest), self.attrs.wrt)

    grad = Op.grad  # a grad op has no gradient of its own
