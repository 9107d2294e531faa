"""Family bases shared by many ops: their shape rule, dtype rule, gradient plumbing and cost live
here once.

Gradient helpers: a unary op hands ``dy`` and one saved forward tensor to a fused grad op
(``ElementwiseUnary.fused_grad``); broadcasting ops sum their input gradients back to the input
shape (``ElementwiseBinary.unbroadcast``, ``Variadic.unbroadcast``), honouring the pre-opset-7
``axis`` alignment.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import onnx.defs

from ..dtypes import DataType
from ..errors import ShapeError, UnsupportedOpError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .registry import AI_GRAPHCORE


def broadcast_shapes(op: Op, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy-style multidirectional broadcast; ShapeError naming the op when shapes clash."""
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        dims = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            listed = ", ".join(str(list(s)) for s in shapes)
            raise ShapeError(
                f"{op.debug_name}: shapes {listed} do not broadcast (axis {axis} of the "
                f"right-aligned shapes has sizes {sorted(dims)})."
            )
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def normalize_axis(op: Op, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{op.debug_name}: axis {axis} is out of range for rank {rank}.")
    return axis % rank if rank else 0


class ElementwiseUnary(Op):
    """y = f(x), same shape and dtype."""

    def infer(self, x):
        return x

    def fused_grad(self, g, grad_type: str, from_output: bool = False, **attrs) -> None:
        """dx = ``grad_type``(dy, x) (or (dy, y) with ``from_output``): one ai.graphcore kernel."""
        saved = g.output(0) if from_output else g.input(0)
        g.set_input_grad(0, g.op(grad_type, g.output_grad(0), saved, domain=AI_GRAPHCORE, **attrs))


class ElementwiseGrad(Op):
    """Base of fused unary grad ops: dx = kernel(dy, saved), shaped and typed like dy.

    ``saved`` is the forward input or output, whichever the derivative is cheaper from.
    """

    def infer(self, dy, saved):
        return dy


class ElementwiseBinary(Op):
    """c = f(a, b) with numpy broadcasting (opset >= 7) or legacy ``broadcast``/``axis`` (< 7)."""

    @dataclass(frozen=True)
    class LegacyAttrs:
        broadcast: int = 0
        axis: int | None = None
        consumed_inputs: tuple[int, ...] = ()

    @classmethod
    def attrs_type(cls, version: int):
        return cls.LegacyAttrs if version < 7 else cls.Attrs

    def out_dtype(self, a: TensorInfo, b: TensorInfo) -> DataType:
        return a.dtype

    def infer(self, a, b):
        if isinstance(self.attrs, ElementwiseBinary.LegacyAttrs):
            if not self.attrs.broadcast and a.shape != b.shape:
                raise ShapeError(
                    f"{self.debug_name}: shapes {list(a.shape)} and {list(b.shape)} differ and "
                    f"the opset-{self.version} attribute broadcast=0 forbids broadcasting."
                )
            return TensorInfo(self.out_dtype(a, b), a.shape)
        return TensorInfo(self.out_dtype(a, b), broadcast_shapes(self, a.shape, b.shape))

    def aligned_b_shape(self, a_rank: int, b_shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape B takes for numpy broadcasting: before opset 7 ``axis`` pads it on the right."""
        attrs = self.attrs
        if not isinstance(attrs, ElementwiseBinary.LegacyAttrs) or not attrs.broadcast:
            return b_shape
        if attrs.axis is None or not b_shape:
            return b_shape
        axis = attrs.axis % a_rank
        return b_shape + (1,) * (a_rank - axis - len(b_shape))

    def aligned_input(self, g, index: int) -> str:
        """Input ``index`` as a numpy-broadcastable tensor id (B reshaped for legacy ``axis``)."""
        info = g.input_info(index)
        if index == 0:
            return g.input(0)
        shape = self.aligned_b_shape(g.input_info(0).rank, info.shape)
        if shape == info.shape:
            return g.input(1)
        return g.op("Reshape", g.input(1), g.const(np.array(shape, np.int64), "shape"))

    def unbroadcast(self, g, grad_id: str, index: int) -> None:
        """Set input ``index``'s gradient: ``grad_id`` (output-shaped) summed back to its shape."""
        if not g.needs_input_grad(index):
            return
        info = g.input_info(index)
        shape = info.shape if index == 0 else self.aligned_b_shape(g.input_info(0).rank, info.shape)
        grad_id = g.reduce_to_shape(grad_id, shape)
        if shape != info.shape:
            grad_id = g.op("Reshape", grad_id, g.const(np.array(info.shape, np.int64), "shape"))
        g.set_input_grad(index, grad_id)

    def legacy_align(self, a, b):
        """Reshape ``b`` for pre-opset-7 broadcasting, which aligns it at ``axis`` of ``a``."""
        attrs = self.attrs
        if not isinstance(attrs, ElementwiseBinary.LegacyAttrs) or not attrs.broadcast:
            return b
        if attrs.axis is None or b.dim() == 0:
            return b
        axis = attrs.axis % a.dim()
        return b.reshape(tuple(b.shape) + (1,) * (a.dim() - axis - b.dim()))


class Comparison(ElementwiseBinary):
    """Broadcasting binary op returning BOOL."""

    def out_dtype(self, a, b):
        return DataType.BOOL


class Variadic(Op):
    """y = f(x0, x1, ...) over any number of broadcasting inputs (Sum, Max, Min, Mean)."""

    def infer(self, *xs):
        return TensorInfo(xs[0].dtype, broadcast_shapes(self, *(x.shape for x in xs)))

    def unbroadcast(self, g, grad_ids: list[str]) -> None:
        """Set every input's gradient from its output-shaped ``grad_ids[i]``."""
        for i, grad_id in enumerate(grad_ids):
            if g.needs_input_grad(i):
                g.set_input_grad(i, g.reduce_to_shape(grad_id, g.input_info(i).shape))


# --- dtype constraints --------------------------------------------------------------------------

# torch's CPU kernels implement little beyond copies for these; ops that can widen them to int64
# (BitShift) or only convert them (Cast) opt in with ``wide_unsigned_ok``.
WIDE_UNSIGNED = (DataType.UINT16, DataType.UINT32, DataType.UINT64)


@functools.lru_cache(maxsize=None)
def _type_constraints(op_type: str, version: int) -> tuple[tuple[tuple[str, bool], ...], dict]:
    """(formal inputs as (type param, variadic), type param -> allowed ONNX type names)."""
    schema = onnx.defs.get_schema(op_type, version, "")
    formals = tuple(
        (f.type_str, f.option == onnx.defs.OpSchema.FormalParameterOption.Variadic)
        for f in schema.inputs
    )
    allowed = {
        c.type_param_str: frozenset(t[len("tensor(") : -1] for t in c.allowed_type_strs)
        for c in schema.type_constraints
    }
    return formals, allowed


def check_dtypes(op: Op, *infos: TensorInfo | None, wide_unsigned_ok: bool = False) -> None:
    """Check input dtypes against the ONNX type constraints of ``op``'s version.

    Raises ShapeError when a dtype is outside the schema's list or inputs sharing a type
    parameter differ; UnsupportedOpError for uint16/32/64, which the torch kernels lack.
    """
    formals, allowed = _type_constraints(op.op_type, op.version)
    seen: dict[str, tuple[int, DataType]] = {}
    for i, info in enumerate(infos):
        if info is None or not formals:
            continue
        param, variadic = formals[min(i, len(formals) - 1)]
        if i >= len(formals) and not variadic:
            continue
        name = info.dtype.name.lower()
        if param in allowed and name not in allowed[param]:
            raise ShapeError(
                f"{op.debug_name}: input {i} has dtype {name}, but {op.op_type}-{op.version} "
                f"accepts {', '.join(sorted(allowed[param]))}. Cast the input first."
            )
        if param in seen and seen[param][1] != info.dtype:
            j, other = seen[param]
            raise ShapeError(
                f"{op.debug_name}: inputs {j} and {i} must share one dtype ({param}) but are "
                f"{other.name.lower()} and {name}. Cast one of them."
            )
        seen.setdefault(param, (i, info.dtype))
        if info.dtype in WIDE_UNSIGNED and not wide_unsigned_ok:
            raise UnsupportedOpError(
                f"{op.debug_name}: dtype {name} is valid ONNX but the simulated IPU's kernels "
                f"do not implement {op.op_type} for it. Cast to int32/int64 first."
            )


# --- dtype-checked family bases of the elementwise modules ---------------------------------------


@functools.cache
def _with_consumed_inputs(attrs_type: type) -> type:
    """``attrs_type`` plus the opset-1 ``consumed_inputs`` attribute.

    consumed_inputs told old runtimes which inputs an op may overwrite; it never changes the
    result, so it is accepted and ignored.
    """
    legacy = dataclasses.make_dataclass(
        attrs_type.__name__ + "V1",
        [("consumed_inputs", tuple, dataclasses.field(default=()))],
        bases=(attrs_type,),
        frozen=True,
    )
    legacy.__module__ = __name__
    return legacy


class LegacyConsumedInputs:
    """Mixin: versions below 6 also accept ``consumed_inputs``."""

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return _with_consumed_inputs(cls.Attrs) if version < 6 else cls.Attrs


class Unary(ElementwiseUnary):
    """y = f(x) with ONNX's dtype constraints checked."""

    def infer(self, x):
        check_dtypes(self, x)
        return x


class FloatFormulaUnary(Unary):
    """Unary op whose integer variants compute in float64 and truncate (as onnxruntime)."""

    def infer(self, x):
        check_dtypes(self, x)
        self._is_int = x.dtype.is_int
        return x

    def formula(self, x):
        raise NotImplementedError

    def kernel(self, x):
        if self._is_int:
            return self.formula(x.double()).to(x.dtype)
        return self.formula(x)


def _check_legacy_broadcast(op: ElementwiseBinary, a: TensorInfo, b: TensorInfo) -> None:
    """Before opset 7, broadcast=1 lets B (aligned at ``axis`` or at the end) stretch to A."""
    attrs = op.attrs
    if not isinstance(attrs, ElementwiseBinary.LegacyAttrs) or not attrs.broadcast:
        return
    shape = b.shape
    if attrs.axis is not None and b.rank:
        axis = attrs.axis % max(a.rank, 1)
        shape = shape + (1,) * max(a.rank - axis - b.rank, 0)
    if len(shape) > a.rank or broadcast_shapes(op, a.shape, shape) != a.shape:
        raise ShapeError(
            f"{op.debug_name}: B {list(b.shape)} does not fit A {list(a.shape)} at axis "
            f"{attrs.axis} (opset-{op.version} broadcast=1 stretches B to A's shape only)."
        )


class Binary(ElementwiseBinary):
    """Broadcasting binary op (legacy broadcast/axis below opset 7) with dtype checks."""

    def infer(self, a, b):
        check_dtypes(self, a, b)
        _check_legacy_broadcast(self, a, b)
        return super().infer(a, b)


class Compare(Comparison):
    """Broadcasting comparison returning BOOL, with dtype checks."""

    def infer(self, a, b):
        check_dtypes(self, a, b)
        _check_legacy_broadcast(self, a, b)
        return super().infer(a, b)


class VariadicOp(Variadic):
    """Sum/Max/Min/Mean: versions below 8 require equal shapes, later ones broadcast."""

    def infer(self, *xs):
        check_dtypes(self, *xs)
        if self.version < 8 and len({x.shape for x in xs}) > 1:
            raise ShapeError(
                f"{self.debug_name}: {self.op_type}-{self.version} needs inputs of one shape, got "
                f"{', '.join(str(list(x.shape)) for x in xs)}. Opset 8 and later broadcast."
            )
        return super().infer(*xs)
