"""Family bases shared by many ops: their shape rule, dtype rule, gradient plumbing and cost live
here once.

Gradient helpers: a unary op hands ``dy`` and one saved forward tensor to a fused grad op
(``ElementwiseUnary.fused_grad``); broadcasting ops sum their input gradients back to the input
shape (``ElementwiseBinary.unbroadcast``, ``Variadic.unbroadcast``), honouring the pre-opset-7
``axis`` alignment.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass

import numpy as np
import onnx.defs
import torch

from ..dtypes import DataType, wrap_unsigned
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

# Stored in wider signed surrogates (dtypes module docstring). uint16/uint32 are exact there (the
# execution plan reduces their results modulo 2**bits: ``wrap_unsigned_outputs``); uint64 needs
# the op to say how it computes on int64 bit patterns (``UInt64``).
WIDE_UNSIGNED = (DataType.UINT16, DataType.UINT32, DataType.UINT64)


class UInt64(enum.Enum):
    """How an op computes on uint64 values, which the simulator holds as int64 bit patterns.

    An op class states it with ``uint64 = UInt64.X``; an op without it rejects uint64 inputs
    (UnsupportedOpError) rather than give wrong results for values >= 2**63.
    """

    # int64 two's-complement results have the same bits: add, sub, mul, bitwise ops, selection.
    BITS = "bits"
    # Only the order of values matters (comparisons, min/max, top-k, arg-max): inputs are mapped
    # onto int64 keeping their unsigned order (sign bit flipped), uint64 outputs mapped back.
    ORDER = "order"
    # Unsigned quotient / remainder (Div; Mod, where fmod makes no difference for unsigned).
    QUOTIENT = "quotient"
    REMAINDER = "remainder"
    # uint64 inputs enter the kernel as float64 numbers (Pow's exponent).
    AS_FLOAT = "as_float"


_SIGN_BIT = -(2**63)


def _order_key(x: torch.Tensor) -> torch.Tensor:
    """int64 bits of a uint64 -> an int64 with the same order as the unsigned values (and back:
    the map is its own inverse)."""
    return torch.bitwise_xor(x, _SIGN_BIT)


def unsigned_divmod(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quotient and remainder of uint64 values held as int64 bit patterns.

    A divisor >= 2**63 goes into the dividend at most once. A smaller one divides the dividend
    halved by a logical shift (a non-negative int64), which leaves a remainder below 2*b that
    one unsigned comparison corrects. Division by zero raises, as it does for int64.
    """
    a, b = torch.broadcast_tensors(a, b)
    huge = b < 0
    at_least = _order_key(a) >= _order_key(b)
    divisor = torch.where(huge, 1, b)
    half = torch.bitwise_and(torch.bitwise_right_shift(a, 1), 2**63 - 1)
    q = torch.bitwise_left_shift(torch.div(half, divisor, rounding_mode="floor"), 1)
    r = a - q * divisor
    fix = _order_key(r) >= _order_key(divisor)
    q = torch.where(huge, at_least.to(torch.int64), q + fix)
    r = torch.where(huge, torch.where(at_least, a - b, a), torch.where(fix, r - divisor, r))
    return q, r


def uint64_to_double(x: torch.Tensor) -> torch.Tensor:
    """float64 value of uint64 bit patterns (rounded to nearest as any int -> double cast)."""
    high = torch.bitwise_and(torch.bitwise_right_shift(x, 32), 0xFFFFFFFF).double()
    return high * 2.0**32 + torch.bitwise_and(x, 0xFFFFFFFF).double()


class _UInt64Kernel:
    """The kernel of an op with uint64 inputs, adapted per its ``UInt64`` semantics.

    A callable object (not a closure) so that copying the op rebinds it to the copy.
    """

    __slots__ = ("inputs", "op", "outputs", "semantics")

    def __init__(self, op: Op, semantics: UInt64, inputs: tuple[int, ...]):
        self.op, self.semantics, self.inputs = op, semantics, inputs
        self.outputs: tuple[int, ...] | None = None  # uint64 outputs, once the op has them

    def __call__(self, *xs):
        op, semantics = self.op, self.semantics
        if semantics in (UInt64.QUOTIENT, UInt64.REMAINDER):
            q, r = unsigned_divmod(xs[0], op.legacy_align(xs[0], xs[1]))
            return q if semantics is UInt64.QUOTIENT else r
        convert = _order_key if semantics is UInt64.ORDER else uint64_to_double
        xs = [convert(x) if i in self.inputs else x for i, x in enumerate(xs)]
        result = type(op).kernel(op, *xs)
        if semantics is not UInt64.ORDER:
            return result
        if self.outputs is None:
            self.outputs = tuple(i for i, t in enumerate(op.outputs)
                                 if t is not None and t.info.dtype is DataType.UINT64)
        if isinstance(result, torch.Tensor):
            return _order_key(result) if self.outputs else result
        return tuple(_order_key(r) if i in self.outputs else r for i, r in enumerate(result))


def _adapt_uint64(op: Op, infos: tuple, wide_unsigned_ok: bool) -> None:
    """Give ``op`` the uint64 form of its kernel when an input is uint64 (see ``UInt64``)."""
    op.__dict__.pop("kernel", None)
    inputs = tuple(i for i, info in enumerate(infos)
                   if info is not None and info.dtype is DataType.UINT64)
    if not inputs or wide_unsigned_ok:
        return
    semantics = getattr(type(op), "uint64", None)
    if semantics is None:
        raise UnsupportedOpError(
            f"{op.debug_name}: dtype uint64 is valid ONNX but the simulated IPU holds uint64 "
            f"as int64 bit patterns and {op.op_type} does not say how it computes on them "
            f"(ops.base.UInt64). Cast to int64 first if the values are below 2**63."
        )
    if semantics is not UInt64.BITS:
        op.kernel = _UInt64Kernel(op, semantics, inputs)


def wrap_unsigned_outputs(op: Op, kernel):
    """``kernel`` followed by reducing its uint16/uint32 outputs modulo 2**bits (their int32 /
    int64 surrogates overflow past the unsigned range in add, sub, mul, not, shifts ...)."""
    dtypes = [None if t is None else t.info.dtype for t in op.outputs]
    wrapped = [i for i, d in enumerate(dtypes) if d in (DataType.UINT16, DataType.UINT32)]
    if not wrapped:
        return kernel
    if len(dtypes) == 1:
        dtype = dtypes[0]
        return lambda *xs: wrap_unsigned(kernel(*xs), dtype)

    def run(*xs):
        results = list(kernel(*xs))
        for i in wrapped:
            results[i] = wrap_unsigned(results[i], dtypes[i])
        return tuple(results)

    return run


@functools.cache
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


def allowed_types(op: Op, param: str) -> frozenset[str] | None:
    """ONNX type names (``float``, ``int4`` ...) type parameter ``param`` of ``op``'s version
    accepts; None when the schema has no such parameter."""
    return _type_constraints(op.op_type, op.version)[1].get(param)


def check_dtypes(op: Op, *infos: TensorInfo | None, wide_unsigned_ok: bool = False) -> None:
    """Check input dtypes against the ONNX type constraints of ``op``'s version.

    Raises ShapeError when a dtype is outside the schema's list or inputs sharing a type
    parameter differ. With a uint64 input, installs the op's uint64 kernel (``UInt64``) or
    raises UnsupportedOpError when the op declares none; ``wide_unsigned_ok`` says the op's
    own kernel handles uint64 bit patterns.
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
    _adapt_uint64(op, infos, wide_unsigned_ok)


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

    uint64 = UInt64.ORDER

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
