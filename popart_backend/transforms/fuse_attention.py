"""Pass: scaled dot-product attention spelled as MatMul/Softmax/MatMul becomes one
F.scaled_dot_product_attention call.

The dynamo exporter decomposes ``scaled_dot_product_attention`` into: both operands scaled by
sqrt(scale), K transposed through Reshape/Transpose/Reshape, an additive mask, Softmax, a NaN
guard for fully masked rows, and the second MatMul. Scale factors may also come after the first
MatMul (Mul or Div by a constant, as eager-attention exports write it).

Before:  qs = Mul(q, c)                  # c = scale ** 0.5, constant
         kt = Reshape(Transpose(Reshape(k, [BH,S,E]), perm=[0,2,1]), [B,H,E,S])
         ks = Mul(kt, c)
         s = MatMul(qs, ks)
         a = Add(s, mask)
         p = Softmax(a, axis=-1)
         g = Where(IsNaN(p), 0.0, p)
         y = MatMul(g, v)
After:   y = popart.fused::Attention(q, k, v, mask, scale=c*c, key_transposed=0)

Without the NaN guard, a mask that is not a finite constant (an input, a variable such as a
causal-mask buffer, or computed from an attention-mask input) fuses with
``nan_masked_rows=1``: the fused op gives NaN on rows masked everywhere, as the ONNX Softmax,
and in training the NaN gradients the unguarded softmax gives them.

With ``training=True`` (the training pass list, before autodiff) the fused op also outputs the
log-sum-exp of the scores (``save_stats=1``, tensor ``<y>/logsumexp``) for its gradient, torch's
CPU flash-attention backward. Training fuses only what that kernel takes: f32 [B, H, L, E]
operands, a mask (if any) of rank 2 or 4 that needs no gradient (a constant, an input, or a
variable the model marks frozen such as a causal-mask buffer), and a chain on one IPU and stage.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DataType
from ..ops.fused import Attention
from .fuse_common import (
    is_float,
    is_observed,
    is_scalar,
    only_consumer,
    other_input,
    producer,
    replace_chain,
    same_placement,
    scalar_value,
    variable_dependent,
)


def _const_scale(op, tensor):
    """For Mul(tensor, c) -> c, Div(tensor, c) -> 1/c (c a scalar constant); else None."""
    if op.op_type == "Mul":
        return scalar_value(other_input(op, tensor))
    if op.op_type == "Div" and op.inputs[0] is tensor:
        c = scalar_value(op.inputs[1])
        return 1.0 / c if c else None
    return None


def _prescaled(tensor):
    """(x, c, [the Mul]) if ``tensor`` = Mul(x, c) is used once; else (tensor, 1.0, [])."""
    op = producer(tensor, "Mul")
    if op is None or only_consumer(tensor) is None:
        return tensor, 1.0, []
    for x in op.inputs:
        if scalar_value(x) is None:
            c = _const_scale(op, x)
            if c is not None:
                return x, c, [op]
    return tensor, 1.0, []


def _untransposed_key(kt):
    """K for K^T written as Reshape(Transpose(Reshape(K, [BH,S,E]), [0,2,1]), [B,H,E,S])."""
    r2 = producer(kt, "Reshape")
    if r2 is None or only_consumer(kt) is None:
        return None
    t_out = r2.inputs[0]
    t = producer(t_out, "Transpose")
    if t is None or only_consumer(t_out) is not r2 or tuple(t.attrs.perm) != (0, 2, 1):
        return None
    r1_out = t.inputs[0]
    r1 = producer(r1_out, "Reshape")
    if r1 is None or only_consumer(r1_out) is not t:
        return None
    k = r1.inputs[0]
    shape = k.info.shape
    if k.info.rank < 3 or kt.info.shape != shape[:-2] + (shape[-1], shape[-2]):
        return None
    if r1_out.info.shape != (int(np.prod(shape[:-2])),) + shape[-2:]:
        return None
    return k, [r1, t, r2]


class FuseAttention:
    name = "fuse_attention"

    def __init__(self, training: bool = False):
        self.training = training
        self._needs_grad: set[str] = set()

    def run(self, ir) -> bool:
        graph = ir.main
        changed = False
        if self.training:
            self._needs_grad = variable_dependent(graph)
        for op in list(graph.ops.values()):
            # A non-stable softmax (enableNonStableSoftmax) keeps its own kernel.
            if (op.id in graph.ops and op.op_type == "Softmax" and op.domain == "ai.onnx"
                    and not op.settings.non_stable):
                changed |= self._fuse(graph, op)
        return changed

    def _fuse(self, graph, softmax) -> bool:
        scores_in = softmax.inputs[0]
        rank = scores_in.info.rank
        if rank < 3 or not is_float(scores_in):
            return False
        # Any version: the last axis (versions < 13 then coerce to [N, last dim], the same).
        axis = softmax.attrs.axis
        if (axis + rank if axis < 0 else axis) != rank - 1:
            return False
        p = softmax.outputs[0]
        chain = [softmax]
        guarded = False
        probs = p
        guard_ops = {c.op_type for c in p.consumers}
        if len(p.consumers) == 2 and guard_ops == {"IsNaN", "Where"} and not is_observed(p):
            isnan = next(c for c in p.consumers if c.op_type == "IsNaN")
            where = next(c for c in p.consumers if c.op_type == "Where")
            n = isnan.outputs[0]
            if (only_consumer(n) is not where or where.inputs[0] is not n
                    or where.inputs[2] is not p or not is_scalar(where.inputs[1], 0.0)
                    or where.outputs[0].info != p.info):
                return False
            chain += [isnan, where]
            probs = where.outputs[0]
            guarded = True
        mm2 = only_consumer(probs, "MatMul")
        # Half-partials matmuls (partialsTypeMatMuls) keep their own float16 accumulation.
        if mm2 is None or mm2.inputs[0] is not probs or mm2.settings.half_partials:
            return False
        chain.append(mm2)
        v = mm2.inputs[1]

        # Scores: [Add(., mask)] <- [Mul/Div by constant] <- MatMul(A, B)
        mask = None
        t = scores_in
        scale = 1.0
        add = producer(t, "Add")
        if add is not None and only_consumer(t) is softmax:
            for cand in add.inputs:
                src = cand.producer
                scores_op = src is not None and src.domain == "ai.onnx"
                if scores_op and src.op_type in ("MatMul", "Mul", "Div"):
                    mask = other_input(add, cand)
                    if mask is not None and add.outputs[0].info == cand.info:
                        chain.insert(0, add)
                        t = cand
                        break
                    mask = None
            if mask is None:
                return False
        post = t.producer
        if post is not None and post.op_type in ("Mul", "Div") and only_consumer(t) is not None:
            src = next((x for x in post.inputs if scalar_value(x) is None), None)
            c = _const_scale(post, src) if src is not None else None
            if c is None:
                return False
            scale *= c
            chain.insert(0, post)
            t = src
        mm1 = producer(t, "MatMul")
        if mm1 is None or only_consumer(t) is None or mm1.settings.half_partials:
            return False
        chain.insert(0, mm1)
        a, b = mm1.inputs
        q, qc, q_ops = _prescaled(a)
        kt, kc, k_ops = _prescaled(b)
        scale *= qc * kc
        chain = q_ops + k_ops + chain
        key_transposed = 1
        k = kt
        unwrapped = _untransposed_key(kt)
        if unwrapped is not None:
            k, key_ops = unwrapped
            chain = key_ops + chain
            key_transposed = 0

        nan_rows = 0
        if not guarded and mask is not None and not (mask.is_const
                                                     and np.isfinite(mask.data).all()):
            # Without the guard a fully masked row is NaN in ONNX but zeros in torch: the fused
            # op restores the NaN rows after the call (and their NaN gradients in training).
            nan_rows = 1
        if mask is not None and (mask.info.dtype != q.info.dtype):
            return False
        batch = q.info.shape[:-2]
        if (k.info.shape[:-2] != batch or v.info.shape[:-2] != batch
                or len({q.info.dtype, k.info.dtype, v.info.dtype}) != 1):
            return False
        out = mm2.outputs[0]
        inputs = [q, k, v] + ([mask] if mask is not None else [])
        if self.training and not self._trainable(chain, q, mask):
            return False
        fused = Attention(
            Attention.Attrs(scale=float(scale), key_transposed=key_transposed,
                            save_stats=int(self.training), nan_masked_rows=nan_rows),
            mm2.settings, [x.info for x in inputs], out.info,
        )
        extra = [graph.unique_id(f"{out.id}/logsumexp")] if self.training else []
        replace_chain(graph, chain, fused, [x.id for x in inputs], out, extra)
        return True

    def _trainable(self, chain, q, mask) -> bool:
        """What the flash-attention kernels and the fused gradient handle."""
        if q.info.rank != 4 or q.info.dtype is not DataType.FLOAT:
            return False
        # The CPU flash kernels take a [L, S] or [B, H, L, S] mask (broadcastable).
        if mask is not None and (mask.info.rank not in (2, 4) or mask.id in self._needs_grad):
            return False
        return same_placement(chain)
