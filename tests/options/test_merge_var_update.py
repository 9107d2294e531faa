"""SessionOptions.mergeVarUpdate, mergeVarUpdateMemThreshold, looseThresholdAtPeak (training):
merged weight updates pay one sync per group and hold a concatenated gradient buffer (the
group's weight bytes); the trained weights are those of the unmerged run."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart
from tests.session.pipeline_models import D, MB, chain_model, chain_weights

LAYERS = 3
WEIGHT_BYTES = D * D * 4


def _train(kind=popart.MergeVarUpdateType.Off, threshold=None, loose=None):
    weights = chain_weights(LAYERS)
    proto, loss, ids = chain_model(weights, 1, stages=False, place=False)
    opts = popart.SessionOptions()
    opts.mergeVarUpdate = kind
    if threshold is not None:
        opts.mergeVarUpdateMemThreshold = threshold
    if loose is not None:
        opts.looseThresholdAtPeak = loose
    opts.engineOptions = {"autoReport.all": "true"}
    session = popart.TrainingSession(
        proto, popart.DataFlow(1, [loss]), loss, popart.ConstSGD(0.1),
        popart.DeviceManager().createIpuModelDevice({}), userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    x = np.random.default_rng(5).standard_normal((MB, D)).astype(np.float32)
    session.run(popart.PyStepIO({"x": x}, session.initAnchorArrays()))
    out = {w: np.zeros((D, D), np.float32) for w in ids}
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(out))
    model = session.getReport().model
    buffers = sorted(t.num_bytes for t in model.memory.ipus[0].tensors
                     if t.id.startswith("MergedVarUpdate/"))
    return [out[w] for w in ids], model, buffers


@pytest.fixture(scope="module")
def off():
    return _train()


@pytest.mark.parametrize("kind,threshold,loose,groups", [
    (popart.MergeVarUpdateType.All, None, None, [LAYERS]),
    # Tight: a group may not exceed the threshold, so two weights, then one alone.
    (popart.MergeVarUpdateType.AutoTight, 2 * WEIGHT_BYTES, None, [2]),
    # Loose with a huge peak allowance: the threshold decides, closing at two weights.
    (popart.MergeVarUpdateType.AutoLoose, 2 * WEIGHT_BYTES, 10**9, [2]),
    # Loose with a threshold of one weight: every group closes at once, nothing merges.
    (popart.MergeVarUpdateType.AutoLoose, WEIGHT_BYTES, 10**9, []),
])
def test_merged_updates_sync_once_per_group_and_hold_a_buffer(off, kind, threshold, loose,
                                                              groups):
    weights_off, model_off, buffers_off = off
    weights, model, buffers = _train(kind, threshold, loose)
    for mine, reference in zip(weights, weights_off):
        np.testing.assert_array_equal(mine, reference)
    assert buffers_off == []
    assert buffers == sorted(n * WEIGHT_BYTES for n in groups)
    saved_syncs = sum(n - 1 for n in groups)
    assert (model_off.cycles.step_cycles - model.cycles.step_cycles
            == saved_syncs * model.spec.sync_latency_cycles)


def test_negative_threshold_is_refused():
    with pytest.raises(popart.popart_exception, match="mergeVarUpdateMemThreshold"):
        _train(popart.MergeVarUpdateType.AutoTight, -1)
