"""``ensureFp32LossScaleTensor`` (training): with a float16 loss, the loss scale stays float32
and is applied to the first float16 gradients, so a scale above the float16 maximum works when
the scaled gradients fit (PopART's purpose for the option). Checked against numpy; the same
scale without the option overflows in float16."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.transforms import loss_scaling

N, LR = 64, 0.5
SCALE = 2.0 ** 17  # > 65504, the float16 maximum
RNG = np.random.default_rng(4)
X = RNG.uniform(0.5, 1.5, N).astype(np.float16)
W0 = RNG.uniform(-1, 1, N).astype(np.float16)


def _optimizer(const: bool):
    if const:
        return popart.ConstSGD(LR, loss_scaling=SCALE)
    return popart.SGD({"defaultLearningRate": (LR, True), "lossScaling": (SCALE, False)})


def _train(fp32_scale: bool, const: bool, dtype: str = "FLOAT16"):
    np_dtype = np.float16 if dtype == "FLOAT16" else np.float32
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo(dtype, [N]), "x")
    w = b.addInitializedInputTensor(W0.astype(np_dtype), "w")
    y = b.aiOnnx.mul([x, w])
    loss = b.aiGraphcore.l1loss([y], 1.0, reduction=popart.ReductionType.Mean)
    opts = popart.SessionOptions()
    opts.ensureFp32LossScaleTensor = fp32_scale
    grad = popart.reservedGradientPrefix() + y
    session = popart.TrainingSession(
        b.getModelProto(), popart.DataFlow(1, [grad]), loss, _optimizer(const),
        popart.DeviceManager().createCpuDevice(), userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: X.astype(np_dtype)}, anchors))
    session.weightsToHost()
    weights = {w: np.zeros(N, np_dtype)}
    session.readWeights(popart.PyWeightsIO(weights))
    return session, anchors[grad], weights[w]


def _reference():
    """numpy in float32: loss = mean |x w|; the anchored gradient of y is scaled."""
    x, w = X.astype(np.float32), W0.astype(np.float32)
    dy = np.sign(x * w) / N
    return dy * SCALE, w - LR * dy * x


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # the float16 seed
@pytest.mark.parametrize("const", [True, False], ids=["ConstSGD", "SGD"])
def test_fp32_loss_scale_above_the_float16_range(const):
    session, grad, w = _train(True, const)
    want_grad, want_w = _reference()
    np.testing.assert_allclose(grad.astype(np.float32), want_grad, rtol=1e-3)
    np.testing.assert_allclose(w.astype(np.float32), want_w, rtol=2e-3, atol=2e-3)
    casts = [op for op in session.getIr().main.ops.values()
             if op.op_type == "Mul" and any(t.info.dtype is popart.DataType.FLOAT and
                                            t.id.startswith("lossScaling") for t in op.inputs)]
    assert casts, "the scale is applied by a float32 Mul"
    # Without the option the float16 scale overflows: the gradients are not finite.
    _, grad_off, w_off = _train(False, const)
    assert not np.isfinite(grad_off.astype(np.float32)).all()
    assert not np.isfinite(w_off.astype(np.float32)).all()


def test_fp32_loss_scale_is_neutral_within_the_float16_range():
    global SCALE
    saved, SCALE = SCALE, 128.0
    try:
        _, grad_on, w_on = _train(True, True)
        _, grad_off, w_off = _train(False, True)
        want_grad, want_w = _reference()
    finally:
        SCALE = saved
    for grad, w in ((grad_on, w_on), (grad_off, w_off)):
        np.testing.assert_allclose(grad.astype(np.float32), want_grad, rtol=1e-3)
        np.testing.assert_allclose(w.astype(np.float32), want_w, rtol=2e-3, atol=2e-3)


def test_fp32_loss_scale_on_a_float32_loss_logs_and_scales_as_usual(caplog, monkeypatch):
    monkeypatch.setattr(loss_scaling, "_logged", set())  # logged once per process
    with caplog.at_level(logging.WARNING, logger="popart:transform"):
        _, grad, w = _train(True, True, dtype="FLOAT")
    assert "ensureFp32LossScaleTensor has no effect: the loss" in caplog.text
    want_grad, want_w = _reference()
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5)
    np.testing.assert_allclose(w, want_w, rtol=1e-5, atol=1e-6)
