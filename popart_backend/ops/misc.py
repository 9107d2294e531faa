"""ai.onnx ops that fit no other family: LpNormalization, ReverseSequence, Det, MaxUnpool and
Unique (whose output shape depends on values, so it needs a constant input and folds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..dtypes import DataType, to_storage
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import normalize_axis
from .gather_scatter import _static_only
from .registry import AI_GRAPHCORE, register_op


@register_op("LpNormalization", versions=(1, 22))
class LpNormalization(Op):
    """x / ||x||_p along ``axis`` (p = 1 or 2); a zero-norm slice stays zero."""

    is_normalization = True

    @dataclass(frozen=True)
    class Attrs:
        axis: int = -1
        p: int = 2

    def infer(self, x):
        if self.attrs.p not in (1, 2):
            raise ShapeError(f"{self.debug_name}: p={self.attrs.p}; ONNX allows 1 or 2.")
        if not x.dtype.is_float:
            raise ShapeError(f"{self.debug_name}: input {x} must be floating point.")
        self._axis = normalize_axis(self, self.attrs.axis, x.rank)
        return x

    def norm(self, x):
        return torch.linalg.vector_norm(x, ord=self.attrs.p, dim=self._axis, keepdim=True)

    def kernel(self, x):
        norm = self.norm(x)
        return x / torch.where(norm == 0, torch.ones_like(norm), norm)

    def grad(self, g):
        g.set_input_grad(0, g.op("LpNormalizationGrad", g.output_grad(0), g.input(0),
                                 domain=AI_GRAPHCORE, axis=self.attrs.axis, p=self.attrs.p))


@register_op("LpNormalizationGrad", versions=1, domain=AI_GRAPHCORE)
class LpNormalizationGrad(LpNormalization):
    """dx = (dy - y · <dy, d||x||/dx · ||x||>) / ||x||, with d||x||/dx = sign(x) (p=1) or x/||x||."""

    is_normalization = False  # a grad op, not the forward it inherits from

    def infer(self, dy, x):
        return super().infer(x)

    def kernel(self, dy, x):
        norm = self.norm(x)
        safe = torch.where(norm == 0, torch.ones_like(norm), norm)
        dnorm = torch.sign(x) if self.attrs.p == 1 else x / safe
        inner = (dy * x).sum(self._axis, keepdim=True)
        return dy / safe - inner * dnorm / (safe * safe)

    grad = Op.grad


@register_op("ReverseSequence", versions=(10, 28))
class ReverseSequence(Op):
    """Reverse the first sequence_lens[b] elements along ``time_axis`` of each batch entry b."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @dataclass(frozen=True)
    class Attrs:
        batch_axis: int = 1
        time_axis: int = 0

    def infer(self, x, lens):
        axes = {self.attrs.batch_axis, self.attrs.time_axis}
        if x.rank < 2 or axes not in ({0, 1},):
            raise ShapeError(f"{self.debug_name}: input {x} must be rank >= 2 with batch_axis and "
                             f"time_axis being 0 and 1 (got {self.attrs}).")
        if lens.shape != (x.shape[self.attrs.batch_axis],) or not lens.dtype.is_int:
            raise ShapeError(f"{self.debug_name}: sequence_lens {lens} must be 1-D ints of the "
                             f"batch size {x.shape[self.attrs.batch_axis]}.")
        self._steps = x.shape[self.attrs.time_axis]
        return x

    def kernel(self, x, lens):
        # Source time index per (time, batch): reversed inside the sequence, kept after it.
        t = torch.arange(self._steps).unsqueeze(1)
        n = lens.long().clamp(0, self._steps).unsqueeze(0)
        source = torch.where(t < n, n - 1 - t, t)
        if self.attrs.batch_axis == 0:
            source = source.t()
        index = source.reshape(source.shape + (1,) * (x.dim() - 2)).expand(x.shape)
        return x.gather(self.attrs.time_axis, index)

    def grad(self, g):
        """The reversal is its own inverse."""
        g.set_input_grad(0, g.op("ReverseSequence", g.output_grad(0), g.input(1),
                                 batch_axis=self.attrs.batch_axis, time_axis=self.attrs.time_axis))


@register_op("Det", versions=(11, 22))
class Det(Op):
    """Determinant of the square matrices in the last two axes."""

    def infer(self, x):
        if x.rank < 2 or x.shape[-1] != x.shape[-2] or not x.dtype.is_float:
            raise ShapeError(f"{self.debug_name}: input {x} must be float [..., M, M].")
        return x.with_shape(x.shape[:-2])

    def kernel(self, x):
        return torch.linalg.det(x)

    def grad(self, g):
        g.set_input_grad(0, g.op("DetGrad", g.output_grad(0), g.input(0), g.output(0),
                                 domain=AI_GRAPHCORE))


@register_op("DetGrad", versions=1, domain=AI_GRAPHCORE)
class DetGrad(Op):
    """dx = dy · det(x) · inverse(x)ᵀ (Jacobi's formula); inputs (dy, x, det)."""

    def infer(self, dy, x, det):
        return x

    def kernel(self, dy, x, det):
        scale = (dy * det).unsqueeze(-1).unsqueeze(-1)
        return scale * torch.linalg.inv(x).transpose(-1, -2)


@register_op("MaxUnpool", versions=(9, 11, 22))
class MaxUnpool(Op):
    """Scatter X into a zero tensor at the flat positions I (MaxPool's indices, which count over
    the whole N·C·spatial tensor). The output size comes from kernel/strides/pads or the optional
    output_shape input."""

    const_inputs = (2,)

    @dataclass(frozen=True)
    class Attrs:
        kernel_shape: tuple[int, ...]
        pads: tuple[int, ...] | None = None
        strides: tuple[int, ...] | None = None

    def infer(self, x, indices, output_shape=None):
        k = self.attrs.kernel_shape
        spatial = x.rank - 2
        if len(k) != spatial or indices.shape != x.shape:
            raise ShapeError(f"{self.debug_name}: X {x}, I {indices} and kernel_shape {list(k)} "
                             f"do not match.")
        strides = self.attrs.strides or (1,) * spatial
        pads = self.attrs.pads or (0,) * (2 * spatial)
        shape = x.shape[:2] + tuple(
            (d - 1) * s + kk - pads[i] - pads[i + spatial]
            for i, (d, s, kk) in enumerate(zip(x.shape[2:], strides, k)))
        value = self.const_input(2)
        if value is not None:
            shape = tuple(int(v) for v in np.asarray(value))
            if len(shape) != x.rank:
                raise ShapeError(f"{self.debug_name}: output_shape {list(shape)} must have rank "
                                 f"{x.rank}.")
        self._out = shape
        return x.with_shape(shape)

    def kernel(self, x, indices, output_shape=None):
        out = torch.zeros(int(np.prod(self._out)), dtype=x.dtype)
        return out.scatter_(0, indices.reshape(-1).long(), x.reshape(-1)).reshape(self._out)

    def grad(self, g):
        g.set_input_grad(0, g.op("MaxUnpoolGrad", g.output_grad(0), g.input(1),
                                 domain=AI_GRAPHCORE))


@register_op("MaxUnpoolGrad", versions=1, domain=AI_GRAPHCORE)
class MaxUnpoolGrad(Op):
    """dx = dy gathered at the unpooling positions; inputs (dy, indices)."""

    def infer(self, dy, indices):
        return dy.with_shape(indices.shape)

    def kernel(self, dy, indices):
        return dy.reshape(-1).gather(0, indices.reshape(-1).long()).reshape(indices.shape)


@register_op("Unique", versions=(11, 28))
class Unique(Op):
    """Unique elements (or slices along ``axis``), first-occurrence indices, inverse indices and
    counts. The output size depends on the values, so the input must be constant
    (``const_inputs``); the op folds."""

    const_inputs = (0,)

    @dataclass(frozen=True)
    class Attrs:
        axis: int | None = None
        sorted: int = 1

    def infer(self, x):
        data = to_storage(_static_only(self, 0, "input"), x.dtype)
        self._axis = None if self.attrs.axis is None else normalize_axis(self, self.attrs.axis,
                                                                         x.rank)
        self._result = self._unique(data)
        y, indices, inverse, counts = self._result
        int64 = DataType.INT64
        return [x.with_shape(tuple(y.shape)), TensorInfo(int64, tuple(indices.shape)),
                TensorInfo(int64, tuple(inverse.shape)), TensorInfo(int64, tuple(counts.shape))]

    def _unique(self, data: torch.Tensor):
        axis = self._axis
        y, inverse, counts = torch.unique(data.reshape(-1) if axis is None else data, sorted=True,
                                          return_inverse=True, return_counts=True, dim=axis)
        positions = torch.arange(inverse.numel())
        first = torch.full((counts.numel(),), inverse.numel()).scatter_reduce_(
            0, inverse, positions, "amin")
        if not self.attrs.sorted:  # order of first occurrence
            order = torch.argsort(first)
            rank = torch.empty_like(order)
            rank[order] = torch.arange(order.numel())
            y = y.index_select(0 if axis is None else axis, order)
            first, counts, inverse = first[order], counts[order], rank[inverse]
        return y, first, inverse, counts

    def kernel(self, x):
        return tuple(self._result)
