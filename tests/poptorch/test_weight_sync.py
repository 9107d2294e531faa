"""Lazy host sync of training wrappers and wrapper ownership (spec §2.1 "Weight sync", P10,
P14, P27)."""

import copy
import io

import pytest
import torch

import poptorch_lite as poptorch

from .test_training_compare import Classifier, mlp_classifier
from .training_helpers import classification_batches


@pytest.fixture
def trained():
    """A model trained for two calls on the device and its eager twin."""
    model = mlp_classifier(20)
    reference = copy.deepcopy(model)
    wrapper = poptorch.trainingModel(model, poptorch.Options(),
                                     torch.optim.SGD(model.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in classification_batches(2, 4, (6,), 4, seed=3):
        wrapper(x, y)
        ref_opt.zero_grad()
        reference(x, y)[1].backward()
        ref_opt.step()
    yield model, reference, wrapper
    wrapper.destroy()


def test_attribute_access_pulls_device_weights(trained):
    """P10: model.net[0].weight reads the trained values without copyWeightsToHost()."""
    model, reference, _ = trained
    torch.testing.assert_close(model.net[0].weight, reference.net[0].weight)


def test_parameters_and_state_dict_pull(trained):
    model, reference, _ = trained
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p, q, msg=name)
    torch.testing.assert_close(model.state_dict(), reference.state_dict())


def test_pickling_a_hooked_model_saves_the_user_class(trained):
    model, reference, _ = trained
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded) is Classifier
    torch.testing.assert_close(loaded.state_dict(), reference.state_dict())


def test_destroy_restores_classes_and_allows_rewrapping():
    """P14: destroy() unwraps the model; a second live training wrapper is refused."""
    model = mlp_classifier(21)
    wrapper = poptorch.trainingModel(model, poptorch.Options(),
                                     torch.optim.SGD(model.parameters(), lr=0.1))
    assert type(model) is not Classifier and isinstance(model, Classifier)
    with pytest.raises(RuntimeError, match="destroy"):
        poptorch.trainingModel(model, poptorch.Options(),
                               torch.optim.SGD(model.parameters(), lr=0.1))
    wrapper.destroy()
    assert type(model) is Classifier and type(model.net[0]) is torch.nn.Linear
    poptorch.trainingModel(model, poptorch.Options(),
                           torch.optim.SGD(model.parameters(), lr=0.1)).destroy()


def test_options_changed_after_compile_is_an_error(trained):
    """P27: options given to a wrapper are frozen; the wrapper keeps its own copy."""
    _, _, wrapper = trained
    options = poptorch.Options()
    model = mlp_classifier(22)
    inference = poptorch.inferenceModel(model.eval(), options)
    with pytest.raises(AttributeError, match="frozen.*clone"):
        options.deviceIterations(2)
    with pytest.raises(AttributeError, match="frozen"):
        wrapper.options.deviceIterations(2)
    inference.destroy()
