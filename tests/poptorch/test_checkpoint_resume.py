"""Checkpoints of training wrappers (P56): ``state_dict()`` / ``load_state_dict()`` of the model
and the optimizer, taken after N device steps and loaded into a new wrapper, continue exactly
as N + M continuous device steps."""

import copy

import pytest
import torch

import poptorch_lite as poptorch

from .test_training_compare import mlp_classifier
from .training_helpers import classification_batches

BATCHES = classification_batches(5, 8, (6,), 4, seed=11)
N_STEPS = 2


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1),
    lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.01),
    lambda p: poptorch.optim.SGD(p, lr=0.05, momentum=0.9),
    lambda p: poptorch.optim.Adam(p, lr=0.01),
], ids=["torch.SGD", "torch.Adam", "lite.SGD", "lite.Adam"])
def test_state_dict_resume_equals_continuous_device_training(make):
    """P56: save model + optimizer state_dicts after N steps, load both into a new model,
    optimizer and wrapper, run M steps: the parameters equal N + M continuous device steps."""
    continuous_model = mlp_classifier(21)
    start = copy.deepcopy(continuous_model.state_dict())
    continuous = poptorch.trainingModel(continuous_model, poptorch.Options(),
                                        make(continuous_model.parameters()))
    for x, y in BATCHES:
        continuous(x, y)
    continuous.copyWeightsToHost()
    expected = copy.deepcopy(continuous_model.state_dict())
    continuous.destroy()

    first_model = mlp_classifier(0)
    first_model.load_state_dict(start)
    first_optimizer = make(first_model.parameters())
    first = poptorch.trainingModel(first_model, poptorch.Options(), first_optimizer)
    for x, y in BATCHES[:N_STEPS]:
        first(x, y)
    first.copyWeightsToHost()
    model_state = copy.deepcopy(first_model.state_dict())
    optimizer_state = copy.deepcopy(first_optimizer.state_dict())
    first.destroy()

    resumed_model = mlp_classifier(1)
    resumed_model.load_state_dict(model_state)
    resumed_optimizer = make(resumed_model.parameters())
    resumed_optimizer.load_state_dict(optimizer_state)
    resumed = poptorch.trainingModel(resumed_model, poptorch.Options(), resumed_optimizer)
    for x, y in BATCHES[N_STEPS:]:
        resumed(x, y)
    resumed.copyWeightsToHost()
    for name, value in resumed_model.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-6, msg=name)
    resumed.destroy()


def test_resume_without_optimizer_state_differs():
    """The comparison above can fail: a fresh Adam (moments and step reset) drifts."""
    model = mlp_classifier(21)
    start = copy.deepcopy(model.state_dict())
    wrapper = poptorch.trainingModel(model, poptorch.Options(),
                                     torch.optim.Adam(model.parameters(), lr=0.01))
    for x, y in BATCHES:
        wrapper(x, y)
    wrapper.copyWeightsToHost()
    expected = copy.deepcopy(model.state_dict())
    wrapper.destroy()

    first_model = mlp_classifier(0)
    first_model.load_state_dict(start)
    first = poptorch.trainingModel(first_model, poptorch.Options(),
                                   torch.optim.Adam(first_model.parameters(), lr=0.01))
    for x, y in BATCHES[:N_STEPS]:
        first(x, y)
    first.copyWeightsToHost()
    first.destroy()
    resumed = poptorch.trainingModel(first_model, poptorch.Options(),
                                     torch.optim.Adam(first_model.parameters(), lr=0.01))
    for x, y in BATCHES[N_STEPS:]:
        resumed(x, y)
    resumed.copyWeightsToHost()
    diff = max((first_model.state_dict()[k] - expected[k]).abs().max().item() for k in expected)
    assert diff > 1e-4
    resumed.destroy()
