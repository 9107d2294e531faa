"""Registered buffers as device state (spec §2.10 "Buffers", P65, P66).

Semantics checked here (PopTorch's): a buffer ``forward`` updates in place is device state that
the graph updates every time it runs, i.e. once per micro-batch. A call runs
``deviceIterations`` × ``gradientAccumulation`` micro-batches in order, so the i-th micro-batch
of a call sees the value left by the previous one, across calls too: exactly what an eager loop
over the same micro-batches does. Training wrappers bring the device value to the host on the
first host read (P10); inference wrappers only on ``copyWeightsToHost()`` (P65).
"""

import copy

import pytest
import torch

import poptorch_lite as poptorch


class Counter(torch.nn.Module):
    """Counts its calls in a float buffer and scales its output by the count."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count += 1
        return self.lin(x) * self.count


class CountingLoss(Counter):
    """A counter, an int64 step buffer, a data-dependent sum and a loss."""

    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("seen", torch.zeros(4))

    def forward(self, x, target):
        self.steps += 1
        self.seen.add_(x.sum(0))
        out = super().forward(x)
        return out, torch.nn.functional.mse_loss(out, target)


def _micro_batches(tensor, count):
    return tensor.view(count, -1, *tensor.shape[1:])


def test_inference_counter_across_calls():
    """P65: each call sees the count left by the previous one; the host copy only changes on
    copyWeightsToHost() (inference never copies buffers back implicitly)."""
    model = Counter()
    reference = copy.deepcopy(model)
    wrapper = poptorch.inferenceModel(model)
    x = torch.randn(2, 4)
    for _ in range(3):
        torch.testing.assert_close(wrapper(x), reference(x).detach())
    assert model.count.item() == 0.0
    wrapper.copyWeightsToHost()
    assert model.count.item() == 3.0 == reference.count.item()


def test_inference_device_iterations_update_per_micro_batch():
    """P65: with deviceIterations(2) each micro-batch increments the count once, in order."""
    model = Counter()
    reference = copy.deepcopy(model)
    wrapper = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    for call in range(2):
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(call))
        expected = torch.cat([reference(b).detach() for b in _micro_batches(x, 2)])
        torch.testing.assert_close(wrapper(x), expected)
    wrapper.copyWeightsToHost()
    assert model.count.item() == 4.0 == reference.count.item()


def test_training_matches_eager_loop():
    """P65: deviceIterations(2) × gradientAccumulation(2): four micro-batches per call, each
    updating the buffers (float, int64, data-dependent), with one optimizer step per
    accumulated pair; the host reads the device values lazily (P10)."""
    model = CountingLoss()
    reference = copy.deepcopy(model)
    options = poptorch.Options().deviceIterations(2)
    options.Training.gradientAccumulation(2)
    wrapper = poptorch.trainingModel(model, options,
                                     torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    for _ in range(2):
        x, target = torch.randn(8, 4, generator=generator), torch.randn(8, 4, generator=generator)
        _, loss = wrapper(x, target)
        xs, targets = _micro_batches(x, 4), _micro_batches(target, 4)
        for step in range(2):
            ref_opt.zero_grad()
            for micro in (2 * step, 2 * step + 1):
                _, ref_loss = reference(xs[micro], targets[micro])
                (ref_loss / 2).backward()
            ref_opt.step()
        torch.testing.assert_close(loss, ref_loss.detach())
        for name, buffer in reference.named_buffers():
            torch.testing.assert_close(dict(model.named_buffers())[name], buffer)
    assert model.count.item() == 8.0 and model.steps.item() == 8
    torch.testing.assert_close(model.lin.weight, reference.lin.weight)
    wrapper.destroy()


def test_training_counter_is_not_trained():
    """P65: a buffer the loss depends on gets no optimizer update (lr, weight decay) of its
    own: after three calls the count is exactly 3."""
    model = CountingLoss()
    wrapper = poptorch.trainingModel(
        model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5, weight_decay=0.5))
    x, target = torch.randn(2, 4), torch.randn(2, 4)
    for _ in range(3):
        wrapper(x, target)
    assert model.count.item() == 3.0 and model.steps.item() == 3
    wrapper.destroy()


def test_buffer_reassigned_in_forward_raises():
    """P65: assigning a new tensor to a buffer in forward (not in place) is an Error."""

    class Reassign(Counter):
        def forward(self, x):
            self.count = self.count + 1
            return self.lin(x) * self.count

    wrapper = poptorch.inferenceModel(Reassign())
    with pytest.raises(poptorch.Error, match=r"assigns or registers the buffer 'count'.*copy_"):
        wrapper(torch.randn(2, 4))


def test_buffer_registered_after_compile_raises():
    """P65: a buffer registered (or removed) after compiling is an Error at the next call."""
    model = Counter()
    wrapper = poptorch.inferenceModel(model)
    x = torch.randn(2, 4)
    wrapper(x)
    model.lin.register_buffer("late", torch.ones(()))
    with pytest.raises(poptorch.Error, match=r"registered 'lin.late'"):
        wrapper(x)


def test_buffer_reassigned_on_the_host_after_compile_raises():
    """P65: a buffer replaced by a new tensor after compiling is an Error at the next call;
    an in-place update plus copyWeightsToDevice() reaches the device."""
    model = Counter()
    wrapper = poptorch.inferenceModel(model)
    x = torch.randn(2, 4)
    wrapper(x)
    model.count = torch.full((), 10.0)
    with pytest.raises(poptorch.Error, match=r"buffer\(s\) 'count' were reassigned.*copy_"):
        wrapper(x)
    wrapper.destroy()

    model = Counter()
    wrapper = poptorch.inferenceModel(model)
    wrapper(x)
    model.count.copy_(torch.full((), 10.0))
    wrapper.copyWeightsToDevice()
    reference = Counter()
    reference.count.fill_(10.0)
    torch.testing.assert_close(wrapper(x), reference(x).detach())
    wrapper.destroy()


def test_replicated_training_needs_broadcast_buffers_false():
    """P66: replicated training with a mutated buffer and broadcastBuffers(True) (default) is
    an Error; with broadcastBuffers(False) each replica keeps its own copy and the host reads
    replica 0's."""
    x, target = torch.randn(4, 4), torch.randn(4, 4)
    model = CountingLoss()
    wrapper = poptorch.trainingModel(model, poptorch.Options().replicationFactor(2),
                                     torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match=r"broadcastBuffers\(False\)"):
        wrapper(x, target)
    wrapper.destroy()

    model = CountingLoss()
    options = poptorch.Options().replicationFactor(2).broadcastBuffers(False)
    wrapper = poptorch.trainingModel(model, options, torch.optim.SGD(model.parameters(), lr=0.1))
    wrapper(x, target)
    wrapper(x, target)
    assert model.steps.item() == 2
    torch.testing.assert_close(model.seen, 2 * x[:2].sum(0))  # replica 0's rows
    wrapper.destroy()


def test_training_runs_leave_the_host_copies_stale_until_read():
    """P10: the buffer check of each training call must not pull the device weights to the
    host (a full weight copy per step); the first host read after the runs still does."""
    model = CountingLoss()
    wrapper = poptorch.trainingModel(
        model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    x, target = torch.randn(2, 4), torch.randn(2, 4)
    pulls = []
    original = wrapper.copyWeightsToHost
    wrapper.__dict__["copyWeightsToHost"] = lambda: (pulls.append(1), original())[1]
    for _ in range(3):
        wrapper(x, target)
    assert pulls == []
    assert model.count.item() == 3.0 and pulls == [1]
    wrapper.destroy()
