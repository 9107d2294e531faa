"""Model partitioning in the frontend (spec §2.3, P37-P45): blocks, stages, execution
strategies, the IPU-count rules and the depth rules, and the pipelined + replicated example.

Pipelined and sharded runs must give the numbers of the plain run (spec §2.3, last point): the
references are the same model trained eagerly (``testing.run_reference``) and, for 2 IPUs, the
unannotated single-IPU wrapper.
"""

from __future__ import annotations

import copy
import runpy
import sys
from pathlib import Path

import pytest
import torch

import poptorch_lite as poptorch
from poptorch_lite.testing import run_reference

from .training_helpers import assert_state_equal

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 6


class Chain(torch.nn.Module):
    """``layers`` Linear+tanh layers and a cross-entropy loss on the last one's output."""

    def __init__(self, layers: int = 4, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers))

    def forward(self, x, y):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x, torch.nn.functional.cross_entropy(x, y)


def _batches(calls: int, rows: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, WIDTH, generator=g), torch.randint(0, WIDTH, (rows,), generator=g))
            for _ in range(calls)]


def _options(accumulation: int = 1, iterations: int = 1, replicas: int = 1):
    opts = poptorch.Options().deviceIterations(iterations).replicationFactor(replicas)
    opts.Training.gradientAccumulation(accumulation)
    return opts.showCompilationProgressBar(False)


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _stages(wrapper) -> set[int]:
    """Pipeline stages of the compiled backend graph (forward and backward)."""
    session = wrapper._active.session
    ir = session.getIr()
    return {op.settings.pipeline_stage for op in ir.main.ops.values()
            if op.settings.pipeline_stage is not None}


def _train(model, opts, batches):
    wrapper = poptorch.trainingModel(model, opts, _sgd(model.parameters()))
    outputs = [wrapper(*b) for b in batches]
    return wrapper, outputs


@pytest.mark.parametrize("ipus", [2, 4])
def test_pipelined_accumulation_equals_single_ipu_P37_P41(ipus):
    layers = 4
    model = Chain(layers)
    reference = copy.deepcopy(model)
    for k in range(1, ipus):
        poptorch.BeginBlock(model.layers[k * layers // ipus], f"stage{k}", ipu_id=k)
    accumulation = 2 * ipus  # >= 2P - 1
    opts = _options(accumulation=accumulation, iterations=2)
    batches = _batches(2, 2 * 2 * accumulation)
    wrapper, outputs = _train(model, opts, batches)
    placement = wrapper._active.placement
    assert placement.pipelined and placement.num_stages == ipus
    assert [s.ipu for s in placement.stages] == list(range(ipus))
    assert _stages(wrapper) == set(range(2 * ipus - 1))  # backward stages 2L - s
    expected = run_reference(reference, _sgd(reference.parameters()), batches, opts)
    assert_state_equal(model, reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outputs[-1][1], expected[-1][1], rtol=1e-5, atol=1e-6)
    if ipus == 2:
        # The unannotated model on one IPU: the same weights.
        single = Chain(layers)
        single_wrapper, _ = _train(single, _options(accumulation=accumulation, iterations=2),
                                   batches)
        assert_state_equal(model, single, rtol=1e-5, atol=1e-6)
        assert single_wrapper._active.placement.ipus_per_replica == 1


@pytest.mark.parametrize("strategy", [poptorch.MeanReductionStrategy.Running,
                                      poptorch.MeanReductionStrategy.Post])
def test_pipelined_mean_accumulation_strategies_equal_eager_P37_P41(strategy):
    """Training.setMeanAccumulationAndReplicationReductionStrategy under pipelining: Running
    (a micro-batch counter per backward stage) and Post give the eager mean of the gradients."""
    model = Chain(3, seed=5)
    reference = copy.deepcopy(model)
    poptorch.BeginBlock(model.layers[2], "last", ipu_id=1)
    opts = _options(accumulation=4, iterations=2)
    opts.Training.setMeanAccumulationAndReplicationReductionStrategy(strategy)
    batches = _batches(2, 2 * 2 * 4, seed=6)
    wrapper, outputs = _train(model, opts, batches)
    assert wrapper._active.placement.pipelined
    expected = run_reference(reference, _sgd(reference.parameters()), batches, opts)
    assert_state_equal(model, reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outputs[-1][1], expected[-1][1], rtol=1e-5, atol=1e-6)


def test_sharded_execution_equals_plain_run_P42():
    model = Chain(3, seed=2)
    reference = copy.deepcopy(model)
    poptorch.BeginBlock(model.layers[1], "b", ipu_id=1)
    poptorch.BeginBlock(model.layers[2], "c", ipu_id=0)  # back to IPU 0: fine when sharded
    opts = _options(iterations=2).setExecutionStrategy(poptorch.ShardedExecution())
    batches = _batches(2, 4, seed=3)
    wrapper, _ = _train(model, opts, batches)
    assert wrapper._active.placement.strategy == "sharded"
    assert not _stages(wrapper)
    ir_ipus = {op.settings.ipu for op in wrapper._active.session.getIr().main.ops.values()}
    assert ir_ipus == {0, 1}
    run_reference(reference, _sgd(reference.parameters()), batches, opts)
    assert_state_equal(model, reference, rtol=1e-5, atol=1e-6)


class Blocks(torch.nn.Module):
    """Annotated inside forward: Block.useAutoId, a Block context, Block.start, BlockFunction."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.a = torch.nn.Linear(WIDTH, WIDTH)
        self.b = torch.nn.Linear(WIDTH, WIDTH)
        self.c = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        poptorch.Block.useAutoId()
        with poptorch.Block():  # "0"
            x = torch.relu(self.a(x))
        x = self.middle(x)  # "1"
        poptorch.Block.start()  # "2"
        return self.c(x)

    @poptorch.BlockFunction()
    def middle(self, x):
        return torch.sigmoid(self.b(x))


def test_auto_ids_and_auto_increment_stages_P38_P39_P40():
    model = Blocks().eval()
    x = torch.randn(12, WIDTH)
    expected = model(x)  # blocks do nothing on CPU
    opts = poptorch.Options().deviceIterations(3).showCompilationProgressBar(False)
    opts.autoRoundNumIPUs(True)  # 3 stages on IPUs 0, 1, 2
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    wrapper = poptorch.inferenceModel(model, opts)
    torch.testing.assert_close(wrapper(x), expected, rtol=1e-5, atol=1e-6)
    stages = wrapper._active.placement.stages
    assert [(s.stage, s.ipu, s.blocks) for s in stages] == [(0, 0, ["0"]), (1, 1, ["1"]),
                                                            (2, 2, ["2"])]
    assert _stages(wrapper) == {0, 1, 2}


def test_explicit_stages_merge_adjacent_blocks_on_one_ipu_P40_P45():
    model = Chain(4, seed=5).eval()
    for k, name in enumerate(["A", "B", "C"], start=1):
        poptorch.BeginBlock(model.layers[k], name)
    x, y = _batches(1, 8, seed=6)[0]
    expected = model(x, y)
    opts = poptorch.Options().deviceIterations(2).showCompilationProgressBar(False)
    # "B" as an f-string id and a list of ids both name blocks; A joins the ops before it.
    opts.setExecutionStrategy(poptorch.PipelinedExecution(
        poptorch.Stage("A").ipu(0), [f"{'B'}"], poptorch.Stage("C").ipu(1)))
    wrapper = poptorch.inferenceModel(model, opts)
    got = wrapper(x, y)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-6)
    stages = wrapper._active.placement.stages
    # Stage("B") has no IPU: its position (1) is its IPU.
    assert [(s.ipu, s.blocks) for s in stages] == [(0, ["A"]), (1, ["B", "C"])]


def test_same_id_is_the_same_block_and_remove_blocks_P45():
    model = Chain(3, seed=7).eval()
    poptorch.BeginBlock(model.layers[1], "tail", ipu_id=1)
    poptorch.BeginBlock(model.layers[2], "tail", ipu_id=1)
    opts = poptorch.Options().deviceIterations(2).showCompilationProgressBar(False)
    x, y = _batches(1, 4, seed=8)[0]
    wrapper = poptorch.inferenceModel(model, opts)
    wrapper(x, y)
    assert [s.blocks for s in wrapper._active.placement.stages] == [
        ["<before any block>"], ["tail"]]
    assert "block 'tail' starts at 'layers.1' on ipu 1" in repr(wrapper)
    poptorch.removeBlocks(model)
    plain = poptorch.inferenceModel(model, opts)
    plain(x, y)
    assert plain._active.placement.ipus_per_replica == 1


# --- errors --------------------------------------------------------------------------------------


def _compile_error(model, opts, training=False, rows=8):
    x, y = _batches(1, rows)[0]
    if training:
        wrapper = poptorch.trainingModel(model, opts, _sgd(model.parameters()))
    else:
        wrapper = poptorch.inferenceModel(model.eval(), opts)
    with pytest.raises(poptorch.Error) as info:
        wrapper.compile(x, y)
    return str(info.value)


def test_depth_rules_P41():
    model = Chain(2)
    poptorch.BeginBlock(model.layers[1], "b", ipu_id=1)
    message = _compile_error(model, _options(accumulation=2), training=True)
    assert "gradientAccumulation >= 2 x 2 - 1 = 3" in message
    assert "backward pass doubles the stages" in message and "got gradientAccumulation(2)" in message
    inference = Chain(2)
    poptorch.BeginBlock(inference.layers[1], "b", ipu_id=1)
    message = _compile_error(inference, poptorch.Options().showCompilationProgressBar(False))
    assert "needs Options.deviceIterations >= 2" in message


def test_invalid_stages_P40():
    model = Chain(3)
    poptorch.BeginBlock(model.layers[1], "b", ipu_id=1)
    poptorch.BeginBlock(model.layers[2], "c", ipu_id=2)
    opts = _options(iterations=4).setExecutionStrategy(
        poptorch.PipelinedExecution(poptorch.Stage("b").ipu(1)))
    message = _compile_error(model, opts)
    assert "'c' ran in forward but are in no stage" in message
    assert "Known blocks: 'b', 'c'" in message
    with pytest.raises(poptorch.Error, match="block 'b' is in two stages"):
        poptorch.PipelinedExecution(poptorch.Stage("b"), poptorch.Stage("c", "b"))
    with pytest.raises(TypeError, match="execution strategy"):
        poptorch.Options().setExecutionStrategy("pipelined")
    # Stages must not decrease along the forward graph.
    backwards = Chain(3)
    poptorch.BeginBlock(backwards.layers[1], "b", ipu_id=1)
    poptorch.BeginBlock(backwards.layers[2], "c", ipu_id=0)
    message = _compile_error(backwards, _options(iterations=4))
    assert "Stage ids must not decrease" in message and "ShardedExecution" in message
    # SameAsIpu needs an ipu_id on every block.
    no_ipu = Chain(2)
    poptorch.BeginBlock(no_ipu.layers[1], "b")
    message = _compile_error(no_ipu, _options(iterations=4))
    assert "Block 'b' has no ipu_id" in message and "AutoIncrement" in message


def test_ipu_count_rules_P44():
    model = Chain(3)
    poptorch.BeginBlock(model.layers[1], "b", ipu_id=1)
    poptorch.BeginBlock(model.layers[2], "c", ipu_id=2)
    message = _compile_error(model, _options(iterations=4))
    assert "needs 3 IPUs" in message and "not a power of two" in message
    assert "autoRoundNumIPUs(True)" in message
    message = _compile_error(model, _options(iterations=4, replicas=32), rows=4 * 32)
    assert "too many IPUs requested (96)" in message
    rounded = _options(iterations=4).autoRoundNumIPUs(True)
    wrapper = poptorch.inferenceModel(model.eval(), rounded)
    x, y = _batches(1, 8)[0]
    torch.testing.assert_close(wrapper(x, y)[0], model(x, y)[0], rtol=1e-5, atol=1e-6)
    assert wrapper._device.numIpus == 4  # rounded up; IPU 3 idles


# --- the example ---------------------------------------------------------------------------------


def test_pipelined_replicated_example_runs(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["poptorch_pipelined_replicated.py", "--epochs", "1",
                                      "--samples", "256", "--no-progress"])
    runpy.run_path(str(ROOT / "examples" / "poptorch_pipelined_replicated.py"),
                   run_name="__main__")
    out = capsys.readouterr().out
    assert "stage 0 + backward stage 2: IPU 0" in out
    assert "fill 2 + main" in out and "flush 2" in out
    assert "2 IPU(s) per replica x 2 replica(s) = 4 IPU(s)" in out
    assert "final weights equal the eager run" in out
