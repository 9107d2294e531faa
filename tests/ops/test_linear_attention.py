"""LinearAttention-27 and CausalConvWithState-27 (F78: ai.onnx ops and versions). onnxruntime
lacks opset 27, so the references are torch formulas written from the ONNX text: the
recurrence per head and token, and the convolution over the explicitly concatenated context.
Gradients against torch.autograd of those references."""

import math

import numpy as np
import pytest
import torch

from popart_backend.errors import ShapeError
from tests.helpers import check_grad, check_op, rand

TOL = {"rtol": 1e-4, "atol": 1e-5}


def ref_linear_attention(q, k, v, past=None, decay=None, beta=None, *, hq, hk, rule,
                         scale=0.0):
    """Token by token, head by head, as the update rules in the ONNX text read."""
    q, k, v = (torch.as_tensor(x) for x in (q, k, v))
    b, t, _ = q.shape
    dk, dv = q.shape[2] // hq, v.shape[2] // hk
    scale = scale or 1 / math.sqrt(dk)
    outs = []
    states = []
    for h in range(hk):
        state = torch.as_tensor(past)[:, h] if past is not None else torch.zeros(
            b, dk, dv, dtype=q.dtype)
        per_token = []
        for i in range(t):
            kt, vt = k[:, i, h * dk:(h + 1) * dk], v[:, i, h * dv:(h + 1) * dv]
            if rule in ("gated", "gated_delta"):
                g = torch.as_tensor(decay)[:, i]
                g = g[:, h * dk:(h + 1) * dk, None] if g.shape[1] == hk * dk else g[:, h, None, None]
                state = torch.exp(g) * state
            if rule in ("delta", "gated_delta"):
                bt = torch.as_tensor(beta)[:, i]
                bt = bt[:, h] if bt.shape[1] == hk else bt[:, 0]
                recalled = torch.einsum("bkv,bk->bv", state, kt)
                state = state + bt[:, None, None] * kt[:, :, None] * (vt - recalled)[:, None, :]
            else:
                state = state + kt[:, :, None] * vt[:, None, :]
            per_token.append(state)
        states.append(state)
        outs.append(per_token)
    group = hq // hk
    y = torch.zeros(b, t, hq * dv, dtype=q.dtype)
    rows = []
    for i in range(t):
        cols = []
        for hh in range(hq):
            qt = q[:, i, hh * dk:(hh + 1) * dk]
            cols.append(scale * torch.einsum("bk,bkv->bv", qt, outs[hh // group][i]))
        rows.append(torch.cat(cols, -1))
    y = torch.stack(rows, 1)
    return [y, torch.stack(states, 1)]


def _inputs(rule, b=2, t=3, hq=2, hk=2, dk=4, dv=3, past=True, per_dim=True, beta_heads=True):
    q, k, v = rand(b, t, hq * dk), rand(b, t, hk * dk) * 0.5, rand(b, t, hk * dv)
    state = rand(b, hk, dk, dv) if past else None
    decay = rand(b, t, hk * dk if per_dim else hk, low=-1, high=0) \
        if rule in ("gated", "gated_delta") else None
    beta = rand(b, t, hk if beta_heads else 1, low=0, high=1) \
        if rule in ("delta", "gated_delta") else None
    return [q, k, v, state, decay, beta]


CASES = {
    "linear": ("linear", {}, {}),
    "gated_per_head": ("gated", {"per_dim": False}, {}),
    "gated_per_dim": ("gated", {}, {}),
    "delta_no_past": ("delta", {"past": False}, {}),
    "gated_delta_gqa": ("gated_delta", {"hq": 4, "hk": 2}, {}),
    "gated_delta_mqa_shared_beta": ("gated_delta", {"hq": 2, "hk": 1, "beta_heads": False},
                                    {"scale": 0.3}),
}


def _setup(case):
    rule, shape_kw, attr_kw = CASES[case]
    inputs = _inputs(rule, **shape_kw)
    hq, hk = shape_kw.get("hq", 2), shape_kw.get("hk", 2)
    attrs = {"q_num_heads": hq, "kv_num_heads": hk, "update_rule": rule, **attr_kw}

    def ref(*xs):
        return ref_linear_attention(*xs, hq=hq, hk=hk, rule=rule, scale=attr_kw.get("scale", 0.0))

    return inputs, attrs, ref


@pytest.mark.parametrize("case", sorted(CASES))
def test_linear_attention(case):
    """F78: every update rule, GQA / MQA, per-head and per-dimension decay, shared beta."""
    inputs, attrs, ref = _setup(case)
    check_op("LinearAttention", inputs, attrs, opset=27, num_outputs=2,
             ref=lambda *xs: [r.numpy() for r in ref(*xs)], **TOL)


@pytest.mark.parametrize("case", sorted(CASES))
def test_linear_attention_grad(case):
    """F78 gradients: query, key, value, past_state, decay and beta through the recurrence."""
    inputs, attrs, ref = _setup(case)
    check_grad("LinearAttention", inputs, attrs, opset=27, num_outputs=2, ref=ref, **TOL)


def test_linear_attention_needs_decay():
    inputs = _inputs("linear")
    with pytest.raises(ShapeError, match="LinearAttention.*needs decay"):
        check_op("LinearAttention", inputs[:3], {"q_num_heads": 2, "kv_num_heads": 2},
                 opset=27, num_outputs=2)


def ref_causal_conv(x, w, bias=None, past=None, activation="none"):
    x, w = torch.as_tensor(x), torch.as_tensor(w)
    k = w.shape[2]
    context = torch.as_tensor(past) if past is not None else torch.zeros(
        x.shape[0], x.shape[1], k - 1, dtype=x.dtype)
    full = torch.cat([context, x], 2)
    # out[t] = sum_j w[j] * full[t + j] per channel
    out = sum(w[None, :, 0, j, None] * full[:, :, j:j + x.shape[2]] for j in range(k))
    if bias is not None:
        out = out + torch.as_tensor(bias)[None, :, None]
    if activation != "none":
        out = out * torch.sigmoid(out)
    return [out, full[:, :, full.shape[2] - (k - 1):]]


CONV_CASES = {
    "basic": (lambda: [rand(2, 3, 6), rand(3, 1, 3)], "none"),
    "bias_past_silu": (lambda: [rand(2, 3, 5), rand(3, 1, 4), rand(3), rand(2, 3, 3)], "silu"),
    "short_input": (lambda: [rand(1, 2, 2), rand(2, 1, 5)], "swish"),
    "past_no_bias": (lambda: [rand(2, 2, 4), rand(2, 1, 2), None, rand(2, 2, 1)], "none"),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_causal_conv_with_state(case):
    """F78: CausalConvWithState output and present_state, with bias, past_state, silu/swish
    and an input shorter than the kernel."""
    make, act = CONV_CASES[case]
    inputs = make()
    check_op("CausalConvWithState", inputs, {"activation": act}, opset=27, num_outputs=2,
             ref=lambda *xs: [r.numpy() for r in ref_causal_conv(*xs, activation=act)], **TOL)


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_causal_conv_with_state_grad(case):
    """F78 gradients: input, weight, bias and past_state, including through present_state."""
    make, act = CONV_CASES[case]
    check_grad("CausalConvWithState", make(), {"activation": act}, opset=27, num_outputs=2,
               ref=lambda *xs: ref_causal_conv(*xs, activation=act), **TOL)


def test_causal_conv_kernel_size_one_has_empty_state():
    x, w = rand(1, 2, 3), rand(2, 1, 1)
    _out, state = check_op("CausalConvWithState", [x, w], {}, opset=27, num_outputs=2,
                          ref=lambda x, w: [x * w[None, :, 0], np.zeros((1, 2, 0), np.float32)])
    assert state.shape == (1, 2, 0)
