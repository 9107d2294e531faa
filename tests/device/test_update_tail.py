"""The trailing SGD updates of a one-micro-batch run, fused into one in-place
``torch._fused_sgd_`` call after the anchor writes (device/update_tail.py): numbers as
torch.optim.SGD, a failed run still changes no state, and the steps stay as they are when
something reads the weights after them or the updates differ."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart

BATCH, IN, HIDDEN, OUT = 4, 6, 5, 3
LR, MOMENTUM = 0.05, 0.9


def _start():
    rng = np.random.default_rng(0)
    return {"w1": rng.standard_normal((IN, HIDDEN)).astype(np.float32),
            "w2": rng.standard_normal((HIDDEN, OUT)).astype(np.float32)}


def _session(optimizer, anchor_weight: bool = False):
    builder = popart.Builder()
    start = _start()
    w1 = builder.addInitializedInputTensor(start["w1"], "w1")
    w2 = builder.addInitializedInputTensor(start["w2"], "w2")
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [BATCH, IN]), "x")
    y = builder.aiOnnx.matmul([builder.aiOnnx.relu([builder.aiOnnx.matmul([x, w1])]), w2])
    loss = builder.aiGraphcore.l1loss([y], 0.5, reduction=popart.ReductionType.Sum)
    anchors = {loss: popart.AnchorReturnType("All")}
    if anchor_weight:
        anchors[w2] = popart.AnchorReturnType("All")
    session = popart.TrainingSession(
        fnModel=builder.getModelProto(), dataFlow=popart.DataFlow(1, anchors), loss=loss,
        optimizer=optimizer, deviceInfo=popart.DeviceManager().createIpuModelDevice({}))
    session.prepareDevice()
    session.weightsFromHost()
    return session, x, w2


def _sgd(weight_decay: float = 0.0):
    return popart.SGD({"defaultLearningRate": (LR, False), "defaultMomentum": (MOMENTUM, False),
                       "defaultWeightDecay": (weight_decay, False)})


def _weights(session) -> dict[str, np.ndarray]:
    arrays = {i: np.empty(session.getInfo(i).shape(), np.float32) for i in ("w1", "w2")}
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(arrays))
    return arrays


def _inputs(steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.standard_normal((BATCH, IN)).astype(np.float32) for _ in range(steps)]


def _run(session, x, value):
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: value}, anchors))
    return anchors


def _torch_reference(inputs, lrs=None, weight_decay=0.0) -> dict[str, np.ndarray]:
    start = _start()
    params = {k: torch.tensor(v, requires_grad=True) for k, v in start.items()}
    lrs = lrs or {}
    optimizer = torch.optim.SGD(
        [{"params": [params[k]], "lr": lrs.get(k, LR)} for k in ("w1", "w2")],
        lr=LR, momentum=MOMENTUM, weight_decay=weight_decay)
    for value in inputs:
        optimizer.zero_grad()
        y = torch.relu(torch.tensor(value) @ params["w1"]) @ params["w2"]
        (0.5 * y.abs().sum()).backward()
        optimizer.step()
    return {k: p.detach().numpy() for k, p in params.items()}


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_fused_tail_fires_and_matches_torch_sgd(weight_decay):
    session, x, _ = _session(_sgd(weight_decay))
    tail = session._device._tail
    assert tail is not None and len(tail.steps) == 2
    inputs = _inputs(4)
    for value in inputs:
        _run(session, x, value)
    expected = _torch_reference(inputs, weight_decay=weight_decay)
    for name, value in _weights(session).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)


def test_weights_update_in_place_without_ping_pong():
    session, x, _ = _session(_sgd())
    plan = session._device.plan
    slot = plan.slot["w1"]
    address = plan.values[slot].data_ptr()
    for value in _inputs(3):
        _run(session, x, value)
    assert plan.values[slot].data_ptr() == address


def test_run_failing_at_the_anchor_writes_changes_no_state(monkeypatch):
    """The updates come after the anchor writes: a failure there leaves weights and momenta
    as they were, and the next runs match a session that never failed."""
    session, x, _ = _session(_sgd())
    reference, ref_x, _ = _session(_sgd())
    first, second = _inputs(2)
    _run(session, x, first)
    _run(reference, ref_x, first)
    before = _weights(session)
    device = session._device

    def failing_emit(*args):
        raise RuntimeError("anchor write failed")

    monkeypatch.setattr(device, "_emit", failing_emit)
    with pytest.raises(RuntimeError, match="anchor write failed"):
        _run(session, x, second)
    monkeypatch.undo()
    assert all(before[k].tobytes() == v.tobytes() for k, v in _weights(session).items())
    _run(session, x, second)
    _run(reference, ref_x, second)
    expected = _weights(reference)
    for name, value in _weights(session).items():
        np.testing.assert_allclose(value, expected[name], rtol=0, atol=0)


def test_anchored_weight_keeps_the_updates_before_the_anchors():
    """An anchor of a weight reads it after the update, as without the fusion: no tail."""
    session, x, w2 = _session(_sgd(), anchor_weight=True)
    assert session._device._tail is None
    inputs = _inputs(2)
    for value in inputs:
        anchors = _run(session, x, value)
    expected = _torch_reference(inputs)
    np.testing.assert_allclose(anchors[w2], expected["w2"], rtol=1e-5, atol=1e-6)


def test_different_learning_rates_run_the_steps_one_by_one():
    optimizer = _sgd()
    optimizer.insertSpecific("w2", {"learningRate": (0.01, False)})
    session, x, _ = _session(optimizer)
    tail = session._device._tail
    assert tail is not None
    assert tail.bind(session._device.plan.values) is None  # the updates differ in lr
    inputs = _inputs(3)
    for value in inputs:
        _run(session, x, value)
    expected = _torch_reference(inputs, lrs={"w2": 0.01})
    for name, value in _weights(session).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)


def test_velocity_scaling_is_not_fused():
    optimizer = popart.SGD({"defaultLearningRate": (LR, False),
                            "defaultMomentum": (MOMENTUM, False),
                            "defaultVelocityScaling": (2.0, True)})
    session, _, _ = _session(optimizer)
    assert session._device._tail is None
