"""Slicing and joining ops: Slice, Split, Concat and Pad, at every ai.onnx
since-version <= 28, with the grad ops SliceGrad and PadGrad (ai.graphcore domain).

Their starts, ends, axes, steps, split sizes and pads are constant operands, resolved once in
``infer()`` with the helpers of ``shape.py``.

Gradients: Concat and Split swap roles, Pad in constant mode pads the gradient by the negated
pads, and Slice and the non-constant Pad modes scatter the gradient back with SliceGrad and
PadGrad, which precompute their index plan in ``infer()``.

Aliasing: Slice (positive steps) and Split return views of their input; see ``shape.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import NoAttrs, Op
from .base import normalize_axis
from .registry import AI_GRAPHCORE, register_op
from .shape import ViewOp, const_ints, const_scalar, normalize_axes, shape_str

# --- Slicing and joining -----------------------------------------------------------------------


def slice_indices(op: Op, shape, starts, ends, axes, steps):
    """Resolve ONNX Slice operands to (output shape, tuple of positive-step slices, axes to flip).

    Follows the ONNX rules: negative starts/ends count from the end, then clamp to [0, dim]
    (positive step) or [0, dim-1] / [-1, dim-1] (negative step), so INT64 max/min work as
    "to the end".
    """
    rank = len(shape)
    if len(starts) != len(ends):
        raise ShapeError(
            f"{op.debug_name}: starts {list(starts)} and ends {list(ends)} differ in length."
        )
    axes = tuple(range(len(starts))) if axes is None else axes
    steps = (1,) * len(starts) if steps is None else steps
    if not len(axes) == len(steps) == len(starts):
        raise ShapeError(
            f"{op.debug_name}: starts ({len(starts)}), ends, axes ({len(axes)}) and steps "
            f"({len(steps)}) must have the same length."
        )
    axes = normalize_axes(op, axes, rank)
    out_shape = list(shape)
    index = [slice(None)] * rank
    flip = []
    for axis, start, end, step in zip(axes, starts, ends, steps):
        dim = shape[axis]
        if step == 0:
            raise ShapeError(f"{op.debug_name}: step 0 on axis {axis}; steps must be non-zero.")
        # As the ONNX spec says; onnxruntime differs in one corner: it reads an INT_MAX end with
        # a negative step as "to the beginning", where the spec clamps it to dim - 1.
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start = min(max(start, 0), dim)
            end = min(max(end, 0), dim)
            count = max(0, -(-(end - start) // step))
        else:
            start = min(max(start, 0), dim - 1)
            end = min(max(end, -1), dim - 1)
            count = max(0, -(-(start - end) // -step))
        out_shape[axis] = count
        if count == 0:
            index[axis] = slice(0, 0)
        elif step > 0:
            index[axis] = slice(start, start + (count - 1) * step + 1, step)
        else:
            # torch has no negative-step slicing: take the same elements forwards, then flip.
            last = start + (count - 1) * step
            index[axis] = slice(last, start + 1, -step)
            if count > 1:
                flip.append(axis)
    return tuple(out_shape), tuple(index), tuple(flip)


@register_op("Slice", versions=(1, 10, 11, 13))
class Slice(Op):
    """Slice-1 takes starts/ends/axes attributes; 10+ takes them (and steps) as constant inputs."""

    aliases_inputs = True  # a strided view of the input

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @dataclass(frozen=True)
    class Attrs1:
        starts: tuple[int, ...]
        ends: tuple[int, ...]
        axes: tuple[int, ...] | None = None

    const_inputs = (1, 2, 3, 4)

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs1 if version == 1 else NoAttrs

    def infer(self, data, *operands):
        if self.version == 1:
            starts, ends, axes, steps = self.attrs.starts, self.attrs.ends, self.attrs.axes, None
        else:
            starts = const_ints(self, 1, "starts")
            ends = const_ints(self, 2, "ends")
            axes = const_ints(self, 3, "axes")
            steps = const_ints(self, 4, "steps")
            if starts is None or ends is None:
                raise ShapeError(f"{self.debug_name}: the 'starts' and 'ends' inputs are required.")
        out_shape, self.index, self.flip = slice_indices(
            self, data.shape, starts, ends, axes, steps)
        # The operands with defaults filled, for SliceGrad to rebuild the same plan.
        self.operands = dict(
            starts=tuple(starts), ends=tuple(ends),
            axes=tuple(range(len(starts))) if axes is None else tuple(axes),
            steps=(1,) * len(starts) if steps is None else tuple(steps))
        return data.with_shape(out_shape)

    def kernel(self, x, *operands):
        y = x[self.index]
        return torch.flip(y, self.flip) if self.flip else y

    def grad(self, g):
        g.set_input_grad(0, g.op("SliceGrad", g.output_grad(0), domain=AI_GRAPHCORE,
                                 shape=g.input_info(0).shape, **self.operands))


@register_op("SliceGrad", versions=1, domain=AI_GRAPHCORE)
class SliceGrad(Op):
    """dx = zeros of the sliced input's shape, with dy written where Slice read (any steps)."""

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...]
        starts: tuple[int, ...]
        ends: tuple[int, ...]
        axes: tuple[int, ...]
        steps: tuple[int, ...]

    def infer(self, dy):
        a = self.attrs
        sliced, self.index, self.flip = slice_indices(self, a.shape, a.starts, a.ends, a.axes,
                                                      a.steps)
        if sliced != dy.shape:
            raise ShapeError(
                f"{self.debug_name}: gradient {dy} does not have the slice's shape "
                f"{shape_str(sliced)} (input shape {shape_str(a.shape)}).")
        return dy.with_shape(a.shape)

    def kernel(self, dy):
        dx = dy.new_zeros(self.attrs.shape)
        dx[self.index] = torch.flip(dy, self.flip) if self.flip else dy
        return dx


@register_op("Split", versions=(1, 2, 11, 13, 18))
class Split(ViewOp):
    """Sizes come from the ``split`` attribute (1, 2, 11), the constant ``split`` input (1, 13+),
    ``num_outputs`` (18+, last chunk smaller) or an even split over the node's outputs."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @dataclass(frozen=True)
    class Attrs:
        axis: int = 0
        num_outputs: int | None = None

    @dataclass(frozen=True)
    class AttrsSplit:
        axis: int = 0
        split: tuple[int, ...] | None = None

    @dataclass(frozen=True)
    class Attrs13:
        axis: int = 0

    const_inputs = (1,)

    @classmethod
    def attrs_type(cls, version):
        if version < 13:
            return cls.AttrsSplit
        return cls.Attrs13 if version < 18 else cls.Attrs

    def infer(self, data, split=None):
        axis = normalize_axis(self, self.attrs.axis, data.rank)
        dim = data.shape[axis]
        n_out = self.num_outputs
        sizes = getattr(self.attrs, "split", None)
        if self.version in (1, 13, 18):
            from_input = const_ints(self, 1, "split")
            if from_input is not None:
                if sizes is not None:
                    raise ShapeError(
                        f"{self.debug_name}: split sizes given both as attribute and as input.")
                sizes = from_input
        num_outputs = getattr(self.attrs, "num_outputs", None)
        if sizes is not None:
            if num_outputs is not None:
                raise ShapeError(
                    f"{self.debug_name}: give either the 'split' input or 'num_outputs', not both.")
            if sum(sizes) != dim or any(s < 0 for s in sizes):
                raise ShapeError(
                    f"{self.debug_name}: split sizes {list(sizes)} (sum {sum(sizes)}) do not "
                    f"partition axis {axis} of size {dim} of input '{self.inputs[0].id}' {data}."
                )
        elif num_outputs is not None:
            chunk = -(-dim // num_outputs) if num_outputs > 0 else 0
            last = dim - chunk * (num_outputs - 1)
            if num_outputs <= 0 or last < 0:
                raise ShapeError(
                    f"{self.debug_name}: cannot split axis {axis} of size {dim} into "
                    f"num_outputs={num_outputs} chunks of size ceil({dim}/{num_outputs})."
                )
            sizes = (chunk,) * (num_outputs - 1) + (last,)
        elif self.version >= 18:
            raise ShapeError(
                f"{self.debug_name}: Split-18 needs either the 'split' input or the "
                f"'num_outputs' attribute.")
        else:
            if not n_out or dim % n_out:
                raise ShapeError(
                    f"{self.debug_name}: axis {axis} of size {dim} does not split evenly into "
                    f"{n_out} outputs; give split sizes."
                )
            sizes = (dim // n_out,) * n_out
        if n_out is not None and n_out != len(sizes):
            raise ShapeError(
                f"{self.debug_name}: the node has {n_out} outputs but the split makes "
                f"{len(sizes)} ({list(sizes)})."
            )
        self.axis, self.sizes = axis, tuple(sizes)
        return [data.with_shape(data.shape[:axis] + (s,) + data.shape[axis + 1:]) for s in sizes]

    def kernel(self, x, split=None):
        parts = torch.split(x, self.sizes, dim=self.axis)
        # A one-output node's plan slot takes the tensor itself, not a 1-tuple.
        return parts[0] if len(parts) == 1 else parts

    def grad(self, g):
        parts = []
        for i, size in enumerate(self.sizes):
            if self.outputs[i] is not None:
                parts.append(g.output_grad(i))  # zeros when output i does not reach the loss
            else:  # an output the node left unnamed
                info = g.input_info(0)
                shape = info.shape[:self.axis] + (size,) + info.shape[self.axis + 1:]
                parts.append(g.const(np.zeros(shape, info.dtype.numpy), "zeros"))
        g.set_input_grad(0, g.op("Concat", *parts, axis=self.axis))


@register_op("Concat", versions=(1, 4, 11, 13))
class Concat(Op):
    """Concat-1's axis defaults to 1; 4+ requires it; 11+ accepts negative axes."""

    moves_elements = True
    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @dataclass(frozen=True)
    class Attrs:
        axis: int

    @dataclass(frozen=True)
    class Attrs1:
        axis: int = 1

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs1 if version == 1 else cls.Attrs

    def infer(self, *xs):
        first = xs[0]
        self.axis = normalize_axis(self, self.attrs.axis, first.rank)
        for i, x in enumerate(xs):
            same_rest = x.rank == first.rank and all(
                a == b for j, (a, b) in enumerate(zip(x.shape, first.shape)) if j != self.axis)
            if x.dtype != first.dtype or not same_rest:
                listed = ", ".join(f"'{t.id}' {t.info}" for t in self.inputs)
                raise ShapeError(
                    f"{self.debug_name}: input {i} does not match input 0 for concatenation on "
                    f"axis {self.axis} (dtypes and all other dims must be equal): {listed}."
                )
        total = sum(x.shape[self.axis] for x in xs)
        return first.with_shape(first.shape[:self.axis] + (total,) + first.shape[self.axis + 1:])

    def kernel(self, *xs):
        return torch.cat(xs, dim=self.axis)

    writes_into = True  # the static memory plan (device/arena.py)

    def kernel_into(self, out, *xs):
        return torch.cat(xs, dim=self.axis, out=out)

    def grad(self, g):
        sizes = [t.info.shape[self.axis] for t in self.inputs]
        parts = g.op("Split", g.output_grad(0), g.const(np.array(sizes, np.int64), "split"),
                     axis=self.axis, num_outputs=len(sizes))
        for i, part in enumerate(parts if len(sizes) > 1 else [parts]):
            g.set_input_grad(i, part)


# --- Padding -----------------------------------------------------------------------------------


def _pad_source_index(out_dim: int, begin: int, in_dim: int, mode: str) -> torch.Tensor:
    """For each output position, the input position it copies (edge / reflect / wrap)."""
    j = np.arange(out_dim) - begin
    if mode == "edge":
        j = np.clip(j, 0, in_dim - 1)
    elif mode == "wrap":
        j = np.mod(j, in_dim)
    elif in_dim == 1:  # reflect of a single element repeats it
        j = np.zeros_like(j)
    else:
        period = 2 * (in_dim - 1)
        j = np.mod(j, period)
        j = np.where(j >= in_dim, period - j, j)
    return torch.from_numpy(j.astype(np.int64))


def _pad_gathers(op: Op, shape, out_shape, begins, ends, mode: str) -> list:
    """Per padded axis (in axis order), the index of the input element each output position
    copies (edge / reflect / wrap). Negative pads crop: the index skips the cropped part."""
    gathers = []
    for axis, (dim, b, e) in enumerate(zip(shape, begins, ends)):
        if b == 0 and e == 0:
            continue
        lo, hi = max(0, -b), dim - max(0, -e)
        kept = hi - lo
        if kept == 0 and out_shape[axis] > 0:
            raise ShapeError(f"{op.debug_name}: cannot pad an empty axis {axis} in '{mode}' mode.")
        gathers.append((axis, _pad_source_index(out_shape[axis], max(b, 0), kept, mode) + lo))
    return gathers


@register_op("Pad", versions=(1, 2, 11, 13, 18, 19, 21, 23, 24, 25))
class Pad(Op):
    """Pads are [x1_begin, x2_begin, ..., x1_end, x2_end, ...]; negative pads crop.

    1: ``paddings``/``value`` attributes; 2: ``pads``/``value``; 11+: constant ``pads`` and
    ``constant_value`` inputs; 18+: optional ``axes`` input; 19+: ``wrap`` mode.
    """

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @dataclass(frozen=True)
    class Attrs:
        mode: str = "constant"

    @dataclass(frozen=True)
    class Attrs1:
        paddings: tuple[int, ...]
        mode: str = "constant"
        value: float = 0.0

    @dataclass(frozen=True)
    class Attrs2:
        pads: tuple[int, ...]
        mode: str = "constant"
        value: float = 0.0

    const_inputs = (1, 2, 3)

    @classmethod
    def attrs_type(cls, version):
        if version == 1:
            return cls.Attrs1
        return cls.Attrs2 if version == 2 else cls.Attrs

    def infer(self, data, pads=None, constant_value=None, axes=None):
        mode = self.attrs.mode
        modes = ("constant", "reflect", "edge") + (("wrap",) if self.version >= 19 else ())
        if mode not in modes:
            raise ShapeError(
                f"{self.debug_name}: mode '{mode}' is not one of {list(modes)} in "
                f"Pad-{self.version}.")
        rank = data.rank
        if self.version == 1:
            pad_list, value, axes_list = self.attrs.paddings, self.attrs.value, None
        elif self.version == 2:
            pad_list, value, axes_list = self.attrs.pads, self.attrs.value, None
        else:
            pad_list = const_ints(self, 1, "pads")
            value = const_scalar(self, 2, "constant_value")
            axes_list = const_ints(self, 3, "axes")
            if pad_list is None:
                raise ShapeError(f"{self.debug_name}: the 'pads' input is missing.")
        axes_list = tuple(range(rank)) if axes_list is None else normalize_axes(
            self, axes_list, rank)
        if len(pad_list) != 2 * len(axes_list):
            raise ShapeError(
                f"{self.debug_name}: {len(pad_list)} pads for {len(axes_list)} axes of input "
                f"'{self.inputs[0].id}' {data}; give a begin and an end pad per axis."
            )
        begins, ends = [0] * rank, [0] * rank
        for k, axis in enumerate(axes_list):
            begins[axis], ends[axis] = pad_list[k], pad_list[k + len(axes_list)]
        out_shape = tuple(d + b + e for d, b, e in zip(data.shape, begins, ends))
        if any(d < 0 for d in out_shape):
            raise ShapeError(
                f"{self.debug_name}: pads {list(pad_list)} crop input '{self.inputs[0].id}' "
                f"{data} below zero size (result {shape_str(out_shape)})."
            )
        self.all_zero = not any(begins) and not any(ends)
        self.pads = tuple(begins) + tuple(ends)
        if mode == "constant":
            # torch.nn.functional.pad lists (begin, end) pairs from the last axis backwards.
            self.torch_pads = tuple(p for a in reversed(range(rank)) for p in (begins[a], ends[a]))
            fill = 0 if value is None else value
            self.fill = bool(fill) if data.dtype is DataType.BOOL else (
                float(fill) if data.dtype.is_float else int(fill))
        else:
            self.gathers = _pad_gathers(self, data.shape, out_shape, begins, ends, mode)
        return data.with_shape(out_shape)

    def kernel(self, x, pads=None, constant_value=None, axes=None):
        if self.all_zero:
            return x
        if self.attrs.mode == "constant":
            return torch.nn.functional.pad(x, self.torch_pads, value=self.fill)
        for axis, index in self.gathers:
            x = x.index_select(axis, index)
        return x

    def grad(self, g):
        dy = g.output_grad(0)
        if self.all_zero:
            dx = dy
        elif self.attrs.mode == "constant":
            # The padding is constant, and the negated pads crop it off again (and pad what
            # a negative pad cropped with zeros).
            negated = g.const(np.array([-p for p in self.pads], np.int64), "pads")
            dx = g.op("Pad", dy, negated, mode="constant")
        else:
            dx = g.op("PadGrad", dy, domain=AI_GRAPHCORE, shape=g.input_info(0).shape,
                      pads=self.pads, mode=self.attrs.mode)
        g.set_input_grad(0, dx)


@register_op("PadGrad", versions=1, domain=AI_GRAPHCORE)
class PadGrad(Op):
    """dx of an edge / reflect / wrap Pad: each output gradient is added to the input element
    it copied, undoing the per-axis gathers in reverse order."""

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...]
        pads: tuple[int, ...]  # full rank: begins then ends
        mode: str

    def infer(self, dy):
        a = self.attrs
        rank = len(a.shape)
        begins, ends = a.pads[:rank], a.pads[rank:]
        padded = tuple(d + b + e for d, b, e in zip(a.shape, begins, ends))
        if len(a.pads) != 2 * rank or padded != dy.shape:
            raise ShapeError(
                f"{self.debug_name}: gradient {dy} does not match input shape "
                f"{shape_str(a.shape)} padded by {list(a.pads)}.")
        # Undo the last gather first: scatter each axis back to its input size.
        self.scatters = _pad_gathers(self, a.shape, padded, begins, ends, a.mode)[::-1]
        shape = list(padded)
        self.zero_shapes = []
        for axis, _ in self.scatters:
            shape[axis] = a.shape[axis]
            self.zero_shapes.append(tuple(shape))
        return dy.with_shape(a.shape)

    def kernel(self, dy):
        for (axis, index), shape in zip(self.scatters, self.zero_shapes):
            dy = dy.new_zeros(shape).index_add_(axis, index, dy)
        return dy
