"""Local replication in the frontend (spec §2.4, P22, P24-P26): replicationFactor wired to the
backend, the replica dimension of every output mode, inputReplicaGrouping and the DataLoader's
combined batch.

References: eager PyTorch on the combined batch (``testing.run_reference`` with the replicas
folded into the accumulation: replica is the innermost micro-batch index, spec §2.4), and the
eager module's outputs for inference.
"""

from __future__ import annotations

import copy

import pytest
import torch

import poptorch_lite as poptorch
from poptorch_lite.testing import run_reference

from .training_helpers import assert_state_equal

IN, OUT = 5, 3


class Net(torch.nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(IN, 8)
        self.fc2 = torch.nn.Linear(8, OUT)

    def forward(self, x, y):
        logits = self.fc2(torch.relu(self.fc1(x)))
        return logits, torch.nn.functional.cross_entropy(logits, y)


def _batches(calls: int, rows: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, IN, generator=g), torch.randint(0, OUT, (rows,), generator=g))
            for _ in range(calls)]


def _options(replicas=1, accumulation=1, iterations=1, mean=True):
    opts = poptorch.Options().replicationFactor(replicas).deviceIterations(iterations)
    opts.Training.gradientAccumulation(accumulation)
    opts.Training.accumulationAndReplicationReductionType(
        poptorch.ReductionType.Mean if mean else poptorch.ReductionType.Sum)
    return opts.showCompilationProgressBar(False)


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


@pytest.mark.parametrize("mean", [True, False], ids=["Mean", "Sum"])
def test_replicas_with_accumulation_equal_eager_on_the_combined_batch_P22(mean):
    model = Net()
    reference = copy.deepcopy(model)
    r, g, n, b = 2, 2, 2, 3
    batches = _batches(2, b * n * g * r)
    wrapper = poptorch.trainingModel(model, _options(r, g, n, mean), _sgd(model.parameters()))
    for inputs in batches:
        _, loss = wrapper(*inputs)
    assert loss.shape == (r,)  # Final: one loss per replica
    eager = _options(accumulation=g * r, iterations=n, mean=mean)
    run_reference(reference, _sgd(reference.parameters()), batches, eager)
    assert_state_equal(model, reference, rtol=1e-5, atol=1e-6)
    assert wrapper._device.numIpus == r
    session_options = wrapper._options.to_backend(True)
    assert session_options.enableReplicatedGraphs and session_options.replicatedGraphCount == r


def test_pipelined_replicas_equal_eager_P22_P41():
    model = Net(seed=3)
    reference = copy.deepcopy(model)
    poptorch.BeginBlock(model.fc2, "head", ipu_id=1)
    r, g, b = 2, 3, 2
    batches = _batches(2, b * g * r, seed=4)
    wrapper = poptorch.trainingModel(model, _options(r, g), _sgd(model.parameters()))
    for inputs in batches:
        wrapper(*inputs)
    assert wrapper._device.numIpus == 4  # 2 IPUs per replica x 2 replicas
    assert wrapper._active.placement.pipelined
    run_reference(reference, _sgd(reference.parameters()), batches, _options(accumulation=g * r))
    assert_state_equal(model, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode,period,logits_rows,loss_shape", [
    (poptorch.OutputMode.All, None, 48, (24,)),
    (poptorch.OutputMode.Final, None, 4, (2,)),
    (poptorch.OutputMode.Sum, None, 4, (2,)),
    (poptorch.OutputMode.EveryN, 3, 16, (8,)),
])
def test_output_modes_with_replicas_follow_the_stacking_rule_P25(mode, period, logits_rows,
                                                                  loss_shape):
    # Spec §2.4's worked example: B=2, N=3, G=4, R=2 -> x [48, ...].
    opts = _options(replicas=2, accumulation=4, iterations=3).outputMode(mode, period)
    model = Net()
    wrapper = poptorch.trainingModel(model, opts, _sgd(model.parameters()))
    x, y = _batches(1, 48)[0]
    logits, loss = wrapper(x, y)
    assert logits.shape == (logits_rows, OUT)
    assert loss.shape == loss_shape


@pytest.mark.parametrize("mode", [poptorch.OutputMode.All, poptorch.OutputMode.Final,
                                  poptorch.OutputMode.Sum])
def test_inference_outputs_per_replica_P25(mode):
    model = Net(seed=5).eval()
    r, n, b = 2, 3, 2
    opts = poptorch.Options().replicationFactor(r).deviceIterations(n).outputMode(mode)
    wrapper = poptorch.inferenceModel(model, opts.showCompilationProgressBar(False))
    x, y = _batches(1, n * r * b, seed=6)[0]
    logits, _ = wrapper(x, y)
    eager = model(x, y)[0].detach()  # rows in [N, R, B] order
    per_micro = eager.reshape(n, r, b, OUT)
    if mode is poptorch.OutputMode.All:
        want = eager
    elif mode is poptorch.OutputMode.Final:
        want = per_micro[-1].reshape(r * b, OUT)
    else:
        want = per_micro.sum(0).reshape(r * b, OUT)
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind,groups", [
    (poptorch.CommGroupType.Consecutive, [0, 0, 1, 1]),
    (poptorch.CommGroupType.Orthogonal, [0, 1, 0, 1]),
])
def test_input_replica_grouping_feeds_groups_of_replicas_P22(kind, groups):
    model = Net(seed=7).eval()
    r, size, n, b = 4, 2, 2, 3
    opts = poptorch.Options().replicationFactor(r).deviceIterations(n)
    opts.inputReplicaGrouping(size, kind).outputMode(poptorch.OutputMode.All)
    wrapper = poptorch.inferenceModel(model, opts.showCompilationProgressBar(False))
    rin = r // size
    x, y = _batches(1, n * rin * b, seed=8)[0]  # the input carries R / size micro-batches
    logits, _ = wrapper(x, y)
    eager = model(x, y)[0].detach().reshape(n, rin, b, OUT)
    want = eager[:, groups].reshape(n * r * b, OUT)  # replica q sees its group's rows
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)


def test_grouping_and_combined_batch_errors_P24():
    with pytest.raises(ValueError, match="does not divide replicationFactor 4"):
        poptorch.Options().replicationFactor(4).inputReplicaGrouping(3,
                                                                     poptorch.CommGroupType.Consecutive)
    with pytest.raises(ValueError, match="CommGroupType.All is not valid"):
        poptorch.Options().replicationFactor(2).inputReplicaGrouping(2, poptorch.CommGroupType.All)
    opts = poptorch.Options().replicationFactor(4).deviceIterations(2)
    opts.inputReplicaGrouping(2, poptorch.CommGroupType.Consecutive)
    model = Net().eval()
    wrapper = poptorch.inferenceModel(model, opts.showCompilationProgressBar(False))
    x, y = _batches(1, 6)[0]
    with pytest.raises(poptorch.Error,
                       match=r"replicationFactor\(4\)/input_group_size\(2\) .* = 4"):
        wrapper(x, y)


def test_data_loader_combined_batch_counts_input_groups_P46():
    data = torch.utils.data.TensorDataset(torch.arange(96.0).reshape(48, 2))
    opts = poptorch.Options().replicationFactor(4).deviceIterations(2)
    opts.inputReplicaGrouping(2, poptorch.CommGroupType.Orthogonal)
    loader = poptorch.DataLoader(opts, data, batch_size=3)
    assert loader.combinedBatchSize == 3 * 2 * 2
    assert [len(batch[0]) for batch in loader] == [12] * 4
