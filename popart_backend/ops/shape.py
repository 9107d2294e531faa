"""Shape-manipulation ops: Reshape, Squeeze, Unsqueeze, Flatten, Transpose,
Identity, Tile, Expand, DepthToSpace and SpaceToDepth, at every ai.onnx since-version <= 28.
Slice, Split, Concat and Pad live in ``slicing.py``; Shape, Size, Range, ConstantOfShape,
Constant, EyeLike and Trilu in ``generators.py``. Both use the helpers defined here.

Operands that define a shape, axes, pads or sizes (Reshape's ``shape``, Slice's ``starts`` ...)
are listed in ``const_inputs`` and read with ``const_input()`` (``const_ints``,
``const_scalar``) in ``infer()``: shapes on the simulated IPU are static. ``infer()`` resolves
them once and stores the result on the op, so each kernel is one or two torch calls without any
shape arithmetic.

Gradients sit next to each op. Reshape-like ops reshape the gradient back, Transpose applies
the inverse permutation, Expand and Tile sum the repeated copies, and DepthToSpace /
SpaceToDepth run their rearrangement backwards.

Aliasing: Reshape, Squeeze, Unsqueeze, Flatten, Transpose, Expand and Identity (and, in
``slicing.py``, Slice with positive steps and Split) return views of their input (Identity
returns the input itself). This is safe because no kernel writes into its inputs or into a value
another op may still read. A future in-place kernel (or a buffer reuse scheme) must treat values
produced by these ops as aliases of their inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import NoAttrs, Op
from .base import broadcast_shapes, normalize_axis
from .registry import register_op

INT64 = DataType.INT64


def shape_str(shape) -> str:
    """A shape for error messages: ``[2,3]``."""
    return f"[{','.join(str(d) for d in shape)}]"


def const_ints(op: Op, index: int, what: str) -> tuple[int, ...] | None:
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


def const_scalar(op: Op, index: int, what: str):
    """The single element of constant input ``index`` as a numpy scalar; None if absent."""
    value = op.const_input(index)
    if value is None:
        return None
    array = np.asarray(value)
    if array.size != 1:
        raise ShapeError(
            f"{op.debug_name}: {what} (input {index} '{op.inputs[index].id}') must hold one "
            f"value, got shape {shape_str(array.shape)}."
        )
    return array.reshape(-1)[0]


def normalize_axes(op: Op, axes, rank: int, what: str = "axes") -> tuple[int, ...]:
    """Axes in [0, rank), rejecting out-of-range and repeated ones."""
    result = tuple(normalize_axis(op, int(a), rank) for a in axes)
    if len(set(result)) != len(result):
        raise ShapeError(f"{op.debug_name}: {what} {list(axes)} repeat an axis (rank {rank}).")
    return result


class ViewOp(Op):
    """An op whose output is a view of its input: no data moves on the device."""

    aliases_inputs = True  # its output is a view of the input's storage

    def cost(self) -> tuple[int, int]:
        return 0, 0


def reshape_grad(g, grad_id: str, shape) -> str:
    """``grad_id`` reshaped to ``shape`` (allowzero, so empty dims stay literal)."""
    return g.op("Reshape", grad_id, g.const(np.array(shape, np.int64), "shape"), allowzero=1)


class _Reshaping(ViewOp):
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
            f"{shape_str(in_shape)} ({nelms} elements) to shape {list(requested)}: {why}"
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
        fail(f"the target holds {math.prod(out)} elements (resolved {shape_str(out)}). "
             f"The element count must stay the same; check the target shape.")
    return tuple(out)


@register_op("Reshape", versions=(1, 5, 13, 14, 19, 21, 23, 24, 25))
class Reshape(_Reshaping):
    """Reshape-1 takes ``shape`` as an attribute, 5+ as a constant input; 14+ adds allowzero."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

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
            requested = const_ints(self, 1, "shape")
            if requested is None:
                raise ShapeError(f"{self.debug_name}: the 'shape' input is missing.")
        allowzero = bool(getattr(self.attrs, "allowzero", 0))
        self.out_shape = reshape_target(self, data.shape, requested, allowzero)
        return data.with_shape(self.out_shape)

    def kernel(self, x, shape=None):
        return x.reshape(self.out_shape)


@register_op("Squeeze", versions=(1, 11, 13, 21, 23, 24, 25))
class Squeeze(_Reshaping):
    """``axes`` is an attribute before 13 and an optional constant input from 13."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

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
            requested = const_ints(self, 1, "axes")
        if requested is None:
            drop = {i for i, d in enumerate(data.shape) if d == 1}
        else:
            drop = set(normalize_axes(self, requested, data.rank))
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


@register_op("Unsqueeze", versions=(1, 11, 13, 21, 23, 24, 25))
class Unsqueeze(_Reshaping):
    """``axes`` (of the output) is an attribute before 13 and a constant input from 13."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @dataclass(frozen=True)
    class Attrs:
        axes: tuple[int, ...]

    const_inputs = (1,)

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs if version < 13 else NoAttrs

    def infer(self, data, axes=None):
        requested = self.attrs.axes if self.version < 13 else const_ints(self, 1, "axes")
        if requested is None:
            raise ShapeError(f"{self.debug_name}: the 'axes' input is missing.")
        out_rank = data.rank + len(requested)
        new = set(normalize_axes(self, requested, out_rank))
        dims = iter(data.shape)
        self.out_shape = tuple(1 if i in new else next(dims) for i in range(out_rank))
        return data.with_shape(self.out_shape)

    def kernel(self, x, axes=None):
        return x.reshape(self.out_shape)


@register_op("Flatten", versions=(1, 9, 11, 13, 21, 23, 24, 25))
class Flatten(_Reshaping):
    """2-D output [prod(shape[:axis]), prod(shape[axis:])]; negative axis from 11."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

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


@register_op("Transpose", versions=(1, 13, 21, 23, 24, 25))
class Transpose(ViewOp):
    """Permute the axes; the default ``perm`` reverses them."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

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


@register_op("Identity", versions=(1, 13, 14, 16, 19, 21, 23, 24, 25))
class Identity(ViewOp):
    """Tensor inputs only (sequence and optional values do not exist in this IR)."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    @classmethod
    def expands_at_import(cls, node, values) -> bool:
        """The Identity of a sequence or optional value aliases it at import."""
        return bool(node.input) and values.is_value(node.input[0])

    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        values.alias(node.input[0], node.output[0], settings, where)

    def infer(self, data):
        return data

    def kernel(self, x):
        return x

    def grad(self, g):
        g.set_input_grad(0, g.output_grad(0))


# --- Repetition --------------------------------------------------------------------------------


@register_op("Tile", versions=(1, 6, 13))
class Tile(Op):
    """Tile-1 repeats one axis (``tiles`` and ``axis`` inputs); 6+ takes ``repeats`` per axis."""

    moves_elements = True
    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)
    const_inputs = (1, 2)

    def infer(self, data, repeats=None, axis=None):
        if self.version == 1:
            tiles = const_scalar(self, 1, "tiles")
            axis_value = const_scalar(self, 2, "axis")
            if tiles is None or axis_value is None:
                raise ShapeError(f"{self.debug_name}: Tile-1 needs the 'tiles' and 'axis' inputs.")
            reps = [1] * data.rank
            reps[normalize_axis(self, int(axis_value), data.rank)] = int(tiles)
            reps = tuple(reps)
        else:
            reps = const_ints(self, 1, "repeats")
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
class Expand(ViewOp):
    """Bidirectional broadcast of the input to a constant ``shape``; the result is a view."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)
    const_inputs = (1,)

    def infer(self, data, shape=None):
        target = const_ints(self, 1, "shape")
        if target is None:
            raise ShapeError(f"{self.debug_name}: the 'shape' input is missing.")
        self.out_shape = broadcast_shapes(self, data.shape, target)
        return data.with_shape(self.out_shape)

    def kernel(self, x, shape=None):
        return x.expand(self.out_shape)

    def grad(self, g):
        g.set_input_grad(0, g.reduce_to_shape(g.output_grad(0), g.input_info(0).shape))


# --- Depth <-> space ---------------------------------------------------------------------------


class _Rearrange(Op):
    """x.reshape(split_shape).permute(perm).reshape(out_shape); the gradient runs it backwards."""

    aliases_inputs = True  # the kernel reshapes and permutes views

    def kernel(self, x):
        return x.reshape(self.split_shape).permute(self.perm).reshape(self.out_shape)

    def grad(self, g):
        permuted = tuple(self.split_shape[p] for p in self.perm)
        inverse = tuple(int(a) for a in np.argsort(self.perm))
        dy = reshape_grad(g, g.output_grad(0), permuted)
        dy = g.op("Transpose", dy, perm=inverse)
        g.set_input_grad(0, reshape_grad(g, dy, g.input_info(0).shape))


@register_op("DepthToSpace", versions=(1, 11, 13, 28))
class DepthToSpace(_Rearrange):
    """[N, C, H, W] -> [N, C/b², H·b, W·b]; mode DCR (depth-column-row, default) or CRD (11+)."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

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


@register_op("SpaceToDepth", versions=(1, 13, 28))
class SpaceToDepth(_Rearrange):
    """[N, C, H, W] -> [N, C·b², H/b, W/b], the inverse of DepthToSpace in the same mode
    (``mode`` DCR or CRD from version 28; DCR before)."""

    strings_as_codes = True  # STRING inputs run as codes (ops/string_tensors.py)

    Attrs, Attrs1 = DepthToSpace.Attrs, DepthToSpace.Attrs1

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs if version >= 28 else cls.Attrs1

    def infer(self, data):
        b = self.attrs.blocksize
        mode = getattr(self.attrs, "mode", "DCR")
        if mode not in ("DCR", "CRD"):
            raise ShapeError(f"{self.debug_name}: mode '{mode}' must be 'DCR' or 'CRD'.")
        if data.rank != 4 or b <= 0 or data.shape[2] % b or data.shape[3] % b:
            raise ShapeError(
                f"{self.debug_name}: input '{self.inputs[0].id}' {data} must be 4-D [N,C,H,W] "
                f"with H and W divisible by blocksize {b}.")
        n, c, h, w = data.shape
        self.split_shape = (n, c, h // b, b, w // b, b)
        # DCR puts the block offsets before the channel, CRD after it.
        self.perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
        self.out_shape = (n, c * b * b, h // b, w // b)
        return data.with_shape(self.out_shape)
