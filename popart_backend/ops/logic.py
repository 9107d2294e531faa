"""Comparisons, logic and bitwise ops: Equal, Greater, Less, GreaterOrEqual, LessOrEqual, And,
Or, Xor, Not, BitShift, BitwiseAnd/Or/Xor/Not.

Versions follow the rules in ``elementwise``'s docstring. Every output is BOOL or integer, so
none of these ops has a gradient: autodiff never reaches them (only float tensors carry one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dtypes import DataType, wrap_unsigned
from ..errors import UnsupportedOpError
from ..ir.tensor import TensorInfo
from .base import Binary, Compare, UInt64, Unary, broadcast_shapes, check_dtypes
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
    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

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
    uint64 = UInt64.BITS

    def kernel(self, x):
        return torch.bitwise_not(x)


@register_op("BitShift", versions=(11, 28))
class BitShift(Binary):
    """Shifts in int64, then truncates to the type: left shifts drop the bits past the width
    (for signed types too, from version 28), right shifts are arithmetic for signed and logical
    for unsigned types. A shift amount that is negative or at least the width gives what sign
    extension alone gives: -1 for a right shift of a negative value, else 0 (version 28 states
    it; version 11 leaves it undefined and gets the same)."""

    @dataclass(frozen=True)
    class Attrs:
        direction: str

    def infer(self, a, b):
        check_dtypes(self, a, b, wide_unsigned_ok=True)  # uint64 handled below
        if self.attrs.direction not in ("LEFT", "RIGHT"):
            raise UnsupportedOpError(
                f"{self.debug_name}: direction='{self.attrs.direction}'; use 'LEFT' or 'RIGHT'."
            )
        self._left = self.attrs.direction == "LEFT"
        self._bits = a.dtype.bits
        self._dtype = a.dtype
        self._logical64 = a.dtype is DataType.UINT64
        return TensorInfo(a.dtype, broadcast_shapes(self, a.shape, b.shape))

    def kernel(self, a, b):
        x, shift = a.long(), b.long()
        # uint64 amounts >= 2**63 read as negative int64: out of range either way.
        outside = (shift < 0) | (shift >= self._bits)
        shift = torch.where(outside, 0, shift)
        if self._left:
            result = torch.where(outside, 0, torch.bitwise_left_shift(x, shift))
        else:
            result = torch.bitwise_right_shift(x, shift)
            if self._logical64:
                # Clear the copies of bit 63 the arithmetic shift brought in.
                low_bits = torch.full_like(x, 2**63 - 1)
                keep = torch.bitwise_right_shift(low_bits, (shift - 1).clamp(min=0))
                result = torch.where(shift == 0, x, torch.bitwise_and(result, keep))
            fill = torch.where(x < 0, -1, 0) if not self._dtype.is_unsigned else 0
            result = torch.where(outside, fill, result)
        return wrap_unsigned(result, self._dtype).to(a.dtype)


@register_op("BitwiseAnd", versions=18)
class BitwiseAnd(Binary):
    uint64 = UInt64.BITS

    def kernel(self, a, b):
        return torch.bitwise_and(a, b)


@register_op("BitwiseOr", versions=18)
class BitwiseOr(Binary):
    uint64 = UInt64.BITS

    def kernel(self, a, b):
        return torch.bitwise_or(a, b)


@register_op("BitwiseXor", versions=18)
class BitwiseXor(Binary):
    uint64 = UInt64.BITS

    def kernel(self, a, b):
        return torch.bitwise_xor(a, b)
