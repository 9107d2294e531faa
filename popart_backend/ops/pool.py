"""Pooling: MaxPool (with ONNX's Indices output), AveragePool, LpPool and their Global forms.

Each windowed pool resolves its window once in infer(). When torch's own pooling computes
exactly the ONNX result (symmetric pads within torch's limits) the kernel is one torch call;
otherwise the input is padded (or cropped) to the exact extent the output needs, and an
average's divisor is precomputed per output position.

Gradients: MaxPool routes dY to the position torch's pooling picks (the first maximum of a
window, so ties go where torch sends them) with torch's own backward kernels; in training the
forward keeps those positions on X (``_keep_indices``), so the grad op need not pool again.
Averages and Lp norms spread dY over their windows (torch's avg_pool backward, or the adjoint
of the window sum, a transposed convolution with a window of ones, for pads and dilations
torch lacks).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .conv import CONV_FNS, Window, resolve_window
from .registry import AI_GRAPHCORE, register_op

_MAX_POOL_FNS = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL_FNS = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _spatial_rank(op: Op, x: TensorInfo, low: int = 1, high: int = 3) -> int:
    n = x.rank - 2
    if not low <= n <= high:
        raise ShapeError(
            f"{op.debug_name}: X {x} must be [N, C, D1..Dn] with {low} to {high} spatial dims."
        )
    return n


def _exact_end_pads(win: Window, in_sizes: tuple[int, ...]) -> tuple[int, ...]:
    """End pads making an unpadded torch pool (floor mode) produce exactly ``win.out_sizes``.

    Negative values crop input that no window reaches; larger values extend a ceil-mode window.
    """
    return tuple(
        (o - 1) * s + (k - 1) * d + 1 - i - b
        for o, s, k, d, i, b in zip(
            win.out_sizes, win.strides, win.kernel, win.dilations, in_sizes, win.pads_begin
        )
    )


def _torch_can_pad(win: Window) -> bool:
    """torch pools pad symmetrically, by at most half the kernel size (dilation aside)."""
    return win.symmetric and all(2 * p <= k for p, k in zip(win.pads_begin, win.kernel))


@dataclass(frozen=True)
class _WindowV1Attrs:
    """The window attributes of MaxPool-1 and AveragePool-1, which later versions extend."""

    kernel_shape: tuple[int, ...]
    auto_pad: str = "NOTSET"
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()


class _WindowPool(Op):
    """Shared attribute handling: older versions' Attrs lack later fields, whose defaults then
    mean exactly what the older version did (no dilation, floor mode, ...)."""

    # The grad ops read dY (input 0), which has the pooled output's shape.
    pooled_input: ClassVar[bool] = False
    grad_type: ClassVar[str]
    # The grad op also reads Y (after dY and X).
    grad_reads_output: ClassVar[bool] = False

    def cost(self) -> tuple[int, int]:
        # One compare or add per element of each window.
        _, moved = super().cost()
        pooled = self.inputs[0] if self.pooled_input else self.outputs[0]
        return pooled.info.nelms * math.prod(self.attrs.kernel_shape), moved

    def full_attrs(self):
        return self.Attrs(**dataclasses.asdict(self.attrs))

    def window(self, x: TensorInfo, at) -> Window:
        n = _spatial_rank(self, x)
        if len(at.kernel_shape) != n:
            raise ShapeError(
                f"{self.debug_name}: kernel_shape={list(at.kernel_shape)} needs {n} values for X "
                f"{x}."
            )
        return resolve_window(
            self,
            x.shape[2:],
            tuple(at.kernel_shape),
            at.strides,
            at.dilations,
            at.pads,
            at.auto_pad,
            bool(at.ceil_mode),
        )

    def grad(self, g):
        extra = (g.output(0),) if self.grad_reads_output else ()
        g.set_input_grad(0, g.op(self.grad_type, g.output_grad(0), g.input(0), *extra,
                                 domain=AI_GRAPHCORE, **dataclasses.asdict(self.full_attrs())))


class _WindowPoolGrad:
    """Mixin of the windowed pools' grad ops: inputs dY, X (, Y) and the forward op's latest
    Attrs (the forward's ``grad()`` passes every field, defaults included)."""

    pooled_input = True

    @classmethod
    def attrs_type(cls, version: int):
        return cls.Attrs

    def check_dy(self, dy: TensorInfo, y: TensorInfo) -> None:
        if dy.shape != y.shape:
            raise ShapeError(f"{self.debug_name}: dY {dy} must have the output shape {y}.")


@register_op("MaxPool", versions=(1, 8, 10, 11, 12, 22))
class MaxPool(_WindowPool):
    # Channels-last X in (device/layout.py): torch pools it in place of layout; the indices
    # count within each plane whatever the layout.
    strided_inputs = True
    """Y = max over each window; Indices (version >= 8) = flat index of the max in X."""

    grad_type = "MaxPoolGrad"
    V1Attrs = _WindowV1Attrs

    @dataclass(frozen=True)
    class V8Attrs(V1Attrs):
        storage_order: int = 0

    @dataclass(frozen=True)
    class Attrs(V8Attrs):
        ceil_mode: int = 0
        dilations: tuple[int, ...] = ()

    @classmethod
    def attrs_type(cls, version: int):
        return cls.V1Attrs if version < 8 else cls.V8Attrs if version < 10 else cls.Attrs

    def infer(self, x):
        y = self.setup(x)
        if self.version < 8:
            return y
        return [y, y.with_dtype(DataType.INT64)]

    def setup(self, x: TensorInfo) -> TensorInfo:
        """Resolve the window and the torch call once; returns Y's info."""
        at = self.full_attrs()
        win = self.window(x, at)
        n = x.rank - 2
        in_sizes = x.shape[2:]
        self._fn = _MAX_POOL_FNS[n]
        self._kernel, self._stride, self._dilation = win.kernel, win.strides, win.dilations
        if _torch_can_pad(win):
            self._padding, self._ceil, self._pre_pad = win.pads_begin, bool(at.ceil_mode), None
            padded, offset = in_sizes, (0,) * n
        else:
            end = _exact_end_pads(win, in_sizes)
            self._padding, self._ceil = (0,) * n, False
            self._pre_pad = win.torch_pad(end)
            padded = tuple(i + b + e for i, b, e in zip(in_sizes, win.pads_begin, end))
            offset = win.pads_begin
        is_float = x.dtype.torch.is_floating_point
        self._pad_value = float("-inf") if is_float else float(torch.iinfo(x.dtype.torch).min)
        # torch's indices count within the (padded) plane of one (n, c); ONNX counts in the
        # unpadded X over all of N, C and the spatial dims, in C or Fortran order.
        self._index_map = None
        if self._pre_pad is not None or at.storage_order:
            self._index_map = _index_map(padded, offset, in_sizes, bool(at.storage_order))
        planes = x.shape[0] * x.shape[1]
        self._plane_offset = (torch.arange(planes, dtype=torch.int64) * math.prod(in_sizes)).view(
            x.shape[:2] + (1,) * n
        )
        return TensorInfo(x.dtype, x.shape[:2] + win.out_sizes)

    # Set by grad(): a MaxPoolGrad will read X, so the forward keeps the maxima's positions.
    _keep_for_grad = False

    def grad(self, g):
        self._keep_for_grad = True
        super().grad(g)

    def _window_args(self) -> tuple:
        return (self._kernel, self._stride, self._padding, self._dilation, self._ceil)

    def kernel(self, x):
        if self._pre_pad is not None:
            x = F.pad(x, self._pre_pad, value=self._pad_value)
        if len(self.outputs) < 2 or self.outputs[1] is None:
            if self._keep_for_grad and self._pre_pad is None:
                # Pooling with indices costs about what pooling without does; the grad op
                # then only scatters dY (torch's autograd saves them the same way).
                args = self._window_args()
                y, idx = self._fn(x, *args, True)
                _keep_indices(x, args, idx)
            else:
                y = self._fn(x, self._kernel, self._stride, self._padding, self._dilation,
                             self._ceil)
            return y if len(self.outputs) < 2 else (y, None)
        y, idx = self._fn(
            x, self._kernel, self._stride, self._padding, self._dilation, self._ceil, True
        )
        if self._index_map is not None:
            idx = self._index_map[idx]
        return y, idx.add_(self._plane_offset)


def _max_pool_backward(n: int):
    """torch's max-pool backward for ``n`` spatial dims (1-D through the 2-D kernel)."""
    if n == 3:
        return torch.ops.aten.max_pool3d_with_indices_backward
    two_d = torch.ops.aten.max_pool2d_with_indices_backward
    if n == 2:
        return two_d

    def one_d(dy, x, kernel, stride, padding, dilation, ceil, idx):
        dx = two_d(dy.unsqueeze(-2), x.unsqueeze(-2), (1,) + tuple(kernel), (1,) + tuple(stride),
                   (0,) + tuple(padding), (1,) + tuple(dilation), ceil, idx.unsqueeze(-2))
        return dx.squeeze(-2)

    return one_d


@register_op("MaxPoolGrad", versions=1, domain=AI_GRAPHCORE)
class MaxPoolGrad(_WindowPoolGrad, MaxPool):
    """dX of MaxPool: the window maxima are found again (indices) and dY is routed there."""

    strided_inputs = True

    def infer(self, dy, x):
        self.check_dy(dy, self.setup(x))
        self._backward = _max_pool_backward(x.rank - 2)
        return x

    def kernel(self, dy, x):
        args = self._window_args()
        idx = _kept_indices(x, args) if self._pre_pad is None else None
        if self._pre_pad is not None:
            x = F.pad(x, self._pre_pad, value=self._pad_value)
        if idx is None:
            _, idx = self._fn(x, *args, True)
        dx = self._backward(dy, x, *args, idx)
        if self._pre_pad is not None:
            dx = F.pad(dx, tuple(-p for p in self._pre_pad))
        return dx


# Attribute of a pooled X holding (window args, X's version, torch's indices of the maxima).
_KEPT_INDICES = "_popart_max_pool_indices"


def _keep_indices(x: torch.Tensor, args: tuple, idx: torch.Tensor) -> None:
    """Remember ``idx`` on ``x`` itself, so whichever step holds this value (any replica,
    micro-batch or pipeline stash) finds the indices of exactly this tensor, and they are
    freed with it."""
    if not x.is_inference():  # inference tensors have no version counter
        x.__dict__[_KEPT_INDICES] = (args, x._version, idx)


def _kept_indices(x: torch.Tensor, args: tuple) -> torch.Tensor | None:
    """The indices the forward kept on ``x`` for this window, unless X changed in place since
    (then, or for another tensor, the grad op pools again)."""
    kept = x.__dict__.get(_KEPT_INDICES)
    if kept is None or kept[0] != args or kept[1] != x._version:
        return None
    return kept[2]


def _index_map(padded, offset, in_sizes, column_major: bool) -> torch.Tensor:
    """Flat index in the padded plane -> ONNX flat index in the unpadded plane (-1: padding)."""
    grids = torch.meshgrid(*[torch.arange(p) - o for p, o in zip(padded, offset)], indexing="ij")
    inside = torch.ones(padded, dtype=torch.bool)
    flat = torch.zeros(padded, dtype=torch.int64)
    order = range(len(in_sizes)) if column_major else reversed(range(len(in_sizes)))
    stride = 1
    for axis in order:
        inside &= (grids[axis] >= 0) & (grids[axis] < in_sizes[axis])
        flat += grids[axis] * stride
        stride *= in_sizes[axis]
    return torch.where(inside, flat, -1).reshape(-1)


class _SumPool:
    """Window sums over a pre-padded input, for averages and Lp norms with any pad/dilation."""

    def __init__(self, x: TensorInfo, win: Window, pre_pad: tuple[int, ...], padded):
        self.n = x.rank - 2
        self.pre_pad = pre_pad
        self.win = win
        self.dilated = any(d != 1 for d in win.dilations)
        self.planes = (x.shape[0] * x.shape[1], 1)
        self.padded = tuple(padded)
        self.out_shape = x.shape[:2] + win.out_sizes
        if self.dilated:
            # A depthwise convolution with a window of ones sums dilated windows.
            self.ones = torch.ones((1, 1) + win.kernel, dtype=x.dtype.torch)
            self.conv = CONV_FNS[self.n]
        else:
            self.avg = _AVG_POOL_FNS[self.n]
            self.volume = math.prod(win.kernel)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of each window of ``x`` (already raised to a power if needed)."""
        x = F.pad(x, self.pre_pad)
        if self.dilated:
            flat = x.reshape(self.planes + self.padded)
            # (ones match X's dtype; only a float64 gradient check differs from the model's)
            ones = self.ones if self.ones.dtype == x.dtype else self.ones.to(x.dtype)
            y = self.conv(flat, ones, None, self.win.strides, 0, self.win.dilations)
            return y.reshape(self.out_shape)
        return self.avg(x, self.win.kernel, self.win.strides, 0).mul_(self.volume)


def _counts(win: Window, in_sizes, include_pad: bool) -> list[list[int]]:
    """Per spatial dim, the number of counted elements in each window (pads count or not)."""
    result = []
    for i, b, e_explicit, o, s, k, d in zip(
        in_sizes, win.pads_begin, win.pads_end, win.out_sizes, win.strides, win.kernel, win.dilations
    ):
        lo, hi = (0, b + i + e_explicit) if include_pad else (b, b + i)
        result.append(
            [sum(1 for t in range(k) if lo <= j * s + t * d < hi) for j in range(o)]
        )
    return result


@register_op("AveragePool", versions=(1, 7, 10, 11, 19, 22))
class AveragePool(_WindowPool):
    """Y = mean over each window; count_include_pad decides whether pads count."""

    grad_type = "AveragePoolGrad"
    V1Attrs = _WindowV1Attrs

    @dataclass(frozen=True)
    class V7Attrs(V1Attrs):
        count_include_pad: int = 0

    @dataclass(frozen=True)
    class V10Attrs(V7Attrs):
        ceil_mode: int = 0

    @dataclass(frozen=True)
    class Attrs(V10Attrs):
        dilations: tuple[int, ...] = ()

    @classmethod
    def attrs_type(cls, version: int):
        if version < 7:
            return cls.V1Attrs
        return cls.V7Attrs if version < 10 else cls.V10Attrs if version < 19 else cls.Attrs

    def infer(self, x):
        at = self.full_attrs()
        win = self.window(x, at)
        self._win = win
        include_pad = bool(at.count_include_pad)
        in_sizes = x.shape[2:]
        self._sum = None
        undilated = all(d == 1 for d in win.dilations)
        if undilated and win.symmetric and all(2 * p <= k for p, k in zip(win.pads_begin, win.kernel)):
            # torch's divisor rule (pads count up to the explicit pad, never the ceil overhang)
            # is ONNX's, so one call suffices.
            self._fn = _AVG_POOL_FNS[x.rank - 2]
            self._args = (win.kernel, win.strides, win.pads_begin, bool(at.ceil_mode), include_pad)
        else:
            end = _exact_end_pads(win, in_sizes)
            padded = tuple(i + b + e for i, b, e in zip(in_sizes, win.pads_begin, end))
            self._sum = _SumPool(x, win, win.torch_pad(end), padded)
            counts = _counts(win, in_sizes, include_pad)
            grid = torch.ones(win.out_sizes, dtype=torch.float64)
            for axis, c in enumerate(counts):
                shape = [1] * len(counts)
                shape[axis] = len(c)
                grid = grid * torch.tensor(c, dtype=torch.float64).view(shape)
            if (grid == 0).any():
                raise ShapeError(
                    f"{self.debug_name}: some windows cover only padding (pads "
                    f"{list(win.pads_begin) + list(win.pads_end)}, kernel {list(win.kernel)})."
                )
            self._inv_count = (1.0 / grid).to(x.dtype.torch)
        return TensorInfo(x.dtype, x.shape[:2] + win.out_sizes)

    def kernel(self, x):
        if self._sum is None:
            return self._fn(x, *self._args)
        return self._sum(x).mul_(self._inv_count)


class _SumPoolAdjoint:
    """The adjoint of ``_SumPool``: each window's gradient added back onto every input element
    it covers, as the input gradient of a convolution with a window of ones, then cropped."""

    def __init__(self, x: TensorInfo, win: Window, pre_pad: tuple[int, ...], padded):
        n = x.rank - 2
        self.win = win
        self.planes = (x.shape[0] * x.shape[1], 1)
        self.padded_planes = self.planes + tuple(padded)
        self.ones = torch.ones((1, 1) + win.kernel, dtype=x.dtype.torch)
        self.crop = tuple(-p for p in pre_pad)
        self.x_shape = x.shape[:2] + tuple(padded)
        self.out_planes = self.planes + win.out_sizes
        self.zeros = (0,) * n

    def __call__(self, dsum: torch.Tensor) -> torch.Tensor:
        # Only the input's size matters to the input gradient: an expanded scalar stands in.
        shape_only = dsum.new_zeros(()).expand(self.padded_planes)
        dx = torch.ops.aten.convolution_backward(
            dsum.reshape(self.out_planes), shape_only, self.ones, None, self.win.strides,
            self.zeros, self.win.dilations, False, self.zeros, 1, [True, False, False],
        )[0]
        return F.pad(dx.reshape(self.x_shape), self.crop)


_AVG_POOL_BACKWARD = {2: torch.ops.aten.avg_pool2d_backward, 3: torch.ops.aten.avg_pool3d_backward}


@register_op("AveragePoolGrad", versions=1, domain=AI_GRAPHCORE)
class AveragePoolGrad(_WindowPoolGrad, AveragePool):
    """dX of AveragePool: dY divided by each window's count, spread over the window."""

    def infer(self, dy, x):
        self.check_dy(dy, AveragePool.infer(self, x))
        if self._sum is not None:
            s = self._sum
            self._adjoint = _SumPoolAdjoint(x, s.win, s.pre_pad, s.padded)
        else:
            n = x.rank - 2
            self._one_d = n == 1
            kernel, stride, pads, ceil, include = self._args
            if self._one_d:
                kernel, stride, pads = (1,) + kernel, (1,) + stride, (0,) + pads
            self._backward = _AVG_POOL_BACKWARD[max(n, 2)]
            self._backward_args = (kernel, stride, pads, ceil, include, None)
        return x

    def kernel(self, dy, x):
        if self._sum is not None:
            return self._adjoint(dy * self._inv_count)
        if self._one_d:
            return self._backward(dy.unsqueeze(-2), x.unsqueeze(-2), *self._backward_args).squeeze(-2)
        return self._backward(dy, x, *self._backward_args)


@register_op("LpPool", versions=(1, 2, 11, 18, 22))
class LpPool(_WindowPool):
    """Y = (sum over each window of |x|^p)^(1/p); pads contribute zeros."""

    grad_type = "LpPoolGrad"
    grad_reads_output = True

    @dataclass(frozen=True)
    class V1Attrs:
        kernel_shape: tuple[int, ...] = ()
        auto_pad: str = "NOTSET"
        p: float = 2.0
        pads: tuple[int, ...] = ()
        strides: tuple[int, ...] = ()

    @dataclass(frozen=True)
    class V2Attrs:
        kernel_shape: tuple[int, ...]
        auto_pad: str = "NOTSET"
        p: int = 2
        pads: tuple[int, ...] = ()
        strides: tuple[int, ...] = ()

    @dataclass(frozen=True)
    class Attrs(V2Attrs):
        ceil_mode: int = 0
        dilations: tuple[int, ...] = ()

    @classmethod
    def attrs_type(cls, version: int):
        return cls.V1Attrs if version < 2 else cls.V2Attrs if version < 18 else cls.Attrs

    def full_attrs(self):
        values = dataclasses.asdict(self.attrs)
        if not values["kernel_shape"]:
            raise ShapeError(f"{self.debug_name}: the kernel_shape attribute is required.")
        return self.Attrs(**values)

    def infer(self, x):
        at = self.full_attrs()
        win = self.window(x, at)
        in_sizes = x.shape[2:]
        end = _exact_end_pads(win, in_sizes)
        padded = tuple(i + b + e for i, b, e in zip(in_sizes, win.pads_begin, end))
        self._sum = _SumPool(x, win, win.torch_pad(end), padded)
        self._p = at.p
        return TensorInfo(x.dtype, x.shape[:2] + win.out_sizes)

    def kernel(self, x):
        p = self._p
        if p == 2:
            return self._sum(x * x).sqrt_()
        if p == 1:
            return self._sum(x.abs())
        return self._sum(x.abs().pow_(p)).pow_(1.0 / p)


@register_op("LpPoolGrad", versions=1, domain=AI_GRAPHCORE)
class LpPoolGrad(_WindowPoolGrad, LpPool):
    """dX = adjoint(dY * Y^(1-p)) * |X|^(p-1) * sign(X); Y = 0 windows give NaN, as torch's
    norm backward at zero does for p < 1 and as 0/0 does here."""

    def infer(self, dy, x, y):
        LpPool.infer(self, x)
        s = self._sum
        self._adjoint = _SumPoolAdjoint(x, s.win, s.pre_pad, s.padded)
        return x

    def kernel(self, dy, x, y):
        p = self._p
        if p == 1:
            return self._adjoint(dy) * torch.sign(x)
        if p == 2:
            return self._adjoint(dy / y) * x
        return self._adjoint(dy * y.pow(1 - p)) * x.abs().pow(p - 1) * torch.sign(x)


class _GlobalPool(Op):
    """Reduce all spatial dims to size 1."""

    def cost(self) -> tuple[int, int]:
        # Every input element enters one reduction.
        _, moved = super().cost()
        return self.inputs[0].info.nelms, moved

    def infer(self, x):
        if x.rank < 3:
            raise ShapeError(f"{self.debug_name}: X {x} must be [N, C, D1..Dn] with n >= 1.")
        self._dims = tuple(range(2, x.rank))
        return TensorInfo(x.dtype, x.shape[:2] + (1,) * (x.rank - 2))


@register_op("GlobalAveragePool", versions=(1, 22))
class GlobalAveragePool(_GlobalPool):
    strided_inputs = True  # a mean over the spatial dims, any layout (device/layout.py)

    def kernel(self, x):
        return x.mean(self._dims, keepdim=True)

    def grad(self, g):
        g.set_input_grad(0, g.op("GlobalAveragePoolGrad", g.output_grad(0), domain=AI_GRAPHCORE,
                                 shape=g.input_info(0).shape))


@register_op("GlobalAveragePoolGrad", versions=1, domain=AI_GRAPHCORE)
class GlobalAveragePoolGrad(Op):
    """dX = dY / (spatial size), broadcast over the spatial dims."""

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...]

    def infer(self, dy):
        self._scale = 1.0 / math.prod(self.attrs.shape[2:])
        return dy.with_shape(self.attrs.shape)

    def kernel(self, dy):
        return (dy * self._scale).expand(self.attrs.shape).contiguous()


@register_op("GlobalMaxPool", versions=(1, 22))
class GlobalMaxPool(_GlobalPool):
    strided_inputs = True  # a max over the spatial dims, any layout (device/layout.py)

    def kernel(self, x):
        return x.amax(self._dims, keepdim=True)

    def grad(self, g):
        g.set_input_grad(0, g.op("GlobalMaxPoolGrad", g.output_grad(0), g.input(0),
                                 domain=AI_GRAPHCORE))


@register_op("GlobalMaxPoolGrad", versions=1, domain=AI_GRAPHCORE)
class GlobalMaxPoolGrad(Op):
    """dX: dY at the first maximum of each (n, c) plane (as a max pool over the whole plane
    routes it), zero elsewhere."""

    def infer(self, dy, x):
        self._planes = x.shape[:2] + (-1,)
        return x

    def kernel(self, dy, x):
        flat = x.reshape(self._planes)
        index = flat.argmax(-1, keepdim=True)
        dx = torch.zeros_like(flat).scatter_(-1, index, dy.reshape(index.shape).to(x.dtype))
        return dx.reshape(x.shape)


@register_op("GlobalLpPool", versions=(1, 2, 22))
class GlobalLpPool(_GlobalPool):
    @dataclass(frozen=True)
    class Attrs:
        p: int = 2

    @dataclass(frozen=True)
    class V1Attrs:
        p: float = 2.0

    @classmethod
    def attrs_type(cls, version: int):
        return cls.V1Attrs if version < 2 else cls.Attrs

    def kernel(self, x):
        return torch.linalg.vector_norm(x, ord=self.attrs.p, dim=self._dims, keepdim=True)

    def grad(self, g):
        g.set_input_grad(0, g.op("GlobalLpPoolGrad", g.output_grad(0), g.input(0), g.output(0),
                                 domain=AI_GRAPHCORE, p=float(self.attrs.p)))


@register_op("GlobalLpPoolGrad", versions=1, domain=AI_GRAPHCORE)
class GlobalLpPoolGrad(Op):
    """dX = dY * Y^(1-p) * |X|^(p-1) * sign(X), broadcast over the pooled dims."""

    @dataclass(frozen=True)
    class Attrs:
        p: float = 2.0

    def infer(self, dy, x, y):
        return x

    def kernel(self, dy, x, y):
        p = self.attrs.p
        if p == 1:
            return dy * torch.sign(x)
        if p == 2:
            return dy / y * x
        return dy * y.pow(1 - p) * x.abs().pow(p - 1) * torch.sign(x)
