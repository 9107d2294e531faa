"""Channels-last plans (device/layout.py): activations between 2-D convolutions stay
channels-last, every other op and the host see contiguous tensors, numbers do not change."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

import poptorch_lite as poptorch
from popart_backend.device import layout

CL = torch.channels_last


class _Block(nn.Module):
    """conv-bn-relu stem, then a strided residual block with a 1x1 shortcut, mean, linear."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU())
        self.conv1 = nn.Conv2d(8, 16, 3, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, 1, 1)
        self.bn2 = nn.BatchNorm2d(16)
        self.short = nn.Sequential(nn.Conv2d(8, 16, 1, 2, bias=False), nn.BatchNorm2d(16))
        self.head = nn.Linear(16, 5)

    def forward(self, x, labels):
        x = self.stem(x)
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        logits = self.head(F.relu(y + self.short(x)).mean((2, 3)))
        return logits, F.cross_entropy(logits, labels)


def _data():
    g = torch.Generator().manual_seed(3)
    return torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g)


def _train(enabled: bool, steps: int = 3):
    """(losses, final state dict, the training wrapper) of ``steps`` SGD steps."""
    torch.manual_seed(0)
    model = _Block()
    previous = layout.enabled
    layout.enabled = enabled
    try:
        training = poptorch.trainingModel(
            model, poptorch.Options().showCompilationProgressBar(False),
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        x, labels = _data()
        losses = [float(training(x, labels)[1]) for _ in range(steps)]
    finally:
        layout.enabled = previous
    training.copyWeightsToHost()
    return losses, copy.deepcopy(model.state_dict()), training


def _eager(steps: int = 3):
    torch.manual_seed(0)
    model = _Block()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, labels = _data()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(x, labels)[1]
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model.state_dict()


@pytest.fixture(scope="module")
def trained():
    on, off = _train(True), _train(False)
    yield on, off
    on[2].destroy()
    off[2].destroy()


def _plan(wrapper):
    return wrapper._active.session._device.plan


def test_training_matches_torch_and_the_contiguous_plan(trained):
    """Losses, weights, BN running statistics after three steps: channels-last plan ==
    contiguous plan == eager torch (within float32 reordering of the sums)."""
    (on_losses, on_state, _), (off_losses, off_state, _) = trained
    want_losses, want_state = _eager()
    assert on_losses == pytest.approx(want_losses, rel=1e-5, abs=1e-6)
    assert on_losses == pytest.approx(off_losses, rel=1e-6, abs=1e-7)
    assert on_losses[-1] < on_losses[0]
    for name, want in want_state.items():
        if want.dtype.is_floating_point:
            torch.testing.assert_close(on_state[name], want, rtol=1e-4, atol=1e-5, msg=name)
            torch.testing.assert_close(on_state[name], off_state[name], rtol=1e-5, atol=1e-6,
                                       msg=name)


def test_activations_between_convolutions_are_channels_last(trained):
    """The plan takes conv, BN, ReLU and residual outputs to be channels-last and gives the
    ReLU / Add outputs channels-last arena views; with the switch off there are none."""
    (_, _, on), (_, _, off) = trained
    plan = _plan(on)
    assert plan.layouts.channels_last
    op_types = {op.op_type for _fn, _ins, out, single, _frees, op in plan.steps
                if any(s in plan.layouts.channels_last for s in ((out,) if single else out))}
    assert {"Conv", "ConvGrad", "BatchNormalizationTraining", "BatchNormalizationGrad", "Relu",
            "ReluGrad", "Add"} <= op_types
    views = [plan.values[plan.buffer_slots[s]] for s, b in plan.arena.buffers.items()
             if b.channels_last]
    assert views and all(v.is_contiguous(memory_format=CL) and not v.is_contiguous()
                         for v in views)
    off_plan = _plan(off)
    assert not off_plan.layouts.channels_last
    assert not any(b.channels_last for b in off_plan.arena.buffers.values())


def test_ops_without_strided_inputs_and_the_host_get_contiguous_tensors():
    """A conv output read by Flatten (no ``strided_inputs``) and returned as an anchor: both
    contiguous, numbers as torch's."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            return y, torch.flatten(y, 1) * 2.0

    torch.manual_seed(1)
    net = Net().eval()
    x = torch.randn(2, 3, 5, 5)
    wrapper = poptorch.inferenceModel(copy.deepcopy(net),
                                      poptorch.Options().showCompilationProgressBar(False))
    y, flat = wrapper(x)
    plan = _plan(wrapper)
    assert plan.layouts.channels_last  # the conv and ReLU ran channels-last
    want_y, want_flat = net(x)
    assert y.is_contiguous() and flat.is_contiguous()
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(flat, want_flat, rtol=1e-5, atol=1e-6)
    wrapper.destroy()


def _allocations(wrapper, x, labels, steps=5) -> list[int]:
    """Bytes of each CPU allocation over ``steps`` steady-state steps (leaf memory events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(steps):
            wrapper(x, labels)
    allocating = [e for e in prof.events() if e.cpu_memory_usage > 0]
    parents = {id(e.cpu_parent) for e in allocating if e.cpu_parent is not None}
    return [e.cpu_memory_usage for e in allocating if id(e) not in parents]


def test_channels_last_steps_allocate_no_more_activations_than_contiguous_ones(trained):
    """Steady state: no activation-sized allocation beyond the contiguous plan's (the ReLU and
    residual outputs still write into the arena, channels-last views of it). What the
    channels-last plan adds per convolution is weight-sized: W converted to channels-last for
    oneDNN, dW converted back (the weights are at most 16x16x3x3 floats, 9 KiB, the smallest
    activation 4x8x16x16 floats, 32 KiB; the image input, 12 KiB, is converted once a step)."""
    (_, _, on), (_, _, off) = trained
    x, labels = _data()
    on_sizes, off_sizes = _allocations(on, x, labels), _allocations(off, x, labels)
    big = 16 * 1024
    assert sum(n >= big for n in on_sizes) <= sum(n >= big for n in off_sizes)
    convs = 4
    assert len(on_sizes) - len(off_sizes) <= 5 * (6 * convs + 1)


class _PoolNet(nn.Module):
    """conv-bn-relu, MaxPool, conv, global average pool, linear: pools between channels-last
    convolutions."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, 1, 1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, 5)

    def forward(self, x, labels):
        logits = self.head(self.body(x))
        return logits, F.cross_entropy(logits, labels)


def test_pooling_between_channels_last_convolutions_trains_as_torch():
    x, labels = _data()
    torch.manual_seed(0)
    model = _PoolNet()
    eager = copy.deepcopy(model)
    training = poptorch.trainingModel(model, poptorch.Options().showCompilationProgressBar(False),
                                      torch.optim.SGD(model.parameters(), lr=0.1))
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(2):
        loss = training(x, labels)[1]
        opt.zero_grad()
        want = eager(x, labels)[1]
        want.backward()
        opt.step()
        torch.testing.assert_close(loss, want.detach(), rtol=1e-5, atol=1e-6)
    plan = _plan(training)
    pooled = {op.op_type for _fn, _ins, out, single, _frees, op in plan.steps
              if any(s in plan.layouts.channels_last for s in ((out,) if single else out))}
    assert {"MaxPool", "MaxPoolGrad"} <= pooled
    training.copyWeightsToHost()
    for name, want in eager.state_dict().items():
        if want.dtype.is_floating_point:
            torch.testing.assert_close(model.state_dict()[name], want, rtol=1e-4, atol=1e-5,
                                       msg=name)
    training.destroy()
