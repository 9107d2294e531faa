"""DataType: the element types and their ONNX, numpy and torch equivalents.

Three representations exist for every type:

- ONNX: the ``TensorProto.DataType`` code (the enum value).
- host (numpy): what users feed and get back. The float8 / float4 / float6 / int4 / int2 /
  bfloat16 types use the ``ml_dtypes`` numpy extension types, as ``onnx.numpy_helper`` does.
- storage (torch): the dtype of the simulator's tensors (``DataType.torch``). For most types it
  is the matching torch dtype. Where torch has no such dtype or lacks CPU kernels for it, the
  simulator stores the exact values in a wider type ("surrogate") and converts at the host
  boundary (``to_storage`` / ``to_host``, called by ``device/plan.py``,
  ``device/simulator.py`` and ``transforms/const_fold.py``):

  ========================================  =============  ==================================
  type                                      storage        why
  ========================================  =============  ==================================
  uint16                                    int32          torch has no uint16 arithmetic
  uint32                                    int64          nor uint32
  uint64                                    int64 (bits)   nor uint64; same bits, zero-copy
  int4, int2                                int8           torch has no 4/2-bit types
  uint4, uint2                              uint8
  float8 (4 kinds), float8e8m0, float4e2m1,  float32        every value is exact in float32;
  float6e2m3, float6e3m2                                   torch's float8 dtypes lack flip,
                                                           scatter (and pad for e8m0) kernels
  ========================================  =============  ==================================

  uint16/uint32 results are reduced modulo 2**bits after every kernel (``wrap_unsigned``, called
  by the execution plan), so a surrogate always holds the value the unsigned type would hold.
  uint64 values >= 2**63 are negative int64 bit patterns: ring arithmetic (add, sub, mul,
  bitwise, left shift) is bit-identical; ops whose result depends on order or magnitude declare
  how they handle uint64 (``ops.base.UInt64``).

Memory is counted at the packed width of the type (``bits``): 4-bit types take half a byte per
element, whatever the simulator's storage holds.
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np
import torch

from .errors import popart_exception


class DataType(enum.Enum):
    """An element type; the value is the ONNX ``TensorProto.DataType`` code."""

    UNDEFINED = 0
    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15
    BFLOAT16 = 16
    FLOAT8E4M3FN = 17
    FLOAT8E4M3FNUZ = 18
    FLOAT8E5M2 = 19
    FLOAT8E5M2FNUZ = 20
    UINT4 = 21
    INT4 = 22
    FLOAT4E2M1 = 23
    FLOAT8E8M0 = 24
    UINT2 = 25
    INT2 = 26
    FLOAT6E2M3 = 27
    FLOAT6E3M2 = 28

    @property
    def onnx(self) -> int:
        return self.value

    @classmethod
    def from_onnx(cls, code: int) -> "DataType":
        try:
            return cls(code)
        except ValueError:
            raise popart_exception(
                f"ONNX element type {code} is not supported; supported: "
                f"{', '.join(d.name for d in cls if d is not cls.UNDEFINED)}."
            ) from None

    @classmethod
    def from_string(cls, name: str) -> "DataType":
        """Accept PopART's upper-case names ('FLOAT') and numpy names ('float32', 'int4')."""
        key = name.upper()
        if key in cls.__members__:
            return cls[key]
        if key in GraphcoreFloat8.__members__:
            raise GraphcoreFloat8[key].refusal(f"data type string '{name}'")
        for dt, npdt in _NUMPY.items():
            if npdt.name == name:
                return dt
        try:
            return cls.from_numpy(np.dtype(name))
        except TypeError:
            pass
        raise popart_exception(
            f"Unknown data type string '{name}'. Use one of {', '.join(cls.__members__)}."
        )

    @classmethod
    def from_numpy(cls, dtype) -> "DataType":
        if isinstance(dtype, GraphcoreFloat8):
            raise dtype.refusal("this use")
        dtype = np.dtype(dtype)
        for dt, npdt in _NUMPY.items():
            if npdt == dtype:
                return dt
        raise popart_exception(f"numpy dtype {dtype} has no PopART data type.")

    @classmethod
    def from_torch(cls, dtype: torch.dtype) -> "DataType":
        """The type a torch dtype natively is (storage surrogates map to their own type)."""
        for dt, tdt in _TORCH.items():
            if tdt == dtype and dt not in _SURROGATE:
                return dt
        raise popart_exception(f"torch dtype {dtype} has no PopART data type.")

    @property
    def numpy(self) -> np.dtype:
        """The host (numpy / ml_dtypes) dtype."""
        try:
            return _NUMPY[self]
        except KeyError:
            raise popart_exception(f"Data type {self.name} has no numpy equivalent.") from None

    @property
    def torch(self) -> torch.dtype:
        """The simulator's storage dtype (see the module docstring for the surrogates)."""
        try:
            return _TORCH[self]
        except KeyError:
            raise popart_exception(
                f"Data type {self.name} is not supported by the simulated IPU's kernels."
            ) from None

    @property
    def bits(self) -> int:
        """Packed width of one element on the device."""
        return _BITS[self]

    @property
    def itemsize(self) -> int:
        """Whole bytes per element of the host array (packed types: see ``bits``)."""
        return _ITEMSIZE[self]

    @property
    def short(self) -> str:
        """Short name used by the IR printer: f32, i64, bool ..."""
        return _SHORT[self]

    @property
    def lcase(self) -> str:
        """numpy-style lower-case name, as PopART's ``data_type_lcase()``."""
        return _LCASE.get(self, self.name.lower())

    @property
    def is_float(self) -> bool:
        """float32/16/64 and bfloat16: the types that carry gradients (not the 8-bit and
        narrower floats, which only Cast, quantization and data movement accept)."""
        return self in (DataType.FLOAT, DataType.FLOAT16, DataType.DOUBLE, DataType.BFLOAT16)

    @property
    def is_narrow_float(self) -> bool:
        """float8 (all kinds), float4 and float6."""
        return self in _NARROW_FLOATS

    @property
    def is_int(self) -> bool:
        return self in _INTS

    @property
    def is_unsigned(self) -> bool:
        return self in _UNSIGNED

    @property
    def is_surrogate(self) -> bool:
        """True when the simulator stores this type in a different torch dtype than the host's
        (the conversion at the host boundary is a copy, not a view)."""
        return self in _SURROGATE

    @property
    def storage_views_host(self) -> bool:
        """True when ``to_storage`` can view a host array's memory (no conversion copy), so
        the simulator may write results straight into the user's array."""
        return self not in _SURROGATE or self in _SAME_BITS_VIEW


class GraphcoreFloat8(enum.Enum):
    """Graphcore's own float8 formats, PopART's ``DataType.FLOAT8_143`` (sign, 4 exponent and
    3 mantissa bits) and ``FLOAT8_152`` (5 and 2), whose exponent bias is a runtime operand.
    The names exist; the simulated IPU has no kernels for them, so using one raises."""

    FLOAT8_143 = "FLOAT8_143"
    FLOAT8_152 = "FLOAT8_152"

    def refusal(self, where: str) -> popart_exception:
        return popart_exception(
            f"DataType.{self.name} ({where}): Graphcore's float8 formats with a runtime "
            f"exponent bias cannot be computed by the simulated IPU. Use FLOAT16, or an ONNX "
            f"float8 type (FLOAT8E4M3FN, FLOAT8E5M2) with Cast / QuantizeLinear."
        )


# PopART lists them under DataType; they are not ONNX element types, so not members.
DataType.FLOAT8_143 = GraphcoreFloat8.FLOAT8_143
DataType.FLOAT8_152 = GraphcoreFloat8.FLOAT8_152

_NUMPY = {
    DataType.FLOAT: np.dtype(np.float32),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.INT8: np.dtype(np.int8),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.INT16: np.dtype(np.int16),
    DataType.INT32: np.dtype(np.int32),
    DataType.INT64: np.dtype(np.int64),
    DataType.BOOL: np.dtype(np.bool_),
    DataType.FLOAT16: np.dtype(np.float16),
    DataType.DOUBLE: np.dtype(np.float64),
    DataType.UINT32: np.dtype(np.uint32),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.COMPLEX64: np.dtype(np.complex64),
    DataType.COMPLEX128: np.dtype(np.complex128),
    DataType.STRING: np.dtype(object),
    DataType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    DataType.FLOAT8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    DataType.FLOAT8E4M3FNUZ: np.dtype(ml_dtypes.float8_e4m3fnuz),
    DataType.FLOAT8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DataType.FLOAT8E5M2FNUZ: np.dtype(ml_dtypes.float8_e5m2fnuz),
    DataType.UINT4: np.dtype(ml_dtypes.uint4),
    DataType.INT4: np.dtype(ml_dtypes.int4),
    DataType.FLOAT4E2M1: np.dtype(ml_dtypes.float4_e2m1fn),
    DataType.FLOAT8E8M0: np.dtype(ml_dtypes.float8_e8m0fnu),
    DataType.UINT2: np.dtype(ml_dtypes.uint2),
    DataType.INT2: np.dtype(ml_dtypes.int2),
    DataType.FLOAT6E2M3: np.dtype(ml_dtypes.float6_e2m3fn),
    DataType.FLOAT6E3M2: np.dtype(ml_dtypes.float6_e3m2fn),
}

_NARROW_FLOATS = frozenset({
    DataType.FLOAT8E4M3FN, DataType.FLOAT8E4M3FNUZ, DataType.FLOAT8E5M2,
    DataType.FLOAT8E5M2FNUZ, DataType.FLOAT8E8M0, DataType.FLOAT4E2M1, DataType.FLOAT6E2M3,
    DataType.FLOAT6E3M2,
})

_TORCH = {
    DataType.FLOAT: torch.float32,
    DataType.UINT8: torch.uint8,
    DataType.INT8: torch.int8,
    DataType.INT16: torch.int16,
    DataType.INT32: torch.int32,
    DataType.INT64: torch.int64,
    DataType.BOOL: torch.bool,
    DataType.FLOAT16: torch.float16,
    DataType.DOUBLE: torch.float64,
    DataType.BFLOAT16: torch.bfloat16,
    DataType.COMPLEX64: torch.complex64,
    DataType.COMPLEX128: torch.complex128,
    # Surrogates (module docstring).
    DataType.UINT16: torch.int32,
    DataType.UINT32: torch.int64,
    DataType.UINT64: torch.int64,
    DataType.INT4: torch.int8,
    DataType.INT2: torch.int8,
    DataType.UINT4: torch.uint8,
    DataType.UINT2: torch.uint8,
    **{dt: torch.float32 for dt in _NARROW_FLOATS},
}

_SURROGATE = frozenset({
    DataType.UINT16, DataType.UINT32, DataType.UINT64, DataType.INT4, DataType.INT2,
    DataType.UINT4, DataType.UINT2, *_NARROW_FLOATS,
})

_BITS = {
    DataType.UNDEFINED: 0,
    DataType.STRING: 64,  # the pointer a device would hold, not the characters
    DataType.UINT4: 4,
    DataType.INT4: 4,
    DataType.FLOAT4E2M1: 4,
    DataType.UINT2: 2,
    DataType.INT2: 2,
    DataType.FLOAT6E2M3: 6,
    DataType.FLOAT6E3M2: 6,
}
_BITS.update({dt: 8 * npdt.itemsize for dt, npdt in _NUMPY.items() if dt not in _BITS})

_ITEMSIZE = {
    DataType.UNDEFINED: 0,
    DataType.STRING: 8,  # a pointer per element: memory models count no characters
    **{dt: npdt.itemsize for dt, npdt in _NUMPY.items() if dt is not DataType.STRING},
}

_SHORT = {
    DataType.UNDEFINED: "undef",
    DataType.FLOAT: "f32",
    DataType.UINT8: "u8",
    DataType.INT8: "i8",
    DataType.UINT16: "u16",
    DataType.INT16: "i16",
    DataType.INT32: "i32",
    DataType.INT64: "i64",
    DataType.STRING: "str",
    DataType.BOOL: "bool",
    DataType.FLOAT16: "f16",
    DataType.DOUBLE: "f64",
    DataType.UINT32: "u32",
    DataType.UINT64: "u64",
    DataType.COMPLEX64: "c64",
    DataType.COMPLEX128: "c128",
    DataType.BFLOAT16: "bf16",
    DataType.FLOAT8E4M3FN: "f8e4m3fn",
    DataType.FLOAT8E4M3FNUZ: "f8e4m3fnuz",
    DataType.FLOAT8E5M2: "f8e5m2",
    DataType.FLOAT8E5M2FNUZ: "f8e5m2fnuz",
    DataType.UINT4: "u4",
    DataType.INT4: "i4",
    DataType.FLOAT4E2M1: "f4e2m1",
    DataType.FLOAT8E8M0: "f8e8m0",
    DataType.UINT2: "u2",
    DataType.INT2: "i2",
    DataType.FLOAT6E2M3: "f6e2m3",
    DataType.FLOAT6E3M2: "f6e3m2",
}

_LCASE = {dt: npdt.name for dt, npdt in _NUMPY.items() if dt is not DataType.STRING}

_UNSIGNED = frozenset({
    DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64, DataType.UINT4,
    DataType.UINT2,
})

_INTS = frozenset({
    DataType.UINT8,
    DataType.INT8,
    DataType.UINT16,
    DataType.INT16,
    DataType.INT32,
    DataType.INT64,
    DataType.UINT32,
    DataType.UINT64,
    DataType.UINT4,
    DataType.INT4,
    DataType.UINT2,
    DataType.INT2,
})

# Host dtype whose bits the storage reinterprets without a copy.
_SAME_BITS_VIEW = {
    DataType.BFLOAT16: (np.int16, torch.bfloat16),
    DataType.UINT64: (np.int64, torch.int64),
}

# Bit masks that reduce a uint16/uint32 surrogate modulo 2**bits.
_WRAP_MASK = {DataType.UINT16: 0xFFFF, DataType.UINT32: 0xFFFFFFFF}


def to_storage(array: np.ndarray, dtype: DataType | None = None) -> torch.Tensor:
    """Host array -> simulator tensor of ``dtype.torch`` (default: the array's own type).

    Zero-copy for native types, bfloat16 and uint64 when ``array`` is C-contiguous and
    writeable (so the tensor may be a view the simulator writes into); a converted copy for
    the other surrogates.
    """
    array = np.asarray(array)
    dtype = DataType.from_numpy(array.dtype) if dtype is None else dtype
    if dtype in _SURROGATE and dtype not in _SAME_BITS_VIEW:
        return torch.from_numpy(np.ascontiguousarray(array.astype(_TORCH_HOST[dtype])))
    if not array.flags.c_contiguous or not array.flags.writeable:
        array = np.array(array, order="C", copy=True)  # keeps 0-d values 0-d
    view = _SAME_BITS_VIEW.get(dtype)
    if view is not None:
        return torch.from_numpy(array.view(view[0])).view(view[1])
    return torch.from_numpy(array)


def to_host(tensor: torch.Tensor, dtype: DataType | None = None) -> np.ndarray:
    """Simulator tensor -> host numpy array of ``dtype.numpy`` (default: the tensor's native
    type). May share memory with ``tensor``; copy it to keep it."""
    dtype = DataType.from_torch(tensor.dtype) if dtype is None else dtype
    if dtype is DataType.BFLOAT16:
        return tensor.view(torch.int16).numpy().view(_NUMPY[dtype])
    if dtype is DataType.UINT64:
        return tensor.numpy().view(np.uint64)
    if dtype in _SURROGATE:
        # numpy's integer casts wrap, which is what an unreduced uint16/32 surrogate needs.
        return tensor.numpy().astype(_NUMPY[dtype])
    return tensor.numpy()


def wrap_unsigned(tensor: torch.Tensor, dtype: DataType) -> torch.Tensor:
    """A uint16/uint32 surrogate reduced modulo 2**bits; other types unchanged."""
    mask = _WRAP_MASK.get(dtype)
    return tensor if mask is None else torch.bitwise_and(tensor, mask)


# numpy dtype the host array converts to before becoming a surrogate tensor.
_TORCH_HOST = {
    DataType.UINT16: np.int32,
    DataType.UINT32: np.int64,
    DataType.INT4: np.int8,
    DataType.INT2: np.int8,
    DataType.UINT4: np.uint8,
    DataType.UINT2: np.uint8,
    **{dt: np.float32 for dt in _NARROW_FLOATS},
}
