"""Col2Im (opset 18): sum sliding blocks back into an image, over any number of spatial dims
(torch's ``fold`` for every rank, not just 2-D).

``image_shape`` and ``block_shape`` set the output shape, so they must be compile-time constants.
``infer()`` computes, once, where in the padded image each element of every block lands; the
kernel is then one ``index_add_`` into zeros (overlapping blocks add up, in a fixed order) and a
crop of the padding.

Gradient (Col2ImGrad, torch's ``unfold``): each block element took one image element, so dx
gathers dy, zero-padded, at the same positions.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ShapeError
from ..ir.op import Op
from .conv import spatial_list
from .registry import AI_GRAPHCORE, register_op


@dataclass(frozen=True)
class _Layout:
    """Where the (kernel offset, block) pairs of the column input land in the padded image."""

    kernel_size: int  # elements per block (prod of block_shape)
    num_blocks: int  # L
    padded: tuple[int, ...]
    crop: tuple[slice, ...]  # of the padded image's spatial dims: the image
    index: torch.Tensor  # [kernel_size * num_blocks] linear positions in the padded image


def _layout(op: Op, image: list[int], block: list[int], strides: tuple, pads: tuple,
            dilations: tuple) -> _Layout:
    n = len(image)
    if len(block) != n or n == 0:
        raise ShapeError(
            f"{op.debug_name}: image_shape {image} and block_shape {block} need one equal, "
            f"non-zero number of spatial dims.")
    strides = spatial_list(op, "strides", strides, n, 1)
    dilations = spatial_list(op, "dilations", dilations, n, 1)
    pads = tuple(pads) or (0,) * (2 * n)
    if len(pads) != 2 * n or min(pads) < 0:
        raise ShapeError(f"{op.debug_name}: pads={list(pads)} needs {2 * n} values >= 0.")
    padded = tuple(i + b + e for i, b, e in zip(image, pads[:n], pads[n:]))
    counts = []
    for size, k, s, d in zip(padded, block, strides, dilations):
        count = (size - d * (k - 1) - 1) // s + 1
        if k < 1 or count < 1:
            raise ShapeError(
                f"{op.debug_name}: block_shape {block} (dilations {list(dilations)}) does not fit "
                f"the padded image {list(padded)}.")
        counts.append(count)
    kernel_size, num_blocks = math.prod(block), math.prod(counts)
    # Position along each dim of kernel offset k in block b is b * stride + k * dilation.
    place = np.zeros((kernel_size, num_blocks), np.int64)
    row_stride = np.cumprod((1,) + padded[:0:-1])[::-1]
    for dim, (k, c, s, d) in enumerate(zip(block, counts, strides, dilations)):
        offsets = np.array([o[dim] for o in itertools.product(*map(range, block))]) * d
        starts = np.array([o[dim] for o in itertools.product(*map(range, counts))]) * s
        place += (offsets[:, None] + starts[None, :]) * row_stride[dim]
    crop = tuple(slice(b, b + i) for b, i in zip(pads[:n], image))
    return _Layout(kernel_size, num_blocks, padded, crop, torch.from_numpy(place.reshape(-1)))


def _shape_operand(op: Op, index: int) -> list[int]:
    return [int(v) for v in np.asarray(op.const_input(index)).reshape(-1)]


@register_op("Col2Im", versions=18)
class Col2Im(Op):
    """[N, C * prod(block_shape), L] blocks summed into [N, C, *image_shape]."""

    const_inputs = (1, 2)

    @dataclass(frozen=True)
    class Attrs:
        dilations: tuple[int, ...] = ()
        pads: tuple[int, ...] = ()
        strides: tuple[int, ...] = ()

    def infer(self, cols, image_shape, block_shape):
        a = self.attrs
        self.image = _shape_operand(self, 1)
        self.block = _shape_operand(self, 2)
        lay = self._layout = _layout(self, self.image, self.block, a.strides, a.pads,
                                     a.dilations)
        if cols.rank != 3 or cols.shape[1] % lay.kernel_size or cols.shape[2] != lay.num_blocks:
            raise ShapeError(
                f"{self.debug_name}: input {cols} must be [N, C * {lay.kernel_size}, "
                f"{lay.num_blocks}] for block_shape {self.block} sliding over the padded image "
                f"{list(lay.padded)} (strides {list(a.strides)}, dilations {list(a.dilations)}).")
        self._channels = cols.shape[1] // lay.kernel_size
        return cols.with_shape((cols.shape[0], self._channels, *self.image))

    def kernel(self, cols, image_shape, block_shape):
        lay, c = self._layout, self._channels
        n = cols.shape[0]
        flat = cols.reshape(n, c, lay.kernel_size * lay.num_blocks)
        image = flat.new_zeros((n, c, math.prod(lay.padded)))
        image.index_add_(2, lay.index, flat)
        return image.reshape((n, c) + lay.padded)[(Ellipsis,) + lay.crop]

    def grad(self, g):
        a = self.attrs
        g.set_input_grad(0, g.op("Col2ImGrad", g.output_grad(0), domain=AI_GRAPHCORE,
                                 image_shape=tuple(self.image), block_shape=tuple(self.block),
                                 strides=a.strides, pads=a.pads, dilations=a.dilations))

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        return self.inputs[0].info.nelms, moved


@register_op("Col2ImGrad", versions=1, domain=AI_GRAPHCORE)
class Col2ImGrad(Op):
    """d cols of Col2Im: dy zero-padded and gathered at each block element's position."""

    @dataclass(frozen=True)
    class Attrs:
        image_shape: tuple[int, ...]
        block_shape: tuple[int, ...]
        dilations: tuple[int, ...] = ()
        pads: tuple[int, ...] = ()
        strides: tuple[int, ...] = ()

    def infer(self, dy):
        a = self.attrs
        if dy.rank != len(a.image_shape) + 2 or dy.shape[2:] != a.image_shape:
            raise ShapeError(
                f"{self.debug_name}: gradient {dy} must be [N, C, *{list(a.image_shape)}].")
        lay = self._layout = _layout(self, list(a.image_shape), list(a.block_shape), a.strides,
                                     a.pads, a.dilations)
        return dy.with_shape((dy.shape[0], dy.shape[1] * lay.kernel_size, lay.num_blocks))

    def kernel(self, dy):
        lay = self._layout
        n, c = dy.shape[:2]
        padded = dy.new_zeros((n, c) + lay.padded)
        padded[(Ellipsis,) + lay.crop] = dy
        cols = padded.reshape(n, c, -1).index_select(2, lay.index)
        return cols.reshape(n, c * lay.kernel_size, lay.num_blocks)


__all__: list[str] = []
