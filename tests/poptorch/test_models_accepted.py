"""Models PopTorch accepts (spec §2.1, §2.8, §2.10; P5, P17, P57, P65): several losses and
extra outputs, nested/dict inputs and outputs, no inputs, mutated Python constants, and the
error for a changed input that forward cannot take."""

from __future__ import annotations

import collections
import copy
import logging

import pytest
import torch
import torch.nn.functional as F

import poptorch_lite as poptorch
from poptorch_lite.testing import assert_allclose

from .training_helpers import assert_state_equal


class Net(torch.nn.Module):
    def __init__(self, mode):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 3)
        self.mode = mode

    def forward(self, x, t):
        y = self.fc(x)
        if self.mode == "accuracy":  # a torch loss plus a 0-d metric computed beside it
            return y, F.cross_entropy(y, t), (y.argmax(1) == t).float().mean()
        if self.mode == "scaled_copy":  # extra outputs computed from the loss
            loss = F.mse_loss(y, torch.zeros_like(y))
            return y, loss, loss.detach() * 2, loss * 3
        if self.mode == "nested_identity":  # identity losses folded into the final one
            l1 = poptorch.identity_loss(y.pow(2), "mean")
            l2 = poptorch.identity_loss(y.abs(), "sum")
            return y, poptorch.identity_loss(l1 + 0.5 * l2, "none")
        if self.mode == "loss_into_identity":
            return y, poptorch.identity_loss(F.cross_entropy(y, t) * 2, "sum")
        raise AssertionError(self.mode)

    def reference_loss(self, outputs):
        return {"accuracy": lambda o: o[1], "scaled_copy": lambda o: o[1],
                "nested_identity": lambda o: o[1],
                "loss_into_identity": lambda o: o[1]}[self.mode](outputs)


@pytest.mark.parametrize("mode", ["accuracy", "scaled_copy", "nested_identity",
                                  "loss_into_identity"])
def test_loss_among_extra_outputs_trains_like_torch(mode):
    model = Net(mode)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    wrapper = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    generator = torch.Generator().manual_seed(3)
    for _ in range(2):
        x, t = torch.randn(4, 4, generator=generator), torch.randint(0, 3, (4,), generator=generator)
        expected = reference(x, t)
        reference.reference_loss(expected).backward()
        optimizer.step()
        optimizer.zero_grad()
        actual = wrapper(x, t)
        for got, want in zip(actual, expected):
            assert_allclose(actual=got, expected=want.detach(), rtol=1e-5, atol=1e-6)
    assert_state_equal(model, reference, rtol=1e-5, atol=1e-6)


def test_two_independent_losses_are_an_error():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            y = self.fc(x)
            return F.mse_loss(y, torch.zeros_like(y)), poptorch.identity_loss(y.abs(), "mean")

    model = Model()
    wrapper = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="2 independent losses"):
        wrapper(torch.randn(2, 4))


class DictModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, inputs, extra=None):
        first, (second, third) = inputs["x"], inputs["pair"]
        out = collections.OrderedDict(a=self.fc(first))
        out["b"] = [second * 2, {"c": third + extra["shift"]}]
        out["d"] = (out["a"].sum(), 3, "label", None)
        return out


def test_ordered_dict_and_nested_inputs_and_outputs():
    model = DictModel()
    inputs = collections.OrderedDict(x=torch.randn(2, 4), pair=(torch.randn(2), torch.randn(3)))
    extra = {"shift": torch.ones(3)}
    actual, expected = poptorch.inferenceModel(model)(inputs, extra), model(inputs, extra)
    assert type(actual) is collections.OrderedDict and list(actual) == ["a", "b", "d"]
    assert isinstance(actual["b"], list) and isinstance(actual["b"][1], dict)
    assert actual["d"][1:] == (3, "label", None)  # non-tensor outputs come back as values
    flat_actual = torch.utils._pytree.tree_leaves(actual)
    flat_expected = torch.utils._pytree.tree_leaves(expected)
    assert len(flat_actual) == len(flat_expected)
    for got, want in zip(flat_actual, flat_expected):
        if isinstance(want, torch.Tensor):
            assert_allclose(actual=got, expected=want.detach(), rtol=1e-6, atol=1e-6)
        else:
            assert got == want


def test_models_without_inputs():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))

        def forward(self):
            return self.p * 2, poptorch.identity_loss((self.p ** 2).sum(), "sum")

    model = Model()
    reference = copy.deepcopy(model)
    inference = poptorch.inferenceModel(Model())
    assert_allclose(actual=inference()[0], expected=reference()[0].detach(), rtol=0, atol=0)
    wrapper = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        expected = reference()
        expected[1].backward()
        optimizer.step()
        optimizer.zero_grad()
        actual = wrapper()
        assert_allclose(actual=actual[1], expected=expected[1].detach(), rtol=1e-6, atol=1e-6)
    assert_state_equal(model, reference)


def test_mutated_tensor_attribute_is_a_constant_like_poptorch(caplog):
    """PopTorch's documented counter example: a plain tensor attribute updated in place in
    forward is a constant of the compiled model, so every call returns 1; the host value is
    left as it was, and the frozen update is logged."""
    class CounterModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.i = torch.tensor([0.0])

        def forward(self):
            self.i += 1
            return self.i

    model = CounterModel()
    wrapper = poptorch.inferenceModel(model)
    with caplog.at_level(logging.WARNING, logger="poptorch_lite"):
        first = wrapper()
    # eager, from the same starting value, the first call also returns 1
    assert_allclose(actual=first, expected=CounterModel()(), rtol=0, atol=0)
    assert_allclose(actual=wrapper(), expected=torch.tensor([1.0]), rtol=0, atol=0)
    assert float(model.i) == 0.0
    assert "not a registered buffer" in caplog.text


def test_mutated_python_number_is_frozen_at_its_traced_value():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return x * self.calls

    x = torch.ones(2)
    wrapper = poptorch.inferenceModel(Model())
    expected = Model()(x)  # the value forward computes on its first run
    assert_allclose(actual=wrapper(x), expected=expected, rtol=0, atol=0)
    assert_allclose(actual=wrapper(x), expected=expected, rtol=0, atol=0)


def test_changed_input_that_forward_cannot_take_names_the_change():
    wrapper = poptorch.inferenceModel(torch.nn.Linear(4, 2))
    wrapper(torch.randn(2, 4))
    with pytest.raises(poptorch.Error) as info:
        wrapper(torch.randn(2, 5))
    message = str(info.value)
    assert "input input: expected float32[2, 4], got float32[2, 5]" in message
    assert "Data-dependent" not in message
    assert info.value.type == "input_changed"


def test_changed_input_dtype_is_an_error_and_a_new_wrapper_takes_it():
    class Model(torch.nn.Module):
        def forward(self, x):
            return x * 2 + 1

    model = Model()
    wrapper = poptorch.inferenceModel(model)
    x = torch.randn(2, 4)
    wrapper(x)
    with pytest.raises(poptorch.Error, match="expected float32\\[2, 4\\], got float16"):
        wrapper(x.half())
    out = poptorch.inferenceModel(model)(x.half())
    assert out.dtype == torch.float16
    assert_allclose(actual=out, expected=model(x.half()), rtol=0, atol=0)
