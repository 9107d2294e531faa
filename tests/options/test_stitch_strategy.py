"""``autodiffSettings.stitchStrategy`` in training: our subgraph gradients recompute the forward
body (RecomputeAllNonInputs, the default). RecomputeMinimal trains the same (logged); the
AddFwdOutputs strategies return the forward values as extra outputs (same numbers, not logged;
their IR, memory and cycles: tests/transforms/test_autodiff_stitch.py); without a subgraph every
strategy is logged as having no effect. Weights are checked against numpy."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.options import checks
from tests.helpers import sgd_step

S = popart.AutodiffStitchStrategy
RNG = np.random.default_rng(12)
W0 = RNG.standard_normal(3).astype(np.float32)
X0 = RNG.standard_normal(3).astype(np.float32)
LR = 0.1


def _train(strategy, with_call: bool) -> np.ndarray:
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]), "x")
    w = b.addInitializedInputTensor(W0, "w")
    h = b.aiOnnx.mul([x, w])
    if with_call:
        callee = b.createSubgraphBuilder()
        arg = callee.addUntypedInputTensor()
        callee.addOutputTensor(callee.aiOnnx.sin([arg]))
        (s,) = b.aiGraphcore.call([h], 1, callee)
    else:
        s = b.aiOnnx.sin([h])
    loss = b.aiGraphcore.l1loss([s], 1.0, reduction=popart.ReductionType.Sum)
    opts = popart.SessionOptions()
    opts.autodiffSettings = popart.AutodiffSettings(stitchStrategy=strategy)
    return sgd_step(b.getModelProto(), loss, {x: X0}, w, W0, LR, opts)[0]


def _reference() -> np.ndarray:
    h = X0 * W0
    return W0 - LR * np.sign(np.sin(h)) * np.cos(h) * X0


@pytest.fixture(autouse=True)
def _fresh_log(monkeypatch):
    monkeypatch.setattr(checks, "_STITCH_LOGGED", set())  # logged once per process


@pytest.mark.parametrize("strategy", list(S), ids=[s.name for s in S])
def test_stitch_strategy_without_subgraphs_has_no_effect(strategy, caplog):
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        np.testing.assert_allclose(_train(strategy, False), _reference(), rtol=1e-5, atol=1e-6)
    logged = "has no subgraph" in caplog.text
    assert logged is (strategy is not S.RecomputeAllNonInputs)


@pytest.mark.parametrize("strategy", [S.RecomputeAllNonInputs, S.RecomputeMinimal])
def test_recompute_strategies_train_a_called_body(strategy, caplog):
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        np.testing.assert_allclose(_train(strategy, True), _reference(), rtol=1e-5, atol=1e-6)
    assert ("recomputes its whole forward body" in caplog.text) is (
        strategy is S.RecomputeMinimal)


@pytest.mark.parametrize("strategy", [S.AddFwdOutputs, S.SafeAddFwdOutputs])
def test_add_fwd_outputs_strategies_train_a_called_body(strategy, caplog):
    with caplog.at_level(logging.WARNING):
        np.testing.assert_allclose(_train(strategy, True), _reference(), rtol=1e-5, atol=1e-6)
    assert "stitchStrategy" not in caplog.text  # built: nothing to log
