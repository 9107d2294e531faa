"""Phased execution in the frontend (P43; backend F21): SerialPhasedExecution and
ParallelPhasedExecution as execution phases, tensor liveness as tensor locations, results equal
to eager torch and to the unphased wrapper, and less SRAM per IPU than the unphased run."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

import popart_backend as popart
import poptorch_lite as poptorch
from poptorch_lite import blocks, phased
from poptorch_lite.errors import Error
from poptorch_lite.testing import run_reference

from .training_helpers import assert_state_equal

WIDTH, LAYERS = 256, 4


class Chain(torch.nn.Module):
    """``LAYERS`` Linear+tanh layers and a cross-entropy loss on the last one's output."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))

    def forward(self, x, y):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x, torch.nn.functional.cross_entropy(x, y)


def _batches(calls: int = 2, rows: int = 4, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, WIDTH, generator=g), torch.randint(0, WIDTH, (rows,), generator=g))
            for _ in range(calls)]


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def _blocks(model) -> None:
    for k, layer in enumerate(model.layers):
        poptorch.BeginBlock(layer, f"l{k}")


def _train(model, strategy=None):
    opts = poptorch.Options().showCompilationProgressBar(False)
    if strategy is not None:
        opts.setExecutionStrategy(strategy)
    wrapper = poptorch.trainingModel(model, opts, _sgd(model.parameters()))
    outputs = [wrapper(*b) for b in _batches()]
    return wrapper, outputs, opts


def _ops(wrapper, op_type: str):
    return [op for op in wrapper._active.session.getIr().main.ops.values()
            if op.op_type == op_type]


def _max_sram(wrapper) -> int:
    return max(i.total_bytes for i in wrapper._active.session._device_model.memory.ipus)


def _phases():
    return [[f"l{k}"] for k in range(LAYERS)]


@pytest.fixture(scope="module")
def plain():
    model = Chain()
    wrapper, outputs, _ = _train(model)
    return model, wrapper, outputs


def test_P43_parallel_phases_train_over_two_ipus_like_eager_and_unphased(plain):
    plain_model, plain_wrapper, plain_outputs = plain
    model = Chain()
    reference = copy.deepcopy(model)
    _blocks(model)
    strategy = poptorch.ParallelPhasedExecution(*_phases()).sendTensorsOffChipAfterFwd()
    wrapper, outputs, opts = _train(model, strategy)
    placement = wrapper._active.placement
    assert placement.strategy == "phased" and placement.ipus_per_replica == 2
    assert [s.ipu for s in placement.stages] == [k % 2 for k in range(LAYERS)]
    # Results: the eager torch run and the unphased wrapper.
    expected = run_reference(reference, _sgd(reference.parameters()), _batches(), opts)
    assert_state_equal(model, reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outputs[-1][1], expected[-1][1], rtol=1e-5, atol=1e-6)
    assert_state_equal(model, plain_model, rtol=0, atol=0)
    torch.testing.assert_close(outputs[-1][1], plain_outputs[-1][1], rtol=0, atol=0)
    # Phase k on IPU k % 2; the activations the backward pass reads go through streaming memory.
    session = wrapper._active.session
    assert {op.settings.execution_phase for op in _ops(wrapper, "Tanh")} == set(range(LAYERS))
    for op in session.getIr().main.ops.values():
        if op.settings.execution_phase is not None and op.op_type != "RemoteLoad":
            assert op.settings.ipu == op.settings.execution_phase % 2
    assert _ops(wrapper, "RemoteStore") and _ops(wrapper, "RemoteLoad")
    # Less SRAM per IPU than the unphased run on one IPU.
    assert _max_sram(wrapper) < _max_sram(plain_wrapper)


def test_P43_serial_phases_stream_weights_after_each_phase(plain):
    plain_model, plain_wrapper, _ = plain
    model = Chain()
    _blocks(model)
    strategy = poptorch.SerialPhasedExecution(*_phases())
    strategy.setTensorsLiveness(poptorch.Liveness.OffChipAfterEachPhase)
    wrapper, _, _ = _train(model, strategy)
    assert wrapper._active.placement.ipus_per_replica == 1
    assert_state_equal(model, plain_model, rtol=0, atol=0)
    loaded = {op.inputs[0].id for op in _ops(wrapper, "RemoteLoad")}
    assert sum(name in loaded for name in model.state_dict()) == 2 * LAYERS  # weights, biases
    memory = wrapper._active.session._device_model.memory.ipus[0]
    assert memory.categories["weights"] == 0 and memory.streaming_bytes > 0
    # Less SRAM for data than the unphased run (the RemoteLoad / RemoteStore ops add exchange
    # code on every tile they touch, which on one full-size IPU can outweigh this small model).
    plain_memory = plain_wrapper._active.session._device_model.memory.ipus[0]
    data = [m.total_bytes - m.categories["code"] for m in (memory, plain_memory)]
    assert data[0] < data[1]


def test_P43_liveness_sets_the_tensor_locations():
    strategy = poptorch.SerialPhasedExecution(*_phases())
    placement = blocks.Placement("phased", [], 1, phases=LAYERS, phase_stages=1)
    for liveness, acts, weights, schedule in [
            (poptorch.Liveness.AlwaysLive, False, False, "Preload"),
            (poptorch.Liveness.OffChipAfterFwd, True, False, "Preload"),
            (poptorch.Liveness.OffChipAfterFwdNoOverlap, True, False, "OnDemand"),
            (poptorch.Liveness.OffChipAfterEachPhase, True, True, "Preload")]:
        strategy.setTensorsLiveness(liveness)
        opts = popart.SessionOptions()
        phased.apply_phase_options(opts, placement, strategy)
        off = popart.TensorStorage.OffChip
        assert opts.virtualGraphMode is popart.VirtualGraphMode.ExecutionPhases
        assert (opts.executionPhaseSettings.phases, opts.executionPhaseSettings.stages) == (
            LAYERS, 1)
        assert (opts.activationTensorLocationSettings.location.storage is off) == acts
        assert (opts.weightTensorLocationSettings.location.storage is off) == weights
        assert opts.executionPhaseSettings.activationIOSchedule.name == schedule


def test_P43_separate_backward_phase_is_logged_once(caplog):
    strategy = poptorch.SerialPhasedExecution(*_phases()).useSeparateBackwardPhase(True)
    placement = blocks.Placement("phased", [], 1, phases=LAYERS, phase_stages=1)
    phased._logged.discard("separate")
    with caplog.at_level(logging.WARNING, logger="poptorch_lite"):
        phased.apply_phase_options(popart.SessionOptions(), placement, strategy)
        phased.apply_phase_options(popart.SessionOptions(), placement, strategy)
    assert caplog.text.count("useSeparateBackwardPhase(True) has no effect") == 1


def test_P43_a_phase_with_two_stages_is_refused():
    model = Chain()
    _blocks(model)
    strategy = poptorch.ParallelPhasedExecution(
        poptorch.Phase(poptorch.Stage("l0"), poptorch.Stage("l1")), ["l2"], ["l3"])
    with pytest.raises(Error, match="phase 0 has 2 stages"):
        _train(model, strategy)


def test_P43_blocks_outside_every_phase_are_refused():
    model = Chain()
    _blocks(model)
    with pytest.raises(Error, match="'l3' ran in forward but are in no phase"):
        _train(model, poptorch.SerialPhasedExecution(["l0"], ["l1"], ["l2"]))


def test_P43_parallel_phase_on_the_wrong_ipu_is_refused():
    model = Chain()
    _blocks(model)
    strategy = poptorch.ParallelPhasedExecution(*_phases())
    strategy.phase(0).ipus(1)
    with pytest.raises(Error, match="even phases on IPU 0, odd phases on IPU 1"):
        _train(model, strategy)



def test_P43_serial_phases_on_another_ipu_are_logged_once(caplog):
    # Serial phases share IPU 0 in the simulator: an IPU asked for by a phase or a block's
    # ipu_id has no effect, and says so once.
    phased._logged.discard("serial_ipu")
    x, _ = _batches(1)[0]
    with caplog.at_level(logging.WARNING, logger="poptorch_lite"):
        model = Chain()
        for k, layer in enumerate(model.layers):
            poptorch.BeginBlock(layer, f"l{k}", ipu_id=1)
        strategy = poptorch.SerialPhasedExecution(*_phases())
        strategy.phase(0).ipus(1)
        opts = poptorch.Options().showCompilationProgressBar(False)
        opts.setExecutionStrategy(strategy)
        wrapper = poptorch.inferenceModel(model, opts)
        wrapper(x, torch.zeros(4, dtype=torch.long))
        assert {op.settings.ipu for op in _ops(wrapper, "Gemm")} == {0}
        wrapper.destroy()
        phased._log_serial_ipus(strategy, {1})  # a second model asking the same: not again
    assert caplog.text.count("IPU(s) [1] given to the phases or their blocks have no effect") == 1
