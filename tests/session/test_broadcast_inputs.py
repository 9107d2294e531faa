"""``InputSettings(ReplicatedStreamMode.Broadcast)``: the host feeds one value per micro-batch
(no replica dimension) and every replica reads it; a replicated input beside it still has one
slice per replica. Checked against numpy, in inference (batches per step) and in training
(accumulation and replication, the summed gradient of the weight)."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.errors import StepIOError
from popart_backend.tensorinfo import input_settings_from_model

BROADCAST = popart.InputSettings(popart.ReplicatedStreamMode.Broadcast)


def _options(rf: int, af: int = 1) -> popart.SessionOptions:
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs = rf > 1
    opts.replicatedGraphCount = rf
    opts.enableGradientAccumulation = af > 1
    opts.accumulationFactor = af
    return opts


def _model(with_weight: bool = False):
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]), BROADCAST, "x")
    y = b.addInputTensor(popart.TensorInfo("FLOAT", [3]), "y")
    w0 = np.array([0.5, -1.0, 2.0], np.float32)
    if with_weight:
        w = b.addInitializedInputTensor(w0, "w")
        out = b.aiOnnx.add([b.aiOnnx.mul([w, x]), y])
    else:
        out = b.aiOnnx.mul([x, y])
    return b, x, y, out, w0


def test_broadcast_is_recorded_in_the_model():
    b, x, y, _, _ = _model()
    settings = input_settings_from_model(b._model)
    assert settings[x].replicatedStreamMode() is popart.ReplicatedStreamMode.Broadcast
    assert y not in settings


@pytest.mark.parametrize("rf", [1, 2, 4])
def test_broadcast_input_reaches_every_replica(rf):
    bps = 3
    b, x, y, out, _ = _model()
    session = popart.InferenceSession(
        b.getModelProto(), popart.DataFlow(bps, {out: popart.AnchorReturnType("All")}),
        popart.DeviceManager().createIpuModelDevice({"numIPUs": rf}), userOptions=_options(rf))
    session.prepareDevice()
    rng = np.random.default_rng(rf)
    xs = rng.standard_normal((bps, 3)).astype(np.float32)  # no replica dimension
    ys = rng.standard_normal((bps, rf, 3) if rf > 1 else (bps, 3)).astype(np.float32)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: xs, y: ys}, anchors))
    want = xs[:, None, :] * ys if rf > 1 else xs * ys
    np.testing.assert_allclose(anchors[out], want, rtol=1e-6)


def test_broadcast_input_in_training_with_accumulation_and_replication():
    rf, af, lr = 2, 2, 0.1
    b, x, y, out, w0 = _model(with_weight=True)
    loss = b.aiGraphcore.l1loss([out], 1.0, reduction=popart.ReductionType.Sum)
    session = popart.TrainingSession(
        b.getModelProto(), popart.DataFlow(1, {out: popart.AnchorReturnType("All")}), loss,
        popart.ConstSGD(lr), popart.DeviceManager().createIpuModelDevice({"numIPUs": rf}),
        userOptions=_options(rf, af))
    session.prepareDevice()
    session.weightsFromHost()
    rng = np.random.default_rng(9)
    xs = rng.standard_normal((af, 3)).astype(np.float32)
    ys = rng.standard_normal((af, rf, 3)).astype(np.float32)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: xs, y: ys}, anchors))
    pre = w0 * xs[:, None, :] + ys  # [af, rf, 3]
    np.testing.assert_allclose(anchors[out], pre, rtol=1e-6)
    # Gradients summed over the micro-batches and the replicas (ReductionType.Sum).
    want = w0 - lr * (xs[:, None, :] * np.sign(pre)).sum(axis=(0, 1))
    weights = {"w": np.zeros(3, np.float32)}
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(weights))
    np.testing.assert_allclose(weights["w"], want, rtol=1e-6, atol=1e-6)


def test_broadcast_input_sizes_are_checked():
    rf = 2
    b, x, y, out, _ = _model()
    session = popart.InferenceSession(
        b.getModelProto(), popart.DataFlow(1, [out]),
        popart.DeviceManager().createIpuModelDevice({"numIPUs": rf}), userOptions=_options(rf))
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    ones = np.ones((rf, 3), np.float32)
    with pytest.raises(StepIOError, match="Expected 3, but received 6(.|\n)*broadcast"):
        session.run(popart.PyStepIO({x: ones, y: ones}, anchors))
    callbacks = popart.PyStepIOCallback(lambda tid, prefetch: ones[0], lambda tid: None,
                                        lambda tid: anchors[tid][0], lambda tid: None)
    with pytest.raises(StepIOError, match=r"\['x'\] are broadcast to every replica"):
        session.run(callbacks)
