"""Ops that make tensors from shapes and constants: Shape, Size, Range,
ConstantOfShape, Constant, EyeLike and Trilu, at every ai.onnx since-version <= 28.

Shape, Size and EyeLike fold from static input infos (``fold_from_infos``), and Constant folds
from its attribute, so the shape arithmetic exporters emit (Shape -> Gather -> Concat ->
Reshape) disappears at import. Their constant operands are read with the helpers of
``shape.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from ..dtypes import DataType, to_storage
from ..errors import ShapeError, UnsupportedOpError
from ..ir.op import NoAttrs, Op
from ..ir.tensor import TensorInfo
from .registry import register_op
from .shape import INT64, const_ints, const_scalar, shape_str
from .string_tensors import string_array


# --- Shape queries -----------------------------------------------------------------------------


@register_op("Shape", versions=(1, 13, 15, 19, 21, 23, 24, 25))
class Shape(Op):
    """INT64 dims of the input, ``[start:end]`` from 15 (clamped); folds from static shapes."""

    @dataclass(frozen=True)
    class Attrs:
        start: int = 0
        end: int | None = None

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs if version >= 15 else NoAttrs

    def infer(self, data):
        rank = data.rank
        start = getattr(self.attrs, "start", 0)
        end = getattr(self.attrs, "end", None)
        end = rank if end is None else end
        start = min(max(start + rank if start < 0 else start, 0), rank)
        end = min(max(end + rank if end < 0 else end, 0), rank)
        self.value = np.array(data.shape[start:end], dtype=np.int64)
        return TensorInfo(INT64, self.value.shape)

    def fold_from_infos(self):
        return [self.value.copy()]

    def kernel(self, data):
        return torch.tensor(self.value.tolist(), dtype=torch.int64)


@register_op("Size", versions=(1, 13, 19, 21, 23, 24, 25))
class Size(Op):
    """INT64 scalar element count; folds from static shapes."""

    def infer(self, data):
        self.nelms = data.nelms
        return TensorInfo(INT64, ())

    def fold_from_infos(self):
        return [np.array(self.nelms, dtype=np.int64)]

    def kernel(self, data):
        return torch.tensor(self.nelms, dtype=torch.int64)


# --- Generators --------------------------------------------------------------------------------


@register_op("Range", versions=(11, 27))
class Range(Op):
    """output[i] = start + i * delta for i < max(ceil((limit - start) / delta), 0).

    All three operands are constants, so the op folds at import. From version 27
    ``stash_type`` = 1 (the default) computes float16 / bfloat16 ranges in float32 and casts the
    result back, so large ranges do not accumulate half-precision rounding.
    """

    @dataclass(frozen=True)
    class Attrs:
        stash_type: int = 1

    @dataclass(frozen=True)
    class Attrs11:
        pass

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs if version >= 27 else cls.Attrs11

    const_inputs = (0, 1, 2)

    def infer(self, start, limit, delta):
        if not start.dtype == limit.dtype == delta.dtype:
            raise ShapeError(
                f"{self.debug_name}: start, limit and delta must share a dtype, got "
                f"{start.dtype.name}, {limit.dtype.name}, {delta.dtype.name}.")
        first = const_scalar(self, 0, "start")
        limit_v = const_scalar(self, 1, "limit")
        step = const_scalar(self, 2, "delta")
        if step == 0:
            raise ShapeError(f"{self.debug_name}: delta must be non-zero.")
        if start.dtype.is_float:
            # In the operands' precision, as the reference implementations compute it.
            count = int(np.ceil((limit_v - first) / step))
        else:
            count = -((int(first) - int(limit_v)) // int(step))  # exact integer ceil
        count = max(count, 0)
        half = start.dtype in (DataType.FLOAT16, DataType.BFLOAT16)
        if half and getattr(self.attrs, "stash_type", 1) == 1:
            wide = np.float32(first) + np.arange(count, dtype=np.float32) * np.float32(step)
            values = wide.astype(start.dtype.numpy)
        elif half:
            # stash_type 0: each element is the previous one plus delta, rounded to the type.
            values = np.empty(count, dtype=start.dtype.numpy)
            current = np.asarray(first, dtype=start.dtype.numpy)
            for i in range(count):
                values[i] = current
                current = (current + np.asarray(step, dtype=start.dtype.numpy)).astype(
                    start.dtype.numpy)
        else:
            values = first + np.arange(count, dtype=start.dtype.numpy) * step
        self.value = to_storage(np.asarray(values, dtype=start.dtype.numpy, order="C"))
        return TensorInfo(start.dtype, (count,))

    def kernel(self, start, limit, delta):
        return self.value.clone()


@register_op("ConstantOfShape", versions=(9, 20, 21, 23, 24, 25))
class ConstantOfShape(Op):
    """A tensor of constant shape filled with ``value`` (one element; default float32 0)."""

    @dataclass(frozen=True)
    class Attrs:
        value: np.ndarray | None = None

    const_inputs = (0,)

    def infer(self, shape):
        dims = const_ints(self, 0, "shape")
        if any(d < 0 for d in dims):
            raise ShapeError(f"{self.debug_name}: shape {list(dims)} has negative dimensions.")
        value = self.attrs.value
        value = np.zeros(1, np.float32) if value is None else np.asarray(value)
        if value.size != 1:
            raise ShapeError(
                f"{self.debug_name}: 'value' must hold one element, got shape "
                f"{shape_str(value.shape)}.")
        dtype = DataType.from_numpy(value.dtype)
        self.out_shape, self.dtype = dims, dtype.torch
        self.fill = to_storage(value.reshape(-1)[:1], dtype)[0].item()  # storage's value
        return TensorInfo(dtype, dims)

    def kernel(self, shape):
        return torch.full(self.out_shape, self.fill, dtype=self.dtype)


def _sparse_to_dense(op: Op, sparse: onnx.SparseTensorProto) -> np.ndarray:
    """Dense numpy value of a SparseTensorProto (indices linearized [NNZ] or [NNZ, rank])."""
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(sparse.dims)
    dense = np.zeros(math.prod(dims), dtype=values.dtype)
    if indices.ndim == 2:
        if indices.shape[1] != len(dims):
            raise UnsupportedOpError(
                f"{op.debug_name}: sparse_value indices have shape {list(indices.shape)}, "
                f"expected [NNZ, {len(dims)}].")
        indices = np.ravel_multi_index(tuple(indices.T), dims) if dims else indices[:, 0]
    dense[indices.reshape(-1)] = values.reshape(-1)
    return dense.reshape(dims)


@register_op("Constant", versions=(1, 9, 11, 12, 13, 19, 21, 23, 24, 25))
class Constant(Op):
    """Exactly one of the value attributes; the op folds to a constant tensor at import."""

    @dataclass(frozen=True)
    class Attrs:
        value: np.ndarray | None = None
        sparse_value: object = None
        value_float: float | None = None
        value_floats: tuple[float, ...] | None = None
        value_int: int | None = None
        value_ints: tuple[int, ...] | None = None
        value_string: str | None = None
        value_strings: tuple[str, ...] | None = None

    @dataclass(frozen=True)
    class Attrs1:
        value: np.ndarray

    @dataclass(frozen=True)
    class Attrs11:
        value: np.ndarray | None = None
        sparse_value: object = None

    @classmethod
    def attrs_type(cls, version):
        if version < 11:
            return cls.Attrs1
        return cls.Attrs11 if version == 11 else cls.Attrs

    def infer(self):
        given = {k: v for k, v in vars(self.attrs).items() if v is not None}
        if len(given) != 1:
            raise ShapeError(
                f"{self.debug_name}: exactly one value attribute must be set, got "
                f"{sorted(given) or 'none'}.")
        (name, value), = given.items()
        if name == "value_string":
            array = string_array(value)
        elif name == "value_strings":
            array = string_array(value, (len(value),))
        elif name == "value" and np.asarray(value).dtype.kind in "OSU":
            array = string_array(value)
        elif name == "sparse_value":
            array = _sparse_to_dense(self, value)
        elif name == "value_float":
            array = np.array(value, dtype=np.float32)
        elif name == "value_floats":
            array = np.array(value, dtype=np.float32).reshape(len(value))
        elif name == "value_int":
            array = np.array(value, dtype=np.int64)
        elif name == "value_ints":
            array = np.array(value, dtype=np.int64).reshape(len(value))
        else:
            array = np.asarray(value)
        self.value = np.asarray(array, order="C")  # ascontiguousarray would make 0-d 1-d
        return TensorInfo.of(self.value)

    def fold_from_infos(self):
        return [self.value.copy()]

    def kernel(self):
        return to_storage(self.value.copy())


@register_op("EyeLike", versions=(9, 22))
class EyeLike(Op):
    """Ones on the k-th diagonal of a 2-D tensor shaped like the input; folds from its shape."""

    @dataclass(frozen=True)
    class Attrs:
        dtype: int | None = None
        k: int = 0

    def infer(self, data):
        if data.rank != 2:
            raise ShapeError(
                f"{self.debug_name}: input '{self.inputs[0].id}' {data} must be 2-D.")
        dtype = data.dtype if self.attrs.dtype is None else DataType.from_onnx(self.attrs.dtype)
        self.value = np.eye(*data.shape, k=self.attrs.k, dtype=dtype.numpy)
        return TensorInfo(dtype, data.shape)

    def fold_from_infos(self):
        return [self.value.copy()]

    def kernel(self, data):
        return to_storage(self.value.copy())

    def grad(self, g):
        """The output depends only on the input's shape: zero gradient."""


@register_op("Trilu", versions=(14,))
class Trilu(Op):
    """Upper (``upper=1``) or lower triangle of the last two dims, from diagonal ``k``."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @dataclass(frozen=True)
    class Attrs:
        upper: int = 1

    const_inputs = (1,)

    def infer(self, data, k=None):
        if data.rank < 2:
            raise ShapeError(
                f"{self.debug_name}: input '{self.inputs[0].id}' {data} needs rank >= 2.")
        k_value = const_scalar(self, 1, "k")
        self.k = 0 if k_value is None else int(k_value)
        return data

    def kernel(self, x, k=None):
        return torch.triu(x, self.k) if self.attrs.upper else torch.tril(x, self.k)

    def grad(self, g):
        k = g.const(np.array(self.k, np.int64), "k")
        g.set_input_grad(0, g.op("Trilu", g.output_grad(0), k, upper=self.attrs.upper))
