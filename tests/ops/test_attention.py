"""Attention (opsets 23-25) and ai.onnx.preview FlexAttention (F78: ai.onnx ops and versions):
forward against onnxruntime where it has the op (Attention-23/24) or a torch reference written
from the ONNX text, and the gradients of Attention against torch.autograd."""

import math

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from tests.helpers import assert_close, check_grad, check_op, rand, run_popart

TOL = {"rtol": 1e-4, "atol": 1e-5}


def ref_attention(q, k, v, mask=None, past_k=None, past_v=None, nonpad=None, *, causal=0,
                  scale=None, softcap=0.0, q_heads=None, kv_heads=None, mode=0, left=-1,
                  right=-1):
    """Y, present_key, present_value, qk_matmul_output per the ONNX Attention text."""
    q, k, v = (torch.as_tensor(x) for x in (q, k, v))
    three_d = q.dim() == 3
    if three_d:
        b = q.shape[0]
        q = q.reshape(b, q.shape[1], q_heads, -1).permute(0, 2, 1, 3)
        k = k.reshape(b, k.shape[1], kv_heads, -1).permute(0, 2, 1, 3)
        v = v.reshape(b, v.shape[1], kv_heads, -1).permute(0, 2, 1, 3)
    past = 0
    if past_k is not None:
        past = past_k.shape[2]
        k, v = torch.cat([torch.as_tensor(past_k), k], 2), torch.cat([torch.as_tensor(past_v), v], 2)
    hq, hk = q.shape[1], k.shape[1]
    heads = torch.arange(hq) // (hq // hk)
    kk, vv = k[:, heads], v[:, heads]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    qk = q @ kk.transpose(-1, -2) * scale
    out = [qk]
    if softcap:
        qk = softcap * torch.tanh(qk / softcap)
    out.append(qk)
    sq, total = qk.shape[-2:]
    allowed = torch.ones(sq, total, dtype=torch.bool)
    offset = torch.tensor(past)
    if nonpad is not None:
        nonpad = torch.as_tensor(nonpad).view(-1, 1, 1, 1)
        offset = nonpad - sq if past_k is None else offset
        allowed = allowed & (torch.arange(total) < nonpad)
    pos = torch.arange(sq).view(-1, 1) + offset
    key = torch.arange(total)
    if causal:
        allowed = allowed & (key <= pos)
    if left >= 0:
        allowed = allowed & (key >= pos - left)
    if right >= 0:
        allowed = allowed & (key <= pos + right)
    if mask is not None:
        mask = torch.as_tensor(mask)
        pad = total - mask.shape[-1]
        if mask.dtype == torch.bool:
            allowed = allowed & torch.nn.functional.pad(mask, (0, pad), value=False)
        else:
            qk = qk + torch.nn.functional.pad(mask.to(qk.dtype), (0, pad), value=-math.inf)
    qk = torch.where(allowed, qk, -math.inf)
    out.append(qk)
    probs = torch.softmax(qk, -1)
    probs = torch.where(torch.isneginf(qk).all(-1, keepdim=True), 0.0, probs)
    out.append(probs)
    y = probs @ vv
    if three_d:
        y = y.permute(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
    return [y, k, v, out[mode]]


# --- forward ----------------------------------------------------------------------------------


CASES = {
    "4d": ([rand(2, 3, 4, 8), rand(2, 3, 6, 8), rand(2, 3, 6, 5)], {}),
    "4d_gqa_scaled": ([rand(1, 4, 3, 8), rand(1, 2, 5, 8), rand(1, 2, 5, 8)], {"scale": 0.3}),
    "4d_causal": ([rand(2, 2, 5, 4), rand(2, 2, 5, 4), rand(2, 2, 5, 4)], {"is_causal": 1}),
    "4d_softcap": ([rand(1, 2, 3, 4), rand(1, 2, 3, 4), rand(1, 2, 3, 4)], {"softcap": 0.7}),
    "4d_float_mask_2d": ([rand(2, 2, 3, 4), rand(2, 2, 5, 4), rand(2, 2, 5, 4), rand(3, 5)], {}),
    "4d_bool_mask_4d": (
        [rand(2, 2, 3, 4), rand(2, 2, 5, 4), rand(2, 2, 5, 4), rand(2, 1, 3, 5, dtype=np.bool_)],
        {}),
    "3d_gqa": ([rand(2, 4, 16), rand(2, 6, 8), rand(2, 6, 6)],
               {"q_num_heads": 4, "kv_num_heads": 2}),
    "3d_causal_mask": ([rand(2, 4, 16), rand(2, 4, 16), rand(2, 4, 16), rand(4, 4)],
                       {"q_num_heads": 2, "kv_num_heads": 2, "is_causal": 1}),
}


@pytest.mark.parametrize("opset", [23, 24])
@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_vs_onnxruntime(case, opset):
    """F78: Attention-23/24 forward, Y only, against onnxruntime."""
    inputs, attrs = CASES[case]
    check_op("Attention", inputs, attrs, opset=opset, **TOL)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_past_present_and_qk_output(mode):
    """F78: the KV cache (past -> present) and every qk_matmul_output_mode, causal with a
    past offset, softcap and a float mask, against onnxruntime. Mode 2 against the reference:
    onnxruntime writes -FLT_MAX where the causal rule masks, ONNX's definition -inf."""
    q, k, v = rand(2, 2, 3, 4), rand(2, 2, 3, 4), rand(2, 2, 3, 4)
    mask, pk, pv = rand(2, 1, 3, 7), rand(2, 2, 4, 4), rand(2, 2, 4, 4)
    ref = None
    if mode == 2:
        def ref(*inputs):
            return [r.numpy() for r in ref_attention(*inputs, causal=1, softcap=2.0, mode=2)]
    check_op("Attention", [q, k, v, mask, pk, pv], {"qk_matmul_output_mode": mode,
                                                    "softcap": 2.0, "is_causal": 1},
             opset=23, num_outputs=4, ref=ref, **TOL)


def test_attention_fully_masked_row_is_zero():
    """F78: an all-False bool mask row yields a zero row (the opset-23 errata), also in the
    mode-3 probabilities output."""
    q, k, v = rand(1, 1, 2, 4), rand(1, 1, 3, 4), rand(1, 1, 3, 4)
    mask = np.array([[False, False, False], [True, False, True]])
    y, qk = check_op("Attention", [q, k, v, mask], {"qk_matmul_output_mode": 3}, opset=23,
                     num_outputs=4, ref=lambda *a: [r.numpy() for r in ref_attention(
                         *a, mode=3)], **TOL)[0::3]
    assert not np.any(y[0, 0, 0]) and not np.any(qk[0, 0, 0])


@pytest.mark.parametrize("nonpad", [[6, 3], [2, 5]])
def test_attention_nonpad_kv_seqlen_causal(nonpad):
    """F78: Attention-24 external cache: padding keys masked and the causal frontier offset by
    nonpad_kv_seqlen - q_len per batch (negative offsets empty the leading rows)."""
    q, k, v = rand(2, 2, 3, 4), rand(2, 2, 6, 4), rand(2, 2, 6, 4)
    lengths = np.array(nonpad, np.int64)
    check_op("Attention", [q, k, v, None, None, None, lengths], {"is_causal": 1}, opset=24,
             ref=lambda q, k, v, m, pk, pv, n: ref_attention(q, k, v, nonpad=n, causal=1)[0]
             .numpy(), **TOL)


@pytest.mark.parametrize("left,right,causal", [(2, 0, 0), (1, 1, 0), (2, -1, 1), (-1, 1, 0)])
def test_attention_sliding_window(left, right, causal):
    """F78: Attention-25 left/right windows, composed with is_causal, a past cache and a mask
    shorter than the key length (padded with -inf)."""
    q, k, v = rand(1, 2, 3, 4), rand(1, 2, 3, 4), rand(1, 2, 3, 4)
    pk, pv, mask = rand(1, 2, 2, 4), rand(1, 2, 2, 4), rand(3, 4)
    attrs = {"left_window_size": left, "right_window_size": right, "is_causal": causal}
    check_op("Attention", [q, k, v, mask, pk, pv], attrs, opset=25, num_outputs=3,
             ref=lambda q, k, v, m, pk, pv: [r.numpy() for r in ref_attention(
                 q, k, v, m, pk, pv, causal=causal, left=left, right=right)[:3]], **TOL)


def test_attention_float16_and_softmax_precision():
    """F78: float16 inputs with softmax in float32 (softmax_precision=1)."""
    q, k, v = (rand(1, 2, 3, 8, dtype=np.float16) for _ in range(3))
    check_op("Attention", [q, k, v], {"softmax_precision": 1}, opset=23, num_outputs=4,
             rtol=2e-3, atol=2e-3)


def test_attention_3d_needs_head_counts():
    from popart_backend.errors import ShapeError

    model_inputs = [rand(1, 2, 8), rand(1, 2, 8), rand(1, 2, 8)]
    with pytest.raises(ShapeError, match="Attention.*q_num_heads"):
        check_op("Attention", model_inputs, {}, opset=23)


# --- gradients --------------------------------------------------------------------------------


def _grad_ref(**kw):
    def ref(q, k, v, mask=None, pk=None, pv=None, nonpad=None):
        return ref_attention(q, k, v, mask, pk, pv, nonpad, **kw)
    return ref


GRAD_CASES = {
    "4d_float_mask": ([rand(2, 2, 3, 4), rand(2, 2, 5, 4), rand(2, 2, 5, 3), rand(3, 5)], {}, {}),
    "4d_gqa_causal_softcap": (
        [rand(1, 4, 3, 4), rand(1, 2, 3, 4), rand(1, 2, 3, 4)],
        {"is_causal": 1, "softcap": 1.5}, {"causal": 1, "softcap": 1.5}),
    "3d_bool_mask_scale": (
        [rand(2, 3, 8), rand(2, 4, 8), rand(2, 4, 4), rand(3, 4, dtype=np.bool_)],
        {"q_num_heads": 2, "kv_num_heads": 2, "scale": 0.4},
        {"q_heads": 2, "kv_heads": 2, "scale": 0.4}),
}


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_attention_grad(case):
    """F78 gradients: dQ, dK, dV and the float mask against torch.autograd."""
    inputs, attrs, kw = GRAD_CASES[case]
    check_grad("Attention", inputs, attrs, opset=23, ref=_grad_ref(**kw), **TOL)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_grad_past_present_qk_output(mode):
    """F78 gradients through the KV cache (past inputs, present outputs) and through
    qk_matmul_output at the stage its mode names."""
    q, k, v = rand(1, 2, 2, 4), rand(1, 2, 2, 4), rand(1, 2, 2, 4)
    mask, pk, pv = rand(1, 2, 2, 5), rand(1, 2, 3, 4), rand(1, 2, 3, 4)
    kw = {"causal": 1, "softcap": 2.0, "mode": mode}
    attrs = {"is_causal": 1, "softcap": 2.0, "qk_matmul_output_mode": mode}
    check_grad("Attention", [q, k, v, mask, pk, pv], attrs, opset=23, num_outputs=4,
               ref=_grad_ref(**kw), **TOL)


def test_attention_grad_window_nonpad():
    """F78 gradients with a sliding window and nonpad_kv_seqlen (opset 25)."""
    q, k, v = rand(2, 2, 3, 4), rand(2, 2, 5, 4), rand(2, 2, 5, 4)
    lengths = np.array([5, 4], np.int64)
    attrs = {"is_causal": 1, "left_window_size": 1}
    check_grad("Attention", [q, k, v, None, None, None, lengths], attrs, opset=25,
               ref=_grad_ref(causal=1, left=1), **TOL)


# --- FlexAttention ------------------------------------------------------------------------------


def _flex_model(q, k, v, score_mod=None, prob_mod=None, **attrs):
    names = ["Q", "K", "V"]
    extra = {}
    if score_mod is not None:
        extra["score_mod"] = score_mod
    if prob_mod is not None:
        extra["prob_mod"] = prob_mod
    node = helper.make_node("FlexAttention", names, ["Y"], domain="ai.onnx.preview",
                            **extra, **attrs)
    graph = helper.make_graph(
        [node], "flex",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, x.shape)
         for n, x in zip(names, (q, k, v))],
        [helper.make_empty_tensor_value_info("Y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26),
                                                    helper.make_opsetid("ai.onnx.preview", 1)])
    model.ir_version = 10
    return model, dict(zip(names, (q, k, v)))


def _modifier(name: str, op: str, constant: float) -> onnx.GraphProto:
    """x -> op(x, constant) on a [B, H, L, S] float tensor."""
    return helper.make_graph(
        [helper.make_node(op, ["x", "c"], ["y"])], name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor("c", TensorProto.FLOAT, [], [constant])])


def _flex_ref(q, k, v, scale, score=lambda s: s, prob=lambda p: p):
    q, k, v = (torch.from_numpy(x) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    probs = prob(torch.softmax(score(q @ k.transpose(-1, -2) * scale), -1))
    return (probs @ v).numpy()


def test_flex_attention_plain_gqa():
    """F78 (ai.onnx.preview FlexAttention-1): no modifiers, GQA, default scale."""
    q, k, v = rand(2, 4, 3, 8), rand(2, 2, 5, 8), rand(2, 2, 5, 6)
    model, feeds = _flex_model(q, k, v)
    ours = run_popart(model, feeds)["Y"]
    assert_close(ours, _flex_ref(q, k, v, 1 / math.sqrt(8)), "Y", **TOL)


def test_flex_attention_modifier_subgraphs():
    """F78: score_mod and prob_mod subgraphs run on the scores / probabilities."""
    q, k, v = rand(1, 2, 3, 4), rand(1, 2, 4, 4), rand(1, 2, 4, 4)
    model, feeds = _flex_model(q, k, v, score_mod=_modifier("score", "Add", 0.5),
                               prob_mod=_modifier("prob", "Mul", 2.0), scale=0.25)
    ours = run_popart(model, feeds)["Y"]
    expected = _flex_ref(q, k, v, 0.25, lambda s: s + 0.5, lambda p: p * 2.0)
    assert_close(ours, expected, "Y", **TOL)


def _flex_grad(score_mod=None, prob_mod=None, score=lambda s: s, prob=lambda p: p, shapes=None):
    """Gradients of FlexAttention's Q, K, V (weights) against torch.autograd."""
    from popart_backend.device.plan import ExecutionPlan
    from popart_backend.importer.onnx_model import import_model
    from popart_backend.transforms.autodiff import Autodiff

    q, k, v = (rand(*s) for s in shapes)
    model, _ = _flex_model(q, k, v, score_mod=score_mod, prob_mod=prob_mod, scale=0.4)
    for name, value in zip("QKV", (q, k, v)):
        model.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
    del model.graph.input[:]
    ir = import_model(model, constant_weights=False)
    seed = rand(*ir.main.tensors["Y"].info.shape, seed=3)
    autodiff = Autodiff(None, output_grads={"Y": seed})
    autodiff.run(ir)
    grads = {n: autodiff.variable_grads[n] for n in "QKV"}
    plan = ExecutionPlan(ir.main, keep=list(grads.values()))
    plan.execute()
    leaves = [torch.from_numpy(x.astype(np.float64)).requires_grad_() for x in (q, k, v)]
    group = q.shape[1] // k.shape[1]
    kk, vv = (x.repeat_interleave(group, 1) for x in leaves[1:])
    probs = prob(torch.softmax(score(leaves[0] @ kk.transpose(-1, -2) * 0.4), -1))
    ((probs @ vv) * torch.from_numpy(seed.astype(np.float64))).sum().backward()
    for name, leaf in zip("QKV", leaves):
        assert_close(plan.get_value(grads[name]).numpy(), leaf.grad.numpy().astype(np.float32),
                     f"d{name}", **TOL)


def test_flex_attention_grad_plain_gqa():
    """F78 gradients of FlexAttention without modifiers, GQA."""
    _flex_grad(shapes=[(1, 4, 3, 4), (1, 2, 5, 4), (1, 2, 5, 3)])


def test_flex_attention_grad_modifiers():
    """F78 gradients through score_mod and prob_mod subgraphs (nested autodiff)."""
    _flex_grad(score_mod=_modifier("score", "Mul", 1.5), prob_mod=_modifier("prob", "Mul", 2.0),
               score=lambda s: s * 1.5, prob=lambda p: p * 2.0,
               shapes=[(2, 2, 3, 4), (2, 2, 4, 4), (2, 2, 4, 4)])
