"""The wrapper's repeat-call path (issue #4 performance): a call repeating the last call's
input signature with plain tensors skips binding, flattening and the executable lookup; any
other call takes the full path with its checks and warnings (spec §2.1, P5, P24)."""

import copy
import warnings

import pytest
import torch

import poptorch_lite as poptorch
from poptorch_lite import tracing
from poptorch_lite.testing import assert_allclose

from .conftest import make_mlp


class WithDefaults(torch.nn.Module):
    """A forward with a non-tensor default and an optional tensor, like many user models."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x, scale: float = 2.0, bias=None):
        y = self.fc(x) * scale
        return {"y": y, "sum": y.sum()} if bias is None else {"y": y + bias, "sum": y.sum()}


@pytest.fixture(scope="module")
def wrapped():
    model = make_mlp()
    wrapper = poptorch.inferenceModel(model)
    wrapper(torch.randn(4, 4))
    yield model, wrapper
    wrapper.destroy()


@pytest.fixture
def count_binds(monkeypatch):
    """How often the full path bound a call to forward's signature."""
    calls = []
    original = tracing.bind_inputs

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(tracing, "bind_inputs", counting)
    return calls


def test_repeated_calls_skip_binding_and_read_fresh_data(wrapped, count_binds):
    model, wrapper = wrapped
    x = torch.randn(4, 4)
    first = wrapper(x)  # records the call (the fixture's call may have used another tensor)
    assert_allclose(actual=first, expected=model(x).detach())
    x.mul_(3.0)  # same tensor object, new values: the data is read again every call
    second = wrapper(x)
    assert_allclose(actual=second, expected=model(x).detach())
    assert_allclose(actual=first, expected=model(x / 3.0).detach())  # results are not reused
    other = torch.randn(4, 4)
    assert_allclose(actual=wrapper(other), expected=model(other).detach())
    assert len(count_binds) <= 1


def test_other_calls_take_the_full_path(wrapped, count_binds):
    model, wrapper = wrapped
    x = torch.randn(4, 4)
    wrapper(x)
    binds = len(count_binds)
    assert_allclose(actual=wrapper(x=x), expected=model(x).detach())  # keyword argument
    assert len(count_binds) == binds + 1
    wrapper._warned.discard("requires_grad")
    with pytest.warns(UserWarning, match="requires grad; it is detached"):
        out = wrapper(x.clone().requires_grad_())
    assert_allclose(actual=out, expected=model(x).detach())
    wrapper._warned.discard("contiguous")
    xt = torch.randn(4, 4).t()
    with pytest.warns(UserWarning, match="is not contiguous"):
        out = wrapper(xt)
    assert_allclose(actual=out, expected=model(xt).detach())
    with pytest.raises(poptorch.Error, match=r"forward\(x\)"):
        wrapper(x, x)  # the wrong number of arguments is still reported
    binds = len(count_binds)
    x8 = torch.randn(8, 4)
    with pytest.raises(poptorch.Error, match="inputs differ from those used to compile"):
        wrapper(x8)  # a new shape: full path, then refused (PopTorch's rule)
    assert len(count_binds) == binds + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_allclose(actual=wrapper(x), expected=model(x).detach())
        assert_allclose(actual=wrapper(x), expected=model(x).detach())


def test_detach_and_destroy_leave_the_fast_path():
    model = make_mlp(1)
    wrapper = poptorch.inferenceModel(model)
    x = torch.randn(2, 4)
    wrapper(x)
    wrapper.detachFromDevice()
    assert_allclose(actual=wrapper(x), expected=model(x).detach())  # reattaches
    assert wrapper.isAttached()
    wrapper.destroy()
    assert_allclose(actual=wrapper(x), expected=model(x).detach())  # compiles again
    assert wrapper.isCompiled()
    wrapper.destroy()


def test_defaults_and_output_structure(count_binds):
    model = WithDefaults().eval()
    wrapper = poptorch.inferenceModel(model)
    x = torch.randn(2, 4)
    for _ in range(3):
        out = wrapper(x)
        assert set(out) == {"y", "sum"}
        assert_allclose(actual=out["y"], expected=model(x)["y"].detach())
        assert out["sum"].shape == ()
    assert len(count_binds) == 1
    with pytest.raises(poptorch.Error, match="input scale: expected 2.0, got 3.0"):
        wrapper(x, 3.0)  # a non-tensor argument: full path, refused as a new signature
    assert len(count_binds) == 2
    wrapper.destroy()


def test_training_steps_match_eager_through_the_fast_path(count_binds):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    eager = copy.deepcopy(WithLoss(model))
    training = poptorch.trainingModel(
        WithLoss(model), optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    x, labels = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    for _ in range(3):
        out, loss = training(x, labels)
        eager_opt.zero_grad()
        eager_out, eager_loss = eager(x, labels)
        eager_loss.backward()
        eager_opt.step()
        assert_allclose(actual=loss, expected=eager_loss.detach(), rtol=1e-5, atol=1e-6)
        assert_allclose(actual=out, expected=eager_out.detach(), rtol=1e-5, atol=1e-6)
    assert len(count_binds) == 1
    assert_allclose(actual=model[0].weight, expected=eager.net[0].weight.detach(),
                    rtol=1e-5, atol=1e-6)
    training.destroy()


class WithLoss(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, labels):
        out = self.net(x)
        return out, torch.nn.functional.cross_entropy(out, labels)


def test_one_step_io_serves_every_call_and_a_failed_call_leaves_it_usable():
    """The wrapper reuses its executable's step IO: results of consecutive calls stay
    independent, and a call the backend refuses (an int64 input outside int32) does not
    disturb the next one."""

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.table = torch.nn.Embedding(10, 3)

        def forward(self, ids, x):
            return self.table(ids) * x

    model = Embed()
    wrapper = poptorch.inferenceModel(copy.deepcopy(model))
    ids, x = torch.tensor([1, 2, 3]), torch.randn(3, 3)
    first = wrapper(ids, x)
    stepio = wrapper._active.stepio
    assert stepio is not None
    second = wrapper(ids, 2.0 * x)
    assert wrapper._active.stepio is stepio
    assert_allclose(actual=first, expected=model(ids, x).detach())
    assert_allclose(actual=second, expected=model(ids, 2.0 * x).detach())
    with pytest.raises(poptorch.Error, match="outside the int32 range"):
        wrapper(torch.tensor([1, 2 ** 40, 3]), x)
    assert_allclose(actual=wrapper(ids, x), expected=model(ids, x).detach())
    wrapper.destroy()
