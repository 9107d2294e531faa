"""SGD updates that compute their weight gradient themselves (transforms/fuse_grad_update.py).

A weight gradient that is a matrix product read only by its SGD update need not exist as a
tensor: the product lands in the velocity (or the weight) directly through ``addmm``, whose
``beta`` scales what it adds to. That saves the gradient buffer and a full pass over it.

With g = s·(Aᵀ·B) (s: grad_scale, clip factor, 1/lossScaling, the product's own scale),
c = vs·(1 − dm) (vs·1 on the first momentum step or with momentum 0, and β = 0 then):

    velocity:  v' = addmm(v, Aᵀ, B, beta=mm, alpha=c·s) + c·wd·w,   w' = w − (lr/vs)·v'
    none:      w' = addmm(w, Aᵀ, B, beta=1 − lr·wd, alpha=−lr·s)

which is ``SGDUpdate``'s formula with the additions regrouped (only the rounding differs).
Gradient accumulation adds the product to the accumulator the same way (``MatMulAccumulate``):
``Add`` is addmm(acc, Aᵀ, B, beta=1, alpha=s), the running ``Mean`` with w = 1/(count + 1) is
addmm(acc, Aᵀ, B, beta=1 − w, alpha=w·s).
Anything else (Nesterov, stochastic rounding, skip-on-overflow, mixed dtypes) forms the
gradient and runs ``SGDUpdate``'s own kernel, so the fused op is never wrong, only slower.
Like the other updates, first writes of a run go to the journal's spare buffers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .accumulate import Accumulate
from .fused import FUSED_DOMAIN
from .optimizer_updates import SGDUpdate, _advance_step, _first, _settle
from .registry import register_op

__all__ = ["MatMulAccumulate", "SGDMatMulUpdate"]


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


class _Product:
    """The gradient product op(A)·op(B) of the fused ops (attrs a_transposed, b_transposed)."""

    def _operands(self, a, b):
        a, b = _rows(a), _rows(b)
        return (a.t() if self.attrs.a_transposed else a), (b.t() if self.attrs.b_transposed else b)

    def _check_product(self, target, a, b) -> None:
        rows = [(x.nelms // x.shape[-1], x.shape[-1]) for x in (a, b)]
        (m, k1), (k2, n) = (rows[0][::-1] if self.attrs.a_transposed else rows[0],
                            rows[1][::-1] if self.attrs.b_transposed else rows[1])
        if k1 != k2 or (m, n) != tuple(target.shape) or a.dtype != b.dtype:
            raise ShapeError(
                f"{self.debug_name}: the gradient product of {a} and {b} (transposed: "
                f"{self.attrs.a_transposed}, {self.attrs.b_transposed}) is not a {target} "
                f"gradient.")
        self._flops = 2 * m * k1 * n


@register_op("MatMulAccumulate", versions=(1,), domain=FUSED_DOMAIN)
class MatMulAccumulate(_Product, Accumulate):
    """``Accumulate(accum, op(A)·op(B)·product_scale[, count])`` without the product tensor."""

    @dataclass(frozen=True)
    class Attrs(Accumulate.Attrs):
        a_transposed: bool = True
        b_transposed: bool = False
        product_scale: float = 1.0

    @classmethod
    def from_accumulate(cls, op: Accumulate, a_transposed: bool, b_transposed: bool,
                        product_scale: float) -> MatMulAccumulate:
        attrs = cls.Attrs(**asdict(op.attrs), a_transposed=a_transposed,
                          b_transposed=b_transposed, product_scale=product_scale)
        return cls(attrs, op.settings)

    def infer(self, accum, a, b, count=None):
        self._check_product(accum, a, b)
        if a.dtype != accum.dtype:
            raise ShapeError(f"{self.debug_name}: the product of {a} and {b} must have the "
                             f"accumulator's dtype ({accum}).")
        return super().infer(accum, TensorInfo(a.dtype, accum.shape), count)

    def cost(self) -> tuple[int, int]:
        flops, moved = Op.cost(self)
        return flops + self._flops, moved

    def kernel(self, accum, a, b, count=None):
        return self.journaled_kernel(None, accum, a, b, count)

    def journaled_kernel(self, journal, accum, a, b, count=None):
        out = accum if journal is None else journal.spare_for(accum)
        lhs, rhs = self._operands(a, b)
        scale = self.attrs.product_scale
        if count is None:
            _addmm(accum, lhs, rhs, 1.0, scale, out)
        else:
            w = 1.0 / (float(count) + 1.0)
            _addmm(accum, lhs, rhs, 1.0 - w, w * scale, out)
        if journal is not None:
            journal.settle(accum, out)
        return accum


@register_op("SGDMatMulUpdate", versions=(1,), domain=FUSED_DOMAIN)
class SGDMatMulUpdate(_Product, SGDUpdate):
    """``SGDUpdate`` of (weight, op(A)·op(B), velocity, step, clip, *dynamic) with the gradient
    product's operands as inputs 1 and 2 instead of the gradient.

    op(X) is X folded to rows [M, K] (batch dims into M), transposed when ``a_transposed`` /
    ``b_transposed``; the product is multiplied by ``product_scale`` (a Gemm's alpha).
    """

    @dataclass(frozen=True)
    class Attrs(SGDUpdate.Attrs):
        a_transposed: bool = True
        b_transposed: bool = False
        product_scale: float = 1.0

    def __init__(self, attrs=None, settings=None, version=None):
        super().__init__(attrs, settings, version)
        # The weight and the state; inputs 1 and 2 are the product's operands.
        self.modifies_inputs = (0, *range(3, 3 + len(self.STATE)))

    @classmethod
    def from_update(cls, update: SGDUpdate, a_transposed: bool, b_transposed: bool,
                    product_scale: float) -> SGDMatMulUpdate:
        attrs = cls.Attrs(**asdict(update.attrs), a_transposed=a_transposed,
                          b_transposed=b_transposed, product_scale=product_scale)
        return cls(attrs, update.settings)

    def infer(self, weight, a, b, *rest):
        self._check_product(weight, a, b)
        return super().infer(weight, TensorInfo(a.dtype, weight.shape), *rest)

    def cost(self) -> tuple[int, int]:
        flops, moved = super().cost()
        return flops + self._flops, moved

    def journaled_kernel(self, journal, weight, a, b, *rest):
        velocity, step = rest[0], rest[1]
        h, factor = self._hyper_and_factor(rest)
        dtypes = {a.dtype, b.dtype, weight.dtype} | ({velocity.dtype} if velocity is not None
                                                     else set())
        if (self.settings.stochastic_rounding or self.settings.skip_on_overflow
                or h["nesterov"] != 0.0 or len(dtypes) != 1):
            lhs, rhs = self._operands(a, b)
            grad = torch.mm(lhs, rhs)
            if self.attrs.product_scale != 1.0:
                grad.mul_(self.attrs.product_scale)
            return super().journaled_kernel(journal, weight, grad, *rest)
        lhs, rhs = self._operands(a, b)
        factor *= self.attrs.product_scale
        lr, wd = h["lr"], h["weight_decay"]
        if velocity is None:
            out = _first(journal, weight)
            _addmm(weight, lhs, rhs, 1.0 - lr * wd, -lr * factor, out)
            _settle(journal, weight, out)
            return weight
        mm, vs = h["momentum"], h["velocity_scaling"]
        first = _advance_step(step, journal)
        if mm == 0.0 or first:
            beta, c = 0.0, vs
        else:
            beta, c = mm, vs * (1.0 - h["dampening"])
        out = _first(journal, velocity)
        _addmm(velocity, lhs, rhs, beta, c * factor, out)
        if wd != 0.0:
            out.add_(weight, alpha=c * wd)
        _settle(journal, velocity, out)
        out = _first(journal, weight)
        torch.add(weight, velocity, alpha=-lr / vs, out=out)
        _settle(journal, weight, out)
        return weight

    def kernel(self, weight, a, b, *rest):
        return self.journaled_kernel(None, weight, a, b, *rest)


def _addmm(x, lhs, rhs, beta: float, alpha: float, out) -> None:
    """out = beta·x + alpha·lhs·rhs (beta 0 ignores x, NaNs included), out may be x."""
    if out is x:
        x.addmm_(lhs, rhs, beta=beta, alpha=alpha)
    else:
        torch.addmm(x, lhs, rhs, beta=beta, alpha=alpha, out=out)
