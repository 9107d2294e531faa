"""The run journal (ops/state_journal.py) that replaced the copy-everything run snapshot: the
first write of a state tensor in a run goes out of place into a ping-pong buffer and the
storages swap, so a failed run can be undone without copying all state before every run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.ops.state_journal import StateJournal

TABLE, WIDTH, OUT, ROWS = 5, 4, 3, 2


def test_journal_settles_out_of_place_writes_and_rolls_them_back():
    x = torch.arange(6, dtype=torch.float32)
    start = x.clone()
    journal = StateJournal()
    journal.begin()
    out = journal.spare_for(x)
    assert out is not x
    torch.add(x, 1.0, out=out)
    journal.settle(x, out)
    torch.testing.assert_close(x, start + 1, rtol=0, atol=0)
    assert journal.spare_for(x) is x  # later writes of the run go in place
    x.mul_(2.0)
    journal.rollback()
    torch.testing.assert_close(x, start, rtol=0, atol=0)


def test_journal_reuses_two_buffers_per_tensor_in_steady_state():
    """Ten committed runs: x's storage alternates between two buffers, no third is made."""
    x = torch.zeros(8)
    journal = StateJournal()
    addresses = set()
    for _ in range(10):
        journal.begin()
        out = journal.spare_for(x)
        torch.add(x, 1.0, out=out)
        journal.settle(x, out)
        journal.commit()
        addresses.add(x.data_ptr())
    assert len(addresses) == 2
    torch.testing.assert_close(x, torch.full((8,), 10.0), rtol=0, atol=0)


def test_pinned_tensor_keeps_its_storage_so_views_stay_views():
    x = torch.arange(4, dtype=torch.float32)
    view = x[1:]
    address = x.data_ptr()
    journal = StateJournal()
    journal.begin([x])
    out = journal.spare_for(x)
    assert out is x  # saved by copy, written in place
    out.add_(5.0)
    journal.settle(x, out)
    torch.testing.assert_close(view, torch.tensor([6.0, 7.0, 8.0]), rtol=0, atol=0)
    journal.rollback()
    assert x.data_ptr() == address
    torch.testing.assert_close(view, torch.tensor([1.0, 2.0, 3.0]), rtol=0, atol=0)


def test_save_then_in_place_write_is_copied_back_on_rollback():
    x = torch.ones(3)
    journal = StateJournal()
    journal.begin()
    journal.save(x)
    x.mul_(3.0)
    journal.rollback()
    torch.testing.assert_close(x, torch.ones(3), rtol=0, atol=0)
    journal.save(x)  # closed: no effect
    x.mul_(3.0)
    torch.testing.assert_close(x, torch.full((3,), 3.0), rtol=0, atol=0)


def _session(optimizer, bps: int = 2, accumulation: int = 1):
    builder = popart.Builder()
    rng = np.random.default_rng(0)
    table = builder.addInitializedInputTensor(rng.standard_normal((TABLE, WIDTH), np.float32),
                                              "table")
    weight = builder.addInitializedInputTensor(rng.standard_normal((WIDTH, OUT), np.float32),
                                               "weight")
    idx = builder.addInputTensor(popart.TensorInfo("INT32", [ROWS]), "idx")
    y = builder.aiOnnx.matmul([builder.aiOnnx.gather([table, idx]), weight])
    loss = builder.aiGraphcore.l1loss([y], 0.1)
    options = popart.SessionOptions()
    if accumulation > 1:
        options.enableGradientAccumulation = True
        options.accumulationFactor = accumulation
    session = popart.TrainingSession(
        fnModel=builder.getModelProto(),
        dataFlow=popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")}),
        loss=loss, optimizer=optimizer,
        deviceInfo=popart.DeviceManager().createIpuModelDevice({}), userOptions=options)
    session.prepareDevice()
    session.weightsFromHost()
    return session, idx


def _weights(session) -> dict[str, np.ndarray]:
    arrays = {i: np.empty(session.getInfo(i).shape(), np.float32) for i in ("table", "weight")}
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(arrays))
    return arrays


def _run(session, idx, indices):
    session.run(popart.PyStepIO({idx: indices}, session.initAnchorArrays()))


def _adamw():
    return popart.Adam({"defaultLearningRate": (0.05, False), "defaultWeightDecay": (0.01, True),
                        "defaultBeta1": (0.8, True)}, mode=popart.AdamMode.Adam,
                       weight_decay_mode=popart.WeightDecayMode.Decay)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_failed_adam_run_rolls_back_moments_and_step(accumulation):
    """The last micro-batch fails after earlier ones updated weights, moments, step and
    accumulators out of place; two good runs after it match a session that never failed."""
    good = np.tile(np.array([0, 1], np.int32), 2 * accumulation)
    bad = good.copy()
    bad[-1] = TABLE + 3
    session, idx = _session(_adamw(), accumulation=accumulation)
    reference, ref_idx = _session(_adamw(), accumulation=accumulation)
    _run(session, idx, good)
    _run(reference, ref_idx, good)
    before = _weights(session)
    with pytest.raises(popart.popart_exception):
        _run(session, idx, bad)
    assert all(before[k].tobytes() == v.tobytes() for k, v in _weights(session).items())
    for _ in range(2):
        _run(session, idx, good)
        _run(reference, ref_idx, good)
    expected = _weights(reference)
    assert all(expected[k].tobytes() == v.tobytes() for k, v in _weights(session).items())


def test_steady_state_runs_make_no_new_state_buffers():
    """Ten SGD-with-momentum runs: every variable's storage is one of two buffers (its own and
    its ping-pong spare), and no run copies the state up front. (Kernels still allocate their
    outputs and temporaries: there is no static activation arena yet.)"""
    optimizer = popart.SGD({"defaultLearningRate": (0.1, False),
                            "defaultMomentum": (0.9, False)})
    session, idx = _session(optimizer)
    plan = session._device.plan
    slots = [plan.slot[t] for t in plan.variable_ids]
    seen: dict[int, set[int]] = {s: set() for s in slots}
    for _ in range(10):
        _run(session, idx, np.array([0, 1, 2, 3], np.int32))
        for s in slots:
            value = plan.values[s]
            if isinstance(value, torch.Tensor) and value.numel():
                seen[s].add(value.data_ptr())
    assert max(len(a) for a in seen.values()) == 2  # the weights do ping-pong
    assert all(len(a) <= 2 for a in seen.values())
    # Up front, at most the random seed (2 values) is copied, not the weights and momenta.
    assert sum(t.numel() for t in session._device._state._live) <= 2


def test_spares_of_dropped_tensors_are_released():
    """A slot rebound to new tensors run after run (e.g. weights written as new shards) does not
    grow the journal's buffer table without bound."""
    journal = StateJournal()
    for _ in range(100):
        x = torch.zeros(3)
        journal.begin()
        out = journal.spare_for(x)
        torch.add(x, 1.0, out=out)
        journal.settle(x, out)
        journal.commit()
    assert len(journal._spares) <= 32
