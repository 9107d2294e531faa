"""64-bit host values against the 32-bit device (spec §2.1 Outputs, P17): int64 inputs and
outputs must fit int32 (refused with an Error otherwise, never wrapped), float64 inputs are cast
to float32 with one warning, int64 buffers keep their host dtype."""

import warnings

import pytest
import torch

import poptorch_lite as poptorch

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


class Lookup(torch.nn.Module):
    """Integer arithmetic, an embedding lookup and a float64 input."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(10, 2)

    def forward(self, ids, offsets, scale):
        return offsets + 1, self.table(ids % 10), scale * 2


@pytest.fixture(name="lookup")
def _lookup():
    torch.manual_seed(0)
    model = Lookup()
    wrapper = poptorch.inferenceModel(model)
    yield model, wrapper
    wrapper.destroy()


def _inputs(offsets, scale=(1.5, -2.25)):
    return (torch.tensor([1, 12]), torch.tensor(offsets),
            torch.tensor(scale, dtype=torch.float64))


def test_int64_and_float64_inputs_in_range_are_exact(lookup):
    """P17: int64 values at the int32 limits are exact; int64/float64 outputs narrow."""
    model, wrapper = lookup
    inputs = _inputs([INT32_MAX - 1, INT32_MIN])
    with pytest.warns(UserWarning, match="Input scale is float64.*cast to float32"):
        offsets, rows, scale = wrapper(*inputs)
    expected = model(*inputs)
    assert offsets.dtype is torch.int32 and offsets.tolist() == expected[0].tolist()
    torch.testing.assert_close(rows, expected[1])
    assert scale.dtype is torch.float32 and scale.tolist() == [3.0, -4.5]


def test_float64_warning_is_given_once(lookup):
    """P17: the float64 cast warns on the first call only."""
    _, wrapper = lookup
    with pytest.warns(UserWarning, match="float64"):
        wrapper(*_inputs([1, 2]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapper(*_inputs([3, 4]))
        wrapper(*_inputs([5, 6]))  # the fast path too


@pytest.mark.parametrize("value", [2**40 + 1, INT32_MAX + 1, INT32_MIN - 1])
def test_int64_input_outside_int32_is_refused(lookup, value):
    """P17 (lite): an int64 input that does not fit int32 is an Error naming the input, the
    value and the int32 device, with the calling line; it never wraps (2**40 + 1 -> 1)."""
    _, wrapper = lookup
    with pytest.warns(UserWarning, match="float64"):
        wrapper(*_inputs([0, 0]))  # compiled; the next calls take the fast path
    with pytest.raises(poptorch.Error) as info:
        wrapper(*_inputs([7, value]))  # OFFENDING-CALL
    message = str(info.value)
    assert "Input offsets" in message and str(value) in message
    assert "int32" in message and "IPU" in message
    assert "OFFENDING-CALL" in open(info.value.location.split(":")[0]).read().splitlines()[
        int(info.value.location.split(":")[1]) - 1]


def test_int64_output_outside_int32_is_refused():
    """P17: an int64 result narrowed to int32 for the host must fit, else an Error naming it."""

    class Model(torch.nn.Module):
        def forward(self, x):
            return x * 2**20

    wrapper = poptorch.inferenceModel(Model())
    assert wrapper(torch.tensor([3, -4])).tolist() == [3 * 2**20, -4 * 2**20]
    with pytest.raises(poptorch.Error, match=r"Output .* holds 2147483648.*int32"):
        wrapper(torch.tensor([2**11, 1]))
    wrapper.destroy()


def test_int64_buffer_keeps_its_dtype_and_value():
    """P17, P10: an int64 buffer updated in place on the device comes back int64 and exact."""

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 1)
            self.register_buffer("steps", torch.tensor(5, dtype=torch.int64))

        def forward(self, x):
            self.steps += 1
            return poptorch.identity_loss(self.fc(x).pow(2), "mean")

    model = Counter()
    wrapper = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(3):
        wrapper(torch.randn(4, 3))
    assert model.steps.dtype is torch.int64 and model.steps.item() == 8
    wrapper.destroy()
