"""ONNX's training-preview optimizer ops (domain ai.onnx.preview.training, version 1): Adagrad,
Adam and Momentum.

Each is a pure function of its inputs: ``(R, T, X_1..X_n, G_1..G_n, <state_1..state_n>...)``
gives ``(X_new_1..X_new_n, <state_new_1..state_new_n>...)`` with R the learning rate (a float
scalar) and T the update count (an int64 scalar). Nothing is written in place: a model that
trains with them feeds the outputs back itself. The per-tensor formulas are ONNX's (each class
docstring writes its own); the groups of n tensors are updated independently, which for these
elementwise formulas equals ONNX's "concatenate and update jointly".

Not differentiable: they are optimizer steps, the end of a backward pass, never on the path to
a loss; a backward pass through one fails naming the op.

The Gradient op of this domain is not an op class: it names the graph to differentiate by
tensor ids, so the importer builds it (``popart_backend.importer.gradient_op``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..dtypes import DataType
from ..errors import ModelError, ShapeError
from ..ir.op import Op
from .registry import register_op

PREVIEW_TRAINING = "ai.onnx.preview.training"
_FLOATS = (DataType.FLOAT, DataType.DOUBLE)


class _PreviewOptimizer(Op):
    """Shared shape rule: R, T, then ``groups`` lists of n equally shaped float tensors; the
    outputs are every list but the gradients (X_new, then the new states)."""

    # The input lists after R and T: X, G, then the state lists.
    groups: ClassVar[tuple[str, ...]] = ()

    def infer(self, r, t, *tensors):
        if r.nelms != 1 or r.dtype not in _FLOATS:
            raise ShapeError(f"{self.debug_name}: R (learning rate) must be one float, got {r}.")
        if t.nelms != 1 or t.dtype != DataType.INT64:
            raise ShapeError(f"{self.debug_name}: T (update count) must be one int64, got {t}.")
        k = len(self.groups)
        if not tensors or len(tensors) % k:
            raise ShapeError(
                f"{self.debug_name}: after R and T it takes {k} lists of n tensors "
                f"({', '.join(self.groups)}), got {len(tensors)} tensors."
            )
        n = len(tensors) // k
        for i in range(n):
            group = [tensors[j * n + i] for j in range(k)]
            if len({g.shape for g in group}) > 1 or len({g.dtype for g in group}) > 1:
                raise ShapeError(
                    f"{self.debug_name}: tensor {i}'s {', '.join(self.groups)} must share one "
                    f"shape and dtype, got {[str(g) for g in group]}."
                )
            if group[0].dtype not in _FLOATS:
                raise ShapeError(
                    f"{self.debug_name}: tensor {i} is {group[0]}; the optimizer updates "
                    f"float or double tensors."
                )
        self._n = n
        if len(self.outputs) > (k - 1) * n:
            raise ShapeError(
                f"{self.debug_name}: {len(self.outputs)} outputs requested, the op has "
                f"{(k - 1) * n} ({', '.join(g + '_new' for g in self.groups if g != 'G')} "
                f"for each of the {n} tensors)."
            )
        return [tensors[j * n + i] for j in range(k) if j != 1 for i in range(n)]

    def split(self, tensors) -> list[list[torch.Tensor]]:
        n = self._n
        return [list(tensors[j * n:(j + 1) * n]) for j in range(len(self.groups))]

    def result(self, lists: list[list[torch.Tensor]]):
        flat = [v for values in lists for v in values][: len(self.outputs)]
        return flat[0] if len(flat) == 1 else tuple(flat)


@register_op("Adagrad", versions=1, domain=PREVIEW_TRAINING)
class Adagrad(_PreviewOptimizer):
    """r = R / (1 + T * decay_factor); g = norm_coefficient * X + G; H_new = H + g * g;
    X_new = X - r * g / (sqrt(H_new) + epsilon)."""

    groups = ("X", "G", "H")

    @dataclass(frozen=True)
    class Attrs:
        decay_factor: float = 0.0
        epsilon: float = 1e-6
        norm_coefficient: float = 0.0

    def kernel(self, r, t, *tensors):
        xs, gs, hs = self.split(tensors)
        a = self.attrs
        rate = r.reshape(()) / (1 + t.reshape(()).to(r.dtype) * a.decay_factor)
        new_x, new_h = [], []
        for x, g, h in zip(xs, gs, hs):
            g = a.norm_coefficient * x + g
            h = h + g * g
            new_x.append(x - (rate.to(x.dtype) * g) / (h.sqrt() + a.epsilon))
            new_h.append(h)
        return self.result([new_x, new_h])


@register_op("Adam", versions=1, domain=PREVIEW_TRAINING)
class Adam(_PreviewOptimizer):
    """g = norm_coefficient * X + G; V_new = alpha * V + (1 - alpha) * g;
    H_new = beta * H + (1 - beta) * g * g; R_t = R * sqrt(1 - beta^T) / (1 - alpha^T) when
    T > 0, else R; X_new = (1 - norm_coefficient_post) * (X - R_t * V_new / (sqrt(H_new) + eps))."""

    groups = ("X", "G", "V", "H")

    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 0.9
        beta: float = 0.999
        epsilon: float = 1e-6
        norm_coefficient: float = 0.0
        norm_coefficient_post: float = 0.0

    def kernel(self, r, t, *tensors):
        xs, gs, vs, hs = self.split(tensors)
        a = self.attrs
        steps = int(t.reshape(()))
        rate = r.reshape(()).double()
        if steps > 0:
            rate = rate * (1 - a.beta**steps) ** 0.5 / (1 - a.alpha**steps)
        new_x, new_v, new_h = [], [], []
        for x, g, v, h in zip(xs, gs, vs, hs):
            g = a.norm_coefficient * x + g
            v = a.alpha * v + (1 - a.alpha) * g
            h = a.beta * h + (1 - a.beta) * g * g
            x = x - rate.to(x.dtype) * v / (h.sqrt() + a.epsilon)
            new_x.append((1 - a.norm_coefficient_post) * x)
            new_v.append(v)
            new_h.append(h)
        return self.result([new_x, new_v, new_h])


@register_op("Momentum", versions=1, domain=PREVIEW_TRAINING)
class Momentum(_PreviewOptimizer):
    """g = norm_coefficient * X + G; V_new = alpha * V + (T > 0 ? beta : 1) * g; then
    standard: X_new = X - R * V_new; nesterov: X_new = X - R * (g + alpha * V_new)."""

    groups = ("X", "G", "V")

    @dataclass(frozen=True)
    class Attrs:
        alpha: float
        beta: float
        mode: str
        norm_coefficient: float

    def infer(self, r, t, *tensors):
        if self.attrs.mode not in ("standard", "nesterov"):
            raise ModelError(
                f"{self.debug_name}: mode '{self.attrs.mode}' is not 'standard' or 'nesterov'."
            )
        return super().infer(r, t, *tensors)

    def kernel(self, r, t, *tensors):
        xs, gs, vs = self.split(tensors)
        a = self.attrs
        beta = a.beta if int(t.reshape(())) > 0 else 1.0
        nesterov = a.mode == "nesterov"
        new_x, new_v = [], []
        for x, g, v in zip(xs, gs, vs):
            rate = r.reshape(()).to(x.dtype)
            g = a.norm_coefficient * x + g
            v = a.alpha * v + beta * g
            step = g + a.alpha * v if nesterov else v
            new_x.append(x - rate * step)
            new_v.append(v)
        return self.result([new_x, new_v])
