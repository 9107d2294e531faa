"""``Options.anchorTensor`` and ``PoplarExecutor.getAnchoredTensor`` (P18): a backend tensor
added to the DataFlow anchors comes back after each run, stacked by its output mode as the
outputs are. Values are compared with eager torch (forward hooks, ``retain_grad``)."""

from __future__ import annotations

import copy

import pytest
import torch

import poptorch_lite as poptorch
from poptorch_lite.errors import Error

N = 2  # deviceIterations
B = 2  # micro-batch size
ACT = "relu"  # the backend id of Model.act's output (checked in test_inference)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 3)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(3, 2)

    def forward(self, x, target=None):
        y = self.fc2(self.act(self.fc1(x)))
        if target is None:
            return y
        return y, torch.nn.functional.mse_loss(y, target)


def _model():
    torch.manual_seed(0)
    return Model()


@pytest.mark.parametrize("mode", [poptorch.OutputMode.All, poptorch.OutputMode.Final])
def test_inference(mode):
    model = _model()
    opts = poptorch.Options().deviceIterations(N).anchorTensor("act", ACT, mode)
    wrapper = poptorch.inferenceModel(model, opts)
    x = torch.randn(N * B, 4)
    y = wrapper(x)
    assert ACT in wrapper.getTensorNames()
    seen = []
    model.act.register_forward_hook(lambda m, i, out: seen.append(out.detach()))
    with torch.no_grad():
        expected_y = model(x)
    torch.testing.assert_close(y, expected_y)
    expected = seen[0] if mode is poptorch.OutputMode.All else seen[0][-B:]
    got = wrapper.getAnchoredTensor("act")
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected)
    # the value follows the last call
    x2 = torch.randn(N * B, 4)
    wrapper(x2)
    seen.clear()
    with torch.no_grad():
        model(x2)
    expected = seen[0] if mode is poptorch.OutputMode.All else seen[0][-B:]
    torch.testing.assert_close(wrapper.getAnchoredTensor("act"), expected)


def test_inference_default_mode_is_the_models():
    opts = poptorch.Options().deviceIterations(N).anchorTensor("act", ACT)
    wrapper = poptorch.inferenceModel(_model(), opts)  # inference: Default -> All
    wrapper(torch.randn(N * B, 4))
    assert wrapper.getAnchoredTensor("act").shape == (N * B, 3)


def _eager_training(model, x, target, lr):
    """N SGD steps, one per micro-batch, recording act's output, y's gradient and fc1's weight
    gradient of each."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    acts, y_grads, w_grads = [], [], []
    model.act.register_forward_hook(lambda m, i, out: acts.append(out.detach().clone()))
    for i in range(N):
        rows = slice(i * B, (i + 1) * B)
        optimizer.zero_grad()
        y, loss = model(x[rows], target[rows])
        y.retain_grad()
        loss.backward()
        y_grads.append(y.grad.clone())
        w_grads.append(model.fc1.weight.grad.clone())
        optimizer.step()
    return acts, y_grads, w_grads


@pytest.mark.parametrize("mode", [poptorch.OutputMode.All, poptorch.OutputMode.Final])
def test_training(mode):
    lr = 0.1
    model = _model()
    reference = copy.deepcopy(model)
    opts = (poptorch.Options().deviceIterations(N)
            .anchorTensor("act", ACT, mode)
            .anchorTensor("grad_y", "Gradient___linear_1", mode)
            .anchorTensor("grad_w", "Gradient___fc1.weight", mode))
    wrapper = poptorch.trainingModel(model, opts,
                                     optimizer=torch.optim.SGD(model.parameters(), lr=lr))
    torch.manual_seed(1)
    x, target = torch.randn(N * B, 4), torch.randn(N * B, 2)
    wrapper(x, target)
    acts, y_grads, w_grads = _eager_training(reference, x, target, lr)
    if mode is poptorch.OutputMode.All:
        expected = [torch.cat(acts), torch.cat(y_grads), torch.cat(w_grads)]
    else:
        expected = [acts[-1], y_grads[-1], w_grads[-1]]
    for short, value in zip(("act", "grad_y", "grad_w"), expected):
        got = wrapper.getAnchoredTensor(short)
        assert got.shape == value.shape, short
        torch.testing.assert_close(got, value, rtol=1e-5, atol=1e-6, msg=short)


def test_unknown_long_name_lists_near_names():
    opts = poptorch.Options().anchorTensor("act", "reluu")
    wrapper = poptorch.inferenceModel(_model(), opts)
    with pytest.raises(Error, match=r"anchorTensor\('act', 'reluu'\).*getTensorNames"
                                    r"(.|\n)*'relu'"):
        wrapper(torch.randn(B, 4))


def test_get_anchored_tensor_before_run_or_unknown():
    opts = poptorch.Options().anchorTensor("act", ACT)
    wrapper = poptorch.inferenceModel(_model(), opts)
    with pytest.raises(Error, match="not been compiled"):
        wrapper.getAnchoredTensor("act")
    x = torch.randn(B, 4)
    wrapper.compile(x)
    with pytest.raises(Error, match="not run yet"):
        wrapper.getAnchoredTensor("act")
    wrapper(x)
    with pytest.raises(Error, match=r"getAnchoredTensor\('nope'\).*anchored: 'act'"):
        wrapper.getAnchoredTensor("nope")
    plain = poptorch.inferenceModel(_model())
    plain(x)
    with pytest.raises(Error, match="anchored: none"):
        plain.getAnchoredTensor("act")


def test_output_with_another_mode_is_refused():
    # the model's output is returned with All (inference); one DataFlow anchor has one mode
    opts = poptorch.Options().deviceIterations(N).anchorTensor(
        "y", "linear_1", poptorch.OutputMode.Final)
    wrapper = poptorch.inferenceModel(_model(), opts)
    with pytest.raises(Error, match="already returned with"):
        wrapper(torch.randn(N * B, 4))


def test_option_arguments_are_checked():
    with pytest.raises(TypeError, match="anchorTensor"):
        poptorch.Options().anchorTensor("a", "relu", "All")
    with pytest.raises(ValueError, match="output_return_period"):
        poptorch.Options().anchorTensor("a", "relu", poptorch.OutputMode.EveryN, 0)
    opts = poptorch.Options().deviceIterations(3).anchorTensor(
        "a", ACT, poptorch.OutputMode.EveryN, 2)
    with pytest.raises(Error, match="period must divide deviceIterations"):
        poptorch.inferenceModel(_model(), opts)(torch.randn(3 * B, 4))
