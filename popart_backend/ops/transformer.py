"""Transformer building blocks of recent opsets: RMSNormalization (23), RotaryEmbedding (23),
Swish (24) and SwiGLU (28), each with its gradient op right below it.

- RMSNormalization: Y = X / sqrt(mean(X^2 over [axis, rank)) + epsilon) * scale, the first
  stage in ``stash_type`` then cast back to X's type; Y takes scale's type.
- RotaryEmbedding: rotates the first ``rotary_embedding_dim`` features of each head by the
  angle of its token's position, pairing feature i with i + dim/2 (or 2i with 2i+1 when
  ``interleaved``). cos/sin come from caches indexed by ``position_ids`` ([max_pos, dim/2]) or
  are given per token ([B, S, dim/2]). X is [B, H, S, D], or [B, S, H * D] with ``num_heads``.
- Swish: Y = X * sigmoid(alpha X). SwiGLU: Y = Swish(A) * B with equal shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import ElementwiseGrad, Unary, check_dtypes, normalize_axis
from .multi_grad import add_multi_grad_op, pick_grads, wanted_grads
from .registry import AI_GRAPHCORE, register_op

_STASH_TYPES = {
    DataType.FLOAT.onnx: torch.float32,
    DataType.FLOAT16.onnx: torch.float16,
    DataType.DOUBLE.onnx: torch.float64,
    DataType.BFLOAT16.onnx: torch.bfloat16,
}


def _sum_to(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Sum a gradient over the axes broadcasting stretched, back to ``shape``."""
    lead = t.dim() - len(shape)
    dims = list(range(lead)) + [
        lead + i for i, d in enumerate(shape) if d == 1 and t.shape[lead + i] != 1
    ]
    return (t.sum(dims, keepdim=True) if dims else t).reshape(shape)


# --- RMSNormalization ---------------------------------------------------------------------------


@register_op("RMSNormalization", versions=23)
class RMSNormalization(Op):
    """Y = X / sqrt(mean(X^2) + epsilon) * scale over the dims [axis, rank)."""

    @dataclass(frozen=True)
    class Attrs:
        axis: int = -1
        epsilon: float = 1e-5
        stash_type: int = 1

    def infer(self, x, scale):
        check_dtypes(self, x, scale)
        return self.layout(x, scale)

    def layout(self, x, scale) -> TensorInfo:
        """Check shapes and fix the axes and stash type (shared with the grad op)."""
        axis = normalize_axis(self, self.attrs.axis, x.rank)
        if scale.rank > x.rank or any(
            d not in (1, n) for d, n in zip(reversed(scale.shape), reversed(x.shape))
        ):
            raise ShapeError(
                f"{self.debug_name}: scale {scale} does not broadcast to X {x} (it must be "
                f"unidirectionally broadcastable, usually the normalized shape {list(x.shape[axis:])})."
            )
        if self.attrs.stash_type not in _STASH_TYPES:
            raise ShapeError(
                f"{self.debug_name}: stash_type={self.attrs.stash_type} is not a floating-point "
                f"ONNX type code (1 = float32, 10 = float16, 11 = float64, 16 = bfloat16)."
            )
        self._axes = tuple(range(axis, x.rank))
        self._stash = _STASH_TYPES[self.attrs.stash_type]
        return TensorInfo(scale.dtype, x.shape)

    def normalized(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(X / rms, 1 / rms), both in the stash type."""
        xs = x.to(self._stash)
        inv_rms = 1.0 / torch.sqrt(xs.square().mean(self._axes, keepdim=True) + self.attrs.epsilon)
        return xs * inv_rms, inv_rms

    def kernel(self, x, scale):
        normed = self.normalized(x)[0].to(x.dtype)
        return normed.to(scale.dtype) * scale

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        return 5 * self.inputs[0].info.nelms, moved  # square, sum, scale, divide, multiply

    def grad(self, g):
        wrt = wanted_grads(g, (0, 1))
        if wrt:
            a = self.attrs
            add_multi_grad_op(g, "RMSNormalizationGrad", g.output_grad(0), g.input(0),
                              g.input(1), wrt=wrt, axis=a.axis, epsilon=a.epsilon,
                              stash_type=a.stash_type)


@register_op("RMSNormalizationGrad", versions=1, domain=AI_GRAPHCORE)
class RMSNormalizationGrad(RMSNormalization):
    """dX, dScale (those in ``wrt``) from dY, X, scale. With n = X / rms and dn = dY * scale:
    dX = (dn - n * mean(dn * n)) / rms, dScale = dY * n summed to scale's shape."""

    grad = Op.grad  # no second derivative

    @dataclass(frozen=True)
    class Attrs:
        wrt: tuple[int, ...]
        axis: int = -1
        epsilon: float = 1e-5
        stash_type: int = 1

    def infer(self, dy, x, scale):
        self.layout(x, scale)
        return [(x, scale)[i] for i in self.attrs.wrt]

    def kernel(self, dy, x, scale):
        normed, inv_rms = self.normalized(x)
        dy_s = dy.to(self._stash)
        dx = dscale = None
        if 0 in self.attrs.wrt:
            dn = dy_s * scale.to(self._stash)
            dx = (dn - normed * (dn * normed).mean(self._axes, keepdim=True)) * inv_rms
            dx = dx.to(x.dtype)
        if 1 in self.attrs.wrt:
            dscale = _sum_to(dy_s * normed.to(x.dtype).to(self._stash), scale.shape)
            dscale = dscale.to(scale.dtype)
        return pick_grads((dx, dscale), self.attrs.wrt)


# --- RotaryEmbedding ----------------------------------------------------------------------------


@register_op("RotaryEmbedding", versions=23)
class RotaryEmbedding(Op):
    """Rotary position embedding of X's heads (see the module docstring)."""

    @dataclass(frozen=True)
    class Attrs:
        interleaved: int = 0
        num_heads: int | None = None
        rotary_embedding_dim: int = 0

    def infer(self, x, cos, sin, position_ids=None):
        check_dtypes(self, x, cos, sin, position_ids)
        return self.layout(x, cos, sin, position_ids)

    def layout(self, x, cos, sin, position_ids) -> TensorInfo:
        """Check shapes and fix the head view and rotated width (shared with the grad op)."""
        name = self.debug_name
        if x.rank == 3:
            heads = self.attrs.num_heads
            if not heads or x.shape[2] % heads:
                raise ShapeError(
                    f"{name}: 3-D X {x} needs num_heads (got {heads}) dividing its hidden size."
                )
            batch, seq, head = x.shape[0], x.shape[1], x.shape[2] // heads
            # Rotate a [B, S, H, D] view; cos/sin [B, S, dim/2] broadcast over H.
            self._view, self._angle_axis = (batch, seq, heads, head), 2
        elif x.rank == 4:
            batch, heads, seq, head = x.shape
            self._view, self._angle_axis = None, 1  # cos/sin broadcast over H at axis 1
        else:
            raise ShapeError(f"{name}: X {x} must be [B, H, S, D] or [B, S, H * D].")
        dim = self.attrs.rotary_embedding_dim or head
        if dim % 2 or dim > head:
            raise ShapeError(
                f"{name}: rotary_embedding_dim {dim} must be even and at most the head size "
                f"{head}."
            )
        half = dim // 2
        if position_ids is not None:
            if position_ids.shape != (batch, seq) or cos.rank != 2:
                raise ShapeError(
                    f"{name}: position_ids {position_ids} must be [{batch}, {seq}] and the "
                    f"caches [max_position + 1, {half}], got cos {cos}."
                )
        elif cos.shape != (batch, seq, half):
            raise ShapeError(
                f"{name}: without position_ids cos/sin must be [{batch}, {seq}, {half}], got "
                f"cos {cos}."
            )
        if sin.shape != cos.shape or cos.shape[-1] != half:
            raise ShapeError(
                f"{name}: cos {cos} and sin {sin} must have one shape ending in "
                f"rotary_embedding_dim / 2 = {half}."
            )
        self._dim, self._half = dim, half
        return x

    def angles(self, cos, sin, position_ids):
        """cos and sin per token, shaped to broadcast against the rotated pairs."""
        if position_ids is not None:
            cos, sin = cos[position_ids], sin[position_ids]
        return cos.unsqueeze(self._angle_axis), sin.unsqueeze(self._angle_axis)

    def rotate(self, x, cos, sin):
        """X with its first ``dim`` features of each head rotated by (cos, sin)."""
        shape = x.shape
        if self._view is not None:
            x = x.reshape(self._view)
        rot, rest = x[..., : self._dim], x[..., self._dim :]
        if self.attrs.interleaved:
            a, b = rot[..., 0::2], rot[..., 1::2]
        else:
            a, b = rot[..., : self._half], rot[..., self._half :]
        first, second = a * cos - b * sin, a * sin + b * cos
        if self.attrs.interleaved:
            rot = torch.stack((first, second), -1).flatten(-2)
        else:
            rot = torch.cat((first, second), -1)
        return torch.cat((rot, rest), -1).reshape(shape)

    def kernel(self, x, cos, sin, position_ids=None):
        c, s = self.angles(cos, sin, position_ids)
        return self.rotate(x, c, s)

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        return 3 * self.inputs[0].info.nelms, moved

    def grad(self, g):
        wrt = wanted_grads(g, (0, 1, 2))
        if wrt:
            a = self.attrs
            ids = g.input(3) if g.has_input(3) else None
            add_multi_grad_op(g, "RotaryEmbeddingGrad", g.output_grad(0), g.input(0), g.input(1),
                              g.input(2), ids, wrt=wrt, interleaved=a.interleaved,
                              num_heads=a.num_heads, rotary_embedding_dim=a.rotary_embedding_dim)


@register_op("RotaryEmbeddingGrad", versions=1, domain=AI_GRAPHCORE)
class RotaryEmbeddingGrad(RotaryEmbedding):
    """dX, dCos, dSin (those in ``wrt``) from dY, X, cos, sin, position_ids.

    A rotation's transpose is the rotation by the opposite angle, so dX is dY rotated by
    (cos, -sin). The caches' gradients sum over heads, and over the tokens sharing a position.
    """

    grad = Op.grad  # no second derivative

    @dataclass(frozen=True)
    class Attrs:
        wrt: tuple[int, ...]
        interleaved: int = 0
        num_heads: int | None = None
        rotary_embedding_dim: int = 0

    def infer(self, dy, x, cos, sin, position_ids=None):
        self.layout(x, cos, sin, position_ids)
        return [(x, cos, sin)[i] for i in self.attrs.wrt]

    def pairs(self, x):
        if self._view is not None:
            x = x.reshape(self._view)
        rot = x[..., : self._dim]
        if self.attrs.interleaved:
            return rot[..., 0::2], rot[..., 1::2]
        return rot[..., : self._half], rot[..., self._half :]

    def kernel(self, dy, x, cos, sin, position_ids=None):
        c, s = self.angles(cos, sin, position_ids)
        grads = [None, None, None]
        if 0 in self.attrs.wrt:
            grads[0] = self.rotate(dy, c, -s)
        if 1 in self.attrs.wrt or 2 in self.attrs.wrt:
            a, b = self.pairs(x)
            da, db = self.pairs(dy)
            per_token = {1: da * a + db * b, 2: db * a - da * b}
            for i in (1, 2):
                if i in self.attrs.wrt:
                    value = per_token[i].sum(self._angle_axis)  # over heads: [B, S, dim/2]
                    if position_ids is not None:
                        table = torch.zeros_like(cos)
                        value = table.index_put_((position_ids,), value, accumulate=True)
                    grads[i] = value
        return pick_grads(grads, self.attrs.wrt)


# --- Swish and SwiGLU ---------------------------------------------------------------------------


def _swish(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * torch.sigmoid(x * alpha) if alpha != 1.0 else torch.nn.functional.silu(x)


def _swish_derivative(x: torch.Tensor, alpha: float) -> torch.Tensor:
    s = torch.sigmoid(x * alpha)
    return s * (1.0 + alpha * x * (1.0 - s))


@register_op("Swish", versions=24)
class Swish(Unary):
    """Y = X * sigmoid(alpha * X)."""

    is_nonlinearity = True

    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 1.0

    def kernel(self, x):
        return _swish(x, self.attrs.alpha)

    def grad(self, g):
        self.fused_grad(g, "SwishAlphaGrad", alpha=self.attrs.alpha)


@register_op("SwishAlphaGrad", versions=1, domain=AI_GRAPHCORE)
class SwishAlphaGrad(ElementwiseGrad):
    """dX = dY * s * (1 + alpha X (1 - s)) with s = sigmoid(alpha X) (ai.graphcore SwishGrad
    is the alpha = 1 gradient of ai.graphcore Swish)."""

    Attrs = Swish.Attrs

    def kernel(self, dy, x):
        return dy * _swish_derivative(x, self.attrs.alpha)


@register_op("SwiGLU", versions=28)
class SwiGLU(Op):
    """Y = Swish_alpha(A) * B; A and B have one shape (no broadcasting)."""

    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 1.0

    def infer(self, a, b):
        check_dtypes(self, a, b)
        if a.shape != b.shape:
            raise ShapeError(
                f"{self.debug_name}: gate A {a} and value B {b} must have one shape (SwiGLU "
                f"does not broadcast). Split the packed projection into equal halves first."
            )
        return a

    def kernel(self, a, b):
        return _swish(a, self.attrs.alpha) * b

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        return 5 * self.inputs[0].info.nelms, moved

    def grad(self, g):
        wrt = wanted_grads(g, (0, 1))
        if wrt:
            add_multi_grad_op(g, "SwiGLUGrad", g.output_grad(0), g.input(0), g.input(1), wrt=wrt,
                              alpha=self.attrs.alpha)


@register_op("SwiGLUGrad", versions=1, domain=AI_GRAPHCORE)
class SwiGLUGrad(Op):
    """dA = dY * B * Swish'(A), dB = dY * Swish(A) (those in ``wrt``)."""

    @dataclass(frozen=True)
    class Attrs:
        wrt: tuple[int, ...]
        alpha: float = 1.0

    def infer(self, dy, a, b):
        return [(a, b)[i] for i in self.attrs.wrt]

    def kernel(self, dy, a, b):
        alpha = self.attrs.alpha
        da = dy * b * _swish_derivative(a, alpha) if 0 in self.attrs.wrt else None
        db = dy * _swish(a, alpha) if 1 in self.attrs.wrt else None
        return pick_grads((da, db), self.attrs.wrt)
