"""Cast and CastLike, every ONNX version, and their gradient.

Conversion rules (the Cast schema's tables), computed on the simulator's storage tensors
(``dtypes`` module docstring: narrow floats are held as exact float32 values, int4/int2 in
int8/uint8, uint16/32/64 in int32/int64):

- float -> integer truncates toward zero; integer -> narrower integer (int4/int2/uint4/uint2
  included) keeps the low bits (two's complement for signed types); anything -> bool is != 0.
- -> float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ), float6 and float4: round to nearest even on the
  target's grid. ``saturate`` (default 1, float8 only) clamps out-of-range values and infinities
  to +-max; without it they become NaN (E5M2: +-inf). The FNUZ kinds have no -0 (-> +0).
  float4/float6 have no NaN or inf: they always saturate, and NaN becomes 0 (ONNX leaves it
  undefined).
- -> float8e8m0 (powers of two 2**-127 .. 2**127): ``round_mode`` up / down / nearest on the
  float32 exponent, ``saturate`` keeps the largest exponent instead of overflowing to NaN. Per
  the schema's table: NaN -> NaN; inf -> max (saturate) or NaN; 0 -> 2**-127 (saturate) or NaN.
- STRING -> number parses decimal / scientific literals and INF/+INF/-INF/NaN in any case;
  number -> STRING prints numpy's shortest round-trip form. Both run on numpy arrays in the
  kernel: torch has no string type.

Between float types (float32/16/64, bfloat16) the gradient is cast back to the source type;
casts to or from other types carry no gradient (autodiff only follows those float tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import torch

from ..dtypes import DataType, to_host, to_storage
from ..errors import UnsupportedOpError
from ..ir.tensor import TensorInfo
from .base import Unary, allowed_types, check_dtypes, uint64_to_double
from .registry import register_op

_NATIVE_FLOATS = (DataType.FLOAT, DataType.FLOAT16, DataType.DOUBLE, DataType.BFLOAT16)
_NATIVE_INTS = (DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64, DataType.UINT8)
_PACKED_INTS = {  # type -> (bits, signed)
    DataType.INT4: (4, True),
    DataType.UINT4: (4, False),
    DataType.INT2: (2, True),
    DataType.UINT2: (2, False),
    DataType.UINT16: (16, False),
    DataType.UINT32: (32, False),
}
_ROUND_MODES = ("up", "down", "nearest")


@dataclass(frozen=True)
class _Minifloat:
    """A narrow float format: mantissa bits, smallest normal exponent, largest finite value."""

    mantissa_bits: int
    min_exponent: int
    max_value: float
    has_inf: bool  # E5M2 only
    has_nan: bool  # float8 kinds
    unsigned_zero: bool  # FNUZ kinds: one zero, no -0

    @classmethod
    def of(cls, dtype: DataType) -> _Minifloat:
        info = ml_dtypes.finfo(dtype.numpy)
        return cls(int(info.nmant), int(info.minexp), float(info.max),
                   dtype is DataType.FLOAT8E5M2,
                   dtype.name.startswith("FLOAT8"), dtype.name.endswith("FNUZ"))


_MINIFLOATS = {
    dt: _Minifloat.of(dt)
    for dt in DataType
    if dt.is_narrow_float and dt is not DataType.FLOAT8E8M0
}


def _round_to_minifloat(x: torch.Tensor, fmt: _Minifloat, saturate: bool) -> torch.Tensor:
    """``x`` (float32 or float64) rounded to ``fmt``; float32 result holding exact values."""
    _, exponent = torch.frexp(x)  # x = m * 2**exponent with 0.5 <= |m| < 1
    step = (torch.clamp(exponent - 1, min=fmt.min_exponent) - fmt.mantissa_bits).to(x.dtype)
    # Scaling by powers of two is exact, and torch.round breaks ties to even.
    rounded = torch.ldexp(torch.round(torch.ldexp(x, -step)), step)
    too_big = rounded.abs() > fmt.max_value  # infinities too; NaN compares false
    if saturate or not fmt.has_nan:
        overflow = fmt.max_value
    else:
        overflow = float("inf") if fmt.has_inf else float("nan")
    rounded = torch.where(too_big, torch.copysign(torch.full_like(rounded, overflow), rounded),
                          rounded)
    if not fmt.has_nan:
        rounded = torch.nan_to_num(rounded, nan=0.0)
    if fmt.unsigned_zero:
        rounded = torch.where(rounded == 0, 0.0, rounded)
    return rounded.float()


def _round_to_e8m0(x: torch.Tensor, saturate: bool, round_mode: str) -> torch.Tensor:
    """``x`` as float8e8m0 (a power of two 2**(code - 127), code 255 = NaN), float32 values.

    Works on the float32 exponent field; the sign is ignored (negative inputs are undefined).
    """
    bits = x.float().view(torch.int32)
    exponent = torch.bitwise_and(torch.bitwise_right_shift(bits, 23), 0xFF)
    fraction = torch.bitwise_and(bits, 0x7FFFFF)
    if round_mode == "up":
        up = fraction > 0
    elif round_mode == "nearest":
        # At or past the linear midpoint 1.5 * 2**e; an exact midpoint of a float32
        # subnormal stays down.
        half = 0x400000
        up = (fraction > half) | ((fraction == half) & (exponent > 0))
    else:
        up = torch.zeros_like(fraction, dtype=torch.bool)
    if saturate:
        up = up & (exponent != 0xFE)
    code = exponent + up.to(exponent.dtype)
    nan_or_inf = exponent == 0xFF
    is_inf = nan_or_inf & (fraction == 0)
    if saturate:
        code = torch.where(is_inf, 0xFE, code)
    else:
        code = torch.where(fraction.eq(0) & exponent.eq(0), 0xFF, code)  # zero: no such value
    code = torch.where(nan_or_inf & ~(is_inf & saturate), 0xFF, code)
    value = torch.ldexp(torch.ones_like(x, dtype=torch.float32), (code - 127).float())
    return torch.where(code == 0xFF, float("nan"), value)


def _keep_low_bits(x: torch.Tensor, bits: int, signed: bool) -> torch.Tensor:
    """int64 ``x`` reduced to a ``bits``-wide integer (two's complement when ``signed``)."""
    low = torch.bitwise_and(x, (1 << bits) - 1)
    if signed:
        low = torch.where(low >= 1 << (bits - 1), low - (1 << bits), low)
    return low


def _converter(source: DataType, target: DataType, saturate: bool, round_mode: str):
    """The storage -> storage conversion ``source`` -> ``target`` as one function."""
    if source is target:
        return _unchanged
    storage = target.torch
    from_float = source.is_float or source.is_narrow_float
    # uint64 bits read as negative int64 from 2**63: read them as numbers unless the target
    # keeps only bits (integers) or tests for zero (bool).
    read_unsigned = source is DataType.UINT64 and not (target.is_int or target is DataType.BOOL)

    if target in _NATIVE_FLOATS or target in _NATIVE_INTS or target is DataType.BOOL:
        def convert(x):
            return x.to(storage)
    elif target in _MINIFLOATS:
        fmt = _MINIFLOATS[target]
        wide = torch.float64 if source is DataType.DOUBLE or source.is_int else torch.float32

        def convert(x):
            return _round_to_minifloat(x.to(wide), fmt, saturate)
    elif target is DataType.FLOAT8E8M0:
        def convert(x):
            return _round_to_e8m0(x.float(), saturate, round_mode)
    elif target is DataType.UINT64 and (from_float or read_unsigned):
        def convert(x):
            # Values from 2**63 up are stored as their negative int64 bit pattern.
            x = x.double()
            return torch.where(x >= 2.0**63, x - 2.0**64, x).to(torch.int64)
    elif target is DataType.UINT64:
        def convert(x):
            return x.to(torch.int64)  # sign extension is two's complement's wrap
    else:
        bits, signed = _PACKED_INTS[target]

        def convert(x):
            return _keep_low_bits(x.to(torch.int64), bits, signed).to(storage)
    if not read_unsigned:
        return convert
    return lambda x: convert(uint64_to_double(x))


def _unchanged(x: torch.Tensor) -> torch.Tensor:
    return x


def _parse_strings(array: np.ndarray) -> np.ndarray:
    """Numbers of a STRING array: ints stay exact, everything else goes through float."""
    def number(text):
        text = text.decode() if isinstance(text, bytes) else str(text)
        try:
            return int(text)
        except ValueError:
            return float(text)  # accepts inf, +inf, -inf and nan in any case

    values = [number(s) for s in array.reshape(-1)]
    exact = all(isinstance(v, int) and -(2**63) <= v < 2**63 for v in values)
    return np.array(values, dtype=np.int64 if exact else np.float64).reshape(array.shape)


class CastBase(Unary):
    """Shared kernel and gradient of Cast and CastLike: ``self._convert`` built by infer()."""

    aliases_inputs = True  # a cast to the input's own dtype returns the input

    takes_strings = True  # STRING sides are converted here (ops/string_tensors.py)

    def _prepare(self, source: DataType, target: DataType) -> TensorInfo | None:
        if target in (DataType.UNDEFINED, DataType.COMPLEX64, DataType.COMPLEX128):
            raise UnsupportedOpError(
                f"{self.debug_name}: casts to {target.name} are not supported "
                f"(ONNX Cast has none)."
            )
        targets = allowed_types(self, "T2")
        if targets is not None and target.name.lower() not in targets:
            raise UnsupportedOpError(
                f"{self.debug_name}: {self.op_type}-{self.version} cannot cast to "
                f"{target.name.lower()}; it accepts {', '.join(sorted(targets))}. Import the "
                f"model at a newer opset."
            )
        saturate = bool(getattr(self.attrs, "saturate", 1))
        round_mode = getattr(self.attrs, "round_mode", "up")
        if round_mode not in _ROUND_MODES:
            raise UnsupportedOpError(
                f"{self.debug_name}: round_mode='{round_mode}'; use one of {_ROUND_MODES}."
            )
        self._source, self._target = source, target
        if DataType.STRING in (source, target):
            self._convert = None
        else:
            self._convert = _converter(source, target, saturate, round_mode)
        # Only a cast to the input's own dtype hands back the input; any other is a new tensor.
        self.aliases_inputs = self._convert is None or self._convert is _unchanged
        # torch's own conversion (x.to(dtype), i.e. a copy into the target dtype), which
        # kernel_into can write into a buffer with out.copy_(x).
        self._copies = (self._convert is not None and not self.aliases_inputs
                        and (target in _NATIVE_FLOATS or target in _NATIVE_INTS)
                        and not (source is DataType.UINT64 and not target.is_int))

    def kernel(self, x, *_):
        if self._convert is not None:
            return self._convert(x)
        if self._target is DataType.STRING:
            if self._source is DataType.STRING:
                return x.copy()
            return to_host(x, self._source).astype(np.str_).astype(object)
        numbers = _parse_strings(x)
        source = DataType.from_numpy(numbers.dtype)
        if self._target is DataType.BOOL:
            return torch.from_numpy(numbers != 0)
        convert = _converter(source, self._target, bool(getattr(self.attrs, "saturate", 1)),
                             getattr(self.attrs, "round_mode", "up"))
        return convert(to_storage(numbers))

    # The static memory plan (device/arena.py) writes a dtype-changing cast into a buffer.
    writes_into = True

    def kernel_into(self, out, x, *_):
        return out.copy_(x) if self._copies else self.kernel(x)

    def grad(self, g):
        source, target = g.input_info(0).dtype, g.output_info(0).dtype
        # Integer and bool sides carry no gradient; autodiff never asks for one there.
        if not (source.is_float and target.is_float):
            return
        dy = g.output_grad(0)
        g.set_input_grad(0, dy if source == target else g.op("Cast", dy, to=source.onnx))


@register_op("Cast", versions=(1, 6, 9, 13, 19, 21, 23, 24, 25, 28))
class Cast(CastBase):
    @dataclass(frozen=True)
    class Attrs:
        to: int

    @dataclass(frozen=True)
    class AttrsV1:
        """Cast-1 names the target type as a string ("FLOAT", "INT64" ...)."""

        to: str

    @dataclass(frozen=True)
    class AttrsV19:
        to: int
        saturate: int = 1

    @dataclass(frozen=True)
    class AttrsV24:
        to: int
        saturate: int = 1
        round_mode: str = "up"

    @classmethod
    def attrs_type(cls, version: int) -> type:
        if version >= 24:
            return cls.AttrsV24
        if version >= 19:
            return cls.AttrsV19
        return cls.Attrs if version >= 6 else cls.AttrsV1

    def infer(self, x):
        check_dtypes(self, x, wide_unsigned_ok=True)
        to = self.attrs.to
        if isinstance(to, (str, bytes)):
            name = to.decode() if isinstance(to, bytes) else to
            if name.upper() not in DataType.__members__:
                raise UnsupportedOpError(
                    f"{self.debug_name}: to='{name}' is not an ONNX type name (FLOAT, INT64 ...)."
                )
            target = DataType[name.upper()]
        else:
            try:
                target = DataType(to)
            except ValueError:
                raise UnsupportedOpError(
                    f"{self.debug_name}: to={to} is not an ONNX element type code."
                ) from None
        self._prepare(x.dtype, target)
        return x.with_dtype(target)


@register_op("CastLike", versions=(15, 19, 21, 23, 24, 25))
class CastLike(CastBase):
    @dataclass(frozen=True)
    class Attrs:
        saturate: int = 1

    @dataclass(frozen=True)
    class AttrsV15:
        """CastLike-15 has no attributes."""

    @dataclass(frozen=True)
    class AttrsV24:
        saturate: int = 1
        round_mode: str = "up"

    @classmethod
    def attrs_type(cls, version: int) -> type:
        if version >= 24:
            return cls.AttrsV24
        return cls.Attrs if version >= 19 else cls.AttrsV15

    def infer(self, x, like):
        check_dtypes(self, x, like, wide_unsigned_ok=True)
        self._prepare(x.dtype, like.dtype)
        return x.with_dtype(like.dtype)

    def fold_from_infos(self):
        # Only the dtype of ``like`` matters, so a constant ``x`` folds even when ``like`` is
        # computed (the exporters cast every scalar constant like an activation).
        x = self.inputs[0]
        if x is None or not x.is_const:
            return None
        with torch.no_grad():
            result = self.kernel(x.data if x.info.dtype is DataType.STRING else to_storage(x.data))
        return [result if isinstance(result, np.ndarray) else to_host(result, self._target)]


# --- BitCast ------------------------------------------------------------------------------------

# torch's float8 dtypes hold the codes of the float8 kinds (their float32 storage converts to
# and from them exactly); float4/float6 codes come from a table of their decoded values.
_TORCH_FLOAT8 = {
    DataType.FLOAT8E4M3FN: torch.float8_e4m3fn,
    DataType.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz,
    DataType.FLOAT8E5M2: torch.float8_e5m2,
    DataType.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
    DataType.FLOAT8E8M0: torch.float8_e8m0fnu,
}
_SIGNED_OF_WIDTH = {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


def _code_table(dtype: DataType) -> torch.Tensor:
    """float32 value of every code of a float4/float6 type, by code."""
    codes = np.arange(1 << dtype.bits, dtype=np.uint8)
    # ml_dtypes keeps a sub-byte value in the low bits of its byte, so a view decodes codes.
    return torch.from_numpy(codes.view(dtype.numpy).astype(np.float32))


class _Codes:
    """Conversion between one type's storage tensor and its bit patterns (int64 codes in
    [0, 2**bits), or the int64 bits themselves for 64-bit types)."""

    def __init__(self, dtype: DataType):
        self.dtype, self.bits = dtype, dtype.bits
        if dtype in (DataType.FLOAT4E2M1, DataType.FLOAT6E2M3, DataType.FLOAT6E3M2):
            self.table = _code_table(dtype)
            half = 1 << (self.bits - 1)
            self.magnitudes = self.table[:half]  # codes below the sign bit, ascending

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        dtype, bits = self.dtype, self.bits
        if dtype in _TORCH_FLOAT8:
            return x.to(_TORCH_FLOAT8[dtype]).view(torch.uint8).to(torch.int64)
        if hasattr(self, "table"):
            magnitude = torch.searchsorted(self.magnitudes, x.abs())
            return magnitude + torch.signbit(x).to(torch.int64) * (1 << (bits - 1))
        if dtype in _PACKED_INTS or dtype is DataType.UINT64:
            return torch.bitwise_and(x.to(torch.int64), (1 << bits) - 1) if bits < 64 else x
        if dtype is DataType.BOOL:
            return x.to(torch.int64)
        signed = x.view(_SIGNED_OF_WIDTH[bits]).to(torch.int64)
        return signed if bits == 64 else torch.bitwise_and(signed, (1 << bits) - 1)

    def decode(self, code: torch.Tensor) -> torch.Tensor:
        dtype, bits = self.dtype, self.bits
        if dtype in _TORCH_FLOAT8:
            return code.to(torch.uint8).view(_TORCH_FLOAT8[dtype]).float()
        if hasattr(self, "table"):
            return self.table[code]
        if dtype in _PACKED_INTS:
            bits_, signed = _PACKED_INTS[dtype]
            return _keep_low_bits(code, bits_, signed).to(dtype.torch)
        if dtype is DataType.UINT64:
            return code
        if dtype is DataType.BOOL:
            return code != 0
        signed = _keep_low_bits(code, bits, True) if bits < 64 else code
        return signed.to(_SIGNED_OF_WIDTH[bits]).view(dtype.torch)


@register_op("BitCast", versions=26)
class BitCast(Unary):
    """Reinterprets each element's bits as another type of the same width (no rounding, no
    conversion); integer views of the bits go through int64 codes. Not differentiable: the
    output is not a smooth function of the input."""

    aliases_inputs = True  # reinterprets the input's storage

    @dataclass(frozen=True)
    class Attrs:
        to: int

    def infer(self, x):
        check_dtypes(self, x, wide_unsigned_ok=True)
        try:
            target = DataType(self.attrs.to)
        except ValueError:
            raise UnsupportedOpError(
                f"{self.debug_name}: to={self.attrs.to} is not an ONNX element type code."
            ) from None
        targets = allowed_types(self, "T2")
        if targets is not None and target.name.lower() not in targets:
            raise UnsupportedOpError(
                f"{self.debug_name}: BitCast-{self.version} cannot reinterpret as "
                f"{target.name.lower()}; it accepts {', '.join(sorted(targets))}."
            )
        if target.bits != x.dtype.bits:
            raise UnsupportedOpError(
                f"{self.debug_name}: {x.dtype.name.lower()} ({x.dtype.bits} bits) and "
                f"{target.name.lower()} ({target.bits} bits) differ in width; BitCast needs "
                f"equal widths (use Cast to convert values)."
            )
        if DataType.COMPLEX64 in (x.dtype, target) or DataType.COMPLEX128 in (x.dtype, target):
            raise UnsupportedOpError(
                f"{self.debug_name}: complex BitCast is not implemented by the simulated IPU."
            )
        self._same = target is x.dtype
        self._source, self._target = _Codes(x.dtype), _Codes(target)
        return x.with_dtype(target)

    def kernel(self, x):
        if self._same:
            return x
        return self._target.decode(self._source.encode(x))

    def grad(self, g):
        """No gradient: reinterpreted bits are not a differentiable function of the value."""
