"""Convolutions: Conv and ConvTranspose over 1, 2 or 3 spatial dims with their gradients, plus
the padding rules (explicit pads, auto_pad, ceil mode) that the pooling ops share.

The grad ops compute every wanted gradient (input, weights, bias) in one call of torch's
``convolution_backward``, the kernel torch's own autograd uses.

Next to a channels-last input (device/layout.py) oneDNN wants a 2-D convolution's weights
channels-last too, and converts contiguous ones on every call, forward and backward, into a new
tensor. ``channels_last_weight`` keeps one channels-last copy per weight tensor instead: the
forward rewrites it in place (no allocation), and the gradient op of the same step reuses it when
the weight's torch version counter shows no write since. The forward always rewrites the copy,
so a write the counter does not see (``torch._fused_sgd_`` leaves it unchanged) between runs
can never leave it stale; within a step a weight's updates are scheduled after its last reader.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .conv_partials import half_partials_conv_grads, half_partials_conv_nd
from .multi_grad import add_multi_grad_op, pick_grads, wanted_grads
from .registry import AI_GRAPHCORE, register_op

AUTO_PAD_MODES = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")

CONV_FNS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONV_TRANSPOSE_FNS = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}

_CL = torch.channels_last

# id(weight) -> (weak reference to it, its version when copied, channels-last copy).
_CL_WEIGHTS: dict[int, tuple] = {}
# Testing switch: False hands oneDNN the weights as they are (it converts them per call).
keep_channels_last_weights = True


def wants_channels_last_weight(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether oneDNN would convert ``w`` to channels-last for this channels-last ``x``."""
    return (keep_channels_last_weights and x.dim() == 4 and w.dim() == 4
            and x.dtype is torch.float32 and w.dtype is torch.float32
            and not x.is_contiguous() and x.is_contiguous(memory_format=_CL)
            and not w.is_contiguous(memory_format=_CL) and not w.is_inference()
            and not w.requires_grad)


def _forget(key: int, ref) -> None:
    entry = _CL_WEIGHTS.get(key)
    if entry is not None and entry[0] is ref:
        del _CL_WEIGHTS[key]


def channels_last_weight(x: torch.Tensor, w: torch.Tensor, refresh: bool) -> torch.Tensor:
    """``w`` as oneDNN wants it next to ``x`` (see the module doc): the kept channels-last copy,
    rewritten from ``w`` when ``refresh`` (a forward) or when ``w`` was written since."""
    if not wants_channels_last_weight(x, w):
        return w
    key = id(w)
    entry = _CL_WEIGHTS.get(key)
    if entry is not None and entry[0]() is w and entry[2].shape == w.shape:
        ref, version, kept = entry
        if refresh or version != w._version:
            kept.copy_(w)
            _CL_WEIGHTS[key] = (ref, w._version, kept)
        return kept
    kept = w.contiguous(memory_format=_CL)
    ref = weakref.ref(w, lambda r, k=key: _forget(k, r))
    _CL_WEIGHTS[key] = (ref, w._version, kept)
    return kept


@dataclass(frozen=True)
class Window:
    """A sliding window over the spatial dims, resolved to explicit numbers (one per dim)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out_sizes: tuple[int, ...]

    @property
    def symmetric(self) -> bool:
        return self.pads_begin == self.pads_end

    def torch_pad(self, pads_end: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The pads in F.pad order (last dim first, begin then end)."""
        end = self.pads_end if pads_end is None else pads_end
        out: list[int] = []
        for b, e in zip(reversed(self.pads_begin), reversed(end)):
            out += [b, e]
        return tuple(out)


def spatial_list(op: Op, name: str, values: tuple, n: int, default: int) -> tuple[int, ...]:
    """An attribute with one value per spatial dim (absent: ``default`` for each)."""
    if not values:
        return (default,) * n
    if len(values) != n:
        raise ShapeError(
            f"{op.debug_name}: attribute {name}={list(values)} needs {n} values, one per spatial "
            f"dim of the input."
        )
    return tuple(int(v) for v in values)


def _check_steps(
    op: Op, n: int, strides: tuple, dilations: tuple, auto_pad: str
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per-dim strides and dilations (default 1), after checking them and ``auto_pad``."""
    strides = spatial_list(op, "strides", strides, n, 1)
    dilations = spatial_list(op, "dilations", dilations, n, 1)
    if auto_pad not in AUTO_PAD_MODES:
        raise ShapeError(
            f"{op.debug_name}: auto_pad='{auto_pad}' is not one of {list(AUTO_PAD_MODES)}."
        )
    if any(s < 1 for s in strides) or any(d < 1 for d in dilations):
        raise ShapeError(
            f"{op.debug_name}: strides {list(strides)} and dilations {list(dilations)} must be "
            f">= 1."
        )
    return strides, dilations


def _split_pads(totals, auto_pad: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(begin, end) pads sharing each total; ONNX puts the odd unit at the end for SAME_UPPER,
    else (SAME_LOWER, or ConvTranspose's output_shape) at the start."""
    if auto_pad == "SAME_UPPER":
        begin = tuple(t // 2 for t in totals)
    else:
        begin = tuple(t - t // 2 for t in totals)
    return begin, tuple(t - b for t, b in zip(totals, begin))


def _explicit_pads(op: Op, pads: tuple, n: int, auto_pad: str):
    """(begin, end) pads of the ``pads`` attribute (none for VALID or when absent)."""
    if auto_pad == "VALID" or not pads:
        return (0,) * n, (0,) * n
    if len(pads) != 2 * n:
        raise ShapeError(
            f"{op.debug_name}: pads={list(pads)} needs {2 * n} values (begins then ends)."
        )
    return tuple(int(p) for p in pads[:n]), tuple(int(p) for p in pads[n:])


def resolve_window(
    op: Op,
    in_sizes: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple,
    dilations: tuple,
    pads: tuple,
    auto_pad: str,
    ceil_mode: bool = False,
) -> Window:
    """Output sizes and explicit begin/end pads of a convolution or pooling window (ONNX rules).

    With ``ceil_mode`` a last window that would start inside the end padding is dropped, as the
    ONNX reference, onnxruntime and torch all do.
    """
    n = len(in_sizes)
    strides, dilations = _check_steps(op, n, strides, dilations, auto_pad)
    extent = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out_sizes = tuple(-(-i // s) for i, s in zip(in_sizes, strides))
        totals = [max(0, (o - 1) * s + e - i) for o, s, e, i in zip(out_sizes, strides, extent, in_sizes)]
        begin, end = _split_pads(totals, auto_pad)
        return Window(kernel, strides, dilations, begin, end, out_sizes)
    begin, end = _explicit_pads(op, pads, n, auto_pad)
    if any(p < 0 for p in begin + end):
        raise ShapeError(f"{op.debug_name}: pads={list(pads)} must not be negative.")
    out_sizes = []
    for i, b, e, ext, s in zip(in_sizes, begin, end, extent, strides):
        span = i + b + e - ext
        if span < 0:
            raise ShapeError(
                f"{op.debug_name}: window extent {ext} (kernel {list(kernel)}, dilations "
                f"{list(dilations)}) exceeds the padded input size {i + b + e} "
                f"(input spatial sizes {list(in_sizes)})."
            )
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= i + b:
            o -= 1
        out_sizes.append(o)
    return Window(kernel, strides, dilations, begin, end, tuple(out_sizes))


@dataclass(frozen=True)
class ConvAttrs:
    """The attributes of Conv, which ConvTranspose extends."""

    auto_pad: str = "NOTSET"
    dilations: tuple[int, ...] = ()
    group: int = 1
    kernel_shape: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()


class _Convolution(Op):
    """Shared by Conv and ConvTranspose (and their grad ops): the operand checks, the one grad
    op for every wanted gradient, and the cost of the product."""

    uses_amp = True

    # W's layout, for messages: [M, C/group, k...] (Conv) or [C, M/group, k...] (ConvTranspose).
    weight_layout: ClassVar[str]
    grad_type: ClassVar[str]

    def check_operands(self, x: TensorInfo, w: TensorInfo) -> int:
        """The number of spatial dims, after checking X's rank and W's rank and dtype."""
        if x.rank < 3 or x.rank > 5:
            raise ShapeError(
                f"{self.debug_name}: X {x} must be [N, C, D1..Dn] with 1 to 3 spatial dims."
            )
        if w.rank != x.rank:
            raise ShapeError(
                f"{self.debug_name}: weights W {w} must have the rank of X {x} "
                f"({self.weight_layout})."
            )
        if x.dtype != w.dtype:
            raise ShapeError(f"{self.debug_name}: X {x} and W {w} have different dtypes.")
        return x.rank - 2

    def check_bias(self, bias: TensorInfo | None, channels: int, x: TensorInfo) -> None:
        if bias is None:
            return
        if bias.shape != (channels,):
            raise ShapeError(
                f"{self.debug_name}: bias B {bias} must have shape [{channels}] (one per output "
                f"channel)."
            )
        if bias.dtype != x.dtype:
            raise ShapeError(f"{self.debug_name}: bias B {bias} and X {x} have different dtypes.")

    def check_kernel_shape(self, w: TensorInfo) -> tuple[int, ...]:
        kernel = w.shape[2:]
        kernel_shape = self.attrs.kernel_shape
        if kernel_shape and tuple(kernel_shape) != kernel:
            raise ShapeError(
                f"{self.debug_name}: kernel_shape={list(kernel_shape)} differs from the spatial "
                f"dims of the weights W {w}."
            )
        return kernel

    def grad(self, g):
        # One grad op for all of X, W, B that need a gradient; its outputs follow ``wrt``.
        wrt = wanted_grads(g)
        if wrt:
            add_multi_grad_op(g, self.grad_type, g.output_grad(0), g.input(0), g.input(1),
                              wrt=wrt, **dataclasses.asdict(self.attrs))

    def product_rows(self) -> TensorInfo:
        """The tensor each of whose elements meets ``W.nelms / W.shape[0]`` weights."""
        raise NotImplementedError

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        w = self.inputs[1].info
        bias = self.outputs[0].info.nelms if len(self.inputs) > 2 and self.inputs[2] else 0
        return 2 * self.product_rows().nelms * (w.nelms // w.shape[0]) + bias, moved


class _ConvolutionGrad:
    """Mixin of ConvGrad and ConvTransposeGrad: the output infos and cost of the ``wrt`` grads.

    Inputs dY, X, W; dX and dW each cost the forward product (every element of
    ``product_rows()``, Conv: dY, ConvTranspose: X, does a multiply-add with
    ``W.nelms / W.shape[0]`` weights), and dB sums dY once.
    """

    def grad_infos(self, dy: TensorInfo, y: TensorInfo, x: TensorInfo, w: TensorInfo,
                   bias_channels: int) -> list[TensorInfo]:
        """The infos of the ``wrt`` gradients, after checking dY against the forward's Y."""
        if dy.shape != y.shape:
            raise ShapeError(f"{self.debug_name}: dY {dy} must have the output shape {y}.")
        wrt = self.attrs.wrt
        if any(i not in (0, 1, 2) for i in wrt) or not wrt:
            raise ShapeError(f"{self.debug_name}: wrt={list(wrt)} must list inputs 0, 1, 2.")
        infos = (x, w, TensorInfo(x.dtype, (bias_channels,)))
        self._mask = [i in wrt for i in range(3)]
        self._bias_sizes = [bias_channels] if self._mask[2] else None
        return [infos[i] for i in wrt]

    def cost(self) -> tuple[int, int]:
        _, moved = Op.cost(self)
        dy, w = self.inputs[0].info, self.inputs[2].info
        forward = 2 * self.product_rows().nelms * (w.nelms // w.shape[0])
        wrt = self.attrs.wrt
        return forward * sum(1 for i in wrt if i in (0, 1)) + (dy.nelms if 2 in wrt else 0), moved


@register_op("Conv", versions=(1, 11, 22))
class Conv(_Convolution):
    """Y = conv(X, W) + B with groups, strides, dilations and explicit or automatic pads."""

    weight_layout = "[M, C/group, k1..kn]"
    grad_type = "ConvGrad"
    Attrs = ConvAttrs
    # X channels-last (device/layout.py): oneDNN then convolves without reordering it.
    strided_inputs = True
    channels_last_inputs = (0,)

    def infer(self, x, w, b=None):
        at = self.attrs
        n = self.check_operands(x, w)
        group = at.group
        if group < 1 or x.shape[1] != w.shape[1] * group:
            raise ShapeError(
                f"{self.debug_name}: channel mismatch: X {x} has {x.shape[1]} input channels, "
                f"W {w} expects {w.shape[1]} per group x group={group} = {w.shape[1] * group}. "
                f"Check the layer's in_channels and groups."
            )
        if w.shape[0] % group:
            raise ShapeError(
                f"{self.debug_name}: W {w} has {w.shape[0]} output channels, not divisible by "
                f"group={group}."
            )
        self.check_bias(b, w.shape[0], x)
        kernel = self.check_kernel_shape(w)
        win = resolve_window(
            self, x.shape[2:], kernel, at.strides, at.dilations, at.pads, at.auto_pad
        )
        self._fn = CONV_FNS[n]
        self._stride = win.strides
        self._dilation = win.dilations
        self._groups = group
        # torch pads symmetrically inside the conv; only uneven pads need a separate F.pad.
        self._padding = win.pads_begin if win.symmetric else (0,) * n
        self._pre_pad = None if win.symmetric else win.torch_pad()
        return TensorInfo(x.dtype, (x.shape[0], w.shape[0]) + win.out_sizes)

    # convolutionOptions["partialsType"] = "half" or the builder's setPartialsType(half) may make
    # a float16 1-D, 2-D or 3-D convolution accumulate in float16 (half_partials_conv).
    supports_conv_half_partials = True

    def kernel(self, x, w, b=None):
        if self._pre_pad is not None:
            x = F.pad(x, self._pre_pad)
        if self.settings.half_partials and x.dtype == torch.float16:
            return half_partials_conv(self, x, w, b)
        w = channels_last_weight(x, w, refresh=True)
        return self._fn(x, w, b, self._stride, self._padding, self._dilation, self._groups)

    def product_rows(self) -> TensorInfo:
        # W is [M, C/group, k...]: each output element is a dot product of C/group·prod(k).
        return self.outputs[0].info


def half_partials_conv(op: Conv, x: torch.Tensor, w: torch.Tensor,
                       b: torch.Tensor | None) -> torch.Tensor:
    """A float16 convolution (1-D, 2-D or 3-D) whose sums run in float16, as the IPU's AMP
    units with half partials (ops/conv_partials.py)."""
    return half_partials_conv_nd(x, w, b, op._stride, op._padding, op._dilation, op._groups)


@register_op("ConvGrad", versions=1, domain=AI_GRAPHCORE)
class ConvGrad(_ConvolutionGrad, Conv):
    """dX, dW, dB of Conv (those listed in ``wrt``, in that order) from dY, X and W."""

    # With half partials its dX and dW products accumulate in float16 (ops/conv_partials.py).
    supports_conv_half_partials = True
    # dY and X channels-last (device/layout.py); dW is handed out contiguous, as W.
    strided_inputs = True
    channels_last_inputs = (0, 1)

    @dataclass(frozen=True)
    class Attrs(Conv.Attrs):
        wrt: tuple[int, ...] = (0, 1, 2)

    def infer(self, dy, x, w):
        y = Conv.infer(self, x, w)
        return self.grad_infos(dy, y, x, w, w.shape[0])

    def kernel(self, dy, x, w):
        if self._pre_pad is not None:
            x = F.pad(x, self._pre_pad)
        n = len(self._stride)
        if self.settings.half_partials and dy.dtype == torch.float16:
            grads = half_partials_conv_grads(dy, x, w, self._stride, self._padding,
                                             self._dilation, self._groups, self._mask)
        else:
            w = channels_last_weight(x, w, refresh=False)
            grads = torch.ops.aten.convolution_backward(
                dy, x, w, self._bias_sizes, self._stride, self._padding, self._dilation, False,
                (0,) * n, self._groups, self._mask,
            )
        if self._pre_pad is not None and grads[0] is not None:
            # The adjoint of padding is cropping the padded border off again.
            grads = (F.pad(grads[0], tuple(-p for p in self._pre_pad)),) + tuple(grads[1:])
        if grads[1] is not None and not grads[1].is_contiguous():
            # From channels-last operands oneDNN returns dW channels-last too.
            grads = (grads[0], grads[1].contiguous(), grads[2])
        return pick_grads(grads, self.attrs.wrt)

    def product_rows(self) -> TensorInfo:
        return self.inputs[0].info  # dY, the forward's Y


@register_op("ConvTranspose", versions=(1, 11, 22))
class ConvTranspose(_Convolution):
    """The gradient of Conv with respect to its input, used as an upsampling layer."""

    weight_layout = "[C, M/group, k1..kn]"
    grad_type = "ConvTransposeGrad"

    @dataclass(frozen=True)
    class Attrs(ConvAttrs):
        output_padding: tuple[int, ...] = ()
        output_shape: tuple[int, ...] = ()

    def infer(self, x, w, b=None):
        at = self.attrs
        n = self.check_operands(x, w)
        group = at.group
        if group < 1 or x.shape[1] != w.shape[0] or w.shape[0] % group:
            raise ShapeError(
                f"{self.debug_name}: channel mismatch: X {x} has {x.shape[1]} channels, W {w} "
                f"has {w.shape[0]} input channels (group={group}). Check the layer's in_channels."
            )
        out_channels = w.shape[1] * group
        self.check_bias(b, out_channels, x)
        kernel = self.check_kernel_shape(w)
        in_sizes = x.shape[2:]
        out_pad = spatial_list(self, "output_padding", at.output_padding, n, 0)
        strides, dilations = _check_steps(self, n, at.strides, at.dilations, at.auto_pad)
        extent = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
        # Length of the transposed convolution before any pad is cropped.
        full = tuple(s * (i - 1) + op + e for s, i, op, e in zip(strides, in_sizes, out_pad, extent))
        target = None
        if at.output_shape:
            target = tuple(at.output_shape[-n:])
            if len(at.output_shape) not in (n, n + 2):
                raise ShapeError(
                    f"{self.debug_name}: output_shape={list(at.output_shape)} needs {n} spatial "
                    f"sizes."
                )
        elif at.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            target = tuple(i * s for i, s in zip(in_sizes, strides))
        if target is not None:
            # A target larger than the full result gives negative pads: the output is extended
            # with zeros (at the end for an odd unit), as ONNX's reference computes it.
            totals = [f - t for f, t in zip(full, target)]
            begin, end = _split_pads(totals, at.auto_pad)
        else:
            begin, end = _explicit_pads(self, at.pads, n, at.auto_pad)
        out_sizes = tuple(f - bg - e for f, bg, e in zip(full, begin, end))
        if any(o <= 0 for o in out_sizes):
            raise ShapeError(
                f"{self.debug_name}: pads {list(begin) + list(end)} leave no output "
                f"(sizes {list(out_sizes)})."
            )
        self._fn = CONV_TRANSPOSE_FNS[n]
        self._stride, self._dilation, self._groups = strides, dilations, group
        # torch crops ``padding`` from both ends and appends ``output_padding`` (< stride or
        # dilation) at the end; other pad combinations crop or extend the full result.
        torch_out_pad = tuple(op + bg - e for op, bg, e in zip(out_pad, begin, end))
        if all(0 <= p < max(s, d) for p, s, d in zip(torch_out_pad, strides, dilations)):
            self._padding, self._out_pad, self._crop = begin, torch_out_pad, None
        else:
            self._padding, self._out_pad = (0,) * n, (0,) * n
            produced = tuple(s * (i - 1) + e for s, i, e in zip(strides, in_sizes, extent))
            crop: list[int] = []
            for bg, o, p in zip(reversed(begin), reversed(out_sizes), reversed(produced)):
                crop += [-bg, o + bg - p]
            self._crop = tuple(crop)
            self._bias_shape = (1, out_channels) + (1,) * n
        return TensorInfo(x.dtype, (x.shape[0], out_channels) + out_sizes)

    def kernel(self, x, w, b=None):
        if self._crop is None:
            return self._fn(
                x, w, b, self._stride, self._padding, self._out_pad, self._groups, self._dilation
            )
        y = F.pad(self._fn(x, w, None, self._stride, 0, 0, self._groups, self._dilation), self._crop)
        return y if b is None else y.add_(b.view(self._bias_shape))

    def product_rows(self) -> TensorInfo:
        # W is [C, M/group, k...]: each input element scatters into M/group·prod(k) outputs.
        return self.inputs[0].info


@register_op("ConvTransposeGrad", versions=1, domain=AI_GRAPHCORE)
class ConvTransposeGrad(_ConvolutionGrad, ConvTranspose):
    """dX, dW, dB of ConvTranspose (those listed in ``wrt``, in that order) from dY, X and W."""

    @dataclass(frozen=True)
    class Attrs(ConvTranspose.Attrs):
        wrt: tuple[int, ...] = (0, 1, 2)

    def infer(self, dy, x, w):
        y = ConvTranspose.infer(self, x, w)
        self._sum_dims = (0,) + tuple(range(2, y.rank))
        return self.grad_infos(dy, y, x, w, y.shape[1])

    def kernel(self, dy, x, w):
        mask = self._mask
        db = dy.sum(self._sum_dims) if mask[2] else None
        if self._crop is not None:
            # The forward cropped (or zero-extended) the full result: undo it on dY.
            dy = F.pad(dy, tuple(-c for c in self._crop))
        dx, dw, _ = torch.ops.aten.convolution_backward(
            dy, x, w, None, self._stride, self._padding, self._dilation, True, self._out_pad,
            self._groups, [mask[0], mask[1], False],
        )
        return pick_grads((dx, dw, db), self.attrs.wrt)

    def product_rows(self) -> TensorInfo:
        return self.inputs[1].info  # X
