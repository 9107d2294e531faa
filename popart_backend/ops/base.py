"""Family bases shared by many ops: their shape rule, dtype rule and cost live here once."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import onnx.defs

from ..dtypes import DataType
from ..errors import ShapeError, UnsupportedOpError
from ..ir.op import Op
from ..ir.tensor import TensorInfo


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
