"""Cast and CastLike, and their gradient: between float types the gradient is cast back to the
source type; casts to or from integers and bool carry no gradient (autodiff only follows float
tensors, so it never asks).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import DataType
from ..errors import UnsupportedOpError
from ..ir.tensor import TensorInfo
from .base import Unary, check_dtypes
from .registry import register_op


def _cast_target(op, code: int) -> DataType:
    try:
        dtype = DataType(code)
    except ValueError:
        raise UnsupportedOpError(
            f"{op.debug_name}: cast to ONNX element type {code} (float8/int4 family) is not "
            f"supported by the simulated IPU."
        ) from None
    if dtype in (DataType.STRING, DataType.UNDEFINED):
        raise UnsupportedOpError(f"{op.debug_name}: casts to {dtype.name} are not supported.")
    return dtype


class CastBase(Unary):
    """Float -> int truncates toward zero and anything -> bool tests != 0, as torch's ``to``."""

    def _check_source(self, x: TensorInfo) -> None:
        check_dtypes(self, x, wide_unsigned_ok=True)
        if x.dtype is DataType.STRING:
            raise UnsupportedOpError(f"{self.debug_name}: casts from STRING are not supported.")

    def kernel(self, x, *_):
        return x.to(self._target)

    def grad(self, g):
        source, target = g.input_info(0).dtype, g.output_info(0).dtype
        # Integer and bool sides carry no gradient; autodiff never asks for one there.
        if not (source.is_float and target.is_float):
            return
        dy = g.output_grad(0)
        g.set_input_grad(0, dy if source == target else g.op("Cast", dy, to=source.onnx))


@register_op("Cast", versions=(6, 9, 13, 19, 21))
class Cast(CastBase):
    @dataclass(frozen=True)
    class Attrs:
        to: int

    # saturate only changes float8 results, which this backend does not produce.
    @dataclass(frozen=True)
    class AttrsV19:
        to: int
        saturate: int = 1

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return cls.AttrsV19 if version >= 19 else cls.Attrs

    def infer(self, x):
        self._check_source(x)
        target = _cast_target(self, self.attrs.to)
        self._target = target.torch
        return x.with_dtype(target)


@register_op("CastLike", versions=(15, 19, 21))
class CastLike(CastBase):
    @dataclass(frozen=True)
    class Attrs:
        saturate: int = 1

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return cls.Attrs if version >= 19 else NoSaturateAttrs

    def infer(self, x, like):
        self._check_source(x)
        check_dtypes(self, x, like, wide_unsigned_ok=True)
        target = _cast_target(self, like.dtype.value)
        self._target = target.torch
        return x.with_dtype(target)

    def fold_from_infos(self):
        # Only the dtype of ``like`` matters, so a constant ``x`` folds even when ``like`` is
        # computed (the exporters cast every scalar constant like an activation).
        x = self.inputs[0]
        return [x.data] if x is not None and x.is_const else None


@dataclass(frozen=True)
class NoSaturateAttrs:
    """CastLike-15 has no attributes."""

