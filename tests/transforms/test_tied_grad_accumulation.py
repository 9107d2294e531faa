"""A tied weight read on two pipeline stages (F65, F73): with gradient accumulation each partial
gradient is added into the accumulator on the stage that makes it, so no partial is stashed;
the numbers equal eager torch (and the unpipelined run); without pipelining nothing changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.ir.op import ExecutionContext

MB, D, AF, BPS = 2, 4, 6, 2
LR, MOMENTUM = 0.05, 0.9
ADAM = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-5)


def _weights():
    rng = np.random.default_rng(5)
    return {name: (rng.standard_normal((D, D)) * 0.5).astype(np.float32) for name in "WV"}


def _model(weights, stages: int):
    """h = tanh(x @ W) [stage 0] -> tanh(h @ V) [stage 1] -> y = . @ W^T, L1 loss [stage 2];
    stages 0 and 2 on IPU 0, stage 1 on IPU 1 (a tied W, like BERT's embedding). With 2
    stages the last two parts share stage 1 on IPU 1."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    w = builder.addInitializedInputTensor(weights["W"], "W")
    v = builder.addInitializedInputTensor(weights["V"], "V")
    with builder.virtualGraph(0), builder.pipelineStage(0):
        h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([x, w])])
    with builder.virtualGraph(1), builder.pipelineStage(1):
        h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, v])])
    with builder.virtualGraph((stages - 1) % 2), builder.pipelineStage(stages - 1):
        y = builder.aiOnnx.matmul([h, builder.aiOnnx.transpose([w], perm=[1, 0])])
        loss = builder.aiGraphcore.l1loss([y], 0.5, reduction=popart.ReductionType.Mean)
    return builder.getModelProto(), loss


def _optimizer(kind: str):
    if kind == "sgd":
        return popart.SGD({"defaultLearningRate": (LR, True), "defaultMomentum": (MOMENTUM, True)})
    return popart.Adam({"defaultLearningRate": (ADAM["lr"], True),
                        "defaultBeta1": (ADAM["betas"][0], True),
                        "defaultBeta2": (ADAM["betas"][1], True),
                        "defaultEps": (ADAM["eps"], True)}, popart.AdamMode.Adam)


def _session(kind: str, pipelined: bool, stages: int = 3, anchors=(), **values):
    ipus = 2
    proto, loss = _model(_weights(), stages)
    opts = popart.SessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    opts.enablePipelining = pipelined
    opts.enableGradientAccumulation = True
    opts.accumulationFactor = AF
    for key, value in values.items():
        setattr(opts, key, value)
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus})
    flow = popart.DataFlow(BPS, {name: popart.AnchorReturnType("All")
                                 for name in (loss, *anchors)})
    session = popart.TrainingSession(proto, flow, loss, _optimizer(kind), device,
                                     userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    return session


def _data(steps: int = 1) -> np.ndarray:
    rng = np.random.default_rng(11)
    return rng.standard_normal((steps, BPS, AF, MB, D)).astype(np.float32)


def _train(session, data) -> dict[str, np.ndarray]:
    anchors = session.initAnchorArrays()
    for step in data:
        session.run(popart.PyStepIO({"x": np.ascontiguousarray(step)}, anchors))
    session.weightsToHost()
    out = {name: np.zeros((D, D), np.float32) for name in "WV"}
    session.readWeights(popart.PyWeightsIO(out))
    return out


def _torch(kind: str, data, mean: bool = False) -> dict[str, np.ndarray]:
    params = {k: torch.tensor(v, requires_grad=True) for k, v in _weights().items()}
    if kind == "sgd":
        opt = torch.optim.SGD(params.values(), lr=LR, momentum=MOMENTUM)
    else:
        opt = torch.optim.Adam(params.values(), **ADAM)
    for step in data:
        for batch in step:
            opt.zero_grad()
            for micro in batch:
                h = torch.tanh(torch.tanh(torch.from_numpy(micro) @ params["W"]) @ params["V"])
                loss = 0.5 * (h @ params["W"].T).abs().mean()
                (loss / AF if mean else loss).backward()
            opt.step()
    return {k: v.detach().numpy() for k, v in params.items()}


def _accumulates(session, accum_id="Accum___W"):
    graph = session.getIr().main
    return sorted((op for op in graph.ops_of_type("Accumulate") if op.inputs[0].id == accum_id),
                  key=lambda op: op.settings.pipeline_stage or 0)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("stages, decompose", [(3, False), (3, True), (2, False)])
def test_tied_weight_partials_accumulate_on_their_stages_F65_F73(kind, stages, decompose):
    """3 stages: stages 0 and 2 read W, so its partials come from backward stages 4 and 2
    (2L - s), both on IPU 0; each is accumulated there. 2 stages: the partials are on IPUs 1
    and 0, so they are summed on stage 2 (copied, not stashed). The weights equal eager torch
    and the unpipelined run."""
    session = _session(kind, True, stages, decomposeGradSum=decompose)
    accumulates = _accumulates(session)
    placed = [(op.settings.pipeline_stage, op.settings.ipu) for op in accumulates]
    if stages == 2:
        assert placed == [(2, 0)] and accumulates[0].inputs[1].id == "Gradient___W"
    else:
        assert placed == [(2, 0), (4, 0)]
        assert "Gradient___W" not in session.getIr().main.tensors  # the sum is gone
    for op in accumulates[stages - 2:]:
        partial = op.inputs[1]
        assert partial.producer.settings.pipeline_stage == op.settings.pipeline_stage
        assert op.settings.execution_context is ExecutionContext.Normal
    data = _data(2)
    got = _train(session, data)
    want = _torch(kind, data)
    plain = _train(_session(kind, False, stages, decomposeGradSum=decompose), data)
    for name in "WV":
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(got[name], plain[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_no_stash_for_the_partial_in_the_memory_report_F67():
    """Only forward values are stashed; the earlier-made partial of W is not (IR and memory
    report)."""
    session = _session("sgd", True)
    partials = {op.inputs[1].id for op in _accumulates(session)}
    graph = session.getIr().main
    stashed = {op.inputs[2].id for op in graph.ops_of_type("Stash")}
    assert stashed and not stashed & partials
    assert all(not t.id.startswith("Gradient___") for t in
               (graph.tensor(i) for i in stashed))
    for ipu in (0, 1):
        memory = session._device_model.memory.ipu(ipu)
        stash_ids = {t.id for t in memory.tensors if t.category == "pipeline stashes"}
        assert not {f"StashBuffer___{p}" for p in partials} & stash_ids
        assert all(not i.startswith("StashBuffer___Gradient") for i in stash_ids)


def test_without_pipelining_the_sum_is_accumulated_once_F73():
    """Without pipelining there are no stages: one Accumulate reads the gradient Sum."""
    session = _session("sgd", False)
    [accumulate] = _accumulates(session)
    grad = accumulate.inputs[1]
    assert grad.id == "Gradient___W" and grad.producer.op_type == "Sum"
    assert accumulate.settings.pipeline_stage is None


@pytest.mark.parametrize("strategy", [popart.MeanReductionStrategy.Post,
                                      popart.MeanReductionStrategy.PostAndLoss,
                                      popart.MeanReductionStrategy.Running])
def test_mean_reductions_stay_the_mean_F73(strategy):
    """Post and PostAndLoss accumulate sums, so they split; a running mean rescales the whole
    accumulator each time, so its partials stay summed (on the later stage). All three give
    the mean of the micro-batch gradients, as torch with the loss divided by af."""
    session = _session("sgd", True, accumulationAndReplicationReductionType=(
        popart.ReductionType.Mean), meanAccumulationAndReplicationReductionStrategy=strategy)
    stages = [op.settings.pipeline_stage for op in _accumulates(session)]
    running = strategy is popart.MeanReductionStrategy.Running
    assert stages == ([4] if running else [2, 4])
    data = _data(1)
    got = _train(session, data)
    want = _torch("sgd", data, mean=True)
    for name in "WV":
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_an_anchored_gradient_sum_is_kept_F35():
    """Anchoring ``Gradient___W`` asks for the summed gradient of every micro-batch: the sum
    stays (accumulated on the later stage) and the anchor holds it."""
    session = _session("sgd", True, anchors=("Gradient___W",))
    [accumulate] = _accumulates(session)
    assert accumulate.inputs[1].id == "Gradient___W"
    assert accumulate.settings.pipeline_stage == 4
    anchors = session.initAnchorArrays()
    data = _data(1)[0]
    session.run(popart.PyStepIO({"x": np.ascontiguousarray(data)}, anchors))
    assert anchors["Gradient___W"].shape == (BPS, AF, D, D)
    # The first af micro-batches see the initial weights.
    params = {k: torch.tensor(v, requires_grad=True) for k, v in _weights().items()}
    for k, micro in enumerate(data[0]):
        params["W"].grad = None
        h = torch.tanh(torch.tanh(torch.from_numpy(micro) @ params["W"]) @ params["V"])
        (0.5 * (h @ params["W"].T).abs().mean()).backward()
        np.testing.assert_allclose(anchors["Gradient___W"][0, k], params["W"].grad.numpy(),
                                   rtol=1e-5, atol=1e-7)
