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
