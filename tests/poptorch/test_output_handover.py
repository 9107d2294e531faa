"""Inference outputs of consecutive calls (issue 17: the anchor output path).

Each call returns new tensors, as PopTorch does, even though the device hands its result tensor
over instead of copying it: a result must stay as it was when later calls run, when the caller
changes its inputs, and when the weights change; every result equals eager torch.
"""

import torch

import poptorch_lite as poptorch
from poptorch_lite.testing import assert_allclose

from .conftest import make_mlp


class Aliasing(torch.nn.Module):
    """Outputs that are (views of) values the device or the caller keeps: the input itself, a
    reshape of it, a parameter, and the same value twice."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return x, x.reshape(-1), self.fc.weight, y, y


def test_consecutive_calls_stay_independent_and_equal_eager():
    model = make_mlp()
    wrapper = poptorch.inferenceModel(model)
    x1, x2, x3 = (torch.randn(4, 4, generator=torch.Generator().manual_seed(s))
                  for s in (1, 2, 3))
    out1 = wrapper(x1)
    kept = out1.clone()
    row = wrapper(x2)[0]  # only a view of the second result survives
    out3 = wrapper(x3)
    with torch.no_grad():
        assert_allclose(actual=out1, expected=model(x1))
        assert_allclose(actual=row, expected=model(x2)[0])
        assert_allclose(actual=out3, expected=model(x3))
    assert torch.equal(out1, kept)
    assert out1.data_ptr() != out3.data_ptr()
    wrapper.destroy()


def test_outputs_aliasing_inputs_or_weights_are_independent():
    model = Aliasing().eval()
    wrapper = poptorch.inferenceModel(model)
    x = torch.randn(2, 4)
    x_copy = x.clone()
    first = wrapper(x)
    with torch.no_grad():
        expected = [t.clone() for t in model(x_copy)]
    x.add_(10.0)  # the caller reuses its input buffer
    with torch.no_grad():
        model.fc.weight.mul_(3.0)
    wrapper.copyWeightsToDevice()
    second = wrapper(x)
    for got, want in zip(first, expected):
        assert_allclose(actual=got, expected=want)
    with torch.no_grad():
        for got, want in zip(second, model(x)):
            assert_allclose(actual=got, expected=want)
    assert first[3].data_ptr() != second[3].data_ptr()
    wrapper.destroy()


def test_large_output_reuses_a_dropped_result_and_never_a_held_one():
    """A large result (1 MiB logits, device/recycle.py) is written into the previous call's
    result once the caller dropped it; a result still held, or a view of it, never changes."""
    torch.manual_seed(2)
    model = torch.nn.Linear(16, 4096)
    wrapper = poptorch.inferenceModel(model)
    xs = [torch.randn(64, 16, generator=torch.Generator().manual_seed(s)) for s in range(4)]
    first = wrapper(xs[0])
    address = first.data_ptr()
    del first
    second = wrapper(xs[1])
    assert second.data_ptr() == address  # the dropped result's memory, no page faulted in
    kept = second.clone()
    row = second[3]  # a view keeps the result alive
    del second
    third = wrapper(xs[2])
    assert third.data_ptr() != address
    assert torch.equal(row, kept[3])
    with torch.no_grad():
        for x, out in ((xs[1], kept), (xs[2], third), (xs[3], wrapper(xs[3]))):
            assert_allclose(actual=out, expected=model(x))
