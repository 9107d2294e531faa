"""Conv weights kept channels-last for oneDNN (ops/conv.py ``channels_last_weight``): one
converted copy per weight, rewritten by each forward and reused by the step's gradient op;
numbers, host reads and host writes as with the switch off and as eager torch."""

from __future__ import annotations

import copy
import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

import poptorch_lite as poptorch
from popart_backend.ops import conv

CL = torch.channels_last


def test_kept_copy_is_rewritten_by_a_forward_and_reused_only_while_unwritten():
    x = torch.randn(2, 4, 5, 5).contiguous(memory_format=CL)
    w = torch.randn(6, 4, 3, 3)
    first = conv.channels_last_weight(x, w, refresh=True)
    assert first.is_contiguous(memory_format=CL) and not first.is_contiguous()
    torch.testing.assert_close(first, w, rtol=0, atol=0)
    # A gradient op of the same step gets the same tensor, no copy.
    assert conv.channels_last_weight(x, w, refresh=False) is first
    # A versioned write is seen even without a forward in between.
    w.add_(1.0)
    again = conv.channels_last_weight(x, w, refresh=False)
    assert again is first  # rewritten in place, not reallocated
    torch.testing.assert_close(again, w, rtol=0, atol=0)
    # A write the version counter does not see (``.data``) is caught by the next forward.
    w.data.mul_(3.0)
    torch.testing.assert_close(conv.channels_last_weight(x, w, refresh=True), w, rtol=0, atol=0)
    # A dead weight's entry goes with it.
    key = id(w)
    del w, first, again
    gc.collect()
    assert key not in conv._CL_WEIGHTS


@pytest.mark.parametrize("x_layout, w_shape", [
    (torch.contiguous_format, (6, 4, 3, 3)),  # oneDNN would not convert W: left alone
    (CL, (6, 4, 1, 1)),  # a 1x1 kernel is channels-last already
])
def test_weights_oneDNN_would_not_convert_are_handed_over_as_they_are(x_layout, w_shape):
    x = torch.randn(2, 4, 5, 5).contiguous(memory_format=x_layout)
    w = torch.randn(w_shape)
    assert conv.channels_last_weight(x, w, refresh=True) is w


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU())
        self.conv = nn.Conv2d(8, 16, 3, 2, 1)
        self.head = nn.Linear(16, 5)

    def forward(self, x, labels):
        y = F.relu(self.conv(self.stem(x)))
        logits = self.head(y.mean((2, 3)))
        return logits, F.cross_entropy(logits, labels)


def _data():
    g = torch.Generator().manual_seed(5)
    return torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 5, (4,), generator=g)


def _weight_copies(wrapper, args, shapes, steps=3) -> int:
    """Copies of a conv-weight-shaped tensor over ``steps`` runs (profiler ``copy_`` events)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            wrapper(*args)
    return sum(1 for e in prof.events()
               if e.name == "aten::copy_" and e.input_shapes and tuple(e.input_shapes[0]) in shapes)


def _train(keep: bool):
    torch.manual_seed(0)
    model = _Net()
    previous = conv.keep_channels_last_weights
    conv.keep_channels_last_weights = keep
    try:
        training = poptorch.trainingModel(
            model, poptorch.Options().showCompilationProgressBar(False),
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        x, labels = _data()
        losses = [float(training(x, labels)[1]) for _ in range(2)]
        shapes = {(8, 3, 3, 3), (16, 8, 3, 3)}
        copies = _weight_copies(training, (x, labels), shapes)
        # A host write between runs: the next step must use it.
        training.copyWeightsToHost()
        with torch.no_grad():
            model.conv.weight.mul_(0.5)
        training.copyWeightsToDevice()
        losses += [float(training(x, labels)[1]) for _ in range(2)]
        training.copyWeightsToHost()
    finally:
        conv.keep_channels_last_weights = previous
    state = copy.deepcopy(model.state_dict())
    training.destroy()
    return losses, state, copies


def _eager():
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, labels = _data()
    losses = []
    for step in range(7):
        if step == 5:
            with torch.no_grad():
                model.conv.weight.mul_(0.5)
        opt.zero_grad()
        loss = model(x, labels)[1]
        loss.backward()
        opt.step()
        if step < 2 or step >= 5:
            losses.append(loss.item())
    return losses, model.state_dict()


def test_training_with_kept_weights_matches_torch_and_converts_each_weight_once_a_step():
    on_losses, on_state, on_copies = _train(True)
    off_losses, off_state, off_copies = _train(False)
    want_losses, want_state = _eager()
    assert on_losses == pytest.approx(want_losses, rel=1e-5, abs=1e-6)
    assert on_losses == pytest.approx(off_losses, rel=1e-6, abs=1e-7)
    for name, want in want_state.items():
        got = on_state[name]
        assert got.shape == want.shape and got.is_contiguous(), name
        if want.dtype.is_floating_point:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)
            torch.testing.assert_close(got, off_state[name], rtol=1e-5, atol=1e-6, msg=name)
    # Off: oneDNN converts W in the forward and again in the backward. On: the backward reuses
    # the forward's copy (2 convolutions with weights x 3 steps).
    assert on_copies <= off_copies - 2 * 3


class _Infer(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.b = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.b(self.a(x))


def test_inference_sees_host_weight_writes_and_keeps_the_folded_weight_channels_last():
    torch.manual_seed(2)
    net = _Infer().eval()
    with torch.no_grad():
        net.a[1].running_mean.uniform_(-0.5, 0.5)
        net.a[1].running_var.uniform_(0.5, 2.0)
    model = copy.deepcopy(net)
    wrapper = poptorch.inferenceModel(model, poptorch.Options().showCompilationProgressBar(False))
    x = torch.randn(2, 3, 9, 9)
    for _ in range(2):
        torch.testing.assert_close(wrapper(x), net(x), rtol=1e-4, atol=1e-5)
    # Folded W' (8x3x3x3) is converted once, not per run.
    assert _weight_copies(wrapper, (x,), {(8, 3, 3, 3)}) == 0
    with torch.no_grad():
        for m in (model, net):
            m.a[0].weight.mul_(-0.5)
            m.b.weight.add_(0.25)
    wrapper.copyWeightsToDevice()
    torch.testing.assert_close(wrapper(x), net(x), rtol=1e-4, atol=1e-5)
    wrapper.destroy()
