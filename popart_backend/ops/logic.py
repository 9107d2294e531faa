"""Comparisons, logic and bitwise ops: Equal, Greater, Less, GreaterOrEqual, LessOrEqual, And,
Or, Xor, Not, BitShift, BitwiseAnd/Or/Xor/Not.

Versions follow the rules in ``elementwise``'s docstring. Every output is BOOL or integer, so
none of these ops has a gradient: autodiff never reaches them (only float tensors carry one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import UnsupportedOpError
from ..ir.tensor import TensorInfo
from .base import WIDE_UNSIGNED, Binary, Compare, Unary, broadcast_shapes, check_dtypes
from .registry import register_op


@register_op("And", versions=(1, 7))
class And(Compare):
    def kernel(self, a, b):
        return torch.logical_and(a, self.legacy_align(a, b))


@register_op("Or", versions=(1, 7))
class Or(Compare):
    def kernel(self, a, b):
        return torch.logical_or(a, self.legacy_align(a, b))


@register_op("Xor", versions=(1, 7))
class Xor(Compare):
    def kernel(self, a, b):
        return torch.logical_xor(a, self.legacy_align(a, b))


@register_op("Equal", versions=(1, 7, 11, 13, 19))
class Equal(Compare):
    def kernel(self, a, b):
        return torch.eq(a, self.legacy_align(a, b))


@register_op("Greater", versions=(1, 7, 9, 13))
class Greater(Compare):
    def kernel(self, a, b):
        return torch.gt(a, self.legacy_align(a, b))


@register_op("Less", versions=(1, 7, 9, 13))
class Less(Compare):
    def kernel(self, a, b):
        return torch.lt(a, self.legacy_align(a, b))


@register_op("GreaterOrEqual", versions=(12, 16))
class GreaterOrEqual(Compare):
    def kernel(self, a, b):
        return torch.ge(a, b)


@register_op("LessOrEqual", versions=(12, 16))
class LessOrEqual(Compare):
    def kernel(self, a, b):
        return torch.le(a, b)


# --- bitwise ------------------------------------------------------------------------------------


@register_op("Not", versions=1)
class Not(Unary):
    def kernel(self, x):
        return torch.logical_not(x)


@register_op("BitwiseNot", versions=18)
class BitwiseNot(Unary):
    def kernel(self, x):
        return torch.bitwise_not(x)


@register_op("BitShift", versions=11)
class BitShift(Binary):
    """uint16/uint32 shift in int64 (torch lacks those kernels) and wrap back; uint64 raises."""

    @dataclass(frozen=True)
    class Attrs:
        direction: str

    def infer(self, a, b):
        check_dtypes(self, a, b, wide_unsigned_ok=True)
        if self.attrs.direction not in ("LEFT", "RIGHT"):
            raise UnsupportedOpError(
                f"{self.debug_name}: direction='{self.attrs.direction}'; use 'LEFT' or 'RIGHT'."
            )
        if a.dtype is DataType.UINT64:
            raise UnsupportedOpError(
                f"{self.debug_name}: uint64 shifts are not implemented by the simulated IPU's "
                f"kernels; use uint8, uint16 or uint32."
            )
        self._widen = a.dtype in WIDE_UNSIGNED
        left = self.attrs.direction == "LEFT"
        self._shift = torch.bitwise_left_shift if left else torch.bitwise_right_shift
        return TensorInfo(a.dtype, broadcast_shapes(self, a.shape, b.shape))

    def kernel(self, a, b):
        if self._widen:
            return self._shift(a.long(), b.long()).to(a.dtype)
        return self._shift(a, b)


@register_op("BitwiseAnd", versions=18)
class BitwiseAnd(Binary):
    def kernel(self, a, b):
        return torch.bitwise_and(a, b)


@register_op("BitwiseOr", versions=18)
class BitwiseOr(Binary):
    def kernel(self, a, b):
        return torch.bitwise_or(a, b)


@register_op("BitwiseXor", versions=18)
class BitwiseXor(Binary):
    def kernel(self, a, b):
        return torch.bitwise_xor(a, b)
