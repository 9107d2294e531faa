"""Gradient accumulation in a TrainingSession (spec §4.2, §5.3, §11): af micro-batches per weight
update, Sum or Mean reduction with each MeanReductionStrategy, compared with torch eager.

Features: F35, F50, F73, F75.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart

from .training_models import (
    IN,
    MB,
    OUT,
    assert_params_close,
    inputs,
    mlp_params,
    read_weights,
    run,
    torch_train,
    training_session,
)

STRATEGIES = [popart.MeanReductionStrategy.Running, popart.MeanReductionStrategy.Post,
              popart.MeanReductionStrategy.PostAndLoss]


def sgd(lr: float = 0.05):
    return lambda params: torch.optim.SGD(params, lr=lr)


def mean_options(strategy) -> popart.SessionOptions:
    options = popart.SessionOptions()
    options.accumulationAndReplicationReductionType = popart.ReductionType.Mean
    options.meanAccumulationAndReplicationReductionStrategy = strategy
    return options


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_mean_af4_equals_one_step_on_the_4x_batch_F73_F75(strategy):
    params, x = mlp_params(), inputs(1, af=4, seed=20)
    session = training_session(params, popart.ConstSGD(0.05), af=4,
                               options=mean_options(strategy))
    run(session, x)
    # One torch step on the 4x batch, with the loss's Mean over all 16 samples.
    big = x.reshape(1, 1, 4 * MB, IN)
    want = torch_train(params, big, sgd())
    assert_params_close(read_weights(session), want)


def test_sum_af4_uses_the_summed_gradient_F73():
    params, x = mlp_params(1), inputs(2, af=4, seed=21)
    session = training_session(params, popart.ConstSGD(0.02), bps=2, af=4)
    run(session, x)
    assert_params_close(read_weights(session), torch_train(params, x, sgd(0.02), af=4))


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_strategies_agree_with_bps_and_momentum_F73(strategy):
    params, x = mlp_params(2), inputs(3, af=3, seed=22)
    optimizer = popart.SGD({"defaultLearningRate": (0.05, False), "defaultMomentum": (0.9, True),
                            "defaultWeightDecay": (0.01, True)})
    session = training_session(params, optimizer, bps=3, af=3, options=mean_options(strategy))
    run(session, x)
    run(session, x)
    want = torch_train(params, np.concatenate([x, x]), lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.9, weight_decay=0.01), af=3, mean=True)
    assert_params_close(read_weights(session), want)


def test_adam_with_accumulation_matches_torch_F73():
    params, x = mlp_params(3), inputs(2, af=2, seed=23)
    optimizer = popart.Adam({"defaultLearningRate": (0.01, True), "defaultEps": (1e-6, True)})
    session = training_session(params, optimizer, bps=2, af=2,
                               options=mean_options(popart.MeanReductionStrategy.Post))
    run(session, x)
    want = torch_train(params, x, lambda p: torch.optim.Adam(p, lr=0.01, eps=1e-6), af=2,
                       mean=True)
    assert_params_close(read_weights(session), want)


def test_anchor_shapes_and_gradient_anchor_per_micro_batch_F35_F75():
    params, x = mlp_params(4), inputs(2, af=3, seed=24)
    session = training_session(params, popart.ConstSGD(0.05), bps=2, af=3,
                               anchors=("loss", "Gradient___w1", "y"))
    anchors = run(session, x)
    assert anchors["loss"].shape == (2, 3)
    assert anchors["Gradient___w1"].shape == (2, 3, IN, 5)
    assert anchors["y"].shape == (2, 3, MB, OUT)
    grads = []
    torch_train(params, x, sgd(), af=3, grads_out=grads)
    np.testing.assert_allclose(anchors["Gradient___w1"].reshape(6, IN, 5), np.stack(grads),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("art,shape", [("Final", ()), ("Sum", ()), ("All", (2, 3))])
def test_loss_anchor_return_types_with_accumulation_F75(art, shape):
    params, x = mlp_params(5), inputs(2, af=3, seed=25)
    session = training_session(params, popart.ConstSGD(0.05), bps=2, af=3, anchors=("loss",),
                               art=art)
    assert run(session, x)["loss"].shape == shape


def test_accumulation_enabled_with_factor_1_equals_plain_training_F75():
    params, x = mlp_params(6), inputs(3, seed=26)
    session = training_session(params, popart.ConstSGD(0.05), bps=3, af=1, accumulate=True)
    assert session.accumulationFactor == 1
    assert "Accum___w1" in session.getIr().main.tensors
    run(session, x)
    assert_params_close(read_weights(session), torch_train(params, x, sgd()))


def test_accumulators_restart_every_window_and_run_F75():
    """Each run is bps whole windows: the accumulators are zero again after it."""
    params, x = mlp_params(7), inputs(2, af=2, seed=27)
    session = training_session(params, popart.ConstSGD(0.05), bps=2, af=2,
                               options=mean_options(popart.MeanReductionStrategy.Running))
    run(session, x)
    state = read_weights(session, ["Accum___w1", "Counter___accumulation"])
    assert not state["Accum___w1"].any() and state["Counter___accumulation"] == 0


def test_input_layout_is_bps_af_mb_F75():
    """Chunk k = b·af + a feeds batch b, accumulation step a (§4.1, rf = 1)."""
    params = mlp_params(8)
    x = inputs(2, af=2, seed=28)
    session = training_session(params, popart.ConstSGD(0.05), bps=2, af=2, anchors=("y",))
    y = run(session, x.reshape(-1))["y"]  # only the element count is enforced
    assert y.shape == (2, 2, MB, OUT)
    # The first micro-batch ran with the initial weights.
    h = np.maximum(x[0, 0] @ params["w1"] + params["b1"], 0)
    np.testing.assert_allclose(y[0, 0], h @ params["w2"] + params["b2"], rtol=1e-5, atol=1e-6)


def test_accum_type_sets_the_accumulator_dtype_F73():
    params, x = mlp_params(9), inputs(2, af=2, seed=29)
    optimizer = popart.SGD({"defaultLearningRate": (0.05, True)},
                           accumType=popart.DataType.FLOAT16)
    session = training_session(params, optimizer, bps=2, af=2)
    assert session.getIr().main.tensors["Accum___w1"].info.dtype is popart.DataType.FLOAT16
    run(session, x)
    want = torch_train(params, x, sgd(), af=2)
    assert_params_close(read_weights(session), want, rtol=2e-3, atol=2e-3)
