"""Optimizers on training wrappers (spec §2.7, P51-P56): every supported torch and lite class
against torch.optim (LAMB against its formula), variable vs constant hyper-parameters,
setOptimizer, and optimizer state_dict() read from / written to the device."""

import copy
import math

import pytest
import torch

import poptorch_lite as poptorch
from poptorch_lite.testing import assert_allclose

from .test_training_compare import mlp_classifier
from .training_helpers import assert_state_equal, classification_batches, compare_training

BATCHES = classification_batches(2, 8, (6,), 4, seed=5)


def _two_groups(cls, **kwargs):
    """An optimizer with a second param group (other lr) for the last layer."""
    def make(params):
        params = list(params)
        return cls([{"params": params[:2]}, {"params": params[2:], "lr": 0.003}], **kwargs)
    return make


@pytest.mark.parametrize("make", [
    _two_groups(torch.optim.Adam, lr=0.01, weight_decay=0.1),
    _two_groups(torch.optim.AdamW, lr=0.01, betas=(0.8, 0.99)),
    _two_groups(torch.optim.RMSprop, lr=0.01, momentum=0.5, centered=True, weight_decay=0.01),
    _two_groups(torch.optim.Adagrad, lr=0.05, initial_accumulator_value=0.1),
    _two_groups(poptorch.optim.SGD, lr=0.05, momentum=0.9, dampening=0.1, loss_scaling=8.0),
    _two_groups(poptorch.optim.Adam, lr=0.01, loss_scaling=4.0),
    _two_groups(poptorch.optim.AdamW, lr=0.01, weight_decay=0.05),
    _two_groups(poptorch.optim.RMSprop, lr=0.01, alpha=0.9),
], ids=["Adam", "AdamW", "RMSprop", "Adagrad", "lite.SGD", "lite.Adam", "lite.AdamW",
        "lite.RMSprop"])
def test_optimizer_matches_torch(make):
    """P51-P53: each class (with per-group values, loss scaling) gives torch.optim's result."""
    # The lite classes are torch optimizers: their torch step() is the reference.
    wrapper, _, _ = compare_training(mlp_classifier(6), make, BATCHES,
                                     poptorch.Options().deviceIterations(2))
    wrapper.destroy()


def test_lamb_matches_its_formula():
    """P51: LAMB = Adam's direction plus decoupled decay, scaled by min(‖w‖, max)/‖u‖."""
    model = mlp_classifier(7)
    reference = copy.deepcopy(model)
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-6, 0.01
    wrapper = poptorch.trainingModel(model, poptorch.Options(), poptorch.optim.LAMB(
        model.parameters(), lr=lr, eps=eps, weight_decay=wd, max_weight_norm=None))
    state = {}
    for step, (x, y) in enumerate(BATCHES, start=1):
        wrapper(x, y)
        reference.zero_grad()
        reference(x, y)[1].backward()
        with torch.no_grad():
            for p in reference.parameters():
                m, v = state.setdefault(p, (torch.zeros_like(p), torch.zeros_like(p)))
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                u = (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps) + wd * p
                ratio = p.norm() / u.norm() if p.norm() > 0 and u.norm() > 0 else 1.0
                p.sub_(lr * ratio * u)
    assert_state_equal(model, reference)
    wrapper.destroy()


def test_constant_attribute_change_is_an_error_variable_is_not():
    """P55: lr is variable (setOptimizer without recompiling); momentum left at torch's
    default is constant, so changing it after compile raises naming old and new values."""
    model = mlp_classifier(8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapper = poptorch.trainingModel(model, poptorch.Options(), optimizer)
    wrapper(*BATCHES[0])
    optimizer.param_groups[0]["lr"] = 0.05
    wrapper.setOptimizer(optimizer)  # fine: lr is variable
    optimizer.param_groups[0]["momentum"] = 0.9
    with pytest.raises(poptorch.Error, match=r"'momentum'.*constant: compiled with 0.0, now 0.9"
                                             r".*markAsVariable"):
        wrapper.setOptimizer(optimizer)
    wrapper.destroy()


def test_optimizer_missing_a_parameter_is_an_error():
    """Acceptance: a trainable parameter outside every param group is named in the error."""
    model = mlp_classifier(9)
    params = list(model.parameters())
    wrapper = poptorch.trainingModel(model, poptorch.Options(),
                                     torch.optim.SGD(params[:-1], lr=0.1))
    with pytest.raises(poptorch.Error, match=r"'net.2.bias'.*not in any param group"):
        wrapper(*BATCHES[0])
    wrapper.destroy()


def test_frozen_parameter_does_not_change():
    """requires_grad=False parameters stay fixed, like torch.optim skipping them."""
    model = mlp_classifier(10)
    model.net[0].weight.requires_grad_(False)
    compare_training(model, lambda p: torch.optim.Adam(p, lr=0.01), BATCHES)[0].destroy()


def test_unsupported_optimizer_is_an_error():
    model = mlp_classifier(11)
    wrapper = poptorch.trainingModel(model, poptorch.Options(),
                                     torch.optim.Adamax(model.parameters()))
    with pytest.raises(poptorch.Error, match="Adamax is not supported"):
        wrapper(*BATCHES[0])
    wrapper.destroy()


def test_torch_optimizer_state_dict_is_read_from_the_device_and_resumes_on_cpu():
    """P56: after device training, torch Adam's state_dict() holds the device moments and
    step, so training continues on CPU exactly as if it had run there."""
    model = mlp_classifier(12)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    wrapper = poptorch.trainingModel(model, poptorch.Options(), optimizer)
    for x, y in BATCHES:
        wrapper(x, y)
        ref_optimizer.zero_grad()
        reference(x, y)[1].backward()
        ref_optimizer.step()
    state = optimizer.state_dict()
    expected = ref_optimizer.state_dict()
    for index, entry in expected["state"].items():
        for key, value in entry.items():
            assert_allclose(actual=state["state"][index][key], expected=value, rtol=1e-4,
                            atol=1e-6, msg=f"state[{index}][{key!r}]")
    wrapper.destroy()


def test_lite_state_dict_round_trip_between_wrappers():
    """P56: a lite optimizer's state_dict has ipu_state/ipu_param; loading it into a new
    wrapper's optimizer continues the trajectory; a plain torch state is refused."""
    model = mlp_classifier(13)
    reference = copy.deepcopy(model)
    first = poptorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    wrapper = poptorch.trainingModel(model, poptorch.Options(), first)
    wrapper(*BATCHES[0])
    saved = first.state_dict()
    assert {"ipu_state", "ipu_param", "state", "param_groups"} <= set(saved)
    assert any(k.startswith("Accl___") for k in saved["ipu_state"])
    weights = copy.deepcopy(model.state_dict())
    wrapper.destroy()

    resumed = mlp_classifier(13)
    resumed.load_state_dict(weights)
    second = poptorch.optim.SGD(resumed.parameters(), lr=0.05, momentum=0.9)
    second.load_state_dict(saved)
    wrapper2 = poptorch.trainingModel(resumed, poptorch.Options(), second)
    wrapper2(*BATCHES[1])

    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    for x, y in BATCHES:
        ref_optimizer.zero_grad()
        reference(x, y)[1].backward()
        ref_optimizer.step()
    assert_state_equal(resumed, reference)
    with pytest.raises(RuntimeError, match="no 'ipu_state'"):
        second.load_state_dict(ref_optimizer.state_dict())
    wrapper2.destroy()


def test_new_optimizer_object_through_set_optimizer():
    """P12: setOptimizer with another optimizer object of the same class takes its values and
    state (here: fresh state, so momentum restarts)."""
    model = mlp_classifier(14)
    reference = copy.deepcopy(model)
    wrapper = poptorch.trainingModel(model, poptorch.Options(),
                                     torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    x, y = BATCHES[0]
    wrapper(x, y)
    ref_opt.zero_grad()
    reference(x, y)[1].backward()
    ref_opt.step()
    wrapper.setOptimizer(torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.02, momentum=0.9)
    x, y = BATCHES[1]
    wrapper(x, y)
    ref_opt.zero_grad()
    reference(x, y)[1].backward()
    ref_opt.step()
    assert_state_equal(model, reference)
    wrapper.destroy()


def test_max_grad_norm_clips_like_clip_grad_norm():
    """P56: lite optimizers' max_grad_norm = torch.nn.utils.clip_grad_norm_ before the step."""
    model = mlp_classifier(15)
    reference = copy.deepcopy(model)
    wrapper = poptorch.trainingModel(model, poptorch.Options(), poptorch.optim.SGD(
        model.parameters(), lr=0.1, max_grad_norm=0.05))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in BATCHES:
        wrapper(x, y)
        ref_opt.zero_grad()
        reference(x, y)[1].backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
        ref_opt.step()
    assert_state_equal(model, reference)
    assert math.isfinite(float(wrapper.model.net[0].weight.detach().sum()))
    wrapper.destroy()
