"""A failed ``run()`` changes nothing on the device (hardening): weights, optimizer state,
gradient accumulators, RNG state and step-IO offsets are as before the call, so fixing the
input and running again gives what one good run gives (no micro-batch applied twice)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart

TABLE, WIDTH, OUT, ROWS = 5, 4, 3, 2


def _session(bps: int = 2, accumulation: int = 1, dropout: bool = False):
    builder = popart.Builder()
    rng = np.random.default_rng(0)
    table = builder.addInitializedInputTensor(rng.standard_normal((TABLE, WIDTH), np.float32),
                                              "table")
    weight = builder.addInitializedInputTensor(rng.standard_normal((WIDTH, OUT), np.float32),
                                               "weight")
    idx = builder.addInputTensor(popart.TensorInfo("INT32", [ROWS]), "idx")
    rows = builder.aiOnnx.gather([table, idx])
    if dropout:
        rows = builder.aiOnnx.dropout([rows], 1, 0.5)[0]
    y = builder.aiOnnx.matmul([rows, weight])
    loss = builder.aiGraphcore.l1loss([y], 0.1)
    options = popart.SessionOptions()
    options.enableLoadAndOffloadRNGState = True
    if accumulation > 1:
        options.enableGradientAccumulation = True
        options.accumulationFactor = accumulation
    session = popart.TrainingSession(
        fnModel=builder.getModelProto(),
        dataFlow=popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")}),
        loss=loss,
        optimizer=popart.SGD({"defaultLearningRate": (0.1, False),
                              "defaultMomentum": (0.9, False)}),
        deviceInfo=popart.DeviceManager().createIpuModelDevice({}),
        userOptions=options)
    session.prepareDevice()
    session.weightsFromHost()
    return session, idx


def _weights(session) -> dict[str, np.ndarray]:
    ids = ["table", "weight"]
    arrays = {i: np.empty(session.getInfo(i).shape(), np.float32) for i in ids}
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(arrays))
    return arrays


def _same(a: dict, b: dict) -> bool:
    return all(a[k].tobytes() == b[k].tobytes() for k in a)


def _run(session, idx, indices: np.ndarray, stepio_offsets=None):
    anchors = session.initAnchorArrays()
    stepio = popart.PyStepIO({idx: indices}, anchors)
    session.run(stepio)
    return anchors


@pytest.mark.parametrize("accumulation", [1, 2])
def test_failed_run_keeps_weights_and_a_retry_applies_each_batch_once(accumulation):
    """bps 2 (× accumulation): a bad Gather index in the last micro-batch fails the run after
    the first micro-batch(es) updated the weights and momentum; they are rolled back."""
    steps = 2 * accumulation
    good = np.tile(np.array([0, 1], np.int32), steps)
    bad = good.copy()
    bad[-1] = TABLE + 7  # out of range in the last micro-batch
    session, idx = _session(accumulation=accumulation)
    reference, ref_idx = _session(accumulation=accumulation)
    before = _weights(session)
    with pytest.raises(popart.popart_exception, match="gather|Gather|index|indices"):
        _run(session, idx, bad)
    assert _same(_weights(session), before)
    _run(session, idx, good)
    _run(reference, ref_idx, good)
    after, expected = _weights(session), _weights(reference)
    assert not _same(after, before)  # the good run did train
    assert _same(after, expected)
    # Momentum (optimizer state) and accumulators were rolled back too: a second good step
    # also matches.
    _run(session, idx, good)
    _run(reference, ref_idx, good)
    assert _same(_weights(session), _weights(reference))


def test_failed_run_keeps_step_io_offsets_and_rng_state():
    """Offsets of a step IO reused across runs and the RNG state move only after a good run."""
    session, idx = _session(dropout=True)
    state = session.getRNGState()
    bad = np.array([0, 1, 2, TABLE], np.int32)
    anchors = session.initAnchorArrays()
    stepio = popart.PyStepIO({idx: bad}, anchors)
    in_offsets, out_offsets = dict(stepio.input_offsets), dict(stepio.output_offsets)
    with pytest.raises(popart.popart_exception):
        session.run(stepio)
    assert stepio.input_offsets == in_offsets and stepio.output_offsets == out_offsets
    assert session.getRNGState() == state
    # The retry draws the dropout masks of a fresh session's first run.
    reference, ref_idx = _session(dropout=True)
    good = np.array([0, 1, 2, 3], np.int32)
    _run(session, idx, good)
    _run(reference, ref_idx, good)
    assert _same(_weights(session), _weights(reference))
    assert session.getRNGState() == reference.getRNGState()


def test_poptorch_failed_call_keeps_weights_buffers_and_step_count():
    """poptorch_lite: a call that fails on the device leaves the model's parameters, its
    buffers (BatchNorm running statistics) and the optimizer's step bookkeeping as they were."""
    import poptorch_lite as poptorch  # noqa: PLC0415 - the frontend, only for this test

    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(TABLE, WIDTH)
            self.norm = torch.nn.BatchNorm1d(WIDTH)
            self.lin = torch.nn.Linear(WIDTH, OUT)

        def forward(self, ids):
            return self.lin(self.norm(self.emb(ids))).abs().mean()

    model = Model()
    options = poptorch.Options().deviceIterations(2)
    wrapper = poptorch.trainingModel(model, options,
                                     optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    good = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    wrapper(good)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    steps = wrapper._steps_done
    bad = torch.tensor([0, 1, 2, TABLE + 3], dtype=torch.int32)
    with pytest.raises(poptorch.Error, match="Gather|gather|ind"):
        wrapper(bad)
    assert wrapper._steps_done == steps
    wrapper.copyWeightsToHost()  # read the device's weights and buffers, not the host copy
    after = model.state_dict()
    for key, value in state.items():
        assert torch.equal(after[key], value), key


def _pipelined_session():
    """Two pipeline stages on two IPUs (Gather, then MatMul + loss), accumulation 4."""
    builder = popart.Builder()
    rng = np.random.default_rng(0)
    idx = builder.addInputTensor(popart.TensorInfo("INT32", [ROWS]), "idx")
    with builder.virtualGraph(0), builder.pipelineStage(0):
        table = builder.addInitializedInputTensor(
            rng.standard_normal((TABLE, WIDTH), np.float32), "table")
        rows = builder.aiOnnx.gather([table, idx])
    with builder.virtualGraph(1), builder.pipelineStage(1):
        weight = builder.addInitializedInputTensor(
            rng.standard_normal((WIDTH, OUT), np.float32), "weight")
        loss = builder.aiGraphcore.l1loss([builder.aiOnnx.matmul([rows, weight])], 0.1)
    options = popart.SessionOptions()
    options.enablePipelining = True
    options.virtualGraphMode = popart.VirtualGraphMode.Manual
    options.enableGradientAccumulation = True
    options.accumulationFactor = 4
    session = popart.TrainingSession(
        fnModel=builder.getModelProto(),
        dataFlow=popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}),
        loss=loss,
        optimizer=popart.SGD({"defaultLearningRate": (0.1, False),
                              "defaultMomentum": (0.9, False)}),
        deviceInfo=popart.DeviceManager().createIpuModelDevice({"numIPUs": 2}),
        userOptions=options)
    session.prepareDevice()
    session.weightsFromHost()
    return session, idx


def test_pipelined_failed_run_is_rolled_back():
    """The pipelined run loop too: a bad index in the last micro-batch of a window (stashes
    and accumulators already written) leaves the session as a fresh one."""
    good = np.tile(np.array([0, 1], np.int32), 4)
    bad = good.copy()
    bad[-1] = TABLE + 1
    session, idx = _pipelined_session()
    reference, ref_idx = _pipelined_session()
    before = _weights(session)
    with pytest.raises(popart.popart_exception):
        _run(session, idx, bad)
    assert _same(_weights(session), before)
    for _ in range(2):
        _run(session, idx, good)
        _run(reference, ref_idx, good)
    assert _same(_weights(session), _weights(reference))
