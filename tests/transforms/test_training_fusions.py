"""The fusions of the training pass list (transforms/pipeline.py): MatMul + bias (+ Relu) with
a transposed variable weight, GELU, a spelled-out layer norm and attention become fused ops with
gradients before autodiff, and the trained weights still equal torch's (DESIGN decision 9;
spec §4.3, F6, F50).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart

B, S, D, H, FF = 2, 4, 8, 2, 16
E = D // H
LR = 0.1


def _params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def randn(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {
        "wq": randn(D, D), "bq": randn(D), "wk": randn(D, D), "bk": randn(D),
        "wv": randn(D, D), "bv": randn(D),
        "w1": randn(FF, D), "b1": randn(FF),  # nn.Linear layout [out, in]: transposed in-graph
        "w2": randn(FF, D), "b2": randn(D),   # [in, out]: read by MatMul directly
    }


def _feeds(masked: float, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.zeros((B, 1, 1, S), np.float32)
    mask[1, ..., 2:] = masked  # padding keys of sample 1
    return {"x": rng.standard_normal((B, S, D)).astype(np.float32), "mask": mask}


def _int64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _f32(name, value):
    """A Constant node: float initializers of a training model are trained variables."""
    tensor = numpy_helper.from_array(np.asarray(value, np.float32), name)
    return helper.make_node("Constant", [], [name], value=tensor)


def _model(params, r: np.ndarray, weighted_mask: bool, guarded: bool = True) -> bytes:
    """An encoder block written the way the dynamo exporter writes it, then
    IdentityLoss(mean(y * r)); ``guarded=False`` drops the exporter's NaN guard after the
    Softmax (as eager attention code written out by hand exports)."""
    n = helper.make_node
    inits = [numpy_helper.from_array(v, k) for k, v in params.items()]
    inits += [_int64("heads", [B, S, H, E]), _int64("k3", [B * H, S, E]),
              _int64("k4", [B, H, E, S]), _int64("merged", [B, S, D])]
    nodes = [_f32("c", (1 / math.sqrt(E)) ** 0.5), _f32("zero", 0.0), _f32("r", r),
             _f32("sqrt2", math.sqrt(2.0)), _f32("one", 1.0), _f32("half", 0.5)]
    for name in "qkv":
        nodes += [n("Transpose", [f"w{name}"], [f"w{name}t"], perm=[1, 0]),
                  n("MatMul", ["x", f"w{name}t"], [f"{name}0"]),
                  n("Add", [f"{name}0", f"b{name}"], [f"{name}1"]),
                  n("Reshape", [f"{name}1", "heads"], [f"{name}2"]),
                  n("Transpose", [f"{name}2"], [f"{name}h"], perm=[0, 2, 1, 3])]
    mask = "mask"
    if weighted_mask:  # a mask computed from a weight needs a gradient: not fused
        inits.append(numpy_helper.from_array(np.asarray(0.5, np.float32), "wm"))
        nodes.append(n("Mul", ["mask", "wm"], ["mask_w"]))
        mask = "mask_w"
    nodes += [
        n("Reshape", ["kh", "k3"], ["kr"]), n("Transpose", ["kr"], ["krt"], perm=[0, 2, 1]),
        n("Reshape", ["krt", "k4"], ["kt"]),
        n("Mul", ["qh", "c"], ["qs"]), n("Mul", ["kt", "c"], ["ks"]),
        n("MatMul", ["qs", "ks"], ["scores"]), n("Add", ["scores", mask], ["masked"]),
        n("Softmax", ["masked"], ["p" if guarded else "pg"], axis=-1),
        *([n("IsNaN", ["p"], ["nan"]), n("Where", ["nan", "zero", "p"], ["pg"])] if guarded
          else []),
        n("MatMul", ["pg", "vh"], ["att"]),
        n("Transpose", ["att"], ["att_t"], perm=[0, 2, 1, 3]),
        n("Reshape", ["att_t", "merged"], ["a"]),
        # fc1 (transposed weight) + exact GELU
        n("Transpose", ["w1"], ["w1t"], perm=[1, 0]), n("MatMul", ["a", "w1t"], ["f0"]),
        n("Add", ["f0", "b1"], ["f1"]),
        n("Div", ["f1", "sqrt2"], ["g0"]), n("Erf", ["g0"], ["g1"]),
        n("Add", ["g1", "one"], ["g2"]), n("Mul", ["half", "g2"], ["g3"]),
        n("Mul", ["f1", "g3"], ["g"]),
        # fc2 (weight in [in, out]) + Relu
        n("MatMul", ["g", "w2"], ["o0"]), n("Add", ["o0", "b2"], ["o1"]),
        n("Relu", ["o1"], ["y"]),
        n("Mul", ["y", "r"], ["yr"]),
        n("IdentityLoss", ["yr"], ["loss"], domain="ai.graphcore", reduction=1),
    ]
    graph = helper.make_graph(
        nodes, "encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, D]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, [B, 1, 1, S])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("ai.graphcore", 1)])
    model.ir_version = 8
    return model.SerializeToString()


def _torch_train(params, feeds, r, steps: int, weighted_mask: bool) -> dict[str, np.ndarray]:
    p = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    if weighted_mask:
        p["wm"] = torch.tensor(0.5, requires_grad=True)
    x, mask, r = (torch.from_numpy(a) for a in (feeds["x"], feeds["mask"], r))
    opt = torch.optim.SGD(p.values(), lr=LR)

    def heads(name):
        t = x @ p[f"w{name}"].T + p[f"b{name}"]
        return t.reshape(B, S, H, E).transpose(1, 2)

    for _ in range(steps):
        opt.zero_grad()
        m = mask * p["wm"] if weighted_mask else mask
        scores = heads("q") @ heads("k").transpose(-1, -2) / math.sqrt(E) + m
        att = torch.softmax(scores, -1) @ heads("v")
        a = att.transpose(1, 2).reshape(B, S, D)
        g = torch.nn.functional.gelu(a @ p["w1"].T + p["b1"])
        y = torch.relu(g @ p["w2"] + p["b2"])
        (y * r).mean().backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in p.items()}


def _session(model: bytes):
    session = popart.TrainingSession(
        fnModel=model, dataFlow=popart.DataFlow(1, {"loss": popart.AnchorReturnType("All")}),
        loss="loss", optimizer=popart.ConstSGD(LR),
        deviceInfo=popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    return session


@pytest.mark.parametrize("weighted_mask", [False, True])
def test_encoder_block_fuses_and_trains_like_torch_F6_F50(weighted_mask):
    # A weighted mask must be finite: its gradient multiplies the mask values.
    params, feeds = _params(), _feeds(-1e4 if weighted_mask else -np.inf)
    r = np.random.default_rng(2).standard_normal((B, S, D)).astype(np.float32)
    session = _session(_model(params, r, weighted_mask))
    main = session.getIr().main
    types = Counter(op.op_type for op in main.ops.values())
    # q, k, v and fc1 read their [out, in] weights without a Transpose; fc2 fuses its Relu.
    linear = [op for op in main.ops.values() if op.op_type == "LinearBias"]
    assert sorted(op.attrs.transposed_weight for op in linear) == [0, 1, 1, 1, 1]
    assert [op.attrs.activation for op in linear if not op.attrs.transposed_weight] == ["relu"]
    assert types["Gelu"] == 1 and types["GeluGrad"] == 1 and types["Erf"] == 0
    assert types["LinearBiasWeightGrad"] == 5 and types["LinearBiasBiasGrad"] == 5
    assert types["MatMul"] == (2 if weighted_mask else 0)
    if weighted_mask:
        assert types["Attention"] == 0 and types["Softmax"] == 1
    else:
        assert types["Attention"] == 1 and types["AttentionGrad"] == 1
        assert types["Softmax"] == 0 and "att/logsumexp" in main.tensors
    anchors = session.initAnchorArrays()
    for _ in range(2):
        session.run(popart.PyStepIO(feeds, anchors))
    names = list(params) + (["wm"] if weighted_mask else [])
    session.weightsToHost()
    got = {k: np.zeros(session.getInfo(k).shape(), np.float32) for k in names}
    session.readWeights(popart.PyWeightsIO(got))
    want = _torch_train(params, feeds, r, 2, weighted_mask)
    for k in names:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6, err_msg=k)


def test_inference_passes_keep_the_transposed_weight_chain():
    """The transposed-weight absorption and the statistics output are training-only."""
    params, r = _params(), np.ones((B, S, D), np.float32)
    session = popart.InferenceSession(
        fnModel=_model(params, r, False),
        dataFlow=popart.DataFlow(1, {"loss": popart.AnchorReturnType("All")}),
        deviceInfo=popart.DeviceManager().createCpuDevice())
    types = Counter(op.op_type for op in session._ir.main.ops.values())
    attention = [op for op in session._ir.main.ops.values() if op.op_type == "Attention"]
    assert len(attention) == 1 and not attention[0].attrs.save_stats
    # Constant weights: FoldConstants folds the weight Transposes before the fusions run.
    assert types["LinearBias"] == 5 and types["Transpose"] == 4  # the head splits and merge


def _layer_norm_model(params, r: np.ndarray) -> bytes:
    """h = x @ w (variable w), a layer norm spelled out in reductions (as TorchScript exports
    before opset 17 write it) with trained scale and bias, loss = mean(y * r)."""
    n = helper.make_node
    inits = [numpy_helper.from_array(v, k) for k, v in params.items()]
    inits.append(_int64("axes", [-1]))
    nodes = [
        _f32("two", 2.0), _f32("eps", 1e-5), _f32("r", r),
        n("MatMul", ["x", "w"], ["h"]),
        n("ReduceMean", ["h", "axes"], ["m"]), n("Sub", ["h", "m"], ["d"]),
        n("Pow", ["d", "two"], ["p"]), n("ReduceMean", ["p", "axes"], ["v"]),
        n("Add", ["v", "eps"], ["ve"]), n("Sqrt", ["ve"], ["s"]), n("Div", ["d", "s"], ["nd"]),
        n("Mul", ["nd", "g"], ["t"]), n("Add", ["t", "b"], ["y"]),
        n("Mul", ["y", "r"], ["yr"]),
        n("IdentityLoss", ["yr"], ["loss"], domain="ai.graphcore", reduction=1),
    ]
    graph = helper.make_graph(
        nodes, "layer_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, D])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("ai.graphcore", 1)])
    model.ir_version = 8
    return model.SerializeToString()


def test_spelled_out_layer_norm_fuses_and_trains_like_torch_F6_F50():
    rng = np.random.default_rng(3)
    params = {"w": (rng.standard_normal((D, D)) * 0.5).astype(np.float32),
              "g": (1 + 0.1 * rng.standard_normal(D)).astype(np.float32),
              "b": (0.1 * rng.standard_normal(D)).astype(np.float32)}
    x = rng.standard_normal((B, S, D)).astype(np.float32)
    r = rng.standard_normal((B, S, D)).astype(np.float32)
    session = _session(_layer_norm_model(params, r))
    main = session.getIr().main
    types = Counter(op.op_type for op in main.ops.values())
    assert types["LayerNorm"] == 1 and types["LayerNormGrad"] == 1
    assert types["ReduceMean"] == 0 and types["Sqrt"] == 0
    assert {"y/mean", "y/rstd"} <= set(main.tensors)
    anchors = session.initAnchorArrays()
    for _ in range(2):
        session.run(popart.PyStepIO({"x": x}, anchors))
    session.weightsToHost()
    got = {k: np.zeros(v.shape, np.float32) for k, v in params.items()}
    session.readWeights(popart.PyWeightsIO(got))

    p = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    opt = torch.optim.SGD(p.values(), lr=LR)
    for _ in range(2):
        opt.zero_grad()
        y = torch.nn.functional.layer_norm(torch.from_numpy(x) @ p["w"], (D,), p["g"], p["b"])
        (y * torch.from_numpy(r)).mean().backward()
        opt.step()
    for k in params:
        np.testing.assert_allclose(got[k], p[k].detach().numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=k)


@pytest.mark.parametrize("padded", [-1e4, -np.inf])
def test_unguarded_attention_with_an_input_mask_fuses_for_training(padded):
    """Without the NaN guard, an attention mask fed as an input (BERT's padding mask) fuses
    with nan_masked_rows=1 and trains as torch does; a key row masked everywhere (-inf on
    every key of sample 1's queries) gives the NaN weights the unfused softmax gives."""
    params, feeds = _params(), _feeds(padded)
    if padded == -np.inf:
        feeds["mask"][1] = -np.inf  # every key of sample 1: its rows are fully masked
    r = np.random.default_rng(2).standard_normal((B, S, D)).astype(np.float32)
    session = _session(_model(params, r, False, guarded=False))
    attention = [op for op in session.getIr().main.ops.values() if op.op_type == "Attention"]
    assert len(attention) == 1 and attention[0].attrs.nan_masked_rows == 1
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, anchors))
    session.weightsToHost()
    got = {k: np.zeros(session.getInfo(k).shape(), np.float32) for k in params}
    session.readWeights(popart.PyWeightsIO(got))
    want = _torch_train(params, feeds, r, 1, False)
    for k in params:
        assert np.array_equal(np.isnan(got[k]), np.isnan(want[k])), k
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6, err_msg=k)
    if padded == -np.inf:
        assert any(np.isnan(v).any() for v in got.values())
