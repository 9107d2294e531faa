"""In-place updates of forward's inputs and parameters (spec §2.1 P5, §2.10 P65, P72).

Semantics checked here: an input ``forward`` updates in place is written back into the caller's
tensor after each call, every micro-batch's rows, as eager torch leaves it. A parameter updated
in place is device state in an inference wrapper, like a buffer: each run sees the previous
run's value, and the host copy changes on ``copyWeightsToHost()``. A training wrapper refuses a
parameter update at compile, and an update through ``.data`` is refused too; each error names
the tensor and the user's line.
"""

import copy

import pytest
import torch

import poptorch_lite as poptorch
from poptorch_lite.options.enums import CommGroupType


class AddInput(torch.nn.Module):
    """Shifts its input in place, then uses it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        x.add_(self.lin(x))
        return x * 2


class ReturnsUpdated(torch.nn.Module):
    def forward(self, x, ids):
        x[:, 0] = 0
        ids.add_(1)
        return x.mul_(3), ids


class ScalarInput(torch.nn.Module):
    def forward(self, x, step):
        step.add_(1)
        return x * step


class ShiftParameter(torch.nn.Module):
    """Shifts its parameter under no_grad every call."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))
        self.scale = torch.nn.Parameter(torch.full((4,), 2.0))

    def forward(self, x):
        with torch.no_grad():
            self.w += 1
            self.scale.copy_(self.scale * 0.5)
        return x * self.w + self.scale


class ParameterInTraining(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, x, target):
        with torch.no_grad():
            self.w.mul_(0.5)  # the line the error names
        out = x * self.w
        return out, torch.nn.functional.mse_loss(out, target)


class DataUpdate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        self.w.data.mul_(0.5)
        return x * self.w


class InputTraining(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, target):
        x.mul_(2).add_(1)
        out = self.lin(x)
        return out, torch.nn.functional.mse_loss(out, target)


def _line_of(text: str) -> int:
    with open(__file__) as source:
        return next(i for i, line in enumerate(source, 1) if text in line)


def test_input_update_written_back_across_calls():
    """P5: an input forward updates in place is changed in the caller's tensor after each call,
    as eager leaves it; a second call (the fast path) sees and updates the new value."""
    model = AddInput()
    reference = copy.deepcopy(model)
    wrapper = poptorch.inferenceModel(model)
    x = torch.randn(3, 4)
    x_ref = x.clone()
    for _ in range(2):
        out = wrapper(x)
        with torch.no_grad():
            expected = reference(x_ref)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(x, x_ref)


def test_input_update_non_contiguous_reaches_caller():
    """P5: a non-contiguous input is copied before the call; the update still reaches the
    caller's tensor (and its base)."""
    model = AddInput()
    reference = copy.deepcopy(model)
    wrapper = poptorch.inferenceModel(model)
    base = torch.randn(4, 3)
    base_ref = base.clone()
    with pytest.warns(UserWarning, match="not contiguous"):
        out = wrapper(base.t())
    with torch.no_grad():
        expected = reference(base_ref.t())
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(base, base_ref)


def test_input_update_every_micro_batch_replicated():
    """P5, P22, P24: deviceIterations(2) × replicationFactor(2): every micro-batch's rows of
    the updated input come back in place, in the combined-batch order."""
    model = AddInput()
    reference = copy.deepcopy(model)
    options = poptorch.Options().deviceIterations(2).replicationFactor(2)
    wrapper = poptorch.inferenceModel(model, options)
    x = torch.randn(8, 4)
    x_ref = x.clone()
    out = wrapper(x)
    with torch.no_grad():
        expected = reference(x_ref)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, x_ref)


def test_input_update_with_input_replica_groups():
    """P22: with inputReplicaGrouping both replicas of a group see the same rows; the host
    tensor gets the group's update once."""
    model = AddInput()
    reference = copy.deepcopy(model)
    options = poptorch.Options().replicationFactor(2)
    options.inputReplicaGrouping(2, CommGroupType.Consecutive)
    wrapper = poptorch.inferenceModel(model, options)
    x = torch.randn(2, 4)
    x_ref = x.clone()
    wrapper(x)
    with torch.no_grad():
        reference(x_ref)
    torch.testing.assert_close(x, x_ref)


def test_updated_input_returned_and_int_input():
    """P5, P17: a partly overwritten input that forward also returns, and an int64 input
    updated in place (computed in int32 on the device) come back as eager leaves them."""
    wrapper = poptorch.inferenceModel(ReturnsUpdated())
    x, ids = torch.randn(2, 3), torch.arange(6).view(2, 3)
    x_ref, ids_ref = x.clone(), ids.clone()
    out, out_ids = wrapper(x, ids)
    expected, expected_ids = ReturnsUpdated()(x_ref, ids_ref)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out_ids, expected_ids.to(torch.int32))
    torch.testing.assert_close(x, x_ref)
    assert ids.dtype is torch.int64
    torch.testing.assert_close(ids, ids_ref)


def test_scalar_input_update():
    """P5: a 0-d input updated in place with one micro-batch per call is written back."""
    wrapper = poptorch.inferenceModel(ScalarInput())
    x, step = torch.ones(2, 3), torch.tensor(1.0)
    out = wrapper(x, step)
    torch.testing.assert_close(out, torch.full((2, 3), 2.0))
    assert step.item() == 2.0


def test_scalar_input_update_several_micro_batches_raises():
    """P5, P72: a 0-d input shared by several micro-batches has no single new value."""
    wrapper = poptorch.inferenceModel(ScalarInput(), poptorch.Options().deviceIterations(2))
    with pytest.raises(poptorch.Error, match=r"0-d input 'step' in place.*2 micro-batches"):
        wrapper(torch.ones(2, 3), torch.tensor(1.0))


def test_training_input_update_written_back():
    """P5, P23: a training wrapper (output mode Final) still writes every micro-batch's update
    of the input back; the loss it returns matches eager on the last micro-batch."""
    model = InputTraining()
    reference = copy.deepcopy(model)
    options = poptorch.Options().deviceIterations(2)
    options.Training.gradientAccumulation(2)
    wrapper = poptorch.trainingModel(model, options,
                                     torch.optim.SGD(model.parameters(), lr=0.0))
    x, target = torch.randn(8, 4), torch.randn(8, 4)
    x_ref = x.clone()
    _, loss = wrapper(x, target)
    with torch.no_grad():
        _, expected = reference(x_ref[6:].clone(), target[6:])
        reference(x_ref, target)
    torch.testing.assert_close(x, x_ref)
    torch.testing.assert_close(loss, expected)


def test_inference_parameter_update_is_device_state():
    """P65, P8: a parameter updated in place under no_grad persists on the device across
    calls like a buffer; the host copy follows on copyWeightsToHost()."""
    model = ShiftParameter()
    reference = copy.deepcopy(model)
    wrapper = poptorch.inferenceModel(model)
    x = torch.randn(2, 4)
    for _ in range(3):
        torch.testing.assert_close(wrapper(x), reference(x).detach())
    torch.testing.assert_close(model.w.detach(), torch.ones(4))
    wrapper.copyWeightsToHost()
    torch.testing.assert_close(model.w.detach(), reference.w.detach())
    torch.testing.assert_close(model.scale.detach(), reference.scale.detach())


def test_inference_parameter_update_per_micro_batch():
    """P65: with deviceIterations(2) the parameter is updated once per micro-batch, in order,
    as an eager loop over the micro-batches."""
    model = ShiftParameter()
    reference = copy.deepcopy(model)
    wrapper = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    x = torch.randn(4, 4)
    out = wrapper(x)
    expected = torch.cat([reference(part).detach() for part in x.split(2)])
    torch.testing.assert_close(out, expected)


def test_training_parameter_update_raises():
    """P65, P72: a training wrapper refuses a parameter updated in place in forward, naming
    it and the user's line, at compile."""
    model = ParameterInTraining()
    wrapper = poptorch.trainingModel(model, poptorch.Options(),
                                     torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="parameter 'w' in place") as info:
        wrapper.compile(torch.randn(2, 4), torch.randn(2, 4))
    line = _line_of("the line the error names")
    assert info.value.location.startswith(f"{__file__}:{line}")
    assert "copyWeightsToDevice" in info.value.message
    torch.testing.assert_close(model.w.detach(), torch.ones(4))


@pytest.mark.parametrize("training", [False, True])
def test_update_through_data_raises(training):
    """P72: an update through `.data` cannot be traced; both wrappers refuse it at compile."""
    model = DataUpdate()
    wrapper = (poptorch.trainingModel(model) if training else poptorch.inferenceModel(model))
    with pytest.raises(poptorch.Error, match=r"through `\.data`"):
        wrapper.compile(torch.randn(2, 4))


def test_torchscript_exporter_refuses_updates_and_restores_tensors():
    """P72: the legacy exporter runs forward on the real tensors and drops in-place updates:
    it is refused, naming the tensors, and the caller's input and parameters are restored."""
    model = ShiftParameter()
    options = poptorch.Options()
    options.Jit.exporter("torchscript")
    wrapper = poptorch.inferenceModel(model, options)
    x = torch.randn(2, 4)
    x_before = x.clone()
    with pytest.warns(UserWarning, match="legacy exporter"), \
            pytest.raises(poptorch.Error, match=r"'w', 'scale' in place.*TorchScript"):
        wrapper(x)
    torch.testing.assert_close(x, x_before)
    torch.testing.assert_close(model.w.detach(), torch.ones(4))
    torch.testing.assert_close(model.scale.detach(), torch.full((4,), 2.0))
