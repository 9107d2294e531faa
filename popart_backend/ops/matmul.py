"""Matrix products: MatMul (numpy semantics), Gemm (alpha·A'·B' + beta·C) and Einsum."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import broadcast_shapes
from .registry import register_op

# torch's CPU matmul has no unsigned 32/64-bit kernels. int64 arithmetic wraps modulo 2**64
# exactly like the unsigned types do, so the product is computed there and cast back.
_WIDENED = {DataType.UINT32: torch.int64, DataType.UINT64: torch.int64}


def _operand(name: str, info: TensorInfo) -> str:
    return f"{name} {info}"


def matmul_shape(op: Op, a: TensorInfo, b: TensorInfo) -> tuple[int, ...]:
    """numpy.matmul's result shape: 1-D operands are promoted and the added axis removed."""
    if a.rank == 0 or b.rank == 0:
        raise ShapeError(
            f"{op.debug_name}: MatMul needs operands of rank >= 1, got {_operand('lhs', a)} and "
            f"{_operand('rhs', b)}. Use Mul for scalar products."
        )
    a_shape = (1,) + a.shape if a.rank == 1 else a.shape
    b_shape = b.shape + (1,) if b.rank == 1 else b.shape
    if a_shape[-1] != b_shape[-2]:
        raise ShapeError(
            f"{op.debug_name}: inner dims differ: lhs {a} has {a_shape[-1]} columns, rhs {b} has "
            f"{b_shape[-2]} rows. Check the layer's in_features or transpose one operand."
        )
    try:
        batch = broadcast_shapes(op, a_shape[:-2], b_shape[:-2])
    except ShapeError:
        raise ShapeError(
            f"{op.debug_name}: batch dims of lhs {a} and rhs {b} do not broadcast."
        ) from None
    out = batch + (a_shape[-2], b_shape[-1])
    if a.rank == 1:
        out = out[:-2] + out[-1:]
    if b.rank == 1:
        out = out[:-1]
    return out


@register_op("MatMul", versions=(1, 9, 13))
class MatMul(Op):
    """Y = A @ B with numpy broadcasting of the batch dims."""

    def infer(self, a, b):
        if a.dtype != b.dtype:
            raise ShapeError(f"{self.debug_name}: operand dtypes differ: lhs {a}, rhs {b}.")
        self._widen = _WIDENED.get(a.dtype)
        self._out_dtype = a.dtype.torch
        return TensorInfo(a.dtype, matmul_shape(self, a, b))

    def kernel(self, a, b):
        if self._widen is not None:
            return torch.matmul(a.to(self._widen), b.to(self._widen)).to(self._out_dtype)
        return torch.matmul(a, b)


@register_op("Gemm", versions=(1, 6, 7, 9, 11, 13))
class Gemm(Op):
    """Y = alpha * A' @ B' + beta * C, where X' is X or its transpose; C broadcasts to Y."""

    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 1.0
        beta: float = 1.0
        transA: int = 0  # noqa: N815 - ONNX attribute name
        transB: int = 0  # noqa: N815

    @dataclass(frozen=True)
    class LegacyAttrs:
        """Versions 1 and 6: C broadcasts only when ``broadcast`` is set."""

        alpha: float = 1.0
        beta: float = 1.0
        transA: int = 0  # noqa: N815
        transB: int = 0  # noqa: N815
        broadcast: int = 0

    @classmethod
    def attrs_type(cls, version: int):
        return cls.LegacyAttrs if version < 7 else cls.Attrs

    def infer(self, a, b, c=None):
        at = self.attrs
        if a.rank != 2 or b.rank != 2:
            raise ShapeError(
                f"{self.debug_name}: Gemm needs 2-D A and B, got A {a} and B {b}. Use MatMul for "
                f"batched products."
            )
        m, k = (a.shape[1], a.shape[0]) if at.transA else a.shape
        k2, n = (b.shape[1], b.shape[0]) if at.transB else b.shape
        if k != k2:
            raise ShapeError(
                f"{self.debug_name}: inner dims differ: A {a} (transA={at.transA}) gives K={k}, "
                f"B {b} (transB={at.transB}) gives K={k2}."
            )
        if c is None and self.version < 11:
            raise ShapeError(
                f"{self.debug_name}: input C is required before Gemm-11 (opset {self.version})."
            )
        if c is not None:
            legacy_exact = isinstance(at, Gemm.LegacyAttrs) and not at.broadcast
            if legacy_exact and c.shape != (m, n):
                raise ShapeError(
                    f"{self.debug_name}: C {c} must have the output shape {[m, n]} because "
                    f"broadcast=0 (opset {self.version})."
                )
            if broadcast_shapes(self, c.shape, (m, n)) != (m, n):
                raise ShapeError(
                    f"{self.debug_name}: C {c} does not broadcast unidirectionally to the output "
                    f"shape {[m, n]}."
                )
        dtype = a.dtype
        self._widen = _WIDENED.get(dtype)
        self._out_dtype = dtype.torch
        self._integral = not dtype.torch.is_floating_point
        if self._integral and (at.alpha != int(at.alpha) or at.beta != int(at.beta)):
            raise ShapeError(
                f"{self.debug_name}: alpha={at.alpha} and beta={at.beta} must be whole numbers "
                f"for the integer dtype {dtype.name}."
            )
        # F.linear computes A @ B.T + C in one fused call: the common fully-connected layer.
        self._linear = (
            not at.transA
            and at.transB
            and at.alpha == 1.0
            and (c is None or (at.beta == 1.0 and c.rank <= 2))
            and not self._integral
        )
        return TensorInfo(dtype, (m, n))

    def kernel(self, a, b, c=None):
        at = self.attrs
        if self._linear:
            return F.linear(a, b, c)
        if self._widen is not None:
            a, b = a.to(self._widen), b.to(self._widen)
            c = c.to(self._widen) if c is not None else None
        if at.transA:
            a = a.t()
        if at.transB:
            b = b.t()
        if self._integral:
            # addmm rejects float alpha/beta on integer tensors; ONNX scales in the element type.
            y = torch.mm(a, b)
            if at.alpha != 1.0:
                y = y * int(at.alpha)
            if c is not None:
                y = y + (c * int(at.beta) if at.beta != 1.0 else c)
            return y.to(self._out_dtype)
        if c is None:
            y = torch.mm(a, b)
            return y if at.alpha == 1.0 else y.mul_(at.alpha)
        return torch.addmm(c, a, b, beta=at.beta, alpha=at.alpha)


_TERM = re.compile(r"^(?:[A-Za-z]|\.\.\.)*$")


def _split_term(term: str) -> list[str]:
    """'ab...c' -> ['a', 'b', '...', 'c']."""
    return re.findall(r"\.\.\.|[A-Za-z]", term)


@register_op("Einsum", versions=(12,))
class Einsum(Op):
    """Einstein summation (torch.einsum), with the equation checked against the input shapes."""

    @dataclass(frozen=True)
    class Attrs:
        equation: str

    def _bad(self, why: str, infos) -> ShapeError:
        shapes = ", ".join(str(i) for i in infos)
        return ShapeError(
            f"{self.debug_name}: equation '{self.attrs.equation}' does not fit inputs [{shapes}]: "
            f"{why}."
        )

    def infer(self, *infos):
        equation = self.attrs.equation.replace(" ", "")
        lhs, arrow, rhs = equation.partition("->")
        terms = lhs.split(",")
        if len(terms) != len(infos):
            raise self._bad(f"it has {len(terms)} operand term(s) for {len(infos)} input(s)", infos)
        if not all(_TERM.match(t) for t in terms) or (arrow and not _TERM.match(rhs)):
            raise self._bad("terms may hold only letters and one '...'", infos)
        if len({i.dtype for i in infos}) > 1:
            raise self._bad("inputs have different dtypes", infos)
        sizes: dict[str, int] = {}
        counts: dict[str, int] = {}
        ellipsis: tuple[int, ...] | None = None
        for term, info in zip(terms, infos):
            labels = _split_term(term)
            if labels.count("...") > 1:
                raise self._bad(f"term '{term}' has more than one '...'", infos)
            n_named = len(labels) - labels.count("...")
            if ("..." in labels and info.rank < n_named) or (
                "..." not in labels and info.rank != n_named
            ):
                raise self._bad(f"term '{term}' does not match the rank of {info}", infos)
            dim = 0
            for label in labels:
                if label == "...":
                    span = info.rank - n_named
                    dims = info.shape[dim:dim + span]
                    ellipsis = dims if ellipsis is None else broadcast_shapes(self, ellipsis, dims)
                    dim += span
                    continue
                size = info.shape[dim]
                dim += 1
                counts[label] = counts.get(label, 0) + 1
                if label in sizes and sizes[label] != size:
                    raise self._bad(
                        f"label '{label}' has size {sizes[label]} and size {size}", infos
                    )
                sizes[label] = size
        if arrow:
            out_labels = _split_term(rhs)
            for label in out_labels:
                if label != "..." and label not in sizes:
                    raise self._bad(f"output label '{label}' is not in any input", infos)
            if len(set(out_labels)) != len(out_labels):
                raise self._bad("the output repeats a label", infos)
        else:
            # Implicit output: the ellipsis dims, then labels used once, alphabetically.
            once = sorted(label for label, n in counts.items() if n == 1)
            out_labels = (["..."] if ellipsis is not None else []) + once
        shape: list[int] = []
        for label in out_labels:
            shape.extend((ellipsis or ()) if label == "..." else (sizes[label],))
        self._equation = equation
        dtype = infos[0].dtype
        self._widen = _WIDENED.get(dtype)
        self._out_dtype = dtype.torch
        return TensorInfo(dtype, tuple(shape))

    def kernel(self, *xs):
        if self._widen is not None:
            return torch.einsum(self._equation, *(x.to(self._widen) for x in xs)).to(self._out_dtype)
        return torch.einsum(self._equation, *xs)
