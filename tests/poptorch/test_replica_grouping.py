"""Replica-grouped parameters in the frontend: ``wrapper.<param>.replicaGrouping(...)``.

Each group of replicas trains its own copy of the parameter on its replicas' data only.
Reference: one eager torch model per group, trained with torch's SGD on the rows of the
combined batch that the group's replicas receive (replica r gets rows r·mb .. r·mb + mb − 1).
"""

from __future__ import annotations

import copy

import pytest
import torch

import poptorch_lite as poptorch

IN, OUT, MB, RF = 3, 2, 2, 4
CG = poptorch.CommGroupType
Mode = poptorch.VariableRetrievalMode


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(IN, OUT, bias=False)

    def forward(self, x, y):
        out = self.fc(x)
        return out, torch.nn.functional.mse_loss(out, y)


def _groups(kind, shards):
    if kind is CG.NoGrouping:
        return [[r] for r in range(RF)]
    if kind is CG.Consecutive:
        return [list(range(s, s + shards)) for s in range(0, RF, shards)]
    m = RF // shards
    return [list(range(first, RF, m)) for first in range(m)]


def _opts():
    opts = poptorch.Options().replicationFactor(RF).showCompilationProgressBar(False)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Mean)
    return opts


@pytest.mark.parametrize("kind,shards", [(CG.Consecutive, 2), (CG.Orthogonal, 2),
                                         (CG.NoGrouping, 1)])
@pytest.mark.parametrize("mode", [Mode.OnePerGroup, Mode.AllReplicas])
def test_each_group_trains_on_its_replicas_data(kind, shards, mode):
    model = Net()
    groups = _groups(kind, shards)
    references = [copy.deepcopy(model) for _ in groups]
    wrapper = poptorch.trainingModel(model, _opts(),
                                     torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    wrapper.fc.weight.replicaGrouping(kind, shards, mode)
    ref_optims = [torch.optim.SGD(r.parameters(), lr=0.1, momentum=0.9) for r in references]
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(RF * MB, IN, generator=g), torch.randn(RF * MB, OUT, generator=g)
        wrapper(x, y)
        for members, ref, opt in zip(groups, references, ref_optims):
            rows = torch.cat([torch.arange(r * MB, (r + 1) * MB) for r in members])
            opt.zero_grad()
            torch.nn.functional.mse_loss(ref.fc(x[rows]), y[rows]).backward()
            opt.step()
    # Touching the model's parameters reads the device back.
    weight = model.fc.weight.detach().clone()
    got = wrapper.per_replica_weights["fc.weight"]
    want = torch.stack([r.fc.weight.detach() for r in references])
    if mode is Mode.AllReplicas:
        group_of = {r: i for i, members in enumerate(groups) for r in members}
        want = want[[group_of[r] for r in range(RF)]]
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weight, want[0], rtol=1e-5, atol=1e-6)  # replica 0's value
    # torch's optimizer state of the parameter: replica 0's group's momentum.
    momentum = wrapper._optimizer.state_dict()["state"][0]["momentum_buffer"]
    torch.testing.assert_close(
        momentum, ref_optims[0].state_dict()["state"][0]["momentum_buffer"], rtol=1e-5,
        atol=1e-6)
    wrapper.destroy()


def test_groups_survive_a_weight_round_trip_and_a_host_change_resets_them():
    model = Net()
    wrapper = poptorch.trainingModel(model, _opts(),
                                     torch.optim.SGD(model.parameters(), lr=0.1))
    wrapper.fc.weight.replicaGrouping(CG.Consecutive, 2, Mode.OnePerGroup)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(RF * MB, IN, generator=g), torch.randn(RF * MB, OUT, generator=g)
    wrapper(x, y)
    wrapper.copyWeightsToHost()
    before = wrapper.per_replica_weights["fc.weight"].clone()
    assert not torch.equal(before[0], before[1])  # the groups saw different data
    wrapper.copyWeightsToDevice()  # the parameter still holds group 0's value: groups kept
    wrapper.copyWeightsToHost()
    torch.testing.assert_close(wrapper.per_replica_weights["fc.weight"], before)
    with torch.no_grad():
        model.fc.weight.fill_(0.25)
    wrapper.copyWeightsToDevice()  # a new host value: every group starts from it
    wrapper.copyWeightsToHost()
    torch.testing.assert_close(wrapper.per_replica_weights["fc.weight"],
                               torch.full((2, OUT, IN), 0.25))
    wrapper.destroy()


def test_grouping_of_an_unused_parameter_is_refused():
    class Unused(Net):
        def __init__(self):
            super().__init__()
            self.extra = torch.nn.Parameter(torch.ones(2))

    model = Unused()
    wrapper = poptorch.trainingModel(model, _opts(),
                                     torch.optim.SGD(model.parameters(), lr=0.1))
    wrapper.extra.replicaGrouping(CG.Consecutive, 2, Mode.OnePerGroup)
    x, y = torch.randn(RF * MB, IN), torch.randn(RF * MB, OUT)
    with pytest.raises(poptorch.Error, match="does not use this parameter"):
        wrapper(x, y)
