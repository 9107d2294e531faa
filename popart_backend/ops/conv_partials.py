"""Convolutions with float16 partials (convolutionOptions ``partialsType`` "half", the
builder's ``setPartialsType(half)``), 1-D, 2-D and 3-D, forward and gradient.

The IPU's AMP units then keep their running sums in float16: every product and every addition
is rounded to float16. Each convolution is written as matrix products over the unfolded
windows of X (im2col: rows in the order channel, then kernel position in row-major order) and
those products go through ``half_partials_matmul``:

- forward: Y[n, m, o] = sum over (c, k) of W[m, c, k] · X[n, c, o·s + k·d - p], per group;
- dW[m, c, k] = sum over (n, o) of dY[n, m, o] · X[n, c, o·s + k·d - p] (n outer, o inner);
- dX: for each kernel position k (row-major) the column gradient sum over m of
  W[m, c, k] · dY[n, m, o] (float16 running sum), added in float16 to dX at o·s + k·d - p.

The bias gradient is a reduction of dY, not a product: it keeps the ordinary reduction.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from .matmul import half_partials_matmul

__all__ = ["half_partials_conv_grads", "half_partials_conv_nd", "unfold_nd"]


def _torch_pad(padding) -> tuple[int, ...]:
    pads: list[int] = []
    for p in reversed(tuple(padding)):
        pads += [p, p]
    return tuple(pads)


def out_sizes(sizes, kernel, stride, padding, dilation) -> tuple[int, ...]:
    return tuple((i + 2 * p - d * (k - 1) - 1) // s + 1
                 for i, k, s, p, d in zip(sizes, kernel, stride, padding, dilation))


def unfold_nd(x: torch.Tensor, kernel, stride, padding, dilation) -> torch.Tensor:
    """The windows of ``x`` [N, C, i1..in] as columns [N, C·prod(k), prod(o)] (rows: channel,
    then kernel position row-major), as ``F.unfold`` for any number of spatial dims."""
    n, c = x.shape[:2]
    spatial = len(kernel)
    outs = out_sizes(x.shape[2:], kernel, stride, padding, dilation)
    x = F.pad(x, _torch_pad(padding))
    for d in range(spatial):
        x = x.unfold(2 + d, dilation[d] * (kernel[d] - 1) + 1, stride[d])
    # [N, C, o1..on, e1..en]: keep every dilation-th window element, then kernel before output.
    x = x[(Ellipsis, *(slice(None, None, dil) for dil in dilation))]
    x = x[(slice(None), slice(None), *(slice(0, o) for o in outs))]
    order = [0, 1, *range(2 + spatial, 2 + 2 * spatial), *range(2, 2 + spatial)]
    return x.permute(order).reshape(n, c * math.prod(kernel), math.prod(outs))


def half_partials_conv_nd(x, w, b, stride, padding, dilation, groups: int) -> torch.Tensor:
    """Y of a float16 convolution whose sums run in float16 (module docstring)."""
    n = x.shape[0]
    m, per_group = w.shape[:2]
    kernel = tuple(w.shape[2:])
    outs = out_sizes(x.shape[2:], kernel, stride, padding, dilation)
    cols = unfold_nd(x, kernel, stride, padding, dilation)
    k = per_group * math.prod(kernel)
    cols = cols.reshape(n, groups, k, math.prod(outs))
    weights = w.reshape(groups, m // groups, k)
    y = torch.cat([half_partials_matmul(weights[g], cols[:, g]) for g in range(groups)], dim=1)
    if b is not None:
        y = y + b.reshape(1, m, 1)
    return y.reshape(n, m, *outs)


def half_partials_conv_grads(dy, x, w, stride, padding, dilation, groups: int, mask):
    """(dX, dW, dB) of a float16 convolution with float16 partials, None where ``mask`` (three
    booleans) does not ask for it."""
    n, channels = x.shape[:2]
    m, per_group = w.shape[:2]
    kernel = tuple(w.shape[2:])
    outs = tuple(dy.shape[2:])
    positions = math.prod(outs)
    k = per_group * math.prod(kernel)
    dy_groups = dy.reshape(n, groups, m // groups, positions)
    dx = dw = db = None
    if mask[1]:
        cols = unfold_nd(x, kernel, stride, padding, dilation).reshape(n, groups, k, positions)
        dw = torch.cat([half_partials_matmul(
            dy_groups[:, g].permute(1, 0, 2).reshape(m // groups, n * positions),
            cols[:, g].permute(0, 2, 1).reshape(n * positions, k)) for g in range(groups)])
        dw = dw.reshape(w.shape)
    if mask[0]:
        weights = w.reshape(groups, m // groups, k)
        # Column gradients [N, C, k1..kn, o1..on], then added back window by window.
        col_grads = torch.cat([half_partials_matmul(weights[g].t(), dy_groups[:, g])
                               for g in range(groups)], dim=1)
        col_grads = col_grads.reshape(n, channels, *kernel, *outs)
        padded = torch.zeros(n, channels, *(i + 2 * p for i, p in zip(x.shape[2:], padding)),
                             dtype=dy.dtype)
        for position in itertools.product(*(range(kk) for kk in kernel)):
            window = tuple(slice(p * d, p * d + s * (o - 1) + 1, s)
                           for p, d, s, o in zip(position, dilation, stride, outs))
            padded[(slice(None), slice(None), *window)] += col_grads[
                (slice(None), slice(None), *position)]
        dx = padded[(slice(None), slice(None),
                     *(slice(p, p + i) for p, i in zip(padding, x.shape[2:])))]
    if mask[2]:
        db = dy.sum((0, *range(2, dy.dim())))
    return dx, dw, db
