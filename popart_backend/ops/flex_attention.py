"""ai.onnx.preview FlexAttention (1): scaled dot-product attention whose score and probability
modifiers are optional subgraphs, with its gradient.

    Y = prob_mod(softmax(score_mod(Q K^T * scale))) V

Q, K, V are rank 4; query head h reads K/V head h // (H_q / H_kv). Scores and probabilities
have the softmax precision (float32 unless the inputs are double, or ``softmax_precision``).
The modifiers are Bodies run as If / Call run theirs (``control_flow.SubgraphOp``); what they
read from the enclosing graph becomes captured inputs of the op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .attention import float_type
from .control_flow import Body, SubgraphOp, clone_graph, grad_body
from .registry import AI_GRAPHCORE, register_op

AI_ONNX_PREVIEW = "ai.onnx.preview"


@register_op("FlexAttention", versions=1, domain=AI_ONNX_PREVIEW)
class FlexAttention(SubgraphOp):
    """Y = prob_mod(softmax(score_mod(Q K^T * scale))) V for 4-D Q, K, V; the modifiers are
    optional one-input subgraphs run on [B, Hq, L, S] tensors of the softmax precision.

    The gradient is a chain of IR ops: the scores and probabilities are recomputed (the
    modifiers by Calls of copies of their bodies), and each modifier is differentiated by a
    nested autodiff into a gradient body (as Call's gradient is), around SoftmaxGrad and the
    two matmul gradients (FlexAttentionValueGrad, FlexAttentionScoresGrad).
    """

    uses_amp = True

    @dataclass(frozen=True)
    class Attrs:
        score_mod: Body | None = None
        prob_mod: Body | None = None
        scale: float | None = None
        softmax_precision: int | None = None

    body_attrs = ("score_mod", "prob_mod")

    def bodies(self) -> list[Body]:
        return [b for b in (self.attrs.score_mod, self.attrs.prob_mod) if b is not None]

    def _precision(self, q: TensorInfo) -> DataType:
        if self.attrs.softmax_precision is not None:
            return float_type(self, self.attrs.softmax_precision, "softmax_precision")
        return DataType.DOUBLE if q.dtype == DataType.DOUBLE else DataType.FLOAT

    def body_input_infos(self, attr, operands):
        q, k = operands[0], operands[1]
        return [TensorInfo(self._precision(q), (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))]

    def infer(self, *infos):
        operands, _ = self.split_inputs(infos)
        if len(operands) != 3 or any(x is None or x.rank != 4 for x in operands):
            raise ShapeError(
                f"{self.debug_name}: takes rank-4 Q, K, V, got {[str(x) for x in operands]}."
            )
        q, k, v = operands
        if not all(x.dtype.is_float and x.dtype == q.dtype for x in operands):
            raise ShapeError(
                f"{self.debug_name}: Q {q}, K {k}, V {v} must share one floating-point dtype."
            )
        b, hq, q_len, head = q.shape
        _, hk, _kv_len, k_head = k.shape
        if k.shape[0] != b or k_head != head or v.shape[:3] != k.shape[:3] or hq % hk:
            raise ShapeError(
                f"{self.debug_name}: Q {q}, K {k}, V {v} must share batch and head size, K and "
                f"V their heads and length, and q heads be a multiple of kv heads."
            )
        scores = self.body_input_infos("score_mod", operands)[0]
        for name, body in (("score_mod", self.attrs.score_mod), ("prob_mod", self.attrs.prob_mod)):
            if body is not None and body.output_infos() != [scores]:
                raise ShapeError(
                    f"{self.debug_name}: {name} must map {scores} to one tensor of the same "
                    f"type and shape, but returns {[str(i) for i in body.output_infos()]}."
                )
        self._group = hq // hk
        self._scale = self.attrs.scale if self.attrs.scale is not None else 1 / math.sqrt(head)
        self._precision_torch = scores.dtype.torch
        return TensorInfo(q.dtype, (b, hq, q_len, v.shape[3]))

    def kernel(self, q, k, v, *captured):
        dtype = self._precision_torch
        if self._group > 1:
            k, v = k.repeat_interleave(self._group, 1), v.repeat_interleave(self._group, 1)
        scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2)) * self._scale
        if self.attrs.score_mod is not None:
            scores = self.run_body(self.attrs.score_mod, [scores], list(captured))[0]
        probs = torch.softmax(scores, -1)
        if self.attrs.prob_mod is not None:
            probs = self.run_body(self.attrs.prob_mod, [probs], list(captured))[0]
        return torch.matmul(probs, v.to(dtype)).to(q.dtype)

    def grad(self, g):
        wrt = [i for i in range(3) if g.needs_input_grad(i)]
        if not wrt:
            return
        q, k, v = g.input(0), g.input(1), g.input(2)
        attrs = {"scale": self._scale, "group": self._group}
        scores = g.op("FlexAttentionScores", q, k, domain=AI_GRAPHCORE,
                      precision=DataType.from_torch(self._precision_torch).onnx, **attrs)
        modded = _call(g, self.attrs.score_mod, scores)
        probs = g.op("Softmax", modded, axis=-1)
        final = _call(g, self.attrs.prob_mod, probs)
        dfinal, dv = g.op("FlexAttentionValueGrad", g.output_grad(0), final, v,
                          domain=AI_GRAPHCORE, num_outputs=2, group=self._group)
        g.set_input_grad(2, dv)
        if not (g.needs_input_grad(0) or g.needs_input_grad(1)):
            return
        dprobs = _call_grad(g, self, self.attrs.prob_mod, probs, dfinal, "prob_mod_grad")
        dmodded = g.op("SoftmaxGrad", dprobs, probs, domain=AI_GRAPHCORE, axis=-1)
        dscores = _call_grad(g, self, self.attrs.score_mod, scores, dmodded, "score_mod_grad")
        dq, dk = g.op("FlexAttentionScoresGrad", dscores, q, k, domain=AI_GRAPHCORE,
                      num_outputs=2, **attrs)
        g.set_input_grad(0, dq)
        g.set_input_grad(1, dk)

    def cost(self) -> tuple[int, int]:
        flops, moved = super().cost()
        q, k = self.inputs[0].info, self.inputs[1].info
        v = self.inputs[2].info
        rows = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]
        flops = rows * (2 * q.shape[3] + 2 * v.shape[3] + 5)
        for body in self.bodies():
            body_flops, _ = self.body_flops(body)
            flops += body_flops
        return flops, moved


def _call(g, body: Body | None, x: str) -> str:
    """``body`` applied to ``x`` by a Call of a copy of it (``x`` itself when absent)."""
    if body is None:
        return x
    copy = Body(clone_graph(body.graph, f"{body.graph.id}/recompute"), body.num_formal)
    return g.op("Call", x, *copy.captured, domain=AI_GRAPHCORE, callee=copy)


def _call_grad(g, op: Op, body: Body | None, x: str, dy: str, name: str) -> str:
    """The gradient of ``body`` at ``x`` given the gradient ``dy`` of its output."""
    if body is None:
        return dy
    info = body.graph.tensors[body.formal[0]].info
    back = grad_body(g, op, body, [dy], [body.formal[0]], [info], name, keep_formal=True)
    return g.op("Call", x, *back.captured, domain=AI_GRAPHCORE, callee=back)


def _expand_heads(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.repeat_interleave(group, 1) if group > 1 else x


def _fold_heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """Sum a [B, H_q, ...] gradient over each group of query heads sharing a KV head."""
    if group == 1:
        return x
    b, h = x.shape[:2]
    return x.view(b, h // group, group, *x.shape[2:]).sum(2)


@register_op("FlexAttentionScores", versions=1, domain=AI_GRAPHCORE)
class FlexAttentionScores(Op):
    """scale * Q K^T in the softmax precision, K's heads repeated for GQA (FlexAttention's
    gradient recomputes its scores with it)."""

    public = False  # only FlexAttention's gradient creates it
    uses_amp = True

    @dataclass(frozen=True)
    class Attrs:
        scale: float
        group: int
        precision: int

    def infer(self, q, k):
        self._dtype = float_type(self, self.attrs.precision, "precision")
        return TensorInfo(self._dtype, (*q.shape[:3], k.shape[2]))

    def kernel(self, q, k):
        dtype = self._dtype.torch
        k = _expand_heads(k, self.attrs.group).to(dtype)
        return torch.matmul(q.to(dtype), k.transpose(-1, -2)) * self.attrs.scale


@register_op("FlexAttentionScoresGrad", versions=1, domain=AI_GRAPHCORE)
class FlexAttentionScoresGrad(Op):
    """dQ = scale dS K, dK = scale dS^T Q (summed over the query heads of each KV head)."""

    uses_amp = True

    @dataclass(frozen=True)
    class Attrs:
        scale: float
        group: int

    def infer(self, ds, q, k):
        return [q, k]

    def kernel(self, ds, q, k):
        ke = _expand_heads(k, self.attrs.group).to(ds.dtype)
        dq = torch.matmul(ds, ke) * self.attrs.scale
        dk = torch.matmul(ds.transpose(-1, -2), q.to(ds.dtype)) * self.attrs.scale
        return dq.to(q.dtype), _fold_heads(dk, self.attrs.group).to(k.dtype)


@register_op("FlexAttentionValueGrad", versions=1, domain=AI_GRAPHCORE)
class FlexAttentionValueGrad(Op):
    """dP = dY V^T (in P's type) and dV = P^T dY (summed over the query heads of each KV
    head) of Y = P V."""

    uses_amp = True

    @dataclass(frozen=True)
    class Attrs:
        group: int

    def infer(self, dy, p, v):
        return [p, v]

    def kernel(self, dy, p, v):
        ve = _expand_heads(v, self.attrs.group).to(p.dtype)
        dy = dy.to(p.dtype)
        dp = torch.matmul(dy, ve.transpose(-1, -2))
        dv = _fold_heads(torch.matmul(p.transpose(-1, -2), dy), self.attrs.group)
        return dp, dv.to(v.dtype)

