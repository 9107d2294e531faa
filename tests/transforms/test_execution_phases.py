"""Execution phases (spec §3.4, §10; F21): VirtualGraphMode.ExecutionPhases with
executionPhaseSettings, the phases' IPUs, RemoteLoad / RemoteStore in the IR, memory per IPU
and cycles from the device model, and results equal to the unphased run."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.transforms.execution_phases import backward_phase
from popart_backend.options import checks as popart_checks

LAYERS, MB, D = 4, 2, 128
LR = 0.05


def _weights(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((D, D)) * 0.3).astype(np.float32) for _ in range(LAYERS)]


def _model(weights, phased: bool = True):
    """``h = tanh(h @ W_k)`` per layer k (in execution phase k), then an L1 loss in the last
    layer's phase. (ModelProto, input id, loss id, weight ids)."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    h, ids = x, []
    for k, w in enumerate(weights):
        w_id = builder.addInitializedInputTensor(w, f"w{k}")
        ids.append(w_id)
        if phased:
            with builder.executionPhase(k):
                h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, w_id])])
        else:
            h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, w_id])])
    if phased:
        with builder.executionPhase(len(weights) - 1):
            loss = builder.aiGraphcore.l1loss([h], 0.5, reduction=popart.ReductionType.Mean)
    else:
        loss = builder.aiGraphcore.l1loss([h], 0.5, reduction=popart.ReductionType.Mean)
    return builder.getModelProto(), x, loss, ids


def _phased_options(streamed: bool = True, **settings) -> popart.SessionOptions:
    opts = popart.SessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.ExecutionPhases
    opts.executionPhaseSettings.phases = LAYERS
    opts.executionPhaseSettings.stages = 2
    for key, value in settings.items():
        setattr(opts.executionPhaseSettings, key, value)
    if streamed:  # weights and activations in streaming memory between their phases
        opts.weightTensorLocationSettings.location.storage = popart.TensorStorage.OffChip
        opts.activationTensorLocationSettings.location.storage = popart.TensorStorage.OffChip
    return opts


def _device(ipus: int):
    return popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus, "tilesPerIPU": 4})


def _x(steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal((MB, D)).astype(np.float32) for _ in range(steps)]


def _train(weights, opts, ipus: int, phased: bool, steps: int = 3, optimizer=None):
    proto, x, loss, ids = _model(weights, phased)
    opts.engineOptions = {"autoReport.all": "true"}  # the summary report, no files
    session = popart.TrainingSession(
        proto, popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
        optimizer or popart.ConstSGD(LR), _device(ipus), userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    losses = []
    for data in _x(steps):
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({x: data}, anchors))
        losses.append(float(anchors[loss]))
    session.weightsToHost()
    trained = {i: np.zeros((D, D), np.float32) for i in ids}
    session.readWeights(popart.PyWeightsIO(trained))
    return session, losses, [trained[i] for i in ids]


def _torch_reference(weights, steps: int = 3):
    ws = [torch.tensor(w, requires_grad=True) for w in weights]
    losses = []
    for data in _x(steps):
        h = torch.tensor(data)
        for w in ws:
            h = torch.tanh(h @ w)
        loss = 0.5 * h.abs().mean()
        losses.append(float(loss.detach()))
        for w in ws:
            w.grad = None
        loss.backward()
        with torch.no_grad():
            for w in ws:
                w -= LR * w.grad
    return losses, [w.detach().numpy() for w in ws]


def _ops(session, op_type: str):
    return [op for op in session._ir.main.ops.values() if op.op_type == op_type]


@pytest.fixture(scope="module")
def runs():
    weights = _weights()
    phased = _train(weights, _phased_options(), 2, True)
    plain = _train(weights, popart.SessionOptions(), 1, False)
    return weights, phased, plain


def test_F21_phased_training_equals_the_unphased_run_and_torch(runs):
    weights, (_, phased_losses, phased_w), (_, plain_losses, plain_w) = runs
    assert phased_losses == plain_losses
    for a, b in zip(phased_w, plain_w):
        np.testing.assert_array_equal(a, b)
    want_losses, want_w = _torch_reference(weights)
    np.testing.assert_allclose(phased_losses, want_losses, rtol=1e-5, atol=1e-6)
    for got, want in zip(phased_w, want_w):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_F21_phases_alternate_ipus_and_backward_phases_mirror_forward(runs):
    _, (session, _, _), _ = runs
    for op in session._ir.main.ops.values():
        if op.op_type == "MatMul":  # forward: phase k on IPU k % 2
            assert op.settings.ipu == op.settings.execution_phase % 2
    grads = [op for op in session._ir.main.ops.values() if op.op_type == "TanhGrad"]
    assert sorted(op.settings.execution_phase for op in grads) == sorted(
        backward_phase(k, LAYERS) for k in range(LAYERS))
    for op in grads:  # the gradient of phase k runs on phase k's IPU
        assert op.settings.ipu == (backward_phase(op.settings.execution_phase, LAYERS)) % 2


def test_F21_weights_are_loaded_per_phase_and_stored_after_the_update(runs):
    _, (session, _, _), _ = runs
    graph = session._ir.main
    for k in range(LAYERS):
        w = graph.tensors[f"w{k}"]
        assert w.consumers and all(op.remote_transfer for op in w.consumers)
        loads = [op for op in w.consumers if op.op_type == "RemoteLoad"]
        stores = [op for op in w.consumers if op.op_type == "RemoteStore"]
        # Read in its forward phase and in its backward phase (the loss phase is both).
        assert len(loads) == (1 if k == LAYERS - 1 else 2)
        assert len(stores) == 1
        update = stores[0].inputs[1].producer
        assert update.op_type == "SGDUpdate"  # the store writes back the updated copy
    # Forward activations read by the backward pass go through streaming memory.
    assert _ops(session, "Init") and len(_ops(session, "RemoteStore")) > LAYERS
    order = graph.topo_order()
    # The phases run in sequence (the inter-IPU copies, inserted later, follow their data).
    phases = [op.settings.execution_phase for op in order if op.op_type != "IpuCopy"]
    assert phases == sorted(phases)


def _max_sram(session) -> int:
    return max(i.total_bytes for i in session._device_model.memory.ipus)


def test_F21_phased_memory_report_shows_less_sram_than_the_unphased_run(runs):
    """Each IPU holds only the live phase's tensors (the weights and the activations the
    backward pass needs wait in streaming memory)."""
    weights, (phased, _, _), (plain, _, _) = runs
    assert _max_sram(phased) < _max_sram(plain)
    assert len(phased._device_model.memory.ipus) == 2
    # Over the same 2 IPUs without streaming, every IPU keeps its phases' weights all along.
    unstreamed, _, _ = _train(weights, _phased_options(streamed=False), 2, True, steps=1)
    assert _max_sram(phased) < _max_sram(unstreamed)
    for ipu in phased._device_model.memory.ipus:
        assert ipu.categories["weights"] == 0
        # Its two phases' weights and the activations they keep are in streaming memory.
        assert ipu.streaming_bytes >= 2 * D * D * 4
    for ipu in unstreamed._device_model.memory.ipus:
        assert ipu.categories["weights"] == 2 * D * D * 4  # layers k and k + 2
    # The summary reports say the same: per IPU, SRAM in use at the peak.
    memory = {name: s.getSummaryReport().split("Execution (")[0]
              for name, s in (("phased", phased), ("plain", plain))}
    used = {name: [float(v) for v in re.findall(r"IPU \d: ([\d.]+) KiB of", text)]
            for name, text in memory.items()}
    assert len(used["phased"]) == 2 and len(used["plain"]) == 1
    assert max(used["phased"]) < used["plain"][0]
    assert re.search(r"weights [\d.]+ KiB", memory["plain"])
    assert not re.search(r"weights [\d.]+ KiB", memory["phased"])
    assert "streaming memory" in memory["phased"]


def test_F21_default_locations_keep_weights_on_their_phase_ipu():
    """PopART's default tensor locations are on chip: phases place the ops, nothing streams."""
    weights = _weights()
    session, losses, trained = _train(weights, _phased_options(streamed=False), 2, True, steps=2)
    assert not _ops(session, "RemoteLoad") and not _ops(session, "RemoteStore")
    _, plain_losses, plain_trained = _train(weights, popart.SessionOptions(), 1, False, steps=2)
    assert losses == plain_losses
    for a, b in zip(trained, plain_trained):
        np.testing.assert_array_equal(a, b)


def test_F21_streamed_tensors_resolve_off_chip_and_transfers_are_charged(runs):
    _, (session, _, _), (plain, _, _) = runs
    locations = session._device_model.locations
    for k in range(LAYERS):
        assert locations[f"w{k}"].off_chip
        assert "streamed per execution phase" in locations[f"w{k}"].reason
    cycles = session._device_model.cycles
    loads = len(_ops(session, "RemoteLoad"))
    stores = len(_ops(session, "RemoteStore"))
    explicit = [r for r in cycles.remote if r.tensor_id.startswith(("w", "RemoteBuffer___"))]
    assert sum(r.loads for r in explicit) == loads
    assert sum(r.stores for r in explicit) == stores
    # Phases run one after another, plus the transfers: slower than the unphased step.
    assert cycles.step_cycles > plain._device_model.cycles.step_cycles


def test_F21_preload_hides_loads_behind_the_previous_phase():
    """Preload (the default) loads a phase's weights during the phase before, on the idle
    IPU; OnDemand loads them at the start of the phase, in series with its compute."""
    weights = _weights()
    preload = _train(weights, _phased_options(), 2, True, steps=1)[0]
    on_demand = _train(weights, _phased_options(
        weightIOSchedule=popart.ExecutionPhaseIOSchedule.OnDemand,
        activationIOSchedule=popart.ExecutionPhaseIOSchedule.OnDemand), 2, True, steps=1)[0]
    early = [op for op in _ops(preload, "RemoteLoad")
             if op.settings.ipu != op.settings.execution_phase % 2]
    assert early  # prefetches: loads in a phase that runs on the other IPU
    assert all(op.settings.ipu == op.settings.execution_phase % 2
               for op in _ops(on_demand, "RemoteLoad"))
    pre, demand = preload._device_model.cycles, on_demand._device_model.cycles
    assert pre.phase_prefetch_cycles > 0 and demand.phase_prefetch_cycles == 0
    assert pre.step_cycles < demand.step_cycles
    assert sum(r.cycles for r in pre.remote) == sum(r.cycles for r in demand.remote)


@pytest.mark.parametrize("case", ["adam", "momentum", "recompute", "one_stage"])
def test_F21_phased_variants_equal_the_unphased_run(case):
    """Optimizer state updated in the backward phases, recomputed activations, and all phases
    on one IPU (stages = 1) give the unphased numbers."""
    weights, opts, ipus = _weights(2), _phased_options(), 2
    make = {"adam": lambda: popart.Adam({"defaultLearningRate": (0.01, False)}),
            "momentum": lambda: popart.SGD({"defaultLearningRate": (0.1, False),
                                            "defaultMomentum": (0.9, False)})}.get(
        case, lambda: popart.ConstSGD(LR))
    if case == "recompute":
        opts.autoRecomputation = popart.RecomputationType.Standard
    if case == "one_stage":
        opts.executionPhaseSettings.stages, ipus = 1, 1
    phased, losses, trained = _train(weights, opts, ipus, True, steps=2, optimizer=make())
    plain, plain_losses, plain_trained = _train(weights, popart.SessionOptions(), 1, False,
                                                steps=2, optimizer=make())
    assert losses == plain_losses
    for a, b in zip(trained, plain_trained):
        if case == "momentum":  # the unphased run fuses its SGD updates into one kernel,
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # rounded differently
        else:
            np.testing.assert_array_equal(a, b)
    if case == "recompute":
        clones = [op for op in phased._ir.main.ops.values()
                  if op.settings.recompute is popart.RecomputeType.Recomputed]
        assert clones and all(op.settings.execution_phase >= LAYERS - 1 for op in clones)
    if case == "one_stage":
        assert {op.settings.ipu for op in phased._ir.main.ops.values()} == {0}
        assert _max_sram(phased) < _max_sram(plain)


def test_F21_phased_inference_equals_the_plain_run():
    weights = _weights(1)
    results = []
    for phased in (True, False):
        builder = popart.Builder(opsets={"ai.onnx": 17})
        h = x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
        for k, w in enumerate(weights):
            w_id = builder.addInitializedInputTensor(w, f"w{k}")
            with builder.executionPhase(k):
                h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, w_id])])
        opts = _phased_options() if phased else popart.SessionOptions()
        session = popart.InferenceSession(
            builder.getModelProto(), popart.DataFlow(1, {h: popart.AnchorReturnType("All")}),
            _device(2 if phased else 1), userOptions=opts)
        session.prepareDevice()
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({x: _x(1)[0]}, anchors))
        results.append(anchors[h])
        if phased:  # phase k on IPU k % 2; the inference weights are constants, on chip
            assert sorted((op.settings.execution_phase, op.settings.ipu)
                          for op in _ops(session, "MatMul")) == [(k, k % 2)
                                                                 for k in range(LAYERS)]
            assert not _ops(session, "RemoteLoad")
    np.testing.assert_array_equal(results[0], results[1])


# --- option checks --------------------------------------------------------------------------


def _session(opts, ipus=2, phased=True):
    proto, _, loss, _ = _model(_weights(), phased)
    return popart.TrainingSession(
        proto, popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
        popart.ConstSGD(LR), _device(ipus), userOptions=opts)


def test_F21_phase_beyond_the_phases_setting_is_refused():
    opts = _phased_options()
    opts.executionPhaseSettings.phases = 2
    with pytest.raises(popart.popart_exception,
                       match="is in execution phase 2, but executionPhaseSettings.phases = 2"):
        _session(opts)


def test_F21_more_stages_than_ipus_is_refused():
    opts = _phased_options()
    opts.executionPhaseSettings.stages = 4
    with pytest.raises(popart.popart_exception, match="stages = 4, but the device has 2 IPU"):
        _session(opts)


def test_F21_zero_phases_are_refused():
    """(Phased training with gradient accumulation is built: tests/session/
    test_phased_accumulation.py.)"""
    opts = _phased_options()
    opts.executionPhaseSettings.phases = 0
    with pytest.raises(popart.popart_exception, match="phases >= 1"):
        _session(opts)


def test_F21_pipelining_with_phases_is_refused():
    opts = _phased_options()
    opts.enablePipelining = True
    with pytest.raises(popart.popart_exception, match="cannot be combined"):
        _session(opts)


def test_F21_reading_a_later_phase_is_refused():
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    with builder.executionPhase(1):
        h = builder.aiOnnx.tanh([x])
    with builder.executionPhase(0):
        y = builder.aiOnnx.sigmoid([h])
    opts = _phased_options()
    with pytest.raises(popart.popart_exception, match="reads .* in the later phase 1"):
        popart.InferenceSession(builder.getModelProto(),
                                popart.DataFlow(1, {y: popart.AnchorReturnType("All")}),
                                _device(2), userOptions=opts)


def test_F21_settings_without_effect_are_logged(caplog, monkeypatch):
    monkeypatch.setattr(popart_checks, "_PHASE_WARNED", set())  # logged once per process
    opts = popart.SessionOptions()
    opts.executionPhaseSettings.phases = 3
    with caplog.at_level(logging.WARNING):
        _session(opts, ipus=1, phased=False)
    assert "executionPhaseSettings has no effect" in caplog.text
    caplog.clear()
    opts = _phased_options(schedule=popart.ExecutionPhaseSchedule.Batch,
                           optimizerStateIOSchedule=popart.ExecutionPhaseIOSchedule.Preload)
    with caplog.at_level(logging.WARNING):
        _session(opts)
    assert "executionPhaseSettings.schedule" in caplog.text
    assert "optimizerStateIOSchedule" in caplog.text
