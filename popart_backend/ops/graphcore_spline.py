"""The B-spline ops of spline-based graph convolutions (PyTorch Geometric's SplineConv):
SplineBasis and SplineWeighting, and SplineWeighting's gradient.

SplineBasis: for E edges with D-dimensional pseudo-coordinates in [0, 1], each edge touches
S = (degree + 1)^D kernel weights. For the s-th of them, with k_d = (s // (degree+1)^d) mod
(degree+1) and v_d = pseudo[e, d] · (kernel_size[d] - degree · is_open_spline[d]):

    weight_index[e, s] = sum_d ((trunc(v_d) + k_d) mod kernel_size[d]) · prod_{j < d} kernel_size[j]
    basis[e, s]        = prod_d B_{degree, k_d}(v_d - floor(v_d))

with the uniform B-spline pieces B (degree 1: 1 - t, t; degree 2 and 3 the quadratic and cubic
pieces). SplineWeighting: out[e] = sum_s basis[e, s] · (x[e] @ weight[weight_index[e, s]]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.signature import INT, REQUIRED, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from .graphcore_common import GC, _require_float
from .multi_grad import add_multi_grad_op, pick_grads, wanted_grads
from .registry import register_op

_INDEX_DTYPES = (DataType.INT32, DataType.INT64)


def _pieces(t: torch.Tensor, k: torch.Tensor, degree: int) -> torch.Tensor:
    """B_{degree, k}(t) elementwise (t and k broadcast)."""
    if degree == 1:
        return torch.where(k == 0, 1 - t, t)
    if degree == 2:
        return torch.where(k == 0, 0.5 * t * t - t + 0.5,
                           torch.where(k == 1, -t * t + t + 0.5, 0.5 * t * t))
    t2, t3 = t * t, t * t * t
    return torch.where(
        k == 0, (1 - t) ** 3 / 6,
        torch.where(k == 1, (3 * t3 - 6 * t2 + 4) / 6,
                    torch.where(k == 2, (-3 * t3 + 3 * t2 + 3 * t + 1) / 6, t3 / 6)))


@register_op("SplineBasis", versions=1, domain=GC)
class SplineBasis(Op):
    """Inputs pseudo [E, D] (float), kernel_size [D] (int32) and is_open_spline [D] (uint8);
    outputs basis [E, S] in pseudo's dtype and weight_index [E, S] (int32), S = (degree+1)^D.
    No gradient (PopART has none): pseudo-coordinates are data."""

    builder_method = BuilderMethod("splinebasis", 3, 2, (AttrSpec("degree", INT, REQUIRED),))

    @dataclass(frozen=True)
    class Attrs:
        degree: int

    def infer(self, pseudo, kernel_size, is_open_spline):
        degree = self.attrs.degree
        if degree not in (1, 2, 3):
            raise ShapeError(f"{self.debug_name}: degree={degree} must be 1, 2 or 3.")
        _require_float(self, pseudo)
        if pseudo.rank != 2:
            raise ShapeError(f"{self.debug_name}: pseudo {pseudo} must be [edges, dims].")
        dims = pseudo.shape[1]
        for name, info in (("kernel_size", kernel_size), ("is_open_spline", is_open_spline)):
            if info.shape != (dims,) or info.dtype.is_float:
                raise ShapeError(f"{self.debug_name}: {name} {info} must be an integer [{dims}] "
                                 f"(one per pseudo dimension).")
        count = (degree + 1) ** dims
        steps = torch.arange(count)
        # k_d of each of the S kernel weights, [D, S].
        self._k = torch.stack([(steps // (degree + 1) ** d) % (degree + 1) for d in range(dims)])
        shape = (pseudo.shape[0], count)
        return [TensorInfo(pseudo.dtype, shape), TensorInfo(DataType.INT32, shape)]

    def kernel(self, pseudo, kernel_size, is_open_spline):
        degree = self.attrs.degree
        sizes = kernel_size.long()
        v = pseudo * (sizes - degree * is_open_spline.long()).to(pseudo.dtype)  # [E, D]
        frac = (v - torch.floor(v)).unsqueeze(-1)  # [E, D, 1]
        basis = _pieces(frac, self._k, degree).prod(dim=1)
        offsets = torch.cumprod(torch.cat([sizes.new_ones(1), sizes[:-1]]), 0)  # [D]
        cell = torch.fmod(torch.trunc(v).long().unsqueeze(-1) + self._k, sizes.unsqueeze(-1))
        index = (cell * offsets.view(1, -1, 1)).sum(dim=1)
        return basis.to(pseudo.dtype), index.to(torch.int32)


@register_op("SplineWeighting", versions=1, domain=GC)
class SplineWeighting(Op):
    """Inputs x [E, M_in], weight [K, M_in, M_out], basis [E, S], weight_index [E, S] (int);
    out [E, M_out] = sum_s basis[e, s] · x[e] @ weight[weight_index[e, s]]."""

    builder_method = BuilderMethod("splineweighting", 4)

    def infer(self, x, weight, basis, weight_index):
        _require_float(self, x, weight, basis)
        if x.rank != 2 or weight.rank != 3 or basis.rank != 2 or weight.shape[1] != x.shape[1]:
            raise ShapeError(f"{self.debug_name}: x {x} must be [E, M_in] and weight {weight} "
                             f"[K, M_in, M_out] with the same M_in, basis {basis} [E, S].")
        if basis.shape[0] != x.shape[0] or weight_index.shape != basis.shape:
            raise ShapeError(f"{self.debug_name}: basis {basis} and weight_index {weight_index} "
                             f"must both be [{x.shape[0]}, S] (one row per edge of x {x}).")
        if weight_index.dtype not in _INDEX_DTYPES:
            raise ShapeError(f"{self.debug_name}: weight_index {weight_index} must be int32 or "
                             f"int64.")
        if len({x.dtype, weight.dtype, basis.dtype}) != 1:
            raise ShapeError(f"{self.debug_name}: x {x}, weight {weight} and basis {basis} must "
                             f"share one dtype.")
        return TensorInfo(x.dtype, (x.shape[0], weight.shape[2]))

    def kernel(self, x, weight, basis, weight_index):
        # Out-of-range indices fail in the indexing; the plan re-raises naming this op.
        picked = weight[weight_index.long()]  # [E, S, M_in, M_out]
        return torch.einsum("es,ei,esio->eo", basis, x, picked)

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        edges, inputs = self.inputs[0].info.shape
        count, outputs = self.inputs[2].info.shape[1], self.inputs[1].info.shape[2]
        return 2 * edges * count * inputs * outputs, moved

    def grad(self, g):
        wrt = wanted_grads(g)
        if wrt:
            add_multi_grad_op(g, "SplineWeightingGrad", g.output_grad(0), g.input(0),
                              g.input(1), g.input(2), g.input(3), wrt=wrt)


@register_op("SplineWeightingGrad", versions=1, domain=GC)
class SplineWeightingGrad(Op):
    """dx, dweight, dbasis (those in ``wrt``) of SplineWeighting; inputs (dy, x, weight, basis,
    weight_index). Weights several edges use accumulate their gradients."""

    @dataclass(frozen=True)
    class Attrs:
        wrt: tuple[int, ...]

    def infer(self, dy, x, weight, basis, weight_index):
        return [(x, weight, basis)[i] for i in self.attrs.wrt]

    def kernel(self, dy, x, weight, basis, weight_index):
        index = weight_index.long()
        picked = weight[index]
        dx = torch.einsum("es,esio,eo->ei", basis, picked, dy) if 0 in self.attrs.wrt else None
        dweight = None
        if 1 in self.attrs.wrt:
            terms = torch.einsum("es,ei,eo->esio", basis, x, dy).reshape(-1, *weight.shape[1:])
            dweight = weight.new_zeros(weight.shape).index_add_(0, index.reshape(-1), terms)
        dbasis = torch.einsum("ei,esio,eo->es", x, picked, dy) if 2 in self.attrs.wrt else None
        return pick_grads((dx, dweight, dbasis), self.attrs.wrt)

    grad = Op.grad
