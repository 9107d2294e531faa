"""DataType: the element types of spec §3.3 and their ONNX, numpy and torch equivalents."""

from __future__ import annotations

import enum

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
        """Accept PopART's upper-case names ('FLOAT') and numpy names ('float32')."""
        key = name.upper()
        if key in cls.__members__:
            return cls[key]
        try:
            return cls.from_numpy(np.dtype(name))
        except TypeError:
            pass
        raise popart_exception(
            f"Unknown data type string '{name}'. Use one of {', '.join(cls.__members__)}."
        )

    @classmethod
    def from_numpy(cls, dtype) -> "DataType":
        dtype = np.dtype(dtype)
        for dt, npdt in _NUMPY.items():
            if npdt == dtype:
                return dt
        raise popart_exception(f"numpy dtype {dtype} has no PopART data type.")

    @classmethod
    def from_torch(cls, dtype: torch.dtype) -> "DataType":
        for dt, tdt in _TORCH.items():
            if tdt == dtype:
                return dt
        raise popart_exception(f"torch dtype {dtype} has no PopART data type.")

    @property
    def numpy(self) -> np.dtype:
        try:
            return _NUMPY[self]
        except KeyError:
            raise popart_exception(f"Data type {self.name} has no numpy equivalent.") from None

    @property
    def torch(self) -> torch.dtype:
        try:
            return _TORCH[self]
        except KeyError:
            raise popart_exception(
                f"Data type {self.name} is not supported by the simulated IPU's kernels."
            ) from None

    @property
    def itemsize(self) -> int:
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
        return self in (DataType.FLOAT, DataType.FLOAT16, DataType.DOUBLE, DataType.BFLOAT16)

    @property
    def is_int(self) -> bool:
        return self in _INTS


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
}

_TORCH = {
    DataType.FLOAT: torch.float32,
    DataType.UINT8: torch.uint8,
    DataType.INT8: torch.int8,
    DataType.UINT16: torch.uint16,
    DataType.INT16: torch.int16,
    DataType.INT32: torch.int32,
    DataType.INT64: torch.int64,
    DataType.BOOL: torch.bool,
    DataType.FLOAT16: torch.float16,
    DataType.DOUBLE: torch.float64,
    DataType.UINT32: torch.uint32,
    DataType.UINT64: torch.uint64,
    DataType.BFLOAT16: torch.bfloat16,
    DataType.COMPLEX64: torch.complex64,
    DataType.COMPLEX128: torch.complex128,
}

_ITEMSIZE = {
    DataType.UNDEFINED: 0,
    DataType.STRING: 8,
    DataType.BFLOAT16: 2,
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
}

_LCASE = {dt: str(npdt) for dt, npdt in _NUMPY.items() if dt is not DataType.STRING}

_INTS = {
    DataType.UINT8,
    DataType.INT8,
    DataType.UINT16,
    DataType.INT16,
    DataType.INT32,
    DataType.INT64,
    DataType.UINT32,
    DataType.UINT64,
}
