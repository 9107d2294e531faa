"""The stateful sequence mixers of opset 27 (Gated DeltaNet / Mamba style models):
LinearAttention and CausalConvWithState, with their gradients.

LinearAttention runs its recurrence token by token (the ``chunk_size`` attribute is a GPU tuning
hint that does not change results), over a [B, H_kv, d_k, d_v] state S, per token t:

    linear       S = S + k v^T
    gated        S = exp(g) * S + k v^T
    delta        S = S + beta k (v - S^T k)^T
    gated_delta  S = exp(g) * S, then as delta
    output       o = scale * S^T q  (query head h reads KV head h // (H_q / H_kv))

g (``decay``, log-space) is per key dimension [B, T, H_kv * d_k] or per head [B, T, H_kv];
beta is per head [B, T, H_kv] or shared [B, T, 1]. 16-bit inputs run the recurrence in float32.
The gradient (LinearAttentionGrad) replays the recurrence, keeps every state, and walks back
through time by the chain rule written out per step.

CausalConvWithState: a depthwise causal 1-D convolution of [B, C, L] with a (C, 1, k) kernel
whose left context is ``past_state`` [B, C, k-1] (zeros if absent); ``present_state`` is the
last k-1 positions of that context plus the input. ``activation`` silu / swish (the same
function) is applied to the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import check_dtypes
from .multi_grad import add_multi_grad_op, pick_grads, wanted_grads
from .registry import AI_GRAPHCORE, register_op

_RULES = ("linear", "gated", "delta", "gated_delta")


def _as_str(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


@register_op("LinearAttention", versions=27)
class LinearAttention(Op):
    """output [B, T, H_q * d_v] and present_state [B, H_kv, d_k, d_v] of linear attention."""

    @dataclass(frozen=True)
    class Attrs:
        kv_num_heads: int
        q_num_heads: int
        chunk_size: int = 64
        scale: float = 0.0
        update_rule: str = "gated_delta"

    def infer(self, q, k, v, past=None, decay=None, beta=None):
        check_dtypes(self, q, k, v, past, decay, beta)
        return self.layout(q, k, v, past, decay, beta)

    def layout(self, q, k, v, past, decay, beta) -> list[TensorInfo]:
        """Check shapes and fix the dims and the rule (shared with the grad op)."""
        a, name = self.attrs, self.debug_name
        rule = _as_str(a.update_rule)
        if rule not in _RULES:
            raise ShapeError(f"{name}: update_rule '{rule}' is not one of {', '.join(_RULES)}.")
        hq, hk = a.q_num_heads, a.kv_num_heads
        if hq < 1 or hk < 1 or hq % hk:
            raise ShapeError(
                f"{name}: q_num_heads={hq} must be a positive multiple of kv_num_heads={hk}."
            )
        if any(x.rank != 3 for x in (q, k, v)) or k.shape[:2] != q.shape[:2] or (
            v.shape[:2] != q.shape[:2]
        ):
            raise ShapeError(f"{name}: query {q}, key {k}, value {v} must be [B, T, heads * d].")
        if q.shape[2] % hq or k.shape[2] % hk or v.shape[2] % hk:
            raise ShapeError(
                f"{name}: the last dims of query {q} / key {k} / value {v} must be multiples of "
                f"q_num_heads={hq} / kv_num_heads={hk}."
            )
        b, t = q.shape[:2]
        dk, dv = q.shape[2] // hq, v.shape[2] // hk
        if k.shape[2] != hk * dk:
            raise ShapeError(f"{name}: key {k} must be [B, T, {hk} * {dk}] (d_k of the query).")
        state = TensorInfo(past.dtype if past is not None else q.dtype, (b, hk, dk, dv))
        if past is not None and past.shape != state.shape:
            raise ShapeError(f"{name}: past_state {past} must be {list(state.shape)}.")
        gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
        if gated and (decay is None or decay.shape not in ((b, t, hk * dk), (b, t, hk))):
            raise ShapeError(
                f"{name}: update_rule '{rule}' needs decay [{b}, {t}, {hk * dk}] or "
                f"[{b}, {t}, {hk}], got {decay}."
            )
        if delta and (beta is None or beta.shape not in ((b, t, hk), (b, t, 1))):
            raise ShapeError(
                f"{name}: update_rule '{rule}' needs beta [{b}, {t}, {hk}] or [{b}, {t}, 1], "
                f"got {beta}."
            )
        self._dims = (b, t, hq, hk, dk, dv)
        self._gated, self._delta = gated, delta
        self._per_dim_decay = gated and decay.shape[2] == hk * dk
        self._scale = a.scale if a.scale else 1.0 / math.sqrt(dk)
        self._state_dtype = state.dtype.torch
        self._compute = torch.float64 if q.dtype.torch == torch.float64 else torch.float32
        return [TensorInfo(q.dtype, (b, t, hq * dv)), state]

    def unpack(self, q, k, v, past, decay, beta):
        """Inputs as float [B, T, H, d] tensors, the state [B, H_kv, d_k, d_v], the decay
        factors exp(g) shaped [B, T, H_kv, d_k | 1] and beta [B, T, H_kv | 1]."""
        b, t, hq, hk, dk, dv = self._dims
        c = self._compute
        q = q.to(c).view(b, t, hq, dk)
        k = k.to(c).view(b, t, hk, dk)
        v = v.to(c).view(b, t, hk, dv)
        state = past.to(c) if past is not None else torch.zeros(b, hk, dk, dv, dtype=c)
        gate = None
        if self._gated:
            gate = torch.exp(decay.to(c)).view(b, t, hk, dk if self._per_dim_decay else 1)
        rate = beta.to(c) if self._delta else None
        return q, k, v, state, gate, rate

    def step(self, state, k, v, gate, rate):
        """(S after the decay, S^T k after the decay (None unless delta), the new S)."""
        if gate is not None:
            state = state * gate.unsqueeze(-1)
        if rate is None:
            return state, None, state + k.unsqueeze(-1) * v.unsqueeze(-2)
        recalled = torch.einsum("bhkv,bhk->bhv", state, k)
        update = (rate.unsqueeze(-1) * (v - recalled)).unsqueeze(-2)
        return state, recalled, state + k.unsqueeze(-1) * update

    def read(self, state, q):
        """o = scale * S^T q for every query head, [B, H_q, d_v]."""
        b, _t, hq, hk, dk, dv = self._dims
        qg = q.view(b, hk, hq // hk, dk)
        return torch.einsum("bhgk,bhkv->bhgv", qg, state).reshape(b, hq, dv) * self._scale

    def kernel(self, q, k, v, past=None, decay=None, beta=None):
        qf, kf, vf, state, gate, rate = self.unpack(q, k, v, past, decay, beta)
        b, t, hq, _hk, _dk, dv = self._dims
        outs = []
        for i in range(t):
            state = self.step(state, kf[:, i], vf[:, i], None if gate is None else gate[:, i],
                              None if rate is None else rate[:, i])[2]
            outs.append(self.read(state, qf[:, i]))
        out = torch.stack(outs, 1).reshape(b, t, hq * dv).to(q.dtype)
        return out if len(self.outputs) == 1 else (out, state.to(self._state_dtype))

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        b, t, hq, hk, dk, dv = self._dims
        return b * t * (4 * hk + 2 * hq) * dk * dv, moved

    def grad(self, g):
        wrt = wanted_grads(g, (0, 1, 2, 3, 4, 5))
        if not wrt:
            return
        seeds = [g.output_grad(0),
                 g.output_grad(1) if len(self.outputs) > 1 and self.outputs[1] is not None
                 else None]
        inputs = [g.input(i) if g.has_input(i) else None for i in range(6)]
        a = self.attrs
        add_multi_grad_op(g, "LinearAttentionGrad", *seeds, *inputs, wrt=wrt,
                          kv_num_heads=a.kv_num_heads, q_num_heads=a.q_num_heads,
                          scale=a.scale, update_rule=_as_str(a.update_rule))


@register_op("LinearAttentionGrad", versions=1, domain=AI_GRAPHCORE)
class LinearAttentionGrad(LinearAttention):
    """Gradients of LinearAttention's inputs ``wrt`` (0 query, 1 key, 2 value, 3 past_state,
    4 decay, 5 beta) from the gradients of output and present_state (absent if unused)."""

    grad = Op.grad  # no second derivative

    @dataclass(frozen=True)
    class Attrs:
        wrt: tuple[int, ...]
        kv_num_heads: int
        q_num_heads: int
        scale: float = 0.0
        update_rule: str = "gated_delta"

    def infer(self, dout, dstate, q, k, v, past=None, decay=None, beta=None):
        self.layout(q, k, v, past, decay, beta)
        return [(q, k, v, past, decay, beta)[i] for i in self.attrs.wrt]

    def kernel(self, dout, dstate, q, k, v, past=None, decay=None, beta=None):
        qf, kf, vf, state, gate, rate = self.unpack(q, k, v, past, decay, beta)
        b, t, hq, hk, dk, dv = self._dims
        c, group = self._compute, hq // hk
        # Replay: the state after each token's decay (S') and after its update (S), and S'^T k.
        decayed, recalled, states = [], [], []
        for i in range(t):
            s_dec, rec, state = self.step(state, kf[:, i], vf[:, i],
                                          None if gate is None else gate[:, i],
                                          None if rate is None else rate[:, i])
            decayed.append(s_dec)
            recalled.append(rec)
            states.append(state)
        dout = dout.to(c).view(b, t, hk, group, dv)
        ds = dstate.to(c) if dstate is not None else torch.zeros(b, hk, dk, dv, dtype=c)
        dq, dk_, dv_ = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
        dgate = torch.zeros_like(gate) if gate is not None else None
        drate = torch.zeros(b, t, hk, dtype=c) if rate is not None else None
        scale = self._scale
        for i in reversed(range(t)):
            do, qi = dout[:, i], qf[:, i].view(b, hk, group, dk)
            # o = scale * S^T q for each query head of the group.
            ds = ds + scale * torch.einsum("bhgk,bhgv->bhkv", qi, do)
            dq[:, i] = (scale * torch.einsum("bhkv,bhgv->bhgk", states[i], do)).reshape(b, hq, dk)
            ki, vi, s_dec = kf[:, i], vf[:, i], decayed[i]
            if rate is None:
                dk_[:, i] = torch.einsum("bhkv,bhv->bhk", ds, vi)
                dv_[:, i] = torch.einsum("bhkv,bhk->bhv", ds, ki)
                ds_dec = ds
            else:
                beta_i = rate[:, i].expand(b, hk)
                resid = vi - recalled[i]
                ds_k = torch.einsum("bhkv,bhk->bhv", ds, ki)  # dS^T k
                dv_[:, i] = beta_i.unsqueeze(-1) * ds_k
                drate[:, i] = (ds_k * resid).sum(-1)
                drecalled = -beta_i.unsqueeze(-1) * ds_k
                dk_[:, i] = beta_i.unsqueeze(-1) * torch.einsum("bhkv,bhv->bhk", ds, resid) + \
                    torch.einsum("bhkv,bhv->bhk", s_dec, drecalled)
                ds_dec = ds + ki.unsqueeze(-1) * drecalled.unsqueeze(-2)
            if gate is not None:
                # S' = exp(g) * S_prev: d exp(g) * exp(g) = dg, summed over what g spans.
                per_row = (ds_dec * s_dec).sum(-1)  # [B, H, d_k]
                dgate[:, i] = per_row if self._per_dim_decay else per_row.sum(-1, keepdim=True)
                ds = ds_dec * gate[:, i].unsqueeze(-1)
            else:
                ds = ds_dec
        grads = [dq.reshape(q.shape), dk_.reshape(k.shape), dv_.reshape(v.shape), ds, None, None]
        # A decay or beta the rule does not read has a zero gradient.
        if decay is not None:
            grads[4] = dgate.reshape(decay.shape) if dgate is not None else torch.zeros_like(decay)
        if beta is not None:
            if drate is None:
                grads[5] = torch.zeros_like(beta)
            else:
                grads[5] = drate if beta.shape[2] == hk else drate.sum(-1, keepdim=True)
        sources = (q, k, v, past, decay, beta)
        grads = [None if s is None else x.to(s.dtype) for x, s in zip(grads, sources)]
        return pick_grads(grads, self.attrs.wrt)


# --- CausalConvWithState ------------------------------------------------------------------------


@register_op("CausalConvWithState", versions=27)
class CausalConvWithState(Op):
    """output [B, C, L] and present_state [B, C, k-1] of a stateful depthwise causal conv."""

    @dataclass(frozen=True)
    class Attrs:
        activation: str = "none"

    def infer(self, x, weight, bias=None, past=None):
        check_dtypes(self, x, weight, bias, past)
        return self.layout(x, weight, bias, past)

    def layout(self, x, weight, bias, past) -> list[TensorInfo]:
        """Check shapes and fix the context length (shared with the grad op)."""
        name = self.debug_name
        act = _as_str(self.attrs.activation)
        if act not in ("silu", "swish", "none"):
            raise ShapeError(f"{name}: activation '{act}' must be 'silu', 'swish' or 'none'.")
        if x.rank != 3 or weight.rank != 3 or weight.shape[:2] != (x.shape[1], 1):
            raise ShapeError(
                f"{name}: input {x} must be [B, C, L] and weight {weight} [C, 1, k]."
            )
        b, c, _ = x.shape
        k = weight.shape[2]
        if bias is not None and bias.shape != (c,):
            raise ShapeError(f"{name}: bias {bias} must be [{c}].")
        state = TensorInfo(x.dtype, (b, c, k - 1))
        if past is not None and past.shape != state.shape:
            raise ShapeError(f"{name}: past_state {past} must be {list(state.shape)}.")
        self._silu = act != "none"
        self._context = k - 1
        return [x, state]

    def padded(self, x, past):
        if past is None:
            return F.pad(x, (self._context, 0))
        return torch.cat((past, x), 2)

    def kernel(self, x, weight, bias=None, past=None):
        padded = self.padded(x, past)
        y = F.conv1d(padded, weight, bias, groups=x.shape[1])
        if self._silu:
            y = F.silu(y)
        if len(self.outputs) == 1:
            return y
        return y, padded[:, :, padded.shape[2] - self._context :].contiguous()

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        return 2 * (self._context + 1) * self.inputs[0].info.nelms, moved

    def grad(self, g):
        wrt = wanted_grads(g, (0, 1, 2, 3))
        if not wrt:
            return
        dstate = g.output_grad(1) if len(self.outputs) > 1 and self.outputs[1] is not None \
            else None
        inputs = [g.input(i) if g.has_input(i) else None for i in range(4)]
        add_multi_grad_op(g, "CausalConvWithStateGrad", g.output_grad(0), dstate, *inputs,
                          wrt=wrt, activation=_as_str(self.attrs.activation))


@register_op("CausalConvWithStateGrad", versions=1, domain=AI_GRAPHCORE)
class CausalConvWithStateGrad(CausalConvWithState):
    """dInput, dWeight, dBias, dPastState (those in ``wrt``) from dOutput and dPresentState,
    by torch's convolution_backward on the padded sequence."""

    grad = Op.grad  # no second derivative

    @dataclass(frozen=True)
    class Attrs:
        wrt: tuple[int, ...]
        activation: str = "none"

    def infer(self, dy, dstate, x, weight, bias=None, past=None):
        self.layout(x, weight, bias, past)
        return [(x, weight, bias, past)[i] for i in self.attrs.wrt]

    def kernel(self, dy, dstate, x, weight, bias=None, past=None):
        padded = self.padded(x, past)
        channels = x.shape[1]
        if self._silu:
            pre = F.conv1d(padded, weight, bias, groups=channels)
            s = torch.sigmoid(pre)
            dy = dy * s * (1.0 + pre * (1.0 - s))
        wrt = self.attrs.wrt
        mask = [0 in wrt or 3 in wrt, 1 in wrt, 2 in wrt]
        dpad, dw, db = torch.ops.aten.convolution_backward(
            dy, padded, weight, [channels] if mask[2] else None, [1], [0], [1], False, [0],
            channels, mask,
        )
        if dpad is not None and dstate is not None and self._context:
            dpad[:, :, dpad.shape[2] - self._context :] += dstate
        grads = (
            None if dpad is None else dpad[:, :, self._context :].contiguous(),
            dw, db,
            None if dpad is None else dpad[:, :, : self._context].contiguous(),
        )
        return pick_grads(grads, wrt)
