"""Replicated training (spec §5.3; F71–F73, DESIGN decision 6): every replica holds its own
state and trains on its own micro-batch; gradients are all-reduced, so rf replicas equal the
single-replica run on the combined batch (Mean) or the summed gradient (Sum), with and without
gradient accumulation and pipelining."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.device.pipeline_cost import host_sync_ipus
from popart_backend.ir.op import ExecutionContext
from tests.session.replication_models import (
    D_IN,
    assert_weights_close,
    options,
    params,
    read_weights,
    session,
    train,
)

MB, BPS = 2, 2


def _x(bps: int, af: int, rf: int, mb: int = MB, seed: int = 1) -> np.ndarray:
    """Inputs in the §4.1 layout [bps, af, rf, mb, D]."""
    return np.random.default_rng(seed).standard_normal((bps, af, rf, mb, D_IN)).astype(np.float32)


def _combined(x: np.ndarray) -> np.ndarray:
    """The same samples as one micro-batch per weight update: [bps, af·rf·mb, D]."""
    bps = x.shape[0]
    return x.reshape(bps, -1, D_IN)


@pytest.mark.parametrize("mean", [True, False], ids=["Mean", "Sum"])
@pytest.mark.parametrize("rf,af", [(2, 1), (4, 1), (2, 3), (4, 2)])
def test_replicas_equal_the_combined_batch_F71_F73(rf, af, mean):
    p = params()
    x = _x(BPS, af, rf)
    got, anchors, _ = train(p, x, MB, BPS, options(rf, af, mean=mean), mean=mean)
    want, _, _ = train(p, _combined(x), MB * rf * af, BPS, options(mean=mean), mean=mean)
    assert_weights_close(got, want)
    # The loss anchor has the replica dimension (§4.2): [bps, af, rf] after dropping 1s.
    assert anchors[next(iter(anchors))].shape == tuple(d for d in (BPS, af, rf) if d > 1)


@pytest.mark.parametrize("strategy", [popart.MeanReductionStrategy.Running,
                                      popart.MeanReductionStrategy.Post,
                                      popart.MeanReductionStrategy.PostAndLoss])
def test_mean_strategies_divide_by_af_and_rf_F73(strategy):
    p, rf, af = params(), 2, 2
    x = _x(BPS, af, rf)
    got, _, _ = train(p, x, MB, BPS, options(rf, af, strategy=strategy))
    want, _, _ = train(p, _combined(x), MB * rf * af, BPS, options())
    assert_weights_close(got, want)


@pytest.mark.parametrize("rf,af", [(2, 4), (4, 3)])
def test_pipelined_accumulated_replicas_equal_the_combined_batch_F71(rf, af):
    p = params()
    x = _x(BPS, af, rf)
    got, _, s = train(p, x, MB, BPS, options(rf, af, stages=True), stages=True)
    assert s.getIr().main.ops  # pipelined on 2 IPUs per replica, 2·rf IPUs in all
    want, _, _ = train(p, _combined(x), MB * rf * af, BPS, options())
    assert_weights_close(got, want)


@pytest.mark.parametrize("mean", [True, False], ids=["Mean", "Sum"])
def test_pipelined_replicas_without_accumulation_keep_stale_weight_semantics_F71(mean):
    # Without accumulation a pipeline updates weights per micro-batch with stale weights
    # (§5.1); replication must not change that: rf replicas equal the pipelined single-replica
    # run whose micro-batch holds the same samples.
    p, rf, bps = params(), 2, 4
    x = _x(bps, 1, rf)
    got, _, _ = train(p, x, MB, bps, options(rf, stages=True, mean=mean), stages=True,
                      mean=mean)
    want, _, _ = train(p, _combined(x), MB * rf, bps, options(stages=True, mean=mean),
                       stages=True, mean=mean)
    assert_weights_close(got, want)


def test_sum_reduction_uses_the_summed_gradient_F73():
    # A hand-written reference: one SGD step with the gradient summed over the replicas.
    p, rf = params(), 4
    x = _x(1, 1, rf)
    got, _, _ = train(p, x, MB, 1, options(rf, mean=False), mean=False,
                      optimizer=popart.ConstSGD(0.05))
    w = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    total = 0
    for r in range(rf):
        xr = torch.from_numpy(x[0, 0, r])
        y = torch.tanh(torch.relu(xr @ w["w0"] + w["b0"]) @ w["w1"])
        total = total + 0.5 * y.abs().sum()
    total.backward()
    want = {k: (v - 0.05 * v.grad).detach().numpy() for k, v in w.items()}
    assert_weights_close(got, want)


def test_each_replica_holds_its_own_state_and_they_stay_equal_F71():
    p, rf = params(), 2
    s, loss = session(p, MB, 1, options(rf))
    plan = s._device.plan
    w_slot = plan.slot["w0"]
    storages = {values[w_slot].data_ptr() for values in plan.replica_values}
    assert len(storages) == rf  # separate device storage per replica
    out = s.initAnchorArrays()
    x = _x(1, 1, rf)
    s.run(popart.PyStepIO({"x": x}, out))
    device = s._device
    ids = ["w0", "b0", "w1", "Accl___w0"]
    replica0 = device.read_weights(ids, replica=0)
    replica1 = device.read_weights(ids, replica=1)
    for tid in ids:
        np.testing.assert_array_equal(replica0[tid], replica1[tid], err_msg=tid)
    # Each replica computed the loss of its own micro-batch (chunk r of the input).
    w0, b0, w1 = (p[k] for k in ("w0", "b0", "w1"))
    for r in range(rf):
        y = np.tanh(np.maximum(x[0, 0, r] @ w0 + b0, 0) @ w1)
        np.testing.assert_allclose(out[loss][r], 0.5 * np.abs(y).mean(), rtol=1e-5)


def test_gradient_anchor_is_the_replicas_own_gradient_F72():
    p, rf = params(), 2
    x = _x(1, 1, rf)
    _, out, _ = train(p, x, MB, 1, options(rf), anchors=("Gradient___w1",))
    grads = out["Gradient___w1"]
    assert grads.shape == (rf, *p["w1"].shape)
    assert not np.allclose(grads[0], grads[1])  # before the all-reduce: per replica


def test_all_reduce_in_the_ir_F71():
    p = params()
    s, _ = session(p, MB, 1, options(2, 2))
    reduces = [op for op in s.getIr().main.ops.values() if op.op_type == "ReplicatedAllReduce"]
    assert sorted(op.inputs[0].id for op in reduces) == ["Accum___b0", "Accum___w0",
                                                         "Accum___w1"]
    assert {op.settings.execution_context for op in reduces} == {
        ExecutionContext.AccumulateOuterFragment}


def test_write_weights_reach_every_replica_F71():
    p, rf = params(), 2
    s, _ = session(p, MB, 1, options(rf))
    new = {k: v + 1 for k, v in p.items()}
    s.writeWeights(popart.PyWeightsIO(new))
    s.weightsFromHost()
    for r in range(rf):
        values = s._device.read_weights(list(p), replica=r)
        for k in p:
            np.testing.assert_array_equal(values[k], new[k])
    assert_weights_close(read_weights(s, p), new)


def test_device_needs_a_multiple_of_rf_ipus_F71():
    with pytest.raises(popart.popart_exception, match="replicatedGraphCount = 2 replicas"):
        session(params(), MB, 1, options(2), ipus=3)


@pytest.mark.parametrize("pattern,stalled", [
    (popart.SyncPattern.Full, {0, 1, 2, 3}),
    (popart.SyncPattern.SinglePipeline, {1}),
    (popart.SyncPattern.ReplicaAndLadder, {1, 3}),
])
def test_sync_pattern_on_acquisition_decides_which_ipus_stall_on_host_io_F76_F77(pattern,
                                                                                  stalled):
    device = popart.DeviceManager().acquireAvailableDevice(4, pattern=pattern)
    try:
        assert device.syncPattern is pattern
        # IPU 1 streams data from the host: which IPUs wait for that sync.
        assert host_sync_ipus(device.syncPattern, device.numIpus, [1]) == stalled
        # Replicated training runs on it; the pattern changes no value.
        p, rf = params(), 4
        x = _x(1, 1, rf)
        s, _ = session(p, MB, 1, options(rf, mean=False), mean=False, device=device)
        s.run(popart.PyStepIO({"x": x}, s.initAnchorArrays()))
        want, _, _ = train(p, _combined(x), MB * rf, 1, options(mean=False), mean=False)
        assert_weights_close(read_weights(s, p), want)
    finally:
        device.detach()
