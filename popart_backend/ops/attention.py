"""Scaled dot-product attention: ai.onnx Attention (23, 24, 25) with its gradient
(ai.onnx.preview FlexAttention is in ``flex_attention.py``).

Attention, as its ONNX text defines it (one pass, explicit matmul / softmax so every optional
output can be read off along the way):

    K, V     <- concat(past, K / V) on the sequence axis (these are present_key / value)
    raw      <- (Q * sqrt(scale)) @ (K * sqrt(scale))^T        qk_matmul_output mode 0
    capped   <- softcap * tanh(raw / softcap) if softcap        mode 1
    scores   <- capped + float mask, -inf where not allowed    mode 2
    probs    <- softmax(scores) in softmax_precision, 0 on fully-masked rows  mode 3
    Y        <- probs @ V

"Allowed" combines a boolean mask, the causal frontier ``j <= i + offset``, the sliding window
(opset 25) and the padding of ``nonpad_kv_seqlen`` (opset 24+). ``offset`` is the past length
with a KV cache, ``nonpad_kv_seqlen - q_len`` per batch with an external cache, else 0. A mask
shorter than the total key length counts as padded with -inf (False). A row whose scores are
all -inf gives a zero output row (the errata of opsets 23 and 24 make this retroactive). Query
head h reads K/V head h // (q_heads / kv_heads) (GQA / MQA). 3-D inputs pack the heads in the
last axis ([B, S, heads * head_size]) and need ``q_num_heads`` / ``kv_num_heads``.

AttentionGrad recomputes the forward from its inputs (nothing stashed) and back-propagates
through the chain above by hand: dQ, dK, dV, the float mask and the past caches, taking the
gradients of Y, present_key / value and qk_matmul_output (at the stage its mode names).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import broadcast_shapes, check_dtypes
from .multi_grad import add_multi_grad_op, pick_grads
from .registry import AI_GRAPHCORE, register_op

_FLOAT_CODES = {
    DataType.FLOAT.onnx: DataType.FLOAT,
    DataType.FLOAT16.onnx: DataType.FLOAT16,
    DataType.DOUBLE.onnx: DataType.DOUBLE,
    DataType.BFLOAT16.onnx: DataType.BFLOAT16,
}


def float_type(op: Op, code: int, what: str) -> DataType:
    """The DataType of an ONNX floating-point type code given as attribute ``what``."""
    if code not in _FLOAT_CODES:
        raise ShapeError(
            f"{op.debug_name}: {what}={code} is not a floating-point ONNX type code "
            f"(1 = float32, 10 = float16, 11 = float64, 16 = bfloat16)."
        )
    return _FLOAT_CODES[code]


@dataclass(frozen=True)
class _Layout:
    """Shapes and constants of one Attention node, fixed at infer() time."""

    three_d: bool
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    past_len: int
    head: int
    v_head: int
    scale_sqrt: float
    softcap: float
    dtype: torch.dtype
    softmax_dtype: torch.dtype
    mask_kind: str  # "", "bool" or "float"
    mask_pad: int  # keys the mask lacks at the end (counted as disallowed)
    causal: bool
    left: int
    right: int
    has_nonpad: bool
    mode: int

    @property
    def total_len(self) -> int:
        return self.past_len + self.kv_len

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads


def _layout(op: Op, attrs, q, k, v, mask, past_k, past_v, nonpad) -> _Layout:
    """Check the inputs of an Attention node and fix its layout (shared with AttentionGrad)."""
    name = op.debug_name
    if q.rank != k.rank or q.rank != v.rank or q.rank not in (3, 4):
        raise ShapeError(f"{name}: Q {q}, K {k}, V {v} must all be 3-D or all 4-D.")
    if q.rank == 3:
        qh, kvh = attrs.q_num_heads, attrs.kv_num_heads
        if not qh or not kvh:
            raise ShapeError(
                f"{name}: 3-D Q {q} needs the attributes q_num_heads and kv_num_heads "
                f"(got {qh}, {kvh}): the heads are packed in the last axis."
            )
        if q.shape[2] % qh or k.shape[2] % kvh or v.shape[2] % kvh:
            raise ShapeError(
                f"{name}: hidden sizes of Q {q}, K {k}, V {v} must be multiples of "
                f"q_num_heads={qh} / kv_num_heads={kvh}."
            )
        batch, q_len, head = q.shape[0], q.shape[1], q.shape[2] // qh
        kv_len, v_head = k.shape[1], v.shape[2] // kvh
        k_head = k.shape[2] // kvh
        if v.shape[:2] != k.shape[:2]:
            raise ShapeError(f"{name}: K {k} and V {v} differ in batch or sequence length.")
    else:
        batch, qh, q_len, head = q.shape
        _, kvh, kv_len, k_head = k.shape
        v_head = v.shape[3]
        if v.shape[:3] != k.shape[:3]:
            raise ShapeError(f"{name}: K {k} and V {v} differ in batch, heads or length.")
    if k.shape[0] != batch or k_head != head:
        raise ShapeError(f"{name}: Q {q} and K {k} differ in batch size or head size.")
    if qh % kvh:
        raise ShapeError(
            f"{name}: q_num_heads={qh} must be a multiple of kv_num_heads={kvh} (GQA / MQA)."
        )
    if (past_k is None) != (past_v is None):
        raise ShapeError(f"{name}: past_key and past_value must be given together.")
    past_len = 0
    if past_k is not None:
        if past_k.shape[:2] != (batch, kvh) or past_k.shape[3] != head or past_v.shape != (
            *past_k.shape[:3], v_head
        ):
            raise ShapeError(
                f"{name}: past_key {past_k} / past_value {past_v} must be [{batch}, {kvh}, P, "
                f"{head}] / [{batch}, {kvh}, P, {v_head}]."
            )
        past_len = past_k.shape[2]
    if nonpad is not None and (nonpad.shape != (batch,) or nonpad.dtype != DataType.INT64):
        raise ShapeError(f"{name}: nonpad_kv_seqlen {nonpad} must be int64 [{batch}].")
    total = past_len + kv_len
    mask_kind, mask_pad = "", 0
    if mask is not None:
        mask_kind = "bool" if mask.dtype == DataType.BOOL else "float"
        if mask.rank == 0 or mask.rank > 4 or mask.shape[-1] > total:
            raise ShapeError(
                f"{name}: attn_mask {mask} must have rank 1-4 and at most {total} keys "
                f"(past {past_len} + new {kv_len})."
            )
        mask_pad = total - mask.shape[-1]
        broadcast_shapes(op, mask.shape[:-1] + (total,), (batch, qh, q_len, total))
    scale = attrs.scale if attrs.scale is not None else 1.0 / math.sqrt(head)
    dtype = q.dtype
    softmax = dtype if attrs.softmax_precision is None else float_type(
        op, attrs.softmax_precision, "softmax_precision")
    if attrs.qk_matmul_output_mode not in (0, 1, 2, 3):
        raise ShapeError(
            f"{name}: qk_matmul_output_mode={attrs.qk_matmul_output_mode} must be 0-3."
        )
    return _Layout(
        three_d=q.rank == 3, batch=batch, q_heads=qh, kv_heads=kvh, q_len=q_len, kv_len=kv_len,
        past_len=past_len, head=head, v_head=v_head, scale_sqrt=math.sqrt(scale),
        softcap=attrs.softcap, dtype=dtype.torch, softmax_dtype=softmax.torch,
        mask_kind=mask_kind, mask_pad=mask_pad, causal=bool(attrs.is_causal),
        left=getattr(attrs, "left_window_size", -1), right=getattr(attrs, "right_window_size", -1),
        has_nonpad=nonpad is not None, mode=attrs.qk_matmul_output_mode,
    )


def _output_infos(lay: _Layout, q: TensorInfo, k: TensorInfo, v: TensorInfo) -> list[TensorInfo]:
    b, hq, hk = lay.batch, lay.q_heads, lay.kv_heads
    y_shape = (b, lay.q_len, hq * lay.v_head) if lay.three_d else (b, hq, lay.q_len, lay.v_head)
    return [
        TensorInfo(q.dtype, y_shape),
        TensorInfo(k.dtype, (b, hk, lay.total_len, lay.head)),
        TensorInfo(v.dtype, (b, hk, lay.total_len, lay.v_head)),
        TensorInfo(q.dtype, (b, hq, lay.q_len, lay.total_len)),
    ]


def _static_allowed(lay: _Layout) -> torch.Tensor | None:
    """[q_len, total] keys each query may see from the causal / window rules when the offset
    is the (static) past length; None when every key is allowed or the offset is per batch."""
    if lay.has_nonpad or not (lay.causal or lay.left >= 0 or lay.right >= 0):
        return None
    return _frontier(lay, torch.tensor(lay.past_len))


def _frontier(lay: _Layout, offset: torch.Tensor) -> torch.Tensor:
    """Allowed keys from the causal and window rules; ``offset`` broadcasts against [Sq, T]."""
    pos = torch.arange(lay.q_len).view(-1, 1) + offset  # absolute query positions
    key = torch.arange(lay.total_len)
    allowed = torch.ones(torch.broadcast_shapes(pos.shape, key.shape), dtype=torch.bool)
    if lay.causal:
        allowed &= key <= pos
    if lay.right >= 0:
        allowed &= key <= pos + lay.right
    if lay.left >= 0:
        allowed &= key >= pos - lay.left
    return allowed


def _softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax on the last axis. 16-bit types round after each step, as ONNX's definition
    (Sub, Exp, ReduceSum, Div in that type) does; torch's fused kernel rounds once, which is an
    ulp off now and then."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        return torch.softmax(x, -1)
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, S, heads * D] -> [B, heads, S, D]."""
    b, s, hidden = x.shape
    return x.view(b, s, heads, hidden // heads).transpose(1, 2)


def _unheads(x: torch.Tensor) -> torch.Tensor:
    """[B, heads, S, D] -> [B, S, heads * D]."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, h * d)


class _Forward:
    """The intermediates of one Attention evaluation (the grad kernel reuses them)."""

    __slots__ = ("allowed", "k", "ke", "probs", "q", "raw", "scores", "tanh", "v", "ve", "y")

    def __init__(self, lay: _Layout, static_allowed, q, k, v, mask, past_k, past_v, nonpad):
        if lay.three_d:
            q, k, v = _heads(q, lay.q_heads), _heads(k, lay.kv_heads), _heads(v, lay.kv_heads)
        if past_k is not None:
            k, v = torch.cat((past_k, k), 2), torch.cat((past_v, v), 2)
        self.q, self.k, self.v = q, k, v
        ke, ve = k, v
        if lay.group > 1:
            ke, ve = k.repeat_interleave(lay.group, 1), v.repeat_interleave(lay.group, 1)
        self.ke, self.ve = ke, ve
        # sqrt(scale) rounded to the input type first, as ONNX's function body does.
        s = torch.tensor(lay.scale_sqrt, dtype=q.dtype)
        raw = torch.matmul(q * s, (ke * s).transpose(-1, -2))
        self.raw = raw
        self.tanh = None
        scores = raw
        if lay.softcap:
            self.tanh = torch.tanh(raw / lay.softcap)
            scores = self.tanh * lay.softcap
        allowed = static_allowed
        if nonpad is not None:
            length = nonpad.view(-1, 1, 1, 1)
            offset = lay.past_len if past_k is not None else length - lay.q_len
            keys = torch.arange(lay.total_len) < length
            frontier = _frontier(lay, offset) if (
                lay.causal or lay.left >= 0 or lay.right >= 0) else None
            allowed = keys if frontier is None else keys & frontier
        if mask is not None:
            if lay.mask_kind == "bool":
                if lay.mask_pad:
                    mask = torch.nn.functional.pad(mask, (0, lay.mask_pad), value=False)
                allowed = mask if allowed is None else allowed & mask
            else:
                bias = mask.to(scores.dtype)
                if lay.mask_pad:
                    bias = torch.nn.functional.pad(bias, (0, lay.mask_pad), value=-math.inf)
                scores = scores + bias
        if allowed is not None:
            scores = scores.masked_fill(~allowed, -math.inf)
        self.scores, self.allowed = scores, allowed
        # A row with no key left would be 0/0; it yields zeros instead.
        dead = torch.isneginf(scores).all(-1, keepdim=True)
        probs = _softmax(scores.to(lay.softmax_dtype)).masked_fill(dead, 0.0)
        self.probs = probs
        y = torch.matmul(probs.to(ve.dtype), ve).to(lay.dtype)
        self.y = _unheads(y) if lay.three_d else y

    def qk_output(self, lay: _Layout) -> torch.Tensor:
        if lay.mode == 0:
            return self.raw
        if lay.mode == 1:
            return self.raw if self.tanh is None else self.tanh * lay.softcap
        if lay.mode == 2:
            return self.scores
        return self.probs.to(lay.dtype)


@register_op("Attention", versions=(23, 24, 25))
class Attention(Op):
    """Y (and present_key, present_value, qk_matmul_output) of scaled dot-product attention."""

    aliases_inputs = True  # present key/value without a past are the inputs

    uses_amp = True

    @dataclass(frozen=True)
    class V23Attrs:
        is_causal: int = 0
        kv_num_heads: int | None = None
        q_num_heads: int | None = None
        qk_matmul_output_mode: int = 0
        scale: float | None = None
        softcap: float = 0.0
        softmax_precision: int | None = None

    @dataclass(frozen=True)
    class Attrs(V23Attrs):
        """Version 25 adds the sliding window."""

        left_window_size: int = -1
        right_window_size: int = -1

    @classmethod
    def attrs_type(cls, version: int):
        return cls.Attrs if version >= 25 else cls.V23Attrs

    def infer(self, q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
        check_dtypes(self, q, k, v, mask, past_k, past_v, nonpad)
        self._lay = lay = _layout(self, self.attrs, q, k, v, mask, past_k, past_v, nonpad)
        self._allowed = _static_allowed(lay)
        return _output_infos(lay, q, k, v)

    def kernel(self, q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
        lay = self._lay
        f = _Forward(lay, self._allowed, q, k, v, mask, past_k, past_v, nonpad)
        if len(self.outputs) == 1:
            return f.y
        outs = (f.y, f.k, f.v, f.qk_output(lay) if len(self.outputs) > 3 else None)
        return outs[: len(self.outputs)]

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        lay = self._lay
        rows = lay.batch * lay.q_heads * lay.q_len * lay.total_len
        return rows * (2 * lay.head + 2 * lay.v_head + 5), moved

    def grad(self, g):
        lay = self._lay
        wrt = tuple(
            i for i in range(6)
            if g.has_input(i) and g.needs_input_grad(i)
            and not (i == 3 and lay.mask_kind == "bool")
        )
        if not wrt:
            return
        seeds = [
            g.output_grad(i) if i < len(self.outputs) and self.outputs[i] is not None else None
            for i in range(4)
        ]
        inputs = [g.input(i) if g.has_input(i) else None for i in range(7)]
        a = self.attrs
        add_multi_grad_op(
            g, "AttentionGrad", *seeds, *inputs, wrt=wrt, is_causal=a.is_causal,
            kv_num_heads=a.kv_num_heads, q_num_heads=a.q_num_heads,
            qk_matmul_output_mode=a.qk_matmul_output_mode, scale=a.scale, softcap=a.softcap,
            softmax_precision=a.softmax_precision,
            left_window_size=getattr(a, "left_window_size", -1),
            right_window_size=getattr(a, "right_window_size", -1),
        )


@register_op("AttentionGrad", versions=1, domain=AI_GRAPHCORE)
class AttentionGrad(Op):
    """Gradients of Attention inputs ``wrt`` (0 Q, 1 K, 2 V, 3 float mask, 4 past_key,
    5 past_value). Inputs: the gradients of Y, present_key, present_value, qk_matmul_output
    (absent when the forward lacks that output), then the forward's seven inputs."""

    uses_amp = True

    @dataclass(frozen=True)
    class Attrs(Attention.Attrs):
        wrt: tuple[int, ...] = ()

    def infer(self, dy, dpk, dpv, dqk, q, k, v, mask=None, past_k=None, past_v=None,
              nonpad=None):
        self._lay = _layout(self, self.attrs, q, k, v, mask, past_k, past_v, nonpad)
        self._allowed = _static_allowed(self._lay)
        infos = (q, k, v, mask, past_k, past_v)
        return [infos[i] for i in self.attrs.wrt]

    def kernel(self, dy, dpk, dpv, dqk, q, k, v, mask=None, past_k=None, past_v=None,
               nonpad=None):
        lay = self._lay
        f = _Forward(lay, self._allowed, q, k, v, mask, past_k, past_v, nonpad)
        if lay.three_d:
            dy = _heads(dy, lay.q_heads)
        probs = f.probs.to(f.ve.dtype)
        dve = torch.matmul(probs.transpose(-1, -2), dy.to(f.ve.dtype))
        dprobs = torch.matmul(dy.to(f.ve.dtype), f.ve.transpose(-1, -2)).to(lay.softmax_dtype)
        if dqk is not None and lay.mode == 3:
            dprobs = dprobs + dqk.to(lay.softmax_dtype)
        # Softmax backward; masked keys and dead rows have probs 0 and get no gradient.
        p = f.probs
        dscores = (p * (dprobs - (dprobs * p).sum(-1, keepdim=True))).to(lay.dtype)
        if dqk is not None and lay.mode == 2:
            dscores = dscores + dqk
            if f.allowed is not None:  # disallowed scores are constants (-inf)
                dscores = dscores.masked_fill(~f.allowed, 0.0)
        dmask = dscores if 3 in self.attrs.wrt else None
        if dqk is not None and lay.mode == 1:
            dscores = dscores + dqk
        draw = dscores if f.tanh is None else dscores * (1.0 - f.tanh * f.tanh)
        if dqk is not None and lay.mode == 0:
            draw = draw + dqk
        s = lay.scale_sqrt
        dq = torch.matmul(draw, f.ke) * (s * s)
        dke = torch.matmul(draw.transpose(-1, -2), f.q) * (s * s)
        if lay.group > 1:
            b, h, t = lay.batch, lay.kv_heads, lay.total_len
            dke = dke.view(b, h, lay.group, t, lay.head).sum(2)
            dve = dve.view(b, h, lay.group, t, lay.v_head).sum(2)
        dk, dv = dke.to(k.dtype), dve.to(v.dtype)
        if dpk is not None:
            dk = dk + dpk
        if dpv is not None:
            dv = dv + dpv
        p_len = lay.past_len
        dpast_k, dpast_v = dk[:, :, :p_len], dv[:, :, :p_len]
        dk, dv = dk[:, :, p_len:], dv[:, :, p_len:]
        if lay.three_d:
            dq, dk, dv = _unheads(dq), _unheads(dk), _unheads(dv)
        if dmask is not None:
            dmask = _sum_to(dmask[..., : lay.total_len - lay.mask_pad], mask.shape).to(mask.dtype)
        grads = (dq.to(q.dtype), dk.contiguous(), dv.contiguous(), dmask,
                 dpast_k.contiguous(), dpast_v.contiguous())
        return pick_grads(grads, self.attrs.wrt)


def _sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum a gradient over the axes broadcasting stretched, back to ``shape``."""
    lead = t.dim() - len(shape)
    dims = list(range(lead)) + [
        lead + i for i, d in enumerate(shape) if d == 1 and t.shape[lead + i] != 1
    ]
    return (t.sum(dims, keepdim=True) if dims else t).reshape(shape)
