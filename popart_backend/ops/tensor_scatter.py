"""TensorScatter (opset 24): write a block of new sequence entries into a fixed-size KV cache.

The caches are [batch, ..., max_sequence_length, ...] with the sequence on ``axis``; the update
has the same shape except ``sequence_length`` (<= max) entries on that axis. Each batch row's
entries land from its ``write_indices`` value on (0 without the input), wrapping around the
cache in ``circular`` mode. The kernel is one ``scatter`` along the axis, with indices
``write_indices[b] + s`` built from a position ramp precomputed in ``infer()``.

Gradient (TensorScatterGrad): the cache positions written receive nothing from the past cache,
so d past_cache is dy with them zeroed; d update gathers dy from them. write_indices are
integers and carry no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ModelError, ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import normalize_axis
from .multi_grad import add_multi_grad_op, pick_grads, wanted_grads
from .registry import AI_GRAPHCORE, register_op

_MODES = ("linear", "circular")


class _CacheWrite(Op):
    """Shared by TensorScatter and its grad op: which cache positions the update writes."""

    def setup(self, cache: TensorInfo, update_len: int, write_indices: TensorInfo | None) -> None:
        a = self.attrs
        if a.mode not in _MODES:
            raise ModelError(f"{self.debug_name}: mode '{a.mode}' is not one of {list(_MODES)}.")
        self.axis = normalize_axis(self, a.axis, cache.rank)
        if self.axis == 0:
            raise ShapeError(
                f"{self.debug_name}: axis {a.axis} is the batch dimension of {cache}; the "
                f"sequence axis must be another one.")
        max_len = cache.shape[self.axis]
        if update_len > max_len:
            raise ShapeError(
                f"{self.debug_name}: the update's {update_len} sequence entries (axis "
                f"{self.axis}) exceed the cache's max_sequence_length {max_len}.")
        if write_indices is not None and (
                write_indices.dtype != DataType.INT64 or write_indices.shape != cache.shape[:1]):
            raise ShapeError(
                f"{self.debug_name}: write_indices {write_indices} must be int64 of shape "
                f"[{cache.shape[0]}] (one start per batch row).")
        self._max_len = max_len
        self._circular = a.mode == "circular"
        self._update_shape = cache.shape[: self.axis] + (update_len,) + cache.shape[self.axis + 1:]
        self._ramp = torch.arange(update_len).reshape(
            (update_len,) + (1,) * (cache.rank - self.axis - 1))
        self._row_view = cache.shape[:1] + (1,) * (cache.rank - 1)

    def positions(self, write_indices: torch.Tensor | None) -> torch.Tensor:
        """Cache index along ``axis`` of every update element (the update's shape)."""
        index = self._ramp if write_indices is None else (
            write_indices.reshape(self._row_view) + self._ramp)
        if self._circular:
            index = index % self._max_len
        return index.expand(self._update_shape)


@register_op("TensorScatter", versions=24)
class TensorScatter(_CacheWrite):
    """present_cache = past_cache with ``update`` written at each row's write index."""

    @dataclass(frozen=True)
    class Attrs:
        axis: int = -2
        mode: str = "linear"

    def infer(self, past, update, write_indices=None):
        if past.dtype != update.dtype or past.rank != update.rank:
            raise ShapeError(
                f"{self.debug_name}: past_cache {past} and update {update} need one dtype and "
                f"rank.")
        axis = normalize_axis(self, self.attrs.axis, past.rank)
        if any(p != u for i, (p, u) in enumerate(zip(past.shape, update.shape)) if i != axis):
            raise ShapeError(
                f"{self.debug_name}: update {update} must match past_cache {past} except on the "
                f"sequence axis {axis}.")
        self.setup(past, update.shape[axis], write_indices)
        return past

    def kernel(self, past, update, write_indices=None):
        # torch's bounds check rejects a linear-mode write past the end of the cache.
        return past.scatter(self.axis, self.positions(write_indices), update)

    def grad(self, g):
        wrt = wanted_grads(g, (0, 1))
        if wrt:
            indices = g.input(2) if g.has_input(2) else None
            add_multi_grad_op(g, "TensorScatterGrad", g.output_grad(0), indices, wrt=wrt,
                              axis=self.attrs.axis, mode=self.attrs.mode,
                              update_len=g.input_info(1).shape[self.axis])


@register_op("TensorScatterGrad", versions=1, domain=AI_GRAPHCORE)
class TensorScatterGrad(_CacheWrite):
    """d past_cache (dy, written positions zeroed) and d update (dy at those positions), those
    listed in ``wrt``."""

    @dataclass(frozen=True)
    class Attrs:
        axis: int
        mode: str
        update_len: int
        wrt: tuple[int, ...] = (0, 1)

    def infer(self, dy, write_indices=None):
        self.setup(dy, self.attrs.update_len, write_indices)
        infos = (dy, dy.with_shape(self._update_shape))
        return [infos[i] for i in self.attrs.wrt]

    def kernel(self, dy, write_indices=None):
        index = self.positions(write_indices)
        grads = (dy.scatter(self.axis, index, 0.0), dy.gather(self.axis, index))
        return pick_grads(grads, self.attrs.wrt)


__all__: list[str] = []
