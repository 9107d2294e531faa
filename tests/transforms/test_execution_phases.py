"""Execution phases (spec §3.4, §10; F21): VirtualGraphMode.ExecutionPhases with
executionPhaseSettings, the phases' IPUs, RemoteLoad / RemoteStore in the IR, memory per IPU
and cycles from the device model, and results equal to the unphased run."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.errors import NotImplementedOptionError
from popart_backend.transforms.execution_phases import backward_phase

LAYERS, MB, D = 4, 2, 128
LR = 0.05


def _weights(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((D, D)) * 0.3).astype(np.float32) for _ in range(LAYERS)]


def _model(weights, phased: bool = True):
    """``h = tanh(h @ W_k)`` per layer k (in execution phase k), then an L1 loss in the last
    layer's phase. (ModelProto, input id, loss id, weight ids)."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    h, ids = x, []
    for k, w in enumerate(weights):
        w_id = builder.addInitializedInputTensor(w, f"w{k}")
        ids.append(w_id)
        if phased:
            with builder.executionPhase(k):
                h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, w_id])])
        else:
            h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, w_id])])
    if phased:
        with builder.executionPhase(len(weights) - 1):
            loss = builder.aiGraphcore.l1loss([h], 0.5, reduction=popart.ReductionType.Mean)
    else:
        loss = builder.aiGraphcore.l1loss([h], 0.5, reduction=popart.ReductionType.Mean)
    return builder.getModelProto(), x, loss, ids


def _phased_options(**settings) -> popart.SessionOptions:
    opts = popart.SessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.ExecutionPhases
    opts.executionPhaseSettings.phases = LAYERS
    opts.executionPhaseSettings.stages = 2
    for key, value in settings.items():
        setattr(opts.executionPhaseSettings, key, value)
    return opts


def _device(ipus: int):
    return popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus, "tilesPerIPU": 4})


def _x(steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal((MB, D)).astype(np.float32) for _ in range(steps)]


def _train(weights, opts, ipus: int, phased: bool, steps: int = 3):
    proto, x, loss, ids = _model(weights, phased)
    session = popart.TrainingSession(
        proto, popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
        popart.ConstSGD(LR), _device(ipus), userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    losses = []
    for data in _x(steps):
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({x: data}, anchors))
        losses.append(float(anchors[loss]))
    session.weightsToHost()
    trained = {i: np.zeros((D, D), np.float32) for i in ids}
    session.readWeights(popart.PyWeightsIO(trained))
    return session, losses, [trained[i] for i in ids]


def _torch_reference(weights, steps: int = 3):
    ws = [torch.tensor(w, requires_grad=True) for w in weights]
    losses = []
    for data in _x(steps):
        h = torch.tensor(data)
        for w in ws:
            h = torch.tanh(h @ w)
        loss = 0.5 * h.abs().mean()
        losses.append(float(loss))
        for w in ws:
            w.grad = None
        loss.backward()
        with torch.no_grad():
            for w in ws:
                w -= LR * w.grad
    return losses, [w.detach().numpy() for w in ws]


def _ops(session, op_type: str):
    return [op for op in session._ir.main.ops.values() if op.op_type == op_type]


@pytest.fixture(scope="module")
def runs():
    weights = _weights()
    phased = _train(weights, _phased_options(), 2, True)
    plain = _train(weights, popart.SessionOptions(), 1, False)
    return weights, phased, plain


def test_F21_phased_training_equals_the_unphased_run_and_torch(runs):
    weights, (_, phased_losses, phased_w), (_, plain_losses, plain_w) = runs
    assert phased_losses == plain_losses
    for a, b in zip(phased_w, plain_w):
        np.testing.assert_array_equal(a, b)
    want_losses, want_w = _torch_reference(weights)
    np.testing.assert_allclose(phased_losses, want_losses, rtol=1e-5, atol=1e-6)
    for got, want in zip(phased_w, want_w):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_F21_phases_alternate_ipus_and_backward_phases_mirror_forward(runs):
    _, (session, _, _), _ = runs
    for op in session._ir.main.ops.values():
        if op.op_type == "MatMul":  # forward: phase k on IPU k % 2
            assert op.settings.ipu == op.settings.execution_phase % 2
    grads = [op for op in session._ir.main.ops.values() if op.op_type == "TanhGrad"]
    assert sorted(op.settings.execution_phase for op in grads) == sorted(
        backward_phase(k, LAYERS) for k in range(LAYERS))
    for op in grads:  # the gradient of phase k runs on phase k's IPU
        assert op.settings.ipu == (backward_phase(op.settings.execution_phase, LAYERS)) % 2


def test_F21_weights_are_loaded_per_phase_and_stored_after_the_update(runs):
    _, (session, _, _), _ = runs
    graph = session._ir.main
    for k in range(LAYERS):
        w = graph.tensors[f"w{k}"]
        assert w.consumers and all(op.remote_transfer for op in w.consumers)
        loads = [op for op in w.consumers if op.op_type == "RemoteLoad"]
        stores = [op for op in w.consumers if op.op_type == "RemoteStore"]
        # Read in its forward phase and in its backward phase (the loss phase is both).
        assert len(loads) == (1 if k == LAYERS - 1 else 2)
        assert len(stores) == 1
        update = stores[0].inputs[1].producer
        assert update.op_type == "SGDUpdate"  # the store writes back the updated copy
    # Forward activations read by the backward pass go through streaming memory.
    assert _ops(session, "Init") and len(_ops(session, "RemoteStore")) > LAYERS
    order = graph.topo_order()
    # The phases run in sequence (the inter-IPU copies, inserted later, follow their data).
    phases = [op.settings.execution_phase for op in order if op.op_type != "IpuCopy"]
    assert phases == sorted(phases)
