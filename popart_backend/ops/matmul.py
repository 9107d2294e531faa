"""Matrix products: MatMul (numpy semantics), Gemm (alpha·A'·B' + beta·C) and Einsum, with
their gradients (the grad ops sit right below their forward op, in domain ai.graphcore).

Half partials (SessionOptions.partialsTypeMatMuls = "half", transforms/numerics_options.py
HalfPartialMatMuls): a float16 MatMul, Gemm or their gradient marked ``half_partials``
accumulates its products in float16, as the IPU's AMP units do with half partials: each
product a_ik·b_kj is rounded to float16 and added, k = 0, 1, ..., to a float16 sum rounded after
every addition (``half_partials_matmul``). Unmarked float16 products accumulate in float32 and
round once, as torch's CPU kernels (and the IPU's default float partials) do. Float32 products
are never affected: the IPU has no half partials for them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

import torch
import torch.nn.functional as F

from ..dtypes import DataType
from ..errors import ShapeError, UnsupportedOpError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import broadcast_shapes
from .registry import AI_GRAPHCORE, register_op
from .rounding import rounding_generator, stochastic_round
from .weight_cache import KeptWeight

# torch's CPU matmul has no unsigned 32/64-bit kernels. int64 arithmetic wraps modulo 2**64
# exactly like the unsigned types do, so the product is computed there and cast back.
_WIDENED = {DataType.UINT32: torch.int64, DataType.UINT64: torch.int64}


def half_partials_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul of float16 operands with a float16 running sum over the inner index.

    One vectorised multiply and add per inner index k (K steps over [..., M, N] tensors), so it
    costs about K small kernels instead of one gemm: a debug-precision model, not a fast path.
    """
    lhs_vector, rhs_vector = a.dim() == 1, b.dim() == 1
    a = a.unsqueeze(0) if lhs_vector else a
    b = b.unsqueeze(-1) if rhs_vector else b
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    acc = torch.zeros(*batch, a.shape[-2], b.shape[-1], dtype=a.dtype)
    columns = a.unsqueeze(-1)  # [..., M, K, 1]: column k is [..., M, 1]
    rows = b.unsqueeze(-3)  # [..., 1, K, N]: row k is [..., 1, N]
    for k in range(a.shape[-1]):
        acc.add_(columns[..., k, :] * rows[..., k, :])  # float16 product, float16 sum
    if rhs_vector:
        acc = acc.squeeze(-1)
    return acc.squeeze(-2) if lhs_vector else acc


def _product(op: Op, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with the op's partials type (half when the HalfPartialMatMuls pass marked it)."""
    if op.settings.half_partials:
        return half_partials_matmul(a, b)
    return torch.matmul(a, b)


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

    uses_amp = True
    # partialsTypeMatMuls = "half" may make it accumulate in float16 (_product).
    supports_half_partials = True

    # enableStochasticRounding: a float16 product is computed in float32 and rounded to
    # float16 stochastically (the last input is then the random seed, ops/rounding.py).
    supports_stochastic_rounding = True

    def infer(self, a, b, seed=None):
        if a.dtype != b.dtype:
            raise ShapeError(f"{self.debug_name}: operand dtypes differ: lhs {a}, rhs {b}.")
        shape = matmul_shape(self, a, b)
        self._inner = a.shape[-1]
        self._widen = _WIDENED.get(a.dtype)
        self._out_dtype = a.dtype.torch
        return TensorInfo(a.dtype, shape)

    # Inference plans: a kept contiguous copy of a transposed weight for products with few
    # rows (bind_program, ops/weight_cache.py).
    _kept: KeptWeight | None = None

    def bind_program(self, program) -> None:
        a, b = self.inputs[0].info, self.inputs[1].info
        rows = a.nelms // a.shape[-1] if a.rank >= 2 and a.shape[-1] else 0
        self._kept = (KeptWeight.for_op(self, program, rows)
                      if len(self.inputs) == 2 and b.rank == 2 else None)

    def kernel(self, a, b, seed=None):
        if self._kept is not None:
            b = self._kept.operand(b, False)
        if self._widen is not None:
            return torch.matmul(a.to(self._widen), b.to(self._widen)).to(self._out_dtype)
        if seed is not None and a.dtype == torch.float16 and not self.settings.half_partials:
            # float32 partials, then one stochastic rounding of each result to float16.
            exact = torch.matmul(a.float(), b.float())
            return stochastic_round(exact, rounding_generator(self, seed))
        return _product(self, a, b)

    writes_into = True

    def kernel_into(self, out, a, b, seed=None):
        if self._kept is not None:
            b = self._kept.operand(b, False)
        if self._widen is not None or seed is not None or self.settings.half_partials:
            return self.kernel(a, b, seed)
        return torch.matmul(a, b, out=out)

    def grad(self, g):
        dy = g.output_grad(0)
        a, b = g.input(0), g.input(1)
        if g.needs_input_grad(0):
            g.set_input_grad(0, g.op("MatMulLhsGrad", dy, b, domain=AI_GRAPHCORE,
                                     lhs_shape=g.input_info(0).shape))
        if g.needs_input_grad(1):
            g.set_input_grad(1, g.op("MatMulRhsGrad", dy, a, domain=AI_GRAPHCORE,
                                     rhs_shape=g.input_info(1).shape))

    def cost(self) -> tuple[int, int]:
        # A multiply-add per output element and inner index: 2·M·N·K·batch.
        _, moved = super().cost()
        return 2 * self.outputs[0].info.nelms * self._inner, moved


def _promoted(shape: tuple[int, ...], lhs: bool) -> tuple[int, ...]:
    """numpy.matmul's promotion of a 1-D operand to a matrix."""
    if len(shape) != 1:
        return shape
    return (1,) + shape if lhs else shape + (1,)


class _MatMulGrad(Op):
    """Shared by both MatMul grads: view dY as the un-squeezed batched product, then sum the
    batch dims that broadcasting added back to the operand's shape."""

    uses_amp = True
    # partialsTypeMatMuls = "half" may make it accumulate in float16 (_product).
    supports_half_partials = True

    def setup(self, dy: TensorInfo, other: TensorInfo, shape, lhs: bool) -> TensorInfo:
        if not dy.dtype.is_float:
            raise ShapeError(f"{self.debug_name}: gradients need a float dtype, got {dy}.")
        mine = _promoted(tuple(shape), lhs)
        theirs = _promoted(other.shape, not lhs)
        a_shape, b_shape = (mine, theirs) if lhs else (theirs, mine)
        batch = broadcast_shapes(self, a_shape[:-2], b_shape[:-2])
        self._dy_shape = batch + (a_shape[-2], b_shape[-1])
        self._other_shape = theirs
        lead = len(batch) + 2 - len(mine)
        self._sum_dims = tuple(range(lead)) + tuple(
            lead + i for i, d in enumerate(mine[:-2]) if d == 1 and batch[lead + i] != 1
        )
        self._shape = tuple(shape)
        # A product with a 2-D operand folds the batch into rows: one large mm, as torch does.
        self._fold = len(mine) == 2 and len(batch) > 0
        # The summed index is the operand's K: lhs columns for dA = dY·Bᵀ, rhs rows for Aᵀ·dY.
        self._inner = mine[-1] if lhs else mine[-2]
        return TensorInfo(dy.dtype, self._shape)

    def cost(self) -> tuple[int, int]:
        # The forward product's FLOPs: 2 · elements of dY · K.
        _, moved = super().cost()
        return 2 * math.prod(self._dy_shape) * self._inner, moved

    def finish(self, grad: torch.Tensor) -> torch.Tensor:
        if self._sum_dims:
            grad = grad.sum(self._sum_dims)
        return grad.reshape(self._shape)


@register_op("MatMulLhsGrad", versions=1, domain=AI_GRAPHCORE)
class MatMulLhsGrad(_MatMulGrad):
    """dA = dY @ B^T, summed over the batch dims A was broadcast along."""

    @dataclass(frozen=True)
    class Attrs:
        lhs_shape: tuple[int, ...]

    def infer(self, dy, b):
        return self.setup(dy, b, self.attrs.lhs_shape, lhs=True)

    def kernel(self, dy, b):
        dy = dy.reshape(self._dy_shape)
        b = b.reshape(self._other_shape)
        return self.finish(_product(self, dy, b.transpose(-1, -2)))


@register_op("MatMulRhsGrad", versions=1, domain=AI_GRAPHCORE)
class MatMulRhsGrad(_MatMulGrad):
    """dB = A^T @ dY, summed over the batch dims B was broadcast along."""

    @dataclass(frozen=True)
    class Attrs:
        rhs_shape: tuple[int, ...]

    def infer(self, dy, a):
        return self.setup(dy, a, self.attrs.rhs_shape, lhs=False)

    def kernel(self, dy, a):
        dy = dy.reshape(self._dy_shape)
        a = a.reshape(self._other_shape)
        if self._fold:
            a = a.expand(self._dy_shape[:-2] + a.shape[-2:])
            rows = a.reshape(-1, a.shape[-1])
            return _product(self, rows.t(), dy.reshape(-1, dy.shape[-1])).reshape(self._shape)
        return self.finish(_product(self, a.transpose(-1, -2), dy))


@register_op("Gemm", versions=(1, 6, 7, 9, 11, 13))
class Gemm(Op):
    """Y = alpha * A' @ B' + beta * C, where X' is X or its transpose; C broadcasts to Y."""

    uses_amp = True
    # partialsTypeMatMuls = "half" may make it accumulate in float16 (_product).
    supports_half_partials = True

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
        self._inner = k
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

    # Inference plans: a kept contiguous copy of the [N, K] weight's transpose for products with
    # few rows (bind_program, ops/weight_cache.py).
    _kept: KeptWeight | None = None

    def bind_program(self, program) -> None:
        self._kept = None
        if self._linear:
            self._kept = KeptWeight.for_op(self, program, self.inputs[0].info.shape[0])

    def kernel(self, a, b, c=None):
        at = self.attrs
        if self._kept is not None:
            return self.kernel_into(a.new_empty(a.shape[0], b.shape[0]), a, b, c)
        if self._linear and not self.settings.half_partials:
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
        if self.settings.half_partials:
            # The float16 product, then alpha·Y + beta·C in float16 like the IPU's Gemm.
            y = half_partials_matmul(a, b)
            y = y if at.alpha == 1.0 else y.mul_(at.alpha)
            return y if c is None else y + (c if at.beta == 1.0 else c * at.beta)
        if c is None:
            y = torch.mm(a, b)
            return y if at.alpha == 1.0 else y.mul_(at.alpha)
        return torch.addmm(c, a, b, beta=at.beta, alpha=at.alpha)

    writes_into = True

    def kernel_into(self, out, a, b, c=None):
        at = self.attrs
        if self._widen is not None or self._integral or self.settings.half_partials:
            return self.kernel(a, b, c)
        if self._linear:
            # F.linear on matrices: mm, or addmm with the bias.
            b = b.t() if self._kept is None else self._kept.operand(b, True)
        else:
            a = a.t() if at.transA else a
            b = b.t() if at.transB else b
        if c is None:
            torch.mm(a, b, out=out)
            return out if at.alpha == 1.0 else out.mul_(at.alpha)
        if self._linear:
            return torch.addmm(c, a, b, out=out)
        return torch.addmm(c, a, b, beta=at.beta, alpha=at.alpha, out=out)

    def grad(self, g):
        at = self.attrs
        dy = g.output_grad(0)
        common = dict(alpha=at.alpha, transA=at.transA, transB=at.transB)
        if g.needs_input_grad(0):
            g.set_input_grad(0, g.op("GemmGrad", dy, g.input(1), domain=AI_GRAPHCORE,
                                     operand=0, **common))
        if g.needs_input_grad(1):
            g.set_input_grad(1, g.op("GemmGrad", dy, g.input(0), domain=AI_GRAPHCORE,
                                     operand=1, **common))
        if g.has_input(2) and g.needs_input_grad(2):
            dc = g.reduce_to_shape(dy, g.input_info(2).shape)
            if at.beta != 1.0:
                beta = g.const(np.asarray(at.beta, g.input_info(2).dtype.numpy), "beta")
                dc = g.op("Mul", dc, beta)
            g.set_input_grad(2, dc)

    def cost(self) -> tuple[int, int]:
        # 2·M·N·K for the product, plus one add per output element for C.
        _, moved = super().cost()
        y = self.outputs[0].info.nelms
        return 2 * y * self._inner + (y if len(self.inputs) > 2 and self.inputs[2] else 0), moved


@register_op("GemmGrad", versions=1, domain=AI_GRAPHCORE)
class GemmGrad(Op):
    """Gradient of Gemm's A (operand=0, other = B) or B (operand=1, other = A):
    dA' = alpha·dY·B'^T and dB' = alpha·A'^T·dY, transposed back when the operand was."""

    uses_amp = True
    # partialsTypeMatMuls = "half" may make it accumulate in float16 (_product).
    supports_half_partials = True

    @dataclass(frozen=True)
    class Attrs:
        operand: int
        alpha: float = 1.0
        transA: int = 0  # noqa: N815 - Gemm's attribute names
        transB: int = 0  # noqa: N815

    def infer(self, dy, other):
        at = self.attrs
        m, n = dy.shape
        if at.operand == 0:
            k = other.shape[1] if at.transB else other.shape[0]
            shape = (k, m) if at.transA else (m, k)
        else:
            k = other.shape[0] if at.transA else other.shape[1]
            shape = (n, k) if at.transB else (k, n)
        return TensorInfo(dy.dtype, shape)

    def kernel(self, dy, other):
        at = self.attrs
        if at.operand == 0:
            # dA' = dY @ B'^T with B' = B^T when transB.
            b_t = other if at.transB else other.t()
            grad = (_product(self, other.t() if at.transB else other, dy.t()) if at.transA
                    else _product(self, dy, b_t))
        else:
            a_prime = other.t() if at.transA else other
            grad = (_product(self, dy.t(), a_prime) if at.transB
                    else _product(self, a_prime.t(), dy))
        return grad if at.alpha == 1.0 else grad.mul_(at.alpha)

    writes_into = True

    def kernel_into(self, out, dy, other):
        at = self.attrs
        if self.settings.half_partials:
            return self.kernel(dy, other)
        if at.operand == 0:
            x, y = ((other.t() if at.transB else other, dy.t()) if at.transA
                    else (dy, other if at.transB else other.t()))
        else:
            a_prime = other.t() if at.transA else other
            x, y = (dy.t(), a_prime) if at.transB else (a_prime.t(), dy)
        torch.mm(x, y, out=out)
        return out if at.alpha == 1.0 else out.mul_(at.alpha)

    def cost(self) -> tuple[int, int]:
        # The forward's 2·M·N·K: dY is [M, N] and the gradient holds K·(M or N) elements.
        _, moved = super().cost()
        dy, grad = self.inputs[0].info, self.outputs[0].info
        m, n = dy.shape
        k = grad.nelms // (m if self.attrs.operand == 0 else n)
        return 2 * m * n * k, moved


_TERM = re.compile(r"^(?:[A-Za-z]|\.\.\.)*$")


def _split_term(term: str) -> list[str]:
    """'ab...c' -> ['a', 'b', '...', 'c']."""
    return re.findall(r"\.\.\.|[A-Za-z]", term)


@register_op("Einsum", versions=(12, 28))
class Einsum(Op):
    """Einstein summation (torch.einsum), with the equation checked against the input shapes."""

    aliases_inputs = True  # a one-operand equation may return a permuted view

    uses_amp = True

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
        # Every combination of label values is visited once (a multiply-add with operands).
        self._loop_size = math.prod(sizes.values()) * math.prod(ellipsis or ())
        dtype = infos[0].dtype
        self._widen = _WIDENED.get(dtype)
        self._out_dtype = dtype.torch
        return TensorInfo(dtype, tuple(shape))

    def kernel(self, *xs):
        if self._widen is not None:
            return torch.einsum(self._equation, *(x.to(self._widen) for x in xs)).to(self._out_dtype)
        return torch.einsum(self._equation, *xs)

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        return (2 if len(self.inputs) > 1 else 1) * self._loop_size, moved

    def grad(self, g):
        infos = [g.input_info(i) for i in range(len(self.inputs))]
        dy = g.output_grad(0)
        xs = [g.input(i) for i in range(len(self.inputs))]
        for i, info in enumerate(infos):
            if info.dtype.is_float and g.needs_input_grad(i):
                g.set_input_grad(i, g.op("EinsumGrad", dy, *xs, domain=AI_GRAPHCORE,
                                         equation=self.attrs.equation, operand=i))


def explicit_terms(equation: str, ranks: list[int]) -> tuple[list[list[str]], list[str]]:
    """Operand and output labels with '...' spelled out as letters the equation does not use
    (right-aligned, as ellipsis dims broadcast) and an implicit output made explicit."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = [_split_term(t) for t in lhs.split(",")]
    spans = [r - (len(t) - t.count("...")) if "..." in t else 0 for t, r in zip(terms, ranks)]
    used = set(equation)
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in used]
    full = spare[: max(spans, default=0)]

    def expand(labels: list[str], span: int) -> list[str]:
        out: list[str] = []
        for label in labels:
            # An operand's ellipsis takes the last ``span`` letters (right alignment).
            out.extend(full[len(full) - span:] if label == "..." else [label])
        return out

    has_ellipsis = any("..." in t for t in terms)
    if arrow:
        out = expand(_split_term(rhs), len(full))
    else:
        counts: dict[str, int] = {}
        for t in terms:
            for label in t:
                if label != "...":
                    counts[label] = counts.get(label, 0) + 1
        out = (list(full) if has_ellipsis else []) + sorted(k for k, n in counts.items() if n == 1)
    return [expand(t, s) for t, s in zip(terms, spans)], out


@register_op("EinsumGrad", versions=1, domain=AI_GRAPHCORE)
class EinsumGrad(Op):
    """Gradient of Einsum operand ``operand``: an einsum of dY with the other operands into the
    operand's labels; labels only that operand has are broadcast back, broadcast dims summed."""

    aliases_inputs = True  # a one-operand gradient may be a permuted view of dY

    @dataclass(frozen=True)
    class Attrs:
        equation: str
        operand: int

    def infer(self, dy, *xs):
        i = self.attrs.operand
        terms, out = explicit_terms(self.attrs.equation, [x.rank for x in xs])
        mine = terms[i]
        if len(set(mine)) != len(mine):
            raise UnsupportedOpError(
                f"{self.debug_name}: the gradient of Einsum '{self.attrs.equation}' for operand "
                f"{i} needs a diagonal (a label repeated within its term); it is not supported. "
                f"Rewrite the equation without repeated labels."
            )
        sizes: dict[str, int] = {}
        for term, info in zip(terms, xs):
            for label, size in zip(term, info.shape):
                sizes[label] = max(sizes.get(label, 1), size)
        available = set(out)
        for j, term in enumerate(terms):
            if j != i:
                available.update(term)
        kept = [label for label in mine if label in available]
        operands = ",".join(["".join(out)] + ["".join(t) for j, t in enumerate(terms) if j != i])
        self._equation = f"{operands}->{''.join(kept)}"
        self._others = [j for j in range(len(xs)) if j != i]
        shape = xs[i].shape
        self._missing = [p for p, label in enumerate(mine) if label not in available]
        self._expand = tuple(shape[p] if p in self._missing else -1 for p in range(len(mine)))
        self._sum_dims = tuple(
            p for p, label in enumerate(mine)
            if label in available and shape[p] == 1 and sizes[label] != 1
        )
        return TensorInfo(dy.dtype, shape)

    def kernel(self, dy, *xs):
        grad = torch.einsum(self._equation, dy, *(xs[j] for j in self._others))
        for p in self._missing:
            grad = grad.unsqueeze(p)
        if self._missing:
            grad = grad.expand(self._expand).contiguous()
        if self._sum_dims:
            grad = grad.sum(self._sum_dims, keepdim=True)
        return grad
