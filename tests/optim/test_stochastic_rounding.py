"""Stochastic rounding (SessionOptions.enableStochasticRounding, poptorch
Precision.enableStochasticRounding): float16 weight updates and MatMul results round to a
float16 neighbour at random, unbiased, reproducibly for a seed (ops/rounding.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.ops.rounding import stochastic_round

N_WEIGHTS, STEPS, LR = 64, 100, 1.0


def _train(stochastic: bool, seed: int = 1, step_size: float = 1e-4) -> tuple[np.ndarray, float]:
    """A float16 weight vector at 1.0; loss = L1(w * x) with x = step_size, so every SGD step
    subtracts lr * x16 (x16: x in float16). Returns the final weights and x16."""
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT16", [N_WEIGHTS]), "x")
    w = builder.addInitializedInputTensor(np.ones(N_WEIGHTS, np.float16), "w")
    y = builder.aiOnnx.mul([w, x])
    loss = builder.aiGraphcore.l1loss([y], 1.0, reduction=popart.ReductionType.Sum)
    options = popart.SessionOptions()
    options.enableStochasticRounding = stochastic
    session = popart.TrainingSession(
        fnModel=builder.getModelProto(), dataFlow=popart.DataFlow(STEPS, {}), loss=loss,
        optimizer=popart.ConstSGD(LR), userOptions=options,
        deviceInfo=popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.setRandomSeed(seed)
    session.weightsFromHost()
    feed = np.full((STEPS, N_WEIGHTS), step_size, np.float16)
    session.run(popart.PyStepIO({x: feed}, session.initAnchorArrays()))
    session.weightsToHost()
    out = {w: np.zeros(N_WEIGHTS, np.float16)}
    session.readWeights(popart.PyWeightsIO(out))
    return out[w], float(np.float16(step_size))


def test_small_updates_move_a_float16_weight_only_with_stochastic_rounding():
    """100 updates of -1e-4 on a float16 weight at 1.0: round-to-nearest stalls at 1.0 (each
    step is below half an ulp); stochastic rounding moves each weight by the exact total on
    average, within 3 standard deviations of the unbiased-rounding random walk."""
    nearest, _ = _train(False)
    assert np.all(nearest == np.float16(1.0))

    weights, x16 = _train(True)
    expected = 1.0 - STEPS * LR * x16
    # Below 1.0 the float16 spacing is 2**-11; each step goes down one ulp with p = step/ulp.
    ulp = 2.0**-11
    p = LR * x16 / ulp
    sigma_one = math.sqrt(STEPS * p * (1 - p)) * ulp  # one weight's final spread
    moved = weights.astype(np.float64)
    assert np.all(moved < 1.0)
    assert np.all(np.abs(moved - expected) < 5 * sigma_one)
    # The mean over the independent weights: 3 sigma of the mean.
    assert abs(moved.mean() - expected) < 3 * sigma_one / math.sqrt(N_WEIGHTS)


def test_reproducible_for_a_seed_and_different_for_another():
    first, _ = _train(True, seed=5)
    again, _ = _train(True, seed=5)
    other, _ = _train(True, seed=6)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_stochastic_round_is_unbiased_and_exact_values_stay():
    """The helper against its definition: P(up) = (x - lo) / (hi - lo)."""
    generator = torch.Generator().manual_seed(0)
    lo = torch.tensor(1.0, dtype=torch.float16)
    hi = torch.nextafter(lo, torch.tensor(2.0, dtype=torch.float16))
    x = torch.full((20000,), float(lo) + 0.3 * (float(hi) - float(lo)))
    rounded = stochastic_round(x, generator)
    assert set(rounded.unique().tolist()) == {float(lo), float(hi)}
    share_up = (rounded == hi).double().mean().item()
    sigma = math.sqrt(0.3 * 0.7 / x.numel())
    assert abs(share_up - 0.3) < 4 * sigma
    exact = torch.tensor([0.5, -2.0, 0.0, 65504.0])
    assert torch.equal(stochastic_round(exact, generator).float(), exact)
    assert torch.isinf(stochastic_round(torch.tensor([1e6]), generator)).all()


def test_matmul_results_round_stochastically_in_inference():
    """A float16 MatMul with stochastic rounding: every result is one of the two float16
    neighbours of the float32 product, and the mean error over many results is ~0."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 16)).astype(np.float16)
    b = rng.standard_normal((16, 64)).astype(np.float16)
    builder = popart.Builder()
    ia = builder.addInputTensor(popart.TensorInfo("FLOAT16", [64, 16]), "a")
    ib = builder.addInputTensor(popart.TensorInfo("FLOAT16", [16, 64]), "b")
    y = builder.aiOnnx.matmul([ia, ib])
    builder.addOutputTensor(y)
    options = popart.SessionOptions()
    options.enableStochasticRounding = True
    session = popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, [y]),
                                      popart.DeviceManager().createCpuDevice(),
                                      userOptions=options)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({ia: a, ib: b}, anchors))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    got = anchors[y].astype(np.float64)
    down = np.nextafter(got.astype(np.float16), np.float16(-np.inf)).astype(np.float64)
    up = np.nextafter(got.astype(np.float16), np.float16(np.inf)).astype(np.float64)
    assert np.all((exact >= down - 1e-3) & (exact <= up + 1e-3))
    nearest = exact.astype(np.float16).astype(np.float64)
    assert np.mean(got != nearest) > 0.05  # some results went to the farther neighbour
    ulps = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
    bias = np.mean((got - exact) / ulps)
    assert abs(bias) < 0.05


class _Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(N_WEIGHTS, dtype=torch.float16))

    def forward(self, x):
        return (self.w * x).float().sum()


@pytest.mark.parametrize("enabled", [False, True])
def test_poptorch_precision_option_rounds_half_updates(enabled):
    """Precision.enableStochasticRounding: a half parameter at 1.0 moved by 20 SGD steps of
    -1e-4 stays at 1.0 without it and moves down with it."""
    import poptorch_lite as poptorch

    model = _Scale()
    opts = poptorch.Options().deviceIterations(20)
    opts.Precision.enableStochasticRounding(enabled)
    wrapper = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=1.0))
    wrapper(torch.full((20, N_WEIGHTS), 1e-4, dtype=torch.float16))
    wrapper.copyWeightsToHost()
    if enabled:
        expected = 1.0 - 20 * float(torch.tensor(1e-4, dtype=torch.float16))
        assert (model.w < 1.0).any()
        assert abs(model.w.double().mean().item() - expected) < 2e-3
    else:
        assert torch.all(model.w == 1.0)
    wrapper.destroy()


def _replicated_options(stochastic: bool = True):
    options = popart.SessionOptions()
    options.enableStochasticRounding = stochastic
    options.enableReplicatedGraphs = True
    options.replicatedGraphCount = 2
    return options


def test_replicas_round_kernel_results_differently_and_weight_updates_alike():
    """Two replicas fed the same data: their float16 MatMul results round differently (each
    replica draws its own), their weight updates round alike (the weights stay equal)."""
    rf, steps = 2, 20
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT16", [8, N_WEIGHTS]), "x")
    w = builder.addInitializedInputTensor(np.ones((N_WEIGHTS, 4), np.float16), "w")
    y = builder.aiOnnx.matmul([x, w])
    loss = builder.aiGraphcore.l1loss([y], 1e-4, reduction=popart.ReductionType.Sum)
    updated = "UpdatedVar___" + w
    session = popart.TrainingSession(
        fnModel=builder.getModelProto(),
        dataFlow=popart.DataFlow(steps, {y: popart.AnchorReturnType("All"),
                                         updated: popart.AnchorReturnType("All")}),
        loss=loss, optimizer=popart.ConstSGD(1.0), userOptions=_replicated_options(),
        deviceInfo=popart.DeviceManager().createIpuModelDevice({"numIPUs": rf}))
    session.prepareDevice()
    session.weightsFromHost()
    feed = np.random.default_rng(1).standard_normal((8, N_WEIGHTS)).astype(np.float16) * 0.1
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: np.broadcast_to(feed, (steps, rf, 8, N_WEIGHTS)).copy()},
                                anchors))
    ys, weights = anchors[y], anchors[updated]
    assert ys.shape[:2] == (steps, rf) and weights.shape[:2] == (steps, rf)
    assert not np.array_equal(ys[0, 0], ys[0, 1])
    np.testing.assert_array_equal(weights[:, 0], weights[:, 1])
    assert not np.all(weights[-1, 0] == np.float16(1.0))
