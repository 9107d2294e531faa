"""Train -> inference weight propagation between wrappers whose models share modules (P11):
a training wrapper of a model with its loss around ``net`` and an inference wrapper of ``net``
(or of another model containing ``net``). Each inference call after training steps answers
with the trained weights, compared with the same training done eagerly."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import poptorch_lite as poptorch


class WithLoss(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, t):
        y = self.net(x)
        return y, F.cross_entropy(y, t)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))


def _opts():
    return poptorch.Options().showCompilationProgressBar(False)


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 12, generator=g), torch.randint(0, 5, (8,), generator=g)


def _eager_step(model, optimizer, x, t):
    optimizer.zero_grad()
    model(x, t)[1].backward()
    optimizer.step()


@pytest.mark.parametrize("wrap", ["net", "container"])
def test_inference_of_a_shared_module_follows_training_steps(wrap):
    """wrap='net': inference of the trained submodule itself; 'container': inference of a
    different model holding it (net followed by a softmax)."""
    net = _net()
    reference = copy.deepcopy(net)
    trainer = poptorch.trainingModel(WithLoss(net), _opts(),
                                     torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    ref_model = WithLoss(reference)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    model = net if wrap == "net" else nn.Sequential(net, nn.Softmax(-1))
    ref_infer = reference if wrap == "net" else nn.Sequential(reference, nn.Softmax(-1))
    inference = poptorch.inferenceModel(model, _opts())
    x, t = _batch()
    for _ in range(3):
        trainer(x, t)
        _eager_step(ref_model, ref_opt, x, t)
        with torch.no_grad():
            want = ref_infer(x)
        torch.testing.assert_close(inference(x), want, rtol=1e-5, atol=1e-5)
    trainer.destroy()


def test_inference_compiled_before_the_training_wrapper_follows_it():
    net = _net()
    reference = copy.deepcopy(net)
    x, t = _batch()
    inference = poptorch.inferenceModel(net, _opts())
    with torch.no_grad():
        torch.testing.assert_close(inference(x), reference(x))
    trainer = poptorch.trainingModel(WithLoss(net), _opts(),
                                     torch.optim.SGD(net.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        trainer(x, t)
        _eager_step(WithLoss(reference), ref_opt, x, t)
        with torch.no_grad():
            torch.testing.assert_close(inference(x), reference(x), rtol=1e-5, atol=1e-5)
    trainer.destroy()


def test_a_second_training_wrapper_of_a_shared_module_is_refused():
    net = _net()
    trainer = poptorch.trainingModel(WithLoss(net), _opts(),
                                     torch.optim.SGD(net.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="already held by the training wrapper of another"):
        poptorch.trainingModel(WithLoss(net), _opts(), torch.optim.SGD(net.parameters(), lr=0.1))
    trainer.destroy()
    # Once destroyed, the module can be trained by another wrapper.
    poptorch.trainingModel(WithLoss(net), _opts(),
                           torch.optim.SGD(net.parameters(), lr=0.1)).destroy()


class TwoLayers(nn.Module):
    """Linear, ReLU, Linear as named attributes (not a Sequential)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(12, 16), nn.Linear(16, 5)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _loaded_state():
    """A state dict for TwoLayers (shapes read from a fresh one: reading the trained model's
    would pull its device weights first)."""
    g = torch.Generator().manual_seed(5)
    return {k: torch.randn(v.shape, generator=g) for k, v in TwoLayers().state_dict().items()}


@pytest.mark.parametrize("how", ["model", "wrapper"])
def test_load_state_dict_after_training_is_kept_P10(how):
    """A state dict loaded into the trained model (its own ``load_state_dict``, then
    ``copyWeightsToDevice()``, or the wrapper's ``load_state_dict``) is what the host and the
    next training step start from, not the device weights of the previous steps pulled over it.
    Reference: eager training from the loaded state."""
    net = TwoLayers()
    model = WithLoss(net)
    trainer = poptorch.trainingModel(model, _opts(), torch.optim.SGD(net.parameters(), lr=0.1))
    x, t = _batch()
    trainer(x, t)
    state = {"net." + k: v for k, v in _loaded_state().items()}
    if how == "model":
        model.load_state_dict(state)
        trainer.copyWeightsToDevice()
    else:
        trainer.load_state_dict(state)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)
    reference = WithLoss(TwoLayers())
    reference.load_state_dict(state)
    _eager_step(reference, torch.optim.SGD(reference.parameters(), lr=0.1), x, t)
    trainer(x, t)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, reference.state_dict()[k])


@pytest.mark.parametrize("wrap", ["net", "container"])
def test_inference_wrapper_load_state_dict_of_a_shared_module_is_kept_P10_P11(wrap):
    """The inference wrapper of ``net`` (or of a model containing it) loads a state dict while a
    training wrapper of a model holding ``net`` has newer device weights: the inference answers
    with the loaded weights."""
    net = TwoLayers()
    trainer = poptorch.trainingModel(WithLoss(net), _opts(),
                                     torch.optim.SGD(net.parameters(), lr=0.1))
    model = net if wrap == "net" else nn.Sequential(net, nn.Softmax(-1))
    inference = poptorch.inferenceModel(model, _opts())
    x, t = _batch()
    inference(x)
    trainer(x, t)
    prefix = "" if wrap == "net" else "0."
    state = {prefix + k: v for k, v in _loaded_state().items()}
    inference.load_state_dict(state)
    reference = TwoLayers() if wrap == "net" else nn.Sequential(TwoLayers(), nn.Softmax(-1))
    reference.load_state_dict(state)
    torch.testing.assert_close(inference(x), reference(x).detach())
