"""Execution phases with gradient accumulation (F21 with F73/F75): every micro-batch runs the
forward and backward phases and adds its gradients into the accumulators, the weight update
runs once per ``accumulationFactor`` micro-batches in phases of its own, and the accumulators
and optimizer state live where their tensor locations and IO schedules say.

Numbers are compared with the unphased session and with torch; memory and cycles with the
device model's own records of the IR the pass built (what lives where, what is transferred).
"""

from __future__ import annotations

import copy
import logging
import re

import numpy as np
import pytest
import torch

import popart_backend as popart
import poptorch_lite as poptorch
from popart_backend.options import checks as popart_checks
from poptorch_lite.testing import run_reference

MB, D = 2, 32
LR, MOMENTUM, EPS = 0.05, 0.9, 1e-6
OFF = popart.TensorStorage.OffChip
PRELOAD = popart.ExecutionPhaseIOSchedule.Preload
ON_DEMAND = popart.ExecutionPhaseIOSchedule.OnDemand


def _weights(layers: int, seed: int = 0, d: int = D) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((d, d)) * 0.3).astype(np.float32) for _ in range(layers)]


def _model(weights, phased: bool):
    """``h = tanh(h @ W_k)`` per layer k (execution phase k), an L1 loss in the last phase."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, weights[0].shape[0]]), "x")
    h, ids = x, []
    last = len(weights) - 1
    for k, w in enumerate(weights):
        w_id = builder.addInitializedInputTensor(w, f"w{k}")
        ids.append(w_id)
        if phased:
            with builder.executionPhase(k):
                h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, w_id])])
        else:
            h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, w_id])])
    if phased:
        with builder.executionPhase(last):
            loss = builder.aiGraphcore.l1loss([h], 0.5, reduction=popart.ReductionType.Mean)
    else:
        loss = builder.aiGraphcore.l1loss([h], 0.5, reduction=popart.ReductionType.Mean)
    return builder.getModelProto(), x, loss, ids


def _options(phases: int | None, af: int, reduction=None, strategy=None, weights=None,
             accumulators=None, state=None, **schedules) -> popart.SessionOptions:
    """Phased (``phases`` forward phases on 2 IPUs) or plain options with accumulation ``af``;
    ``weights`` / ``accumulators`` / ``state``: a storage for that tensor type."""
    opts = popart.SessionOptions()
    if af:
        opts.enableGradientAccumulation, opts.accumulationFactor = True, af
    if reduction is not None:
        opts.accumulationAndReplicationReductionType = reduction
    if strategy is not None:
        opts.meanAccumulationAndReplicationReductionStrategy = strategy
    if phases is not None:
        opts.virtualGraphMode = popart.VirtualGraphMode.ExecutionPhases
        opts.executionPhaseSettings.phases = phases
        opts.executionPhaseSettings.stages = 2
        for key, value in schedules.items():
            setattr(opts.executionPhaseSettings, key, value)
    for storage, settings in ((weights, opts.weightTensorLocationSettings),
                              (accumulators, opts.accumulatorTensorLocationSettings),
                              (state, opts.optimizerStateTensorLocationSettings)):
        if storage is not None:
            settings.location.storage = storage
    return opts


def _optimizer(name: str):
    if name == "adam":
        return popart.Adam({"defaultLearningRate": (LR, False), "defaultEps": (EPS, False)})
    return popart.SGD({"defaultLearningRate": (LR, False), "defaultMomentum": (MOMENTUM, False)})


def _data(steps: int, bps: int, af: int, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((steps, bps, af, MB, D)).astype(np.float32)


def _session(weights, opts, optimizer: str, bps: int, phased: bool):
    proto, x, loss, ids = _model(weights, phased)
    opts.engineOptions = {"autoReport.all": "true"}  # the summary report, no files
    device = popart.DeviceManager().createIpuModelDevice(
        {"numIPUs": 2 if phased else 1, "tilesPerIPU": 4})
    session = popart.TrainingSession(
        proto, popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")}), loss,
        _optimizer(optimizer), device, userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    return session, x, ids


def _train(weights, opts, optimizer: str, bps: int, data: np.ndarray, phased: bool):
    session, x, ids = _session(weights, opts, optimizer, bps, phased)
    for step in data:  # [bps, af, MB, D]; without the bps axis when bps = 1
        session.run(popart.PyStepIO({x: step if bps > 1 else step[0]},
                                    session.initAnchorArrays()))
    session.weightsToHost()
    trained = {i: np.zeros((D, D), np.float32) for i in ids}
    session.readWeights(popart.PyWeightsIO(trained))
    return session, [trained[i] for i in ids]


def _torch(weights, data: np.ndarray, optimizer: str, mean: bool) -> list[np.ndarray]:
    """One torch optimizer step per ``af`` micro-batches, on their summed (Sum) or averaged
    (Mean) gradients."""
    ws = [torch.tensor(w, requires_grad=True) for w in weights]
    opt = (torch.optim.Adam(ws, lr=LR, eps=EPS) if optimizer == "adam"
           else torch.optim.SGD(ws, lr=LR, momentum=MOMENTUM))
    for step in data:
        for update in step:
            opt.zero_grad()
            for micro in update:
                h = torch.tensor(micro)
                for w in ws:
                    h = torch.tanh(h @ w)
                loss = 0.5 * h.abs().mean()
                (loss / len(update) if mean else loss).backward()
            opt.step()
    return [w.detach().numpy() for w in ws]


def _ops(session, op_type: str):
    return [op for op in session._ir.main.ops.values() if op.op_type == op_type]


SUM, MEAN = popart.ReductionType.Sum, popart.ReductionType.Mean
CASES = {
    # id: (optimizer, phases, af, bps, reduction, strategy, option storages and schedules)
    "momentum-sum-4phases-bps2-offchip": ("momentum", 4, 2, 2, SUM, None,
                                          {"weights": OFF, "accumulators": OFF, "state": OFF}),
    "momentum-mean-running-2phases": ("momentum", 2, 4, 1, MEAN,
                                      popart.MeanReductionStrategy.Running, {}),
    "momentum-mean-post-4phases-ondemand": (
        "momentum", 4, 2, 1, MEAN, popart.MeanReductionStrategy.Post,
        {"accumulators": OFF, "accumulatorIOSchedule": ON_DEMAND}),
    "adam-mean-postandloss-4phases-bps2": (
        "adam", 4, 2, 2, MEAN, popart.MeanReductionStrategy.PostAndLoss,
        {"weights": OFF, "accumulators": OFF, "state": OFF,
         "optimizerStateIOSchedule": PRELOAD}),
    "adam-sum-2phases-af4": ("adam", 2, 4, 1, SUM, None, {"weights": OFF}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_F21_F73_phased_accumulation_equals_the_unphased_run_and_torch(case):
    optimizer, phases, af, bps, reduction, strategy, extra = CASES[case]
    weights = _weights(phases, seed=len(case))
    data = _data(2, bps, af)
    phased, got = _train(weights, _options(phases, af, reduction, strategy, **extra),
                         optimizer, bps, data, True)
    plain_extra = {k: v for k, v in extra.items() if not k.endswith("IOSchedule")}
    _, plain = _train(weights, _options(None, af, reduction, strategy, **plain_extra),
                      optimizer, bps, data, False)
    for a, b in zip(got, plain):
        np.testing.assert_array_equal(a, b)
    want = _torch(weights, data, optimizer, reduction is MEAN)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert {op.settings.ipu for op in _ops(phased, "MatMul")} == {0, 1}


def _by_weight(session, op_type: str) -> dict[str, object]:
    """The ``op_type`` ops keyed by the weight (or accumulator) id they read first."""
    found = {}
    for op in _ops(session, op_type):
        root = op.inputs[0]
        while root.producer is not None and root.producer.remote_transfer:
            root = root.producer.inputs[0]
        found[re.sub(r"^Accum___", "", root.id)] = op
    return found


def test_F21_F73_update_runs_once_per_window_in_the_weights_backward_phase():
    phases, af = 4, 2
    session, _, ids = _session(_weights(phases), _options(phases, af), "momentum", 1, True)
    updates, accumulates = _by_weight(session, "SGDUpdate"), _by_weight(session, "Accumulate")
    assert sorted(updates) == sorted(ids) == sorted(accumulates)
    for k, w in enumerate(ids):
        update, accumulate = updates[w], accumulates[w]
        assert update.settings.execution_context.name == "AccumulateOuterFragment"
        assert accumulate.settings.execution_context.name == "Normal"
        # The gradient of phase k is made and accumulated in backward phase 2P - 2 - k, on the
        # IPU of phase k; the update follows it there.
        assert accumulate.settings.execution_phase == 2 * phases - 2 - k
        assert accumulate.settings.ipu == k % 2
        assert (update.settings.execution_phase, update.settings.ipu) == (
            accumulate.settings.execution_phase, accumulate.settings.ipu)


def _cycles(session):
    return session._device_model.cycles


def _remote(session, prefix: str, context: str):
    return [r for r in _cycles(session).remote
            if r.tensor_id.startswith(prefix) and r.context.name == context]


def test_F21_F73_step_cycles_grow_with_the_accumulation_factor():
    """A step is af micro-batches of every forward and backward phase, plus one update."""
    phases, weights = 4, _weights(4)
    steps = {}
    for af in (1, 2, 4):
        session, _, _ = _session(weights, _options(phases, af), "momentum", 1, True)
        cycles = _cycles(session)
        assert cycles.batch.micro_batches_per_step == af
        ops = session._ir.main.ops.values()
        compute = sum(c.cycles for c in cycles.ops if c.context.name == "Normal")
        update = sum(c.cycles for c in cycles.ops if c.op_type == "SGDUpdate")
        assert update > 0 and compute > 0
        assert cycles.micro_batch_cycles >= compute - cycles.phase_prefetch_cycles
        assert cycles.outer_cycles >= update
        assert not any(op.op_type == "SGDUpdate"
                       and op.settings.execution_context.name == "Normal" for op in ops)
        steps[af] = (cycles.step_cycles, cycles.micro_batch_cycles, cycles.outer_cycles)
    # The per-micro-batch program and the update do not depend on af; the step is af of one
    # plus the other.
    assert steps[1][1:] == steps[2][1:] == steps[4][1:]
    micro = steps[1][1]
    assert steps[4][0] - steps[2][0] == 2 * micro
    assert steps[2][0] - steps[1][0] == micro
    # Without accumulation the update runs in the micro-batch program: about one accumulated
    # micro-batch plus the update.
    plain, _, _ = _session(weights, _options(phases, 0), "momentum", 1, True)
    assert abs(_cycles(plain).step_cycles - steps[1][0]) < 0.25 * steps[1][0]


def _transfer(num_bytes: int, spec) -> int:
    """One streaming-memory transfer: bytes over the host link plus a sync (device model)."""
    return -(-num_bytes * spec.clock_hz // spec.host_link_bytes_per_s) + (
        spec.ipu_sync_latency_cycles)


def test_F21_F73_off_chip_accumulators_lower_sram_and_add_transfers():
    d = 64  # accumulators big enough to outweigh the code of their loads and stores
    phases, af, weights = 4, 2, _weights(4, d=d)
    on, _, _ = _session(weights, _options(phases, af), "momentum", 1, True)
    off, _, ids = _session(weights, _options(phases, af, accumulators=OFF), "momentum", 1, True)
    size = d * d * 4
    for ipu in on._device_model.memory.ipus:  # two layers per IPU, their accumulators on chip
        assert ipu.categories["accumulators"] == 2 * size
    for ipu in off._device_model.memory.ipus:
        assert ipu.categories["accumulators"] == 0
        assert sum(1 for t in ipu.streaming_tensors if t.startswith("Accum___")) == 2
    # SRAM: the accumulators leave it; one loaded copy at a time comes back as an activation.
    for a, b in zip(on._device_model.memory.ipus, off._device_model.memory.ipus):
        assert b.total_bytes < a.total_bytes
        assert b.categories["activations"] - a.categories["activations"] <= size
    # The summary report shows the accumulators of the on-chip session.
    assert re.search(r"accumulators [\d.]+ KiB", on.getSummaryReport())
    assert not _remote(on, "Accum___", "Normal")
    # Off chip: loaded and stored in the backward phase every micro-batch, and by the update.
    spec = off._device_model.cycles.spec
    for context in ("Normal", "AccumulateOuterFragment"):
        records = _remote(off, "Accum___", context)
        assert sorted(r.tensor_id for r in records) == sorted(f"Accum___{w}" for w in ids)
        for r in records:
            assert (r.loads, r.stores) == (1, 1)
            assert r.cycles == 2 * _transfer(size, spec)
    a, b = _cycles(on), _cycles(off)
    assert b.micro_batch_cycles > a.micro_batch_cycles
    assert b.outer_cycles > a.outer_cycles
    assert b.step_cycles > a.step_cycles


def test_F21_F73_io_schedules_of_accumulators_and_optimizer_state():
    """Preload loads during the previous phase of the same fragment (hidden behind the other
    IPU's compute); OnDemand loads in the phase that reads, in series. The same transfers."""
    phases, af, weights = 4, 2, _weights(4)
    runs = {}
    for schedule in (PRELOAD, ON_DEMAND):
        opts = _options(phases, af, accumulators=OFF, state=OFF,
                        accumulatorIOSchedule=schedule, optimizerStateIOSchedule=schedule)
        runs[schedule] = _session(weights, opts, "momentum", 1, True)[0]
    for schedule, session in runs.items():
        loads = [op for op in _ops(session, "RemoteLoad")
                 if op.inputs[0].id.startswith(("Accum___", "Accl___"))]
        assert {op.settings.execution_context.name for op in loads} == {
            "Normal", "AccumulateOuterFragment"}
        for op in loads:
            reader_phase = op.outputs[0].consumers[0].settings.execution_phase
            shift = 1 if schedule is PRELOAD and reader_phase > 0 else 0
            assert op.settings.execution_phase == reader_phase - shift
    pre, demand = _cycles(runs[PRELOAD]), _cycles(runs[ON_DEMAND])
    assert pre.phase_prefetch_cycles > demand.phase_prefetch_cycles
    assert pre.outer_phase_prefetch_cycles > 0 == demand.outer_phase_prefetch_cycles
    assert pre.micro_batch_cycles < demand.micro_batch_cycles
    assert pre.outer_cycles < demand.outer_cycles
    assert sum(r.cycles for r in pre.remote) == sum(r.cycles for r in demand.remote)


def test_F21_F73_io_schedules_without_effect_are_logged(caplog, monkeypatch):
    weights = _weights(2)
    cases = [  # (options, logged text or None)
        (_options(2, 0, accumulatorIOSchedule=ON_DEMAND), "has no gradient accumulators"),
        (_options(2, 2, accumulatorIOSchedule=ON_DEMAND), "gradient accumulators are on chip"),
        (_options(2, 2, accumulators=OFF, accumulatorIOSchedule=ON_DEMAND), None),
        (_options(2, 2, optimizerStateIOSchedule=PRELOAD), "optimizer state is on chip"),
        (_options(2, 2, state=OFF, optimizerStateIOSchedule=PRELOAD), None),
    ]
    for opts, text in cases:
        monkeypatch.setattr(popart_checks, "_PHASE_WARNED", set())  # logged once per process
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            _session(weights, opts, "momentum", 1, True)
        schedule_logs = [r.getMessage() for r in caplog.records if "IOSchedule" in r.getMessage()]
        if text is None:
            assert not schedule_logs
        else:
            assert len(schedule_logs) == 1 and text in schedule_logs[0]


class _Chain(torch.nn.Module):
    """Four Linear + tanh layers (one phase each) and a cross-entropy loss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(D, D) for _ in range(4))

    def forward(self, x, y):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x, torch.nn.functional.cross_entropy(x, y)


def _poptorch_train(phased: bool):
    model = _Chain()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().showCompilationProgressBar(False).deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    if phased:
        for k, layer in enumerate(model.layers):
            poptorch.BeginBlock(layer, f"l{k}")
        opts.setExecutionStrategy(poptorch.ParallelPhasedExecution(
            *[[f"l{k}"] for k in range(4)]).sendTensorsOffChipAfterFwd())

    def make(params):
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    wrapper = poptorch.trainingModel(model, opts, make(model.parameters()))
    g = torch.Generator().manual_seed(4)
    batches = [(torch.randn(4 * MB, D, generator=g), torch.randint(0, D, (4 * MB,), generator=g))
               for _ in range(2)]
    for batch in batches:
        wrapper(*batch)
    run_reference(reference, make(reference.parameters()), batches, opts)
    return model, reference, wrapper


def test_P43_F73_poptorch_phased_training_with_gradient_accumulation():
    model, reference, wrapper = _poptorch_train(True)
    plain, _, _ = _poptorch_train(False)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model.state_dict()[name], plain.state_dict()[name],
                                   rtol=0, atol=0)
    ops = wrapper._active.session.getIr().main.ops.values()
    assert {op.settings.ipu for op in ops if op.op_type == "Tanh"} == {0, 1}
    assert any(op.settings.execution_context.name == "AccumulateOuterFragment" for op in ops)


def test_F21_F73_replicated_phased_accumulation_equals_the_unphased_run():
    """Two replicas of 2 phased IPUs: the accumulators are all-reduced in the update's phase."""
    weights = _weights(2, seed=9)
    data = np.random.default_rng(6).standard_normal((2, 2, 2, MB, D)).astype(np.float32)
    results = []
    for phased in (True, False):
        opts = (_options(2, 2, MEAN, weights=OFF, accumulators=OFF, state=OFF) if phased
                else _options(None, 2, MEAN))
        opts.enableReplicatedGraphs, opts.replicatedGraphCount = True, 2
        proto, x, loss, ids = _model(weights, phased)
        session = popart.TrainingSession(
            proto, popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
            _optimizer("adam"), popart.DeviceManager().createIpuModelDevice(
                {"numIPUs": 4 if phased else 2, "tilesPerIPU": 4}), userOptions=opts)
        session.prepareDevice()
        session.weightsFromHost()
        for step in data:  # [af, replicas, MB, D]
            session.run(popart.PyStepIO({x: step}, session.initAnchorArrays()))
        session.weightsToHost()
        trained = {i: np.zeros((D, D), np.float32) for i in ids}
        session.readWeights(popart.PyWeightsIO(trained))
        results.append([trained[i] for i in ids])
        if phased:
            reduce = _ops(session, "ReplicatedAllReduce")
            assert reduce and all(
                op.settings.execution_context.name == "AccumulateOuterFragment" for op in reduce)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
