"""CenterCropPad (opset 18): crop or zero-pad chosen axes to a target size around the centre.

The target ``shape`` input sets the output shape, so it must be a compile-time constant (like
Reshape's). ``infer()`` turns it into one source and one destination slice per axis, so the
kernel is a zero fill and one copy for any dtype.

Gradient: cropping then padding back (or the reverse) to the input's size puts every element
back where it came from, because both directions split the size difference the same way (the
extra element goes after the centre). So the gradient is CenterCropPad of dy to the input's
shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ModelError, ShapeError
from ..ir.op import Op
from .base import check_dtypes, normalize_axis
from .registry import register_op


@register_op("CenterCropPad", versions=18)
class CenterCropPad(Op):
    """Each axis in ``axes`` (default all) is cropped to ``shape`` (start rounded down) or padded
    with zeros (the odd element going to the end); the other axes are kept."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)
    const_inputs = (1,)

    @dataclass(frozen=True)
    class Attrs:
        axes: tuple[int, ...] | None = None

    def infer(self, x, shape):
        check_dtypes(self, x, shape, wide_unsigned_ok=True)
        target = np.asarray(self.const_input(1)).reshape(-1).astype(np.int64)
        axes = self.attrs.axes
        axes = tuple(range(x.rank)) if axes is None else tuple(
            normalize_axis(self, a, x.rank) for a in axes)
        if len(set(axes)) != len(axes):
            raise ModelError(f"{self.debug_name}: axes {list(self.attrs.axes)} repeat an axis.")
        if len(target) != len(axes):
            raise ShapeError(
                f"{self.debug_name}: shape {target.tolist()} needs one size per axis of "
                f"{list(axes)} ({len(axes)} values).")
        if (target < 0).any():
            raise ShapeError(f"{self.debug_name}: shape {target.tolist()} must not be negative.")
        out_shape = list(x.shape)
        src = [slice(None)] * x.rank
        dst = [slice(None)] * x.rank
        for axis, size in zip(axes, target.tolist()):
            have = x.shape[axis]
            out_shape[axis] = size
            if size < have:
                start = (have - size) // 2
                src[axis] = slice(start, start + size)
            elif size > have:
                start = (size - have) // 2
                dst[axis] = slice(start, start + have)
        self._src, self._dst = tuple(src), tuple(dst)
        self._out_shape = tuple(out_shape)
        return x.with_shape(self._out_shape)

    def kernel(self, x, shape):
        out = x.new_zeros(self._out_shape)
        out[self._dst] = x[self._src]
        return out

    def grad(self, g):
        shape = np.array(g.input_info(0).shape, np.int64)
        g.set_input_grad(0, g.op("CenterCropPad", g.output_grad(0), g.const(shape, "shape")))


__all__: list[str] = []
