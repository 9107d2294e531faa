"""Shape-manipulation ops (spec §6.1, F78): Reshape, Squeeze, Unsqueeze, Flatten, Transpose,
Slice, Split, Concat, Pad, Tile, Expand, Shape, Size, Range, ConstantOfShape, Constant,
Identity, Trilu, EyeLike, DepthToSpace, SpaceToDepth, at every ai.onnx since-version <= 21.

Operands that define a shape, axes, pads or sizes (Reshape's ``shape``, Slice's ``starts`` ...)
are listed in ``const_inputs`` and read with ``const_input()`` in ``infer()``: shapes on the
simulated IPU are static. ``infer()`` resolves them once and stores the result on the op, so
each kernel is one or two torch calls without any shape arithmetic.

Shape, Size and EyeLike fold from static input infos (``fold_from_infos``), and Constant folds
from its attribute, so the shape arithmetic exporters emit (Shape -> Gather -> Concat ->
Reshape) disappears at import.

Gradients sit next to each op. Reshape-like ops reshape the gradient back, Transpose applies
the inverse permutation, Concat/Split swap roles, Expand and Tile sum the repeated copies, and
Pad in constant mode pads the gradient by the negated pads. Slice and the non-constant Pad
modes scatter the gradient back with dedicated grad ops (SliceGrad, PadGrad, ai.graphcore
domain) that precompute their index plan in ``infer()``.

Aliasing: Reshape, Squeeze, Unsqueeze, Flatten, Transpose, Slice (positive steps), Split,
Expand and Identity return views of their input (Identity returns the input itself). This is
safe because no kernel writes into its inputs or into a value another op may still read.
A future in-place kernel (or a buffer reuse scheme) must treat values produced by these ops as
aliases of their inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from ..dtypes import DataType
from ..errors import ShapeError, UnsupportedOpError
from ..ir.op import NoAttrs, Op
from ..ir.tensor import TensorInfo
from .base import broadcast_shapes, normalize_axis
from .registry import AI_GRAPHCORE, register_op

INT64 = DataType.INT64


def _shape_str(shape) -> str:
    return f"[{','.join(str(d) for d in shape)}]"


def _const_ints(op: Op, index: int, what: str) -> tuple[int, ...] | None:
    """The values of constant integer input ``index`` as Python ints; None if it is absent."""
    value = op.const_input(index)
    if value is None:
        return None
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise ShapeError(
            f"{op.debug_name}: {what} (input {index} '{op.inputs[index].id}') must be an integer "
            f"tensor, got {DataType.from_numpy(array.dtype).name}."
        )
    return tuple(int(v) for v in array.reshape(-1))


def _const_scalar(op: Op, index: int, what: str):
    """The single element of constant input ``index`` as a numpy scalar; None if absent."""
    value = op.const_input(index)
    if value is None:
        return None
    array = np.asarray(value)
    if array.size != 1:
        raise ShapeError(
            f"{op.debug_name}: {what} (input {index} '{op.inputs[index].id}') must hold one "
            f"value, got shape {_shape_str(array.shape)}."
        )
    return array.reshape(-1)[0]


def _normalize_axes(op: Op, axes, rank: int, what: str = "axes") -> tuple[int, ...]:
    """Axes in [0, rank), rejecting out-of-range and repeated ones."""
    result = tuple(normalize_axis(op, int(a), rank) for a in axes)
    if len(set(result)) != len(result):
        raise ShapeError(f"{op.debug_name}: {what} {list(axes)} repeat an axis (rank {rank}).")
    return result


class _ViewOp(Op):
    """An op whose output is a view of its input: no data moves on the device."""

    def cost(self) -> tuple[int, int]:
        return 0, 0


def reshape_grad(g, grad_id: str, shape) -> str:
    """``grad_id`` reshaped to ``shape`` (allowzero, so empty dims stay literal)."""
    return g.op("Reshape", grad_id, g.const(np.array(shape, np.int64), "shape"), allowzero=1)


class _Reshaping(_ViewOp):
    """Same elements in the same order, another shape: the gradient is reshaped back."""

    def grad(self, g):
        g.set_input_grad(0, reshape_grad(g, g.output_grad(0), g.input_info(0).shape))


# --- Reshape family ----------------------------------------------------------------------------


def reshape_target(op: Op, in_shape: tuple[int, ...], requested, allowzero: bool = False
                   ) -> tuple[int, ...]:
    """Resolve an ONNX Reshape shape (0 copies the input dim unless ``allowzero``, -1 infers)."""
    nelms = math.prod(in_shape)
    out, infer_at = [], None

    def fail(why: str):
        raise ShapeError(
            f"{op.debug_name}: cannot reshape input '{op.inputs[0].id}' of shape "
            f"{_shape_str(in_shape)} ({nelms} elements) to shape {list(requested)}: {why}"
        )

    for i, d in enumerate(requested):
        if d == -1:
            if infer_at is not None:
                fail("more than one dimension is -1.")
            infer_at = i
            out.append(1)
        elif d == 0 and not allowzero:
            if i >= len(in_shape):
                fail(f"dimension {i} is 0 (copy the input dimension) but the input has rank "
                     f"{len(in_shape)}.")
            out.append(in_shape[i])
        elif d < 0:
            fail(f"dimension {i} is {d}; only -1 (infer) is allowed below 0.")
        else:
            out.append(d)
    if allowzero and infer_at is not None and 0 in requested:
        fail("with allowzero=1 a shape may not hold both 0 and -1.")
    known = math.prod(out)
    if infer_at is not None:
        if known == 0 or nelms % known:
            fail(f"the other dimensions ({known} elements) do not divide the element count, so "
                 f"-1 has no integer value. Check the target shape.")
        out[infer_at] = nelms // known
    if math.prod(out) != nelms:
        fail(f"the target holds {math.prod(out)} elements (resolved {_shape_str(out)}). "
             f"The element count must stay the same; check the target shape.")
    return tuple(out)


@register_op("Reshape", versions=(1, 5, 13, 14, 19, 21))
class Reshape(_Reshaping):
    """Reshape-1 takes ``shape`` as an attribute, 5+ as a constant input; 14+ adds allowzero."""

    @dataclass(frozen=True)
    class Attrs:
        allowzero: int = 0

    @dataclass(frozen=True)
    class Attrs1:
        shape: tuple[int, ...] | None = None
        consumed_inputs: tuple[int, ...] = ()

    const_inputs = (1,)

    @classmethod
    def attrs_type(cls, version):
        if version == 1:
            return cls.Attrs1
        return cls.Attrs if version >= 14 else NoAttrs

    def infer(self, data, shape=None):
        if self.version == 1:
            if self.attrs.shape is None:
                raise ShapeError(f"{self.debug_name}: Reshape-1 needs the 'shape' attribute.")
            requested = self.attrs.shape
        else:
            requested = _const_ints(self, 1, "shape")
            if requested is None:
                raise ShapeError(f"{self.debug_name}: the 'shape' input is missing.")
        allowzero = bool(getattr(self.attrs, "allowzero", 0))
        self.out_shape = reshape_target(self, data.shape, requested, allowzero)
        return data.with_shape(self.out_shape)

    def kernel(self, x, shape=None):
        return x.reshape(self.out_shape)


@register_op("Squeeze", versions=(1, 11, 13, 21))
class Squeeze(_Reshaping):
    """``axes`` is an attribute before 13 and an optional constant input from 13."""

    @dataclass(frozen=True)
    class Attrs:
        axes: tuple[int, ...] | None = None

    const_inputs = (1,)

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs if version < 13 else NoAttrs

    def infer(self, data, axes=None):
        if self.version < 13:
            requested = self.attrs.axes
        else:
            requested = _const_ints(self, 1, "axes")
        if requested is None:
            drop = {i for i, d in enumerate(data.shape) if d == 1}
        else:
            drop = set(_normalize_axes(self, requested, data.rank))
            wrong = [a for a in sorted(drop) if data.shape[a] != 1]
            if wrong:
                raise ShapeError(
                    f"{self.debug_name}: cannot squeeze axes {wrong} of input '{self.inputs[0].id}'"
                    f" {data}: their size is not 1."
                )
        self.out_shape = tuple(d for i, d in enumerate(data.shape) if i not in drop)
        return data.with_shape(self.out_shape)

    def kernel(self, x, axes=None):
        return x.reshape(self.out_shape)


@register_op("Unsqueeze", versions=(1, 11, 13, 21))
class Unsqueeze(_Reshaping):
    """``axes`` (of the output) is an attribute before 13 and a constant input from 13."""

    @dataclass(frozen=True)
    class Attrs:
        axes: tuple[int, ...]

    const_inputs = (1,)

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs if version < 13 else NoAttrs

    def infer(self, data, axes=None):
        requested = self.attrs.axes if self.version < 13 else _const_ints(self, 1, "axes")
        if requested is None:
            raise ShapeError(f"{self.debug_name}: the 'axes' input is missing.")
        out_rank = data.rank + len(requested)
        new = set(_normalize_axes(self, requested, out_rank))
        dims = iter(data.shape)
        self.out_shape = tuple(1 if i in new else next(dims) for i in range(out_rank))
        return data.with_shape(self.out_shape)

    def kernel(self, x, axes=None):
        return x.reshape(self.out_shape)


@register_op("Flatten", versions=(1, 9, 11, 13, 21))
class Flatten(_Reshaping):
    """2-D output [prod(shape[:axis]), prod(shape[axis:])]; negative axis from 11."""

    @dataclass(frozen=True)
    class Attrs:
        axis: int = 1

    def infer(self, data):
        axis = self.attrs.axis
        low = -data.rank if self.version >= 11 else 0
        if not low <= axis <= data.rank:
            raise ShapeError(
                f"{self.debug_name}: axis {axis} is out of range [{low}, {data.rank}] for input "
                f"'{self.inputs[0].id}' {data}."
            )
        if axis < 0:
            axis += data.rank
        self.out_shape = (math.prod(data.shape[:axis]), math.prod(data.shape[axis:]))
        return data.with_shape(self.out_shape)

    def kernel(self, x):
        return x.reshape(self.out_shape)


@register_op("Transpose", versions=(1, 13, 21))
class Transpose(_ViewOp):
    """Permute the axes; the default ``perm`` reverses them."""

    @dataclass(frozen=True)
    class Attrs:
        perm: tuple[int, ...] | None = None

    def infer(self, data):
        perm = self.attrs.perm
        if perm is None:
            perm = tuple(reversed(range(data.rank)))
        if sorted(perm) != list(range(data.rank)):
            raise ShapeError(
                f"{self.debug_name}: perm {list(perm)} is not a permutation of the "
                f"{data.rank} axes of input '{self.inputs[0].id}' {data}."
            )
        self.perm = tuple(perm)
        return data.with_shape(tuple(data.shape[p] for p in perm))

    def kernel(self, x):
        return x.permute(self.perm)

    def grad(self, g):
        inverse = tuple(int(a) for a in np.argsort(self.perm))
        g.set_input_grad(0, g.op("Transpose", g.output_grad(0), perm=inverse))


@register_op("Identity", versions=(1, 13, 14, 16, 19, 21))
class Identity(_ViewOp):
    """Tensor inputs only (sequence and optional values do not exist in this IR)."""

    def infer(self, data):
        return data

    def kernel(self, x):
        return x

    def grad(self, g):
        g.set_input_grad(0, g.output_grad(0))


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
    axes = _normalize_axes(op, axes, rank)
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
            starts = _const_ints(self, 1, "starts")
            ends = _const_ints(self, 2, "ends")
            axes = _const_ints(self, 3, "axes")
            steps = _const_ints(self, 4, "steps")
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
                f"{_shape_str(sliced)} (input shape {_shape_str(a.shape)}).")
        return dy.with_shape(a.shape)

    def kernel(self, dy):
        dx = dy.new_zeros(self.attrs.shape)
        dx[self.index] = torch.flip(dy, self.flip) if self.flip else dy
        return dx


@register_op("Split", versions=(1, 2, 11, 13, 18))
class Split(_ViewOp):
    """Sizes come from the ``split`` attribute (1, 2, 11), the constant ``split`` input (1, 13+),
    ``num_outputs`` (18+, last chunk smaller) or an even split over the node's outputs."""

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
            from_input = _const_ints(self, 1, "split")
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

    def grad(self, g):
        sizes = [t.info.shape[self.axis] for t in self.inputs]
        parts = g.op("Split", g.output_grad(0), g.const(np.array(sizes, np.int64), "split"),
                     axis=self.axis, num_outputs=len(sizes))
        for i, part in enumerate(parts if len(sizes) > 1 else [parts]):
            g.set_input_grad(i, part)


# --- Padding and repetition --------------------------------------------------------------------


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


@register_op("Pad", versions=(1, 2, 11, 13, 18, 19, 21))
class Pad(Op):
    """Pads are [x1_begin, x2_begin, ..., x1_end, x2_end, ...]; negative pads crop.

    1: ``paddings``/``value`` attributes; 2: ``pads``/``value``; 11+: constant ``pads`` and
    ``constant_value`` inputs; 18+: optional ``axes`` input; 19+: ``wrap`` mode.
    """

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
            pad_list = _const_ints(self, 1, "pads")
            value = _const_scalar(self, 2, "constant_value")
            axes_list = _const_ints(self, 3, "axes")
            if pad_list is None:
                raise ShapeError(f"{self.debug_name}: the 'pads' input is missing.")
        axes_list = tuple(range(rank)) if axes_list is None else _normalize_axes(
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
                f"{data} below zero size (result {_shape_str(out_shape)})."
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
                f"{_shape_str(a.shape)} padded by {list(a.pads)}.")
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


@register_op("Tile", versions=(1, 6, 13))
class Tile(Op):
    """Tile-1 repeats one axis (``tiles`` and ``axis`` inputs); 6+ takes ``repeats`` per axis."""

    const_inputs = (1, 2)

    def infer(self, data, repeats=None, axis=None):
        if self.version == 1:
            tiles = _const_scalar(self, 1, "tiles")
            axis_value = _const_scalar(self, 2, "axis")
            if tiles is None or axis_value is None:
                raise ShapeError(f"{self.debug_name}: Tile-1 needs the 'tiles' and 'axis' inputs.")
            reps = [1] * data.rank
            reps[normalize_axis(self, int(axis_value), data.rank)] = int(tiles)
            reps = tuple(reps)
        else:
            reps = _const_ints(self, 1, "repeats")
            if reps is None or len(reps) != data.rank or any(r < 0 for r in reps):
                raise ShapeError(
                    f"{self.debug_name}: repeats {None if reps is None else list(reps)} must hold "
                    f"one non-negative count per axis of input '{self.inputs[0].id}' {data}."
                )
        self.repeats = reps
        return data.with_shape(tuple(d * r for d, r in zip(data.shape, reps)))

    def kernel(self, x, repeats=None, axis=None):
        return x.repeat(self.repeats) if self.repeats else x.clone()

    def grad(self, g):
        dy = g.output_grad(0)
        shape = g.input_info(0).shape
        if all(r == 1 for r in self.repeats):
            g.set_input_grad(0, dy)
            return
        # Axis a of the output is [repeats[a], shape[a]] laid out flat: sum the copies.
        split = [n for r, d in zip(self.repeats, shape) for n in (r, d)]
        axes = g.const(np.arange(0, 2 * len(shape), 2, dtype=np.int64), "axes")
        summed = g.op("ReduceSum", reshape_grad(g, dy, split), axes, keepdims=0)
        g.set_input_grad(0, summed)


@register_op("Expand", versions=(8, 13))
class Expand(_ViewOp):
    """Bidirectional broadcast of the input to a constant ``shape``; the result is a view."""

    const_inputs = (1,)

    def infer(self, data, shape=None):
        target = _const_ints(self, 1, "shape")
        if target is None:
            raise ShapeError(f"{self.debug_name}: the 'shape' input is missing.")
        self.out_shape = broadcast_shapes(self, data.shape, target)
        return data.with_shape(self.out_shape)

    def kernel(self, x, shape=None):
        return x.expand(self.out_shape)

    def grad(self, g):
        g.set_input_grad(0, g.reduce_to_shape(g.output_grad(0), g.input_info(0).shape))


# --- Shape queries and generators --------------------------------------------------------------


@register_op("Shape", versions=(1, 13, 15, 19, 21))
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


@register_op("Size", versions=(1, 13, 19, 21))
class Size(Op):
    """INT64 scalar element count; folds from static shapes."""

    def infer(self, data):
        self.nelms = data.nelms
        return TensorInfo(INT64, ())

    def fold_from_infos(self):
        return [np.array(self.nelms, dtype=np.int64)]

    def kernel(self, data):
        return torch.tensor(self.nelms, dtype=torch.int64)


@register_op("Range", versions=(11,))
class Range(Op):
    """output[i] = start + i * delta for i < max(ceil((limit - start) / delta), 0).

    All three operands are constants, so the op folds at import.
    """

    const_inputs = (0, 1, 2)

    def infer(self, start, limit, delta):
        if not start.dtype == limit.dtype == delta.dtype:
            raise ShapeError(
                f"{self.debug_name}: start, limit and delta must share a dtype, got "
                f"{start.dtype.name}, {limit.dtype.name}, {delta.dtype.name}.")
        first = _const_scalar(self, 0, "start")
        limit_v = _const_scalar(self, 1, "limit")
        step = _const_scalar(self, 2, "delta")
        if step == 0:
            raise ShapeError(f"{self.debug_name}: delta must be non-zero.")
        if start.dtype.is_float:
            # In the operands' precision, as the reference implementations compute it.
            count = int(np.ceil((limit_v - first) / step))
        else:
            count = -((int(first) - int(limit_v)) // int(step))  # exact integer ceil
        count = max(count, 0)
        values = first + np.arange(count, dtype=start.dtype.numpy) * step
        self.value = torch.from_numpy(np.asarray(values, dtype=start.dtype.numpy, order="C"))
        return TensorInfo(start.dtype, (count,))

    def kernel(self, start, limit, delta):
        return self.value.clone()


@register_op("ConstantOfShape", versions=(9, 20, 21))
class ConstantOfShape(Op):
    """A tensor of constant shape filled with ``value`` (one element; default float32 0)."""

    @dataclass(frozen=True)
    class Attrs:
        value: np.ndarray | None = None

    const_inputs = (0,)

    def infer(self, shape):
        dims = _const_ints(self, 0, "shape")
        if any(d < 0 for d in dims):
            raise ShapeError(f"{self.debug_name}: shape {list(dims)} has negative dimensions.")
        value = self.attrs.value
        value = np.zeros(1, np.float32) if value is None else np.asarray(value)
        if value.size != 1:
            raise ShapeError(
                f"{self.debug_name}: 'value' must hold one element, got shape "
                f"{_shape_str(value.shape)}.")
        dtype = DataType.from_numpy(value.dtype)
        self.out_shape, self.dtype = dims, dtype.torch
        self.fill = value.reshape(-1)[0].item()
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


@register_op("Constant", versions=(1, 9, 11, 12, 13, 19, 21))
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
        if name in ("value_string", "value_strings") or (
                name == "value" and np.asarray(value).dtype.kind in "OSU"):
            raise UnsupportedOpError(
                f"{self.debug_name}: string constants are not supported: the simulated IPU has "
                f"no string tensors.")
        if name == "sparse_value":
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
        return torch.from_numpy(self.value.copy())


@register_op("EyeLike", versions=(9,))
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
        return torch.from_numpy(self.value.copy())

    def grad(self, g):
        """The output depends only on the input's shape: zero gradient."""


@register_op("Trilu", versions=(14,))
class Trilu(Op):
    """Upper (``upper=1``) or lower triangle of the last two dims, from diagonal ``k``."""

    @dataclass(frozen=True)
    class Attrs:
        upper: int = 1

    const_inputs = (1,)

    def infer(self, data, k=None):
        if data.rank < 2:
            raise ShapeError(
                f"{self.debug_name}: input '{self.inputs[0].id}' {data} needs rank >= 2.")
        k_value = _const_scalar(self, 1, "k")
        self.k = 0 if k_value is None else int(k_value)
        return data

    def kernel(self, x, k=None):
        return torch.triu(x, self.k) if self.attrs.upper else torch.tril(x, self.k)

    def grad(self, g):
        k = g.const(np.array(self.k, np.int64), "k")
        g.set_input_grad(0, g.op("Trilu", g.output_grad(0), k, upper=self.attrs.upper))


# --- Depth <-> space ---------------------------------------------------------------------------


class _Rearrange(Op):
    """x.reshape(split_shape).permute(perm).reshape(out_shape); the gradient runs it backwards."""

    def kernel(self, x):
        return x.reshape(self.split_shape).permute(self.perm).reshape(self.out_shape)

    def grad(self, g):
        permuted = tuple(self.split_shape[p] for p in self.perm)
        inverse = tuple(int(a) for a in np.argsort(self.perm))
        dy = reshape_grad(g, g.output_grad(0), permuted)
        dy = g.op("Transpose", dy, perm=inverse)
        g.set_input_grad(0, reshape_grad(g, dy, g.input_info(0).shape))


@register_op("DepthToSpace", versions=(1, 11, 13))
class DepthToSpace(_Rearrange):
    """[N, C, H, W] -> [N, C/b², H·b, W·b]; mode DCR (depth-column-row, default) or CRD (11+)."""

    @dataclass(frozen=True)
    class Attrs:
        blocksize: int
        mode: str = "DCR"

    @dataclass(frozen=True)
    class Attrs1:
        blocksize: int

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs1 if version == 1 else cls.Attrs

    def infer(self, data):
        b = self.attrs.blocksize
        mode = getattr(self.attrs, "mode", "DCR")
        if mode not in ("DCR", "CRD"):
            raise ShapeError(f"{self.debug_name}: mode '{mode}' must be 'DCR' or 'CRD'.")
        if data.rank != 4 or b <= 0 or data.shape[1] % (b * b):
            raise ShapeError(
                f"{self.debug_name}: input '{self.inputs[0].id}' {data} must be 4-D [N,C,H,W] "
                f"with C divisible by blocksize² ({b}²).")
        n, c, h, w = data.shape
        if mode == "DCR":
            self.split_shape, self.perm = (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)
        else:
            self.split_shape, self.perm = (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)
        self.out_shape = (n, c // (b * b), h * b, w * b)
        return data.with_shape(self.out_shape)


@register_op("SpaceToDepth", versions=(1, 13))
class SpaceToDepth(_Rearrange):
    """[N, C, H, W] -> [N, C·b², H/b, W/b], the inverse of DepthToSpace in DCR mode."""

    @dataclass(frozen=True)
    class Attrs:
        blocksize: int

    def infer(self, data):
        b = self.attrs.blocksize
        if data.rank != 4 or b <= 0 or data.shape[2] % b or data.shape[3] % b:
            raise ShapeError(
                f"{self.debug_name}: input '{self.inputs[0].id}' {data} must be 4-D [N,C,H,W] "
                f"with H and W divisible by blocksize {b}.")
        n, c, h, w = data.shape
        self.split_shape, self.perm = (n, c, h // b, b, w // b, b), (0, 3, 5, 1, 2, 4)
        self.out_shape = (n, c * b * b, h // b, w // b)
        return data.with_shape(self.out_shape)
