"""Automatic loss scaling (SessionOptions.automaticLossScalingSettings, poptorch
Training.setAutomaticLossScaling): the loss scale doubles while the float16 gradients stay
clear of the top of the float16 range and halves when they reach it or overflow; the scale is
a variable read during training (transforms/auto_loss_scaling.py, ops/loss_scaling.py).

The expected scales come from the update rule applied to the analytic gradients: for
y = x @ w (x all ``X``, w > 0) and loss = L1(y, lambda=1, Sum), dloss/dw = batch * X per
element, so the loss-scaled float16 gradient is float16(scale * batch * X)."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart

BATCH, FEATURES, OUT = 2, 3, 2
SCALE_ID = "lossScaling_FLOAT"
F16_MAX = float(np.finfo(np.float16).max)


def _session(x_value: float, scale: float, update_period: int = 1, const=False,
             threshold: float = 1e-7):
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT16", [BATCH, FEATURES]), "x")
    w = builder.addInitializedInputTensor(np.full((FEATURES, OUT), 0.5, np.float16), "w")
    y = builder.aiOnnx.matmul([x, w])
    loss = builder.aiGraphcore.l1loss([y], 1.0, reduction=popart.ReductionType.Sum)
    options = popart.SessionOptions()
    options.automaticLossScalingSettings = popart.AutomaticLossScalingSettings(
        enabled=True, updatePeriod=update_period, thresholdUpperCountProportion=threshold)
    optimizer = popart.SGD({"defaultLearningRate": (1e-4, True),
                            "lossScaling": (scale, const)})
    session = popart.TrainingSession(
        fnModel=builder.getModelProto(), dataFlow=popart.DataFlow(1, {}), loss=loss,
        optimizer=optimizer, userOptions=options,
        deviceInfo=popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    feed = np.full((BATCH, FEATURES), x_value, np.float16)

    def step() -> float:
        session.run(popart.PyStepIO({x: feed}, session.initAnchorArrays()))
        session.weightsToHost()
        out = {SCALE_ID: np.zeros((), np.float32), w: np.zeros((FEATURES, OUT), np.float16)}
        session.readWeights(popart.PyWeightsIO(out))
        weights.append(out[w])
        return float(out[SCALE_ID])

    weights: list[np.ndarray] = []
    step.weights = weights
    return step


def _expected(x_value: float, scale: float, steps: int, period: int = 1) -> list[float]:
    """The rule: per update, count float16 gradient elements >= max (inf included); after
    `period` updates halve when any counted (threshold 1e-7 of a few elements), else double;
    clamp to [1, 2**15]."""
    out, upper, seen = [], 0, 0
    for _ in range(steps):
        with np.errstate(over="ignore"):
            grad = np.float16(scale * BATCH * x_value)
        upper += int(not np.isfinite(grad) or abs(float(grad)) >= F16_MAX)
        seen += 1
        if seen == period:
            scale = scale / 2 if upper else scale * 2
            scale = min(max(scale, 1.0), 2.0**15)
            upper, seen = 0, 0
        out.append(scale)
    return out


def test_small_gradients_raise_the_scale():
    step = _session(0.01, 4.0)
    actual = [step() for _ in range(5)]
    assert actual == _expected(0.01, 4.0, 5)
    assert actual[-1] > 4.0


def test_overflowing_gradients_lower_the_scale():
    """scale * 2 * 100 overflows float16 above 32752: from 1024 the scale halves until the
    gradients fit, then rises again and falls back (the histogram sees the overflow)."""
    step = _session(100.0, 1024.0)
    actual = [step() for _ in range(6)]
    assert actual == _expected(100.0, 1024.0, 6)
    assert actual[0] == 512.0 and min(actual) < 512.0
    # The overflowing updates were skipped: the weights stay finite, unchanged by the first
    # two steps, and move (by lr * 200 per element, float16-rounded) on the third.
    start = np.full((FEATURES, OUT), 0.5, np.float16)
    np.testing.assert_array_equal(step.weights[0], start)
    np.testing.assert_array_equal(step.weights[1], start)
    assert all(np.isfinite(w).all() for w in step.weights)
    np.testing.assert_allclose(step.weights[2].astype(np.float32), 0.5 - 1e-4 * BATCH * 100.0,
                               atol=1e-3)


def test_update_period_waits_for_the_period():
    step = _session(0.01, 4.0, update_period=3)
    actual = [step() for _ in range(6)]
    assert actual == _expected(0.01, 4.0, 6, period=3) == [4.0, 4.0, 8.0, 8.0, 8.0, 16.0]


def test_const_loss_scaling_is_refused():
    with pytest.raises(popart.popart_exception, match="non-const loss scaling"):
        _session(0.01, 4.0, const=True)


def test_poptorch_set_automatic_loss_scaling_moves_the_scale():
    """Training.setAutomaticLossScaling: a half model with small gradients sees the loss
    scale (a variable read back into the optimizer's state) grow."""
    import torch

    import poptorch_lite as poptorch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).half()

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, x):
            return self.net(x).float().abs().sum()

    wrapped = Loss()
    opts = poptorch.Options()
    opts.Training.setAutomaticLossScaling(True)
    optimizer = poptorch.optim.SGD(wrapped.parameters(), lr=1e-4, loss_scaling=8.0)
    wrapper = poptorch.trainingModel(wrapped, opts, optimizer)
    for _ in range(3):
        wrapper(torch.full((2, 3), 0.01, dtype=torch.float16))
    scale = wrapper._active.session
    out = {SCALE_ID: np.zeros((), np.float32)}
    scale.weightsToHost()
    scale.readWeights(popart.PyWeightsIO(out))
    assert float(out[SCALE_ID]) == 8.0 * 2**3
    wrapper.destroy()


def test_conv_and_matmul_gradients_tracks_the_gradients_of_every_matmul_input():
    """ConvAndMatmulGradients: the histogram reads the gradients of the MatMul inputs that
    have one (both weights and the activation between them), not only the weights'."""
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT16", [BATCH, FEATURES]), "x")
    w1 = builder.addInitializedInputTensor(np.full((FEATURES, OUT), 0.5, np.float16), "w1")
    w2 = builder.addInitializedInputTensor(np.full((OUT, OUT), 0.5, np.float16), "w2")
    h = builder.aiOnnx.matmul([x, w1])
    y = builder.aiOnnx.matmul([h, w2])
    loss = builder.aiGraphcore.l1loss([y], 1.0, reduction=popart.ReductionType.Sum)

    def tracked(method):
        options = popart.SessionOptions()
        options.automaticLossScalingSettings = popart.AutomaticLossScalingSettings(
            enabled=True, gradientTensorTrackingMethod=method)
        session = popart.TrainingSession(
            fnModel=builder.getModelProto(), dataFlow=popart.DataFlow(1, {}), loss=loss,
            optimizer=popart.SGD({"defaultLearningRate": (1e-4, True),
                                  "lossScaling": (4.0, False)}),
            userOptions=options, deviceInfo=popart.DeviceManager().createCpuDevice())
        histogram = next(op for op in session.getIr().main.ops.values()
                         if op.op_type == "LossScaleHistogram")
        return {t.id for t in histogram.inputs[1:]}

    method = popart.GradientTensorTrackingMethod
    assert tracked(method.AllNonViewChangingGradientTensors) == {
        f"Gradient___{w1}", f"Gradient___{w2}"}
    assert tracked(method.ConvAndMatmulGradients) == {
        f"Gradient___{w1}", f"Gradient___{w2}", f"Gradient___{h}"}
