"""Pipelined training sessions (spec §5.1; F62, F64–F69), compared with the plain run and with a
stale-weights reference written from the spec's cycle table.

- With gradient accumulation all micro-batches of a step see the same weights: the weights
  equal the single-IPU, unpipelined run's (F68).
- Without it each backward stage updates its weights as it runs (F69): the reference below
  walks the cycles ``c = 0 .. G+P-2`` and, in stage order, runs stage s on micro-batch c - s
  with per-layer backprop written out by hand (no code of ours).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart

from .pipeline_models import (
    D,
    LAMBDA,
    MB,
    assert_weights_close,
    chain_weights,
    options,
    read_weights,
    train,
    training_session,
)


def _x(bps: int, af: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (bps, af, MB, D) if af > 1 else (bps, MB, D)
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("ipus", [2, 4])
def test_pipelined_accumulation_equals_single_ipu_run_F68(ipus):
    weights, x = chain_weights(ipus, seed=ipus), _x(bps=2, af=2 * ipus)
    want, want_loss, _ = train(weights, x, 1, options(af=2 * ipus), bps=2, model_ipus=ipus,
                               place=False)
    got, got_loss, session = train(weights, x, ipus, options(ipus, True, af=2 * ipus), bps=2)
    assert session._program.num_stages == 2 * ipus - 1
    assert_weights_close(got, want)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)


def test_pipeline_stages_inferred_from_virtual_graphs_F64():
    weights, x = chain_weights(2, seed=5), _x(bps=1, af=4)
    want, _, _ = train(weights, x, 1, options(af=4), bps=1, model_ipus=2, place=False)
    got, _, session = train(weights, x, 2, options(2, True, af=4), bps=1, stages=False)
    stages = {op.settings.pipeline_stage for op in session.getIr().main.ops.values()
              if op.settings.pipeline_stage is not None}
    assert stages == {0, 1, 2}
    assert_weights_close(got, want)


def test_pipelined_mean_post_reduction_equals_single_ipu_run_F68():
    weights, x = chain_weights(2, seed=6), _x(bps=1, af=3)
    mean = {"accumulationAndReplicationReductionType": popart.ReductionType.Mean,
            "meanAccumulationAndReplicationReductionStrategy": popart.MeanReductionStrategy.Post}
    want, _, _ = train(weights, x, 1, options(af=3, **mean), bps=1, model_ipus=2, place=False)
    got, _, _ = train(weights, x, 2, options(2, True, af=3, **mean), bps=1)
    assert_weights_close(got, want)


# --- stale weights ---------------------------------------------------------------------------


def stale_weights_reference(weights, x, lr):
    """Train the chain with the §5.1 cycle schedule, one SGD update per micro-batch in its
    backward stage. Layer k is stage k; the loss and the last layer's backward are stage L."""
    w = [torch.tensor(v, dtype=torch.float32) for v in weights]
    layers = len(w)
    last = layers - 1  # L
    stages, depth = 2 * last + 1, x.shape[0]
    acts: dict[int, list] = {}  # micro-batch -> [h_0, h_1, ...] as computed in forward
    grads: dict[int, torch.Tensor] = {}  # micro-batch -> gradient wrt the next layer's input
    losses = [None] * depth

    def backward_layer(k, i, grad_out):
        h_in, h_out = acts[i][k], acts[i][k + 1]
        dz = grad_out * (1 - h_out * h_out)
        grad_in = dz @ w[k].T  # the weight as it is now, before this stage's update
        w[k] -= lr * (h_in.T @ dz)
        return grad_in

    for c in range(depth + stages - 1):
        for s in range(stages):
            if not s <= c < s + depth:
                continue
            i = c - s
            if s < last:
                if s == 0:
                    acts[i] = [torch.from_numpy(x[i])]
                acts[i].append(torch.tanh(acts[i][s] @ w[s]))
            elif s == last:
                if s == 0:
                    acts[i] = [torch.from_numpy(x[i])]
                h = torch.tanh(acts[i][s] @ w[s])
                acts[i].append(h)
                losses[i] = LAMBDA * h.abs().mean()
                grads[i] = backward_layer(s, i, LAMBDA * torch.sign(h) / h.numel())
            else:
                grads[i] = backward_layer(2 * last - s, i, grads[i])
    return {f"w{k}": v.numpy() for k, v in enumerate(w)}, np.array([v.item() for v in losses])


@pytest.mark.parametrize("ipus", [2, 3])
def test_pipelining_without_accumulation_has_stale_weights_F69(ipus):
    bps = 2 * ipus + 1
    weights, x = chain_weights(ipus, seed=10 + ipus), _x(bps=bps, af=1)
    want, want_loss = stale_weights_reference(weights, x, lr=0.1)
    got, got_loss, _ = train(weights, x, ipus, options(ipus, True), bps=bps)
    assert_weights_close(got, want)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    # And it differs from the unpipelined run, which updates before every forward.
    plain, _, _ = train(weights, x, 1, options(), bps=bps, model_ipus=ipus, place=False)
    assert max(np.abs(plain[k] - got[k]).max() for k in got) > 1e-4


def test_sharded_training_equals_plain_run_F20():
    weights, x = chain_weights(4, seed=7), _x(bps=3, af=1)
    want, want_loss, _ = train(weights, x, 1, options(), bps=3, model_ipus=4, place=False)
    got, got_loss, session = train(weights, x, 4, options(4), bps=3, stages=False)
    assert session._program.ipus_per_replica == 4
    copies = [op for op in session.getIr().main.ops.values() if op.op_type == "IpuCopy"]
    assert copies  # activations forward and gradients backward cross IPUs
    assert_weights_close(got, want)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)


def test_pipelined_training_with_step_io_callbacks():
    weights, x = chain_weights(2, seed=8), _x(bps=1, af=4)
    want, want_loss, _ = train(weights, x, 2, options(2, True, af=4), bps=1)
    session, _, ids = training_session(weights, 2, options(2, True, af=4), bps=1)
    chunks = list(x.reshape(-1, MB, D))
    losses = []

    def output_callback(tensor_id):
        losses.append(np.zeros((), np.float32))
        return losses[-1]

    stepio = popart.PyStepIOCallback(lambda tensor_id, prefetch: chunks.pop(0),
                                     lambda tensor_id: None, output_callback,
                                     lambda tensor_id: None)
    session.run(stepio)
    assert_weights_close(read_weights(session, ids), want)
    np.testing.assert_allclose(np.array(losses), want_loss.reshape(-1), rtol=1e-6)
