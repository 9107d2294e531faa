"""Recomputation of fused ops (spec §5.2; F70): the training fusions' ops (LinearBias with and
without its ReLU, Gelu) are cloned into the backward pass by ``Op.clone_with``, and
training gives the numbers of the run without recomputation; ConvBiasAct (an inference fusion)
clones into an op computing the same values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.ir.op import OpSettings, RecomputeType

R = popart.RecomputationType
MB, D_IN, D_HID, D_OUT = 2, 6, 5, 4


def _weights(seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"w0": (D_IN, D_HID), "b0": (D_HID,), "w1": (D_HID, D_OUT), "b1": (D_OUT,),
              "g": (D_OUT,), "beta": (D_OUT,)}
    return {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}


def _model(weights, pipelined: bool):
    """MatMul + Add + Relu, MatMul + Add, LayerNormalization, Gelu (erf), L1 loss; with
    ``pipelined`` the first linear layer sits on IPU 0 / stage 0, the rest on IPU 1 / stage 1."""
    builder = popart.Builder(opsets={"ai.onnx": 20, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D_IN]), "x")
    ids = {k: builder.addInitializedInputTensor(v, k) for k, v in weights.items()}

    def placed(ipu):
        if not pipelined:
            return []
        return [builder.virtualGraph(ipu), builder.pipelineStage(ipu)]

    def run(ipu, fn):
        contexts = placed(ipu)
        for c in contexts:
            c.__enter__()
        try:
            return fn()
        finally:
            for c in reversed(contexts):
                c.__exit__(None, None, None)

    on = builder.aiOnnx
    h = run(0, lambda: on.relu([on.add([on.matmul([x, ids["w0"]]), ids["b0"]])]))

    def rest():
        y = on.add([on.matmul([h, ids["w1"]]), ids["b1"]])
        y = on.layernormalization([y, ids["g"], ids["beta"]], num_outputs=1)[0]
        y = on.gelu([y])
        return builder.aiGraphcore.l1loss([y], 0.5, reduction=popart.ReductionType.Mean)

    loss = run(1, rest)
    return builder.getModelProto(), loss


def _train(weights, x, recompute, pipelined: bool):
    proto, loss = _model(weights, pipelined)
    opts = popart.SessionOptions()
    opts.autoRecomputation = recompute
    ipus = 2 if pipelined else 1
    bps = x.shape[0]
    if pipelined:
        opts.virtualGraphMode = popart.VirtualGraphMode.Manual
        opts.enablePipelining = True
        opts.enableGradientAccumulation = True
        opts.accumulationFactor = x.shape[1]
    flow = popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")})
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus})
    session = popart.TrainingSession(proto, flow, loss, popart.ConstSGD(0.1), device,
                                     userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    session.weightsToHost()
    out = {k: np.zeros_like(v) for k, v in weights.items()}
    session.readWeights(popart.PyWeightsIO(out))
    return out, anchors[loss], session


def _recomputed_types(session) -> set[str]:
    return {op.op_type for op in session.getIr().main.ops.values()
            if op.settings.recompute is RecomputeType.Recomputed}


@pytest.mark.parametrize("kind,pipelined", [(R.RecomputeAll, False), (R.Standard, False),
                                            (R.Pipeline, True)])
def test_recomputed_fused_ops_keep_the_numbers_F70(kind, pipelined):
    weights = _weights()
    shape = (1, 4, MB, D_IN) if pipelined else (2, MB, D_IN)
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    want, want_loss, base = _train(weights, x, R.NoRecompute, pipelined)
    assert not _recomputed_types(base)
    assert "LinearBias" in {op.op_type for op in base.getIr().main.ops.values()}
    got, got_loss, session = _train(weights, x, kind, pipelined)
    types = _recomputed_types(session)
    assert "LinearBias" in types, types
    if kind is R.RecomputeAll:
        assert {"LinearBias", "Gelu", "LayerNormalization"} <= types, types
    np.testing.assert_array_equal(got_loss, want_loss)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_trained_weights_match_torch():
    """The run the recomputed ones are compared with is itself right: one SGD step per
    micro-batch, against torch's autograd on the same model."""
    weights = _weights()
    x = np.random.default_rng(5).standard_normal((2, MB, D_IN)).astype(np.float32)
    got, _, _ = _train(weights, x, R.RecomputeAll, False)
    params = {k: torch.tensor(v, requires_grad=True) for k, v in weights.items()}
    for batch in x:
        h = torch.relu(torch.tensor(batch) @ params["w0"] + params["b0"])
        y = torch.nn.functional.layer_norm(h @ params["w1"] + params["b1"], (D_OUT,),
                                           params["g"], params["beta"])
        loss = 0.5 * torch.nn.functional.gelu(y).abs().mean()
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for p, g in zip(params.values(), grads):
                p -= 0.1 * g
    for key, p in params.items():
        np.testing.assert_allclose(got[key], p.detach().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=key)


def test_conv_bias_act_clone_computes_the_same():
    """ConvBiasAct keeps its convolution's window: a clone (new settings) computes what the
    original computes, and what torch computes for conv + residual + relu."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [1, 2, 6, 6]), "x")
    r = builder.addInputTensor(popart.TensorInfo("FLOAT", [1, 3, 3, 3]), "r")
    c = builder.aiOnnx.conv([x, builder.aiOnnx.constant(w), builder.aiOnnx.constant(b)],
                            pads=[1, 1, 1, 1], strides=[2, 2])
    y = builder.aiOnnx.relu([builder.aiOnnx.add([c, r])])
    session = popart.InferenceSession(
        builder.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}),
        popart.DeviceManager().createIpuModelDevice({"numIPUs": 1}))
    graph = session.getIr().main
    fused = [op for op in graph.ops.values() if op.op_type == "ConvBiasAct"]
    assert len(fused) == 1
    op = fused[0]
    clone = op.clone_with(OpSettings(name="clone", recompute=RecomputeType.Recomputed))
    graph.add_op(clone, [t.id for t in op.inputs], [graph.unique_id("clone_out")])
    assert clone.outputs[0].info == op.outputs[0].info
    assert clone.cost() == op.cost()
    xs = [torch.tensor(rng.standard_normal(t.info.shape).astype(np.float32))
          if not t.is_const else torch.tensor(t.data) for t in op.inputs]
    want = torch.relu(torch.nn.functional.conv2d(xs[0], torch.tensor(w), torch.tensor(b),
                                                 stride=2, padding=1) + xs[3])
    torch.testing.assert_close(op.kernel(*[t.clone() for t in xs]), want)
    torch.testing.assert_close(clone.kernel(*[t.clone() for t in xs]), want)
