"""Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, and the integer
products MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv, at every ONNX since-version
up to opset 28.

A scale (and its zero point, of the same shape) applies per tensor (a scalar), per axis (a 1-D
tensor along ``axis``) or per block (the input's rank, ``block_size`` elements of ``axis``
sharing one scale, opset 21+). ``infer()`` resolves which, and the kernels expand the scale to
the input's shape with one reshape or repeat_interleave. Rounding is half to even
(``torch.round``); integer targets saturate to their range. The simulator stores float8 /
float4 / float6 values as exact float32 (``dtypes.py``), so quantizing to them rounds onto the
type's grid here (``_round_to_format``), saturating or overflowing to inf / NaN per
``saturate``; the 4- and 2-bit integers live in int8 / uint8 and only need their range.

The integer products are exact: MatMulInteger accumulates in int32 (wrapping as an int32
accumulator does), convolutions run in float64, which holds every sum of 8-bit products exactly.
The QLinear ops then requantize the int32 accumulator as onnxruntime does: float32 accumulator
times the float32 multiplier ``a_scale * b_scale / y_scale``, rounded, plus the zero point.

Not differentiable: quantized values are integers (autodiff follows float tensors only), and
the float outputs of DequantizeLinear (from a float scale) and DynamicQuantizeLinear (its scale)
have no gradient; a backward pass through them fails naming the op. Detach those paths.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..dtypes import DataType
from ..errors import ModelError, ShapeError, UnsupportedOpError, popart_exception
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import check_dtypes, normalize_axis
from .conv import CONV_FNS, ConvAttrs, resolve_window
from .matmul import matmul_shape
from .registry import register_op

# Saturation ranges of the integer targets, by ONNX element type code (uint8, int8, uint16,
# int16, uint4, int4, uint2, int2).
_INT_RANGES = {2: (0, 255), 3: (-128, 127), 4: (0, 65535), 5: (-32768, 32767), 21: (0, 15),
               22: (-8, 7), 25: (0, 3), 26: (-2, 1)}
# The float targets, by code: (mantissa bits, smallest normal exponent, largest finite value,
# what an overflow becomes without saturation: e5m2 has infinities, the others NaN). float4 and
# float6 have no overflow encoding, so they always saturate; float8 does when ``saturate``.
_FLOAT_FORMATS = {
    17: (3, -6, 448.0, math.nan),  # float8e4m3fn
    18: (3, -7, 240.0, math.nan),  # float8e4m3fnuz
    19: (2, -14, 57344.0, math.inf),  # float8e5m2
    20: (2, -15, 57344.0, math.nan),  # float8e5m2fnuz
    23: (1, 0, 6.0, None),  # float4e2m1
    27: (3, 0, 7.5, None),  # float6e2m3
    28: (2, -2, 28.0, None),  # float6e3m2
}
_SCALE_FLOATS = (DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16)


def _attr(op: Op, name: str):
    """Attribute ``name`` of the op's version; None when that version does not have it."""
    names = {f.name for f in dataclasses.fields(op.attrs)}
    return getattr(op.attrs, name) if name in names else None


def _data_type(op: Op, code: int, what: str) -> DataType:
    """DataType of an ONNX element type code given by an attribute."""
    try:
        return DataType.from_onnx(code)
    except popart_exception as exc:  # re-raised naming the op; DataType lists supported types
        raise UnsupportedOpError(f"{op.debug_name}: {what}={code}: {exc}") from None


@dataclass(frozen=True)
class _Granularity:
    """How a scale (or zero point) tensor expands to the quantized tensor's shape."""

    view: tuple[int, ...]  # reshape of a per-tensor / per-axis scale; unused when blocked
    axis: int
    block_size: int  # > 0: blocked along ``axis``
    length: int  # the input's size along ``axis``

    def expand(self, t: torch.Tensor) -> torch.Tensor:
        if self.block_size:
            return t.repeat_interleave(self.block_size, self.axis).narrow(self.axis, 0, self.length)
        return t.reshape(self.view)


def _granularity(op: Op, x: TensorInfo, scale: TensorInfo, zero_point: TensorInfo | None
                 ) -> _Granularity:
    """Per-tensor, per-axis or blocked, from the scale's shape and the op's attributes."""
    # A one-element zero point goes with a scalar scale (the backend tests write them so).
    if zero_point is not None and zero_point.shape != scale.shape and not (
            zero_point.nelms == 1 and scale.nelms == 1):
        raise ShapeError(
            f"{op.debug_name}: the zero point {zero_point} must have the scale's shape {scale}.")
    axis_attr = _attr(op, "axis")
    block_size = _attr(op, "block_size") or 0
    if block_size < 0:
        raise ShapeError(f"{op.debug_name}: block_size={block_size} must be positive.")
    if scale.nelms == 1 and scale.rank <= 1 and not block_size:
        return _Granularity((), 0, 0, 0)
    if axis_attr is None:
        raise ShapeError(
            f"{op.debug_name}: {op.op_type}-{op.version} takes a scalar scale only (per-tensor "
            f"quantization), got {scale}. Per-axis scales need opset 13.")
    axis = normalize_axis(op, axis_attr, x.rank)
    length = x.shape[axis]
    if not block_size:
        if scale.rank != 1 or scale.shape[0] != length:
            raise ShapeError(
                f"{op.debug_name}: a per-axis scale must be 1-D with the {length} elements of "
                f"axis {axis} of the input {x}, got {scale}. (Blocked quantization needs "
                f"block_size > 0, opset 21+.)")
        return _Granularity((length,) + (1,) * (x.rank - axis - 1), axis, 0, length)
    expected = tuple(-(-d // block_size) if i == axis else d for i, d in enumerate(x.shape))
    if scale.shape != expected:
        raise ShapeError(
            f"{op.debug_name}: with block_size={block_size} along axis {axis}, the scale for "
            f"input {x} must have shape {list(expected)}, got {scale}.")
    return _Granularity((), axis, block_size, length)


# --- QuantizeLinear / DequantizeLinear -----------------------------------------------------------


@register_op("QuantizeLinear", versions=(10, 13, 19, 21, 23, 24, 25, 28))
class QuantizeLinear(Op):
    """y = saturate(round(x / y_scale) + y_zero_point), to the zero point's (or output_dtype's,
    default uint8) type."""

    @dataclass(frozen=True)
    class Attrs:  # opset 23+
        axis: int = 1
        block_size: int = 0
        output_dtype: int = 0
        precision: int = 0
        saturate: int = 1

    @dataclass(frozen=True)
    class Attrs10:
        pass

    @dataclass(frozen=True)
    class Attrs13:
        axis: int = 1

    @dataclass(frozen=True)
    class Attrs19:
        axis: int = 1
        saturate: int = 1

    @dataclass(frozen=True)
    class Attrs21:
        axis: int = 1
        block_size: int = 0
        output_dtype: int = 0
        saturate: int = 1

    @classmethod
    def attrs_type(cls, version):
        return {10: cls.Attrs10, 13: cls.Attrs13, 19: cls.Attrs19, 21: cls.Attrs21}.get(
            version, cls.Attrs)

    def infer(self, x, scale, zero_point=None):
        check_dtypes(self, x, scale, zero_point, wide_unsigned_ok=True)
        out = self._output_dtype(zero_point)
        self._gran = _granularity(self, x, scale, zero_point)
        precision = _attr(self, "precision") or 0
        compute = _data_type(self, precision, "precision") if precision else scale.dtype
        # x / scale in the scale's precision; an int32 one divides exactly in float64.
        self._compute = torch.float64 if compute.is_int else compute.torch
        self._out = out.torch
        code = out.onnx
        self._range = _INT_RANGES.get(code)
        self._format = _FLOAT_FORMATS.get(code)
        if self._format is not None and self._format[3] is not None and _attr(self, "saturate"):
            self._format = self._format[:3] + (None,)
        if self._range is None and self._format is None:
            raise UnsupportedOpError(f"{self.debug_name}: cannot quantize to {out.name}.")
        return TensorInfo(out, x.shape)

    def _output_dtype(self, zero_point: TensorInfo | None) -> DataType:
        code = _attr(self, "output_dtype") or 0
        if zero_point is not None:
            if code and code != zero_point.dtype.onnx:
                raise ModelError(
                    f"{self.debug_name}: output_dtype={code} differs from the zero point's type "
                    f"{zero_point.dtype.name} (code {zero_point.dtype.onnx}); they must agree.")
            return zero_point.dtype
        return _data_type(self, code, "output_dtype") if code else DataType.UINT8

    def kernel(self, x, scale, zero_point=None):
        q = x.to(self._compute) / self._gran.expand(scale.to(self._compute))
        if self._range is not None:
            # float64 holds every rounded value and zero point exactly, so the sum is exact.
            q = torch.round(q).double()
            if zero_point is not None:
                q = q + self._gran.expand(zero_point.double())
            return q.clamp(*self._range).to(self._out)
        q = q.float()
        if zero_point is not None:
            q = q + self._gran.expand(zero_point.float())
        return _round_to_format(q, *self._format)


def _round_to_format(v: torch.Tensor, mantissa_bits: int, min_exponent: int, largest: float,
                     overflow: float | None) -> torch.Tensor:
    """float32 values rounded half to even onto a narrow float's grid (the simulator stores
    those types as float32 holding exact values). Past ``largest``: ``overflow`` (inf / NaN),
    or ``largest`` when None (saturation)."""
    magnitude = v.abs()
    # frexp's exponent is exact (log2 can land on the wrong side of a power of two).
    exponent = torch.frexp(magnitude).exponent - 1
    ulp = torch.exp2((exponent.clamp(min=min_exponent) - mantissa_bits).float())
    rounded = torch.round(magnitude / ulp) * ulp
    past = rounded > largest
    rounded = torch.where(past, largest if overflow is None else overflow, rounded)
    return torch.copysign(rounded, v)


@register_op("DequantizeLinear", versions=(10, 13, 19, 21, 23, 24, 25, 28))
class DequantizeLinear(Op):
    """y = (x - x_zero_point) * x_scale, in the scale's (or output_dtype's) float type."""

    @dataclass(frozen=True)
    class Attrs:  # opset 23+
        axis: int = 1
        block_size: int = 0
        output_dtype: int = 0

    @dataclass(frozen=True)
    class Attrs10:
        pass

    @dataclass(frozen=True)
    class Attrs13:
        axis: int = 1

    @dataclass(frozen=True)
    class Attrs21:
        axis: int = 1
        block_size: int = 0

    @classmethod
    def attrs_type(cls, version):
        return {10: cls.Attrs10, 13: cls.Attrs13, 19: cls.Attrs13, 21: cls.Attrs21}.get(
            version, cls.Attrs)

    def infer(self, x, scale, zero_point=None):
        check_dtypes(self, x, scale, zero_point, wide_unsigned_ok=True)
        if zero_point is not None and zero_point.dtype != x.dtype:
            raise ShapeError(
                f"{self.debug_name}: x {x} and its zero point {zero_point} must share a dtype.")
        self._gran = _granularity(self, x, scale, zero_point)
        code = _attr(self, "output_dtype") or 0
        out = _data_type(self, code, "output_dtype") if code else scale.dtype
        if out not in _SCALE_FLOATS:
            raise ShapeError(
                f"{self.debug_name}: the output type {out.name} (output_dtype={code}, else the "
                f"scale's type) must be float, float16 or bfloat16.")
        self._out = out.torch
        # Integers subtract exactly in int64; float8 / float4 values in float32.
        self._diff = torch.int64 if x.dtype.is_int else torch.float32
        return TensorInfo(out, x.shape)

    def kernel(self, x, scale, zero_point=None):
        d = x.to(self._diff)
        if zero_point is not None:
            d = d - self._gran.expand(zero_point.to(self._diff))
        return d.to(self._out) * self._gran.expand(scale.to(self._out))


@register_op("DynamicQuantizeLinear", versions=11)
class DynamicQuantizeLinear(Op):
    """uint8 quantization with a scale and zero point computed from the data's range (which is
    widened to include 0): outputs y, y_scale, y_zero_point."""

    def infer(self, x):
        check_dtypes(self, x)
        return (TensorInfo(DataType.UINT8, x.shape), TensorInfo(DataType.FLOAT, ()),
                TensorInfo(DataType.UINT8, ()))

    def kernel(self, x):
        zero = x.new_zeros(())
        low = torch.minimum(x.min(), zero) if x.numel() else zero
        high = torch.maximum(x.max(), zero) if x.numel() else zero
        scale = (high - low) / 255
        # An all-zero input has no range: scale 1 then (onnxruntime's choice) rather than 0.
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        zero_point = torch.round(-low / scale).clamp(0, 255)
        y = (torch.round(x / scale) + zero_point).clamp(0, 255)
        return y.to(torch.uint8), scale, zero_point.to(torch.uint8)


# --- integer products ----------------------------------------------------------------------------


def _zero_point_view(op: Op, zp: TensorInfo | None, size: int, trailing: int, what: str
                     ) -> tuple[int, ...] | None:
    """Reshape of a scalar or 1-D (``size`` elements, one per row / column / channel) operand
    that broadcasts against the product; ``trailing`` dims follow that axis."""
    if zp is None or zp.nelms == 1 and zp.rank <= 1:
        return None if zp is None else ()
    if zp.rank != 1 or zp.shape[0] != size:
        raise ShapeError(
            f"{op.debug_name}: {what} must be a scalar or 1-D with {size} elements, got {zp}.")
    return (size,) + (1,) * trailing


def _view(t: torch.Tensor | None, view: tuple[int, ...] | None):
    return None if t is None else t.reshape(view)


class _QuantizedMatMul(Op):
    """Shared by MatMulInteger and QLinearMatMul: the int32 product of zero-point-shifted
    operands. A's zero point may be per row (M), B's per column (N)."""

    uses_amp = True

    def setup_product(self, a, b, a_zp, b_zp) -> tuple[int, ...]:
        shape = matmul_shape(self, a, b)
        rows = a.shape[-2] if a.rank > 1 else 1
        self._a_view = _zero_point_view(self, a_zp, rows, 1, "a_zero_point")
        self._b_view = _zero_point_view(self, b_zp, b.shape[-1] if b.rank > 1 else 1, 0,
                                        "b_zero_point")
        self._inner = a.shape[-1]
        return shape

    def product(self, a, b, a_zp, b_zp) -> torch.Tensor:
        a = a.to(torch.int32)
        b = b.to(torch.int32)
        if a_zp is not None:
            a = a - a_zp.to(torch.int32).reshape(self._a_view)
        if b_zp is not None:
            b = b - b_zp.to(torch.int32).reshape(self._b_view)
        return torch.matmul(a, b)

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        return 2 * self.outputs[0].info.nelms * self._inner, moved


@register_op("MatMulInteger", versions=10)
class MatMulInteger(_QuantizedMatMul):
    """Y = (A - a_zero_point) @ (B - b_zero_point) in int32."""

    def infer(self, a, b, a_zp=None, b_zp=None):
        check_dtypes(self, a, b, a_zp, b_zp)
        return TensorInfo(DataType.INT32, self.setup_product(a, b, a_zp, b_zp))

    def kernel(self, a, b, a_zp=None, b_zp=None):
        return self.product(a, b, a_zp, b_zp)


def _requantize(acc: torch.Tensor, multiplier: torch.Tensor, y_zp: torch.Tensor,
                bounds: tuple[int, int], out: torch.dtype) -> torch.Tensor:
    """round(float32(acc) * multiplier) + y_zero_point, saturated (onnxruntime's requantize)."""
    q = torch.round(acc.float() * multiplier).double() + y_zp.double()
    return q.clamp(*bounds).to(out)


def _output_range(op: Op, y_zp: TensorInfo) -> tuple[int, int]:
    bounds = _INT_RANGES.get(y_zp.dtype.onnx)
    if bounds is None:
        raise UnsupportedOpError(
            f"{op.debug_name}: output type {y_zp.dtype.name} (from y_zero_point) is not an "
            f"8-bit integer; float8 outputs are not implemented.")
    return bounds


def _check_scalar(op: Op, info: TensorInfo, what: str) -> None:
    if info.nelms != 1:
        raise ShapeError(f"{op.debug_name}: {what} must be a scalar, got {info}.")


@register_op("QLinearMatMul", versions=(10, 21))
class QLinearMatMul(_QuantizedMatMul):
    """y = requantize((a - a_zp) @ (b - b_zp), a_scale * b_scale / y_scale, y_zp)."""

    def infer(self, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
        check_dtypes(self, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)
        for info, zp, name in ((a_scale, a_zp, "a"), (b_scale, b_zp, "b")):
            if info.shape != zp.shape:
                raise ShapeError(
                    f"{self.debug_name}: {name}_scale {info} and {name}_zero_point {zp} must have "
                    f"one shape.")
        _check_scalar(self, y_scale, "y_scale")
        _check_scalar(self, y_zp, "y_zero_point")
        self._bounds = _output_range(self, y_zp)
        shape = self.setup_product(a, b, a_zp, b_zp)
        self._out = y_zp.dtype.torch
        return TensorInfo(y_zp.dtype, shape)

    def kernel(self, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
        acc = self.product(a, b, a_zp, b_zp)
        a_s = a_scale.float().reshape(self._a_view)
        b_s = b_scale.float().reshape(self._b_view)
        return _requantize(acc, a_s * b_s / y_scale.float(), y_zp, self._bounds, self._out)


class _QuantizedConv(Op):
    """Shared by ConvInteger and QLinearConv: the exact convolution of zero-point-shifted
    operands (float64; padding after the shift, so it contributes zero, as ONNX pads with the
    zero point). The weights' zero point may be per output channel."""

    uses_amp = True
    Attrs = ConvAttrs

    def setup_conv(self, x, w, x_zp, w_zp) -> tuple[int, ...]:
        at = self.attrs
        if not 3 <= x.rank <= 5 or w.rank != x.rank:
            raise ShapeError(
                f"{self.debug_name}: X {x} must be [N, C, D1..Dn] (1-3 spatial dims) and W {w} "
                f"[M, C/group, k1..kn] of the same rank.")
        group = at.group
        if group < 1 or x.shape[1] != w.shape[1] * group or w.shape[0] % group:
            raise ShapeError(
                f"{self.debug_name}: channel mismatch: X {x}, W {w}, group={group}. Need "
                f"C = W.shape[1] * group and M divisible by group.")
        kernel = w.shape[2:]
        if at.kernel_shape and tuple(at.kernel_shape) != kernel:
            raise ShapeError(
                f"{self.debug_name}: kernel_shape={list(at.kernel_shape)} differs from W {w}.")
        win = resolve_window(self, x.shape[2:], kernel, at.strides, at.dilations, at.pads,
                             at.auto_pad)
        if x_zp is not None and x_zp.nelms != 1:
            raise ShapeError(f"{self.debug_name}: x_zero_point must be a scalar, got {x_zp}.")
        self._w_view = _zero_point_view(self, w_zp, w.shape[0], w.rank - 1, "w_zero_point")
        self._fn = CONV_FNS[x.rank - 2]
        self._conv_args = (win.strides, 0, win.dilations, group)
        self._pad = win.torch_pad()
        self._weights_per_output = w.nelms // w.shape[0]
        return (x.shape[0], w.shape[0]) + win.out_sizes

    def convolve(self, x, w, x_zp, w_zp) -> torch.Tensor:
        x = x.double()
        w = w.double()
        if x_zp is not None:
            x = x - x_zp.double().reshape(())
        if w_zp is not None:
            w = w - w_zp.double().reshape(self._w_view)
        return self._fn(F.pad(x, self._pad), w, None, *self._conv_args)

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        return 2 * self.outputs[0].info.nelms * self._weights_per_output, moved


@register_op("ConvInteger", versions=10)
class ConvInteger(_QuantizedConv):
    """y = conv(x - x_zero_point, w - w_zero_point) in int32."""

    def infer(self, x, w, x_zp=None, w_zp=None):
        check_dtypes(self, x, w, x_zp, w_zp)
        return TensorInfo(DataType.INT32, self.setup_conv(x, w, x_zp, w_zp))

    def kernel(self, x, w, x_zp=None, w_zp=None):
        return self.convolve(x, w, x_zp, w_zp).to(torch.int32)


@register_op("QLinearConv", versions=10)
class QLinearConv(_QuantizedConv):
    """y = requantize(conv(x - x_zp, w - w_zp) + B, x_scale * w_scale / y_scale, y_zp);
    w_scale and w_zero_point may be per output channel."""

    def infer(self, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias=None):
        check_dtypes(self, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias)
        for info, name in ((x_scale, "x_scale"), (y_scale, "y_scale"), (y_zp, "y_zero_point")):
            _check_scalar(self, info, name)
        shape = self.setup_conv(x, w, x_zp, w_zp)
        self._scale_view = _zero_point_view(self, w_scale, w.shape[0], x.rank - 2, "w_scale")
        if bias is not None and bias.shape != (w.shape[0],):
            raise ShapeError(
                f"{self.debug_name}: bias B {bias} must have shape [{w.shape[0]}] (one int32 per "
                f"output channel).")
        self._bias_view = (w.shape[0],) + (1,) * (x.rank - 2)
        self._bounds = _output_range(self, y_zp)
        self._out = y_zp.dtype.torch
        return TensorInfo(y_zp.dtype, shape)

    def kernel(self, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias=None):
        acc = self.convolve(x, w, x_zp, w_zp)
        if bias is not None:
            acc = acc + bias.double().reshape(self._bias_view)
        multiplier = x_scale.float().reshape(()) * w_scale.float().reshape(self._scale_view)
        return _requantize(acc, multiplier / y_scale.float().reshape(()), y_zp, self._bounds,
                           self._out)


__all__: list[str] = []
