"""Pipelined gradient accumulation with the Mean reduction's Running strategy (spec §5.1, §5.3;
F68, F73): every MeanReductionStrategy gives the same math, pipelined or not.

Each backward stage works on another micro-batch in a cycle, so each stage counts its own
micro-batches (``grad_accumulation.count_per_stage``). The weights after a few steps must
equal the unpipelined Running run, the Post runs (within float rounding), and a torch
reference that averages the micro-batch gradients before each optimizer step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart

from .pipeline_models import (
    LAMBDA,
    MB,
    D,
    chain_model,
    chain_weights,
    device,
    options,
    read_weights,
)

S = popart.MeanReductionStrategy
STEPS = 2  # runs of the session, each of BPS weight updates
BPS = 2
LR, MOMENTUM = 0.1, 0.9
ADAM = {"lr": 0.01, "betas": (0.8, 0.95), "eps": 1e-5}


def _ov(value: float):
    return popart.OptimizerValue(value, True)


def _optimizer(kind: str):
    if kind == "sgd":
        return popart.SGD({"defaultLearningRate": _ov(LR), "defaultMomentum": _ov(MOMENTUM)})
    beta1, beta2 = ADAM["betas"]
    return popart.Adam({"defaultLearningRate": _ov(ADAM["lr"]), "defaultBeta1": _ov(beta1),
                        "defaultBeta2": _ov(beta2), "defaultEps": _ov(ADAM["eps"])},
                       popart.AdamMode.Adam, popart.WeightDecayMode.Decay)


def _mean(strategy) -> dict:
    return {"accumulationAndReplicationReductionType": popart.ReductionType.Mean,
            "meanAccumulationAndReplicationReductionStrategy": strategy}


def _x(af: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((STEPS, BPS, af, MB, D)).astype(np.float32)


def _train(weights, x, ipus: int, pipelined: bool, strategy, kind: str):
    """Final weights after ``STEPS`` runs; the chain on ``ipus`` pipeline stages or one IPU."""
    af = x.shape[2]
    proto, loss, ids = chain_model(weights, ipus, place=pipelined)
    opts = options(ipus, True, af=af, **_mean(strategy)) if pipelined else options(
        af=af, **_mean(strategy))
    flow = popart.DataFlow(BPS, {loss: popart.AnchorReturnType("Final")})
    session = popart.TrainingSession(proto, flow, loss, _optimizer(kind),
                                     device(ipus if pipelined else 1), userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    for step in x:
        session.run(popart.PyStepIO({"x": np.ascontiguousarray(step)}, anchors))
    return read_weights(session, ids), session


def _torch_reference(weights, x, kind: str) -> dict[str, np.ndarray]:
    """The chain in torch: per update, the mean of the micro-batches' gradients, one step."""
    w = [torch.tensor(v, requires_grad=True) for v in weights]
    opt = (torch.optim.SGD(w, lr=LR, momentum=MOMENTUM) if kind == "sgd"
           else torch.optim.Adam(w, **ADAM))
    for micro_batches in x.reshape(-1, *x.shape[2:]):
        opt.zero_grad()
        for xb in micro_batches:
            h = torch.from_numpy(xb)
            for wk in w:
                h = torch.tanh(h @ wk)
            (LAMBDA * h.abs().mean() / len(micro_batches)).backward()
        opt.step()
    return {f"w{k}": v.detach().numpy() for k, v in enumerate(w)}


def _close(got: dict, want: dict, rtol: float, atol: float) -> None:
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=rtol, atol=atol, err_msg=key)


# Forward stages = IPUs; P = 2·ipus − 1 stages must fit the accumulation factor (depth rule).
@pytest.mark.parametrize("ipus, af", [(2, 4), (3, 6)])
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_pipelined_running_mean_equals_unpipelined_running_and_post_F68_F73(ipus, af, kind):
    weights, x = chain_weights(ipus, seed=20 + ipus), _x(af, seed=ipus)
    got, session = _train(weights, x, ipus, True, S.Running, kind)
    assert session._program.num_stages == 2 * ipus - 1
    running, _ = _train(weights, x, ipus, False, S.Running, kind)
    post, _ = _train(weights, x, ipus, False, S.Post, kind)
    pipelined_post, _ = _train(weights, x, ipus, True, S.Post, kind)
    # The same ops in the same order per accumulator: the same numbers.
    _close(got, running, rtol=1e-6, atol=1e-7)
    # Running rounds differently from Post's sum-then-divide.
    _close(got, post, rtol=1e-5, atol=1e-6)
    _close(pipelined_post, post, rtol=1e-6, atol=1e-7)
    _close(got, _torch_reference(weights, x, kind), rtol=1e-5, atol=1e-6)
    # Something moved: the comparison is not between untouched weights.
    assert max(np.abs(got[k] - w).max() for k, w in zip(sorted(got), weights)) > 1e-3
