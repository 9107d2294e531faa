"""Steady-state training steps of small models allocate no large tensor (the static memory
plan, device/arena.py): a BERT-like encoder (padded attention mask), a GPT-2-like decoder (LM
head tied to the token embedding, cross-entropy over the vocabulary) and a conv-bn-relu CNN.

Each op's kernel runs inside a profiler label naming it, so every CPU allocation of the
profiled steps is attributed to the op that made it. The models are sized so that the tensors
the arena must hold (cross-entropy gradient, softmax and its gradient, the split gradients'
Concat, embedding gathers and their gradients) are the large ones; any op allocating a tensor
of that size again fails the test, unless it is one of the few listed below with the reason
torch gives it no ``out=`` path.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

import poptorch_lite as poptorch
from popart_backend.device import arena
from popart_backend.ir.op import Op
from tests.tiny_transformers import BATCH, D, SEQ, TinyBert, TinyGpt2

V = 600  # logits: 24 x 600 floats (57.6 KB)


def _op_classes(cls=Op):
    for sub in cls.__subclasses__():
        yield sub
        yield from _op_classes(sub)


def _labelled(fn, label):
    def run(self, *xs):
        with record_function(f"op:{type(self).__name__}{label}"):
            return fn(self, *xs)
    return run


@pytest.fixture
def labelled_kernels(monkeypatch):
    """Every op's kernel and into-kernel run inside a profiler label naming the op."""
    for cls in set(_op_classes()):
        for name, label in (("kernel", ""), ("kernel_into", ":into"),
                            ("kernel_scratch", ":scratch")):
            if name in cls.__dict__:
                monkeypatch.setattr(cls, name, _labelled(cls.__dict__[name], label))


def allocating_ops(prof) -> list[tuple[str, str, int]]:
    """(op label, aten op, bytes) of every profiler event that allocated CPU memory itself
    (its own memory, not its children's, is positive: an aten op whose result is a new
    tensor, even when a child allocates too), attributed to the innermost op label ('-'
    outside any op)."""
    found = []
    for e in prof.events():
        if e.self_cpu_memory_usage <= 0:
            continue
        owner, parent = "-", e
        while parent is not None:
            if parent.name.startswith("op:"):
                owner = parent.name[3:]
                break
            parent = parent.cpu_parent
        found.append((owner, e.name, e.self_cpu_memory_usage))
    return found


def _bert():
    return TinyBert(V)


def _gpt2():
    return TinyGpt2(V)


class _Cnn(nn.Module):
    """conv-bn-relu x2 (8 -> 16 channels, 16x16), global mean, linear, cross-entropy."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.head = nn.Linear(16, 5)

    def forward(self, x, labels):
        logits = self.head(self.features(x).mean((2, 3)))
        return logits, F.cross_entropy(logits, labels)


def _gpt2_batch():
    g = torch.Generator().manual_seed(2)
    return (torch.randint(0, V, (BATCH, SEQ), generator=g),
            torch.randint(0, V, (BATCH, SEQ), generator=g))


def _bert_batch():
    g = torch.Generator().manual_seed(1)
    mask = (torch.arange(SEQ)[None, :] < torch.tensor([SEQ, 5, 3])[:, None]).long()
    return torch.randint(0, V, (BATCH, SEQ), generator=g), mask, torch.randint(0, 5, (BATCH,))


def _cnn_batch():
    g = torch.Generator().manual_seed(3)
    return torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g)


def _wrapper(model):
    return poptorch.trainingModel(model, poptorch.Options().showCompilationProgressBar(False),
                                  torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))


def _steady_allocations(model, batch, steps=3):
    wrapper = _wrapper(model)
    wrapper(*batch)
    wrapper(*batch)  # the arena's pages are touched; every lazily made buffer exists
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(steps):
            wrapper(*batch)
    return wrapper, allocating_ops(prof)


LOGITS = BATCH * SEQ * V * 4

# Ops allowed to allocate a large tensor each step, with the reason.
ALLOWED = {
    # The logits are an output the host reads (an anchor): the run hands over a fresh tensor.
    "LinearBias", "MatMul",
}


@pytest.mark.parametrize("name, model, batch, large", [
    ("gpt2", _gpt2, _gpt2_batch, LOGITS // 4),
    # BERT: the tied/untied embedding gradient [V, D] and the gathers are the large tensors.
    ("bert", _bert, _bert_batch, V * D * 4 // 2),
])
def test_transformer_training_steps_allocate_no_large_tensor(labelled_kernels, name, model,
                                                             batch, large):
    """Nothing but the ALLOWED ops allocates a tensor of ``large`` bytes or more in a steady
    step; the cross-entropy gradient, (log-)softmax and their gradients, Concat, Gather and
    GatherGrad write into their arena buffers."""
    _, found = _steady_allocations(model(), batch())
    big = sorted({(op, aten, size) for op, aten, size in found
                  if size >= large and op.split(":")[0] not in ALLOWED})
    assert not big, f"{name}: ops allocating >= {large} bytes per step: {big}"
    closed = {"SoftmaxCrossEntropyLossGrad", "Softmax", "SoftmaxGrad", "Concat", "Gather",
              "GatherGrad", "SoftmaxCrossEntropyFromProbs", "SoftmaxCrossEntropyGradFromProbs"}
    # They may make index-sized temporaries (wrapped indices, per-label weights: at most
    # BATCH * SEQ int64), nothing of their float outputs' size (BATCH * SEQ * D floats or more).
    float_outputs = [(op, aten, size) for op, aten, size in found
                     if op.split(":")[0] in closed and size > 8 * BATCH * SEQ]
    assert not float_outputs, f"{name}: into-kernels allocating their output: {float_outputs}"


def test_gpt2_cross_entropy_gradient_is_written_into_the_arena(labelled_kernels):
    """The cross-entropy's softmax (float [N, V], computed once in the forward:
    transforms/fuse_grad_cross_entropy.py) has an arena buffer, the gradient is written over
    it in place, and neither the loss nor its gradient allocates anything of the logits' size
    (before, the loss forward allocated a log-softmax and the gradient a softmax every step)."""
    wrapper, found = _steady_allocations(_gpt2(), _gpt2_batch())
    plan = wrapper._active.session._device.plan
    types = [s[5].op_type for s in plan.steps]
    assert "SoftmaxCrossEntropyLoss" not in types and "SoftmaxCrossEntropyLossGrad" not in types
    softmax = [s for s in plan.steps if s[5].op_type == "Softmax"
               and s[5].outputs[0].consumers[0].op_type == "SoftmaxCrossEntropyFromProbs"]
    grads = [s for s in plan.steps if s[5].op_type == "SoftmaxCrossEntropyGradFromProbs"]
    assert len(softmax) == 1 and softmax[0][2] in plan.buffer_slots
    assert len(grads) == 1 and grads[0][5].inputs[1] is softmax[0][5].outputs[0]
    loss_ops = ("Softmax", "SoftmaxCrossEntropyFromProbs", "SoftmaxCrossEntropyGradFromProbs")
    assert not [f for f in found if f[0].split(":")[0] in loss_ops and f[2] >= LOGITS // 4]


def test_cnn_training_steps_allocate_no_large_tensor_outside_the_batch_norm_and_conv(
        labelled_kernels):
    """conv-bn-relu: everything but the convolutions and batch norms (torch kernels without
    an ``out=`` path: mkldnn convolution, native_batch_norm and their backward) writes into
    the arena; the loss and head are small."""
    _, found = _steady_allocations(_Cnn(), _cnn_batch())
    activation = 4 * 8 * 16 * 16 * 4 // 4  # a quarter of the first conv's output
    torch_owned = {"Conv", "ConvGrad", "BatchNormalizationTraining", "BatchNormalizationGrad",
                   "ConvBatchNorm", "ConvBatchNormGrad", "FusedConv", "FusedConvGrad", "-"}
    big = sorted({f for f in found if f[2] >= activation and f[0].split(":")[0] not in torch_owned})
    assert not big, f"ops allocating >= {activation} bytes per step: {big}"


def _train(model, batches, use_arena):
    previous, arena.enabled = arena.enabled, use_arena
    try:
        wrapper = _wrapper(model)
        losses = [float(wrapper(*b)[1]) for b in batches]
    finally:
        arena.enabled = previous
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def test_gpt2_training_is_bit_identical_with_and_without_the_arena():
    batches = [_gpt2_batch()] * 3
    on_losses, on_state = _train(_gpt2(), batches, True)
    off_losses, off_state = _train(_gpt2(), batches, False)
    assert on_losses == off_losses
    for k in on_state:
        assert torch.equal(on_state[k], off_state[k]), k
    ids, labels = batches[0]
    torch.testing.assert_close(torch.tensor(on_losses[0]), _gpt2()(ids, labels)[1].detach(),
                               rtol=1e-5, atol=1e-5)
    assert on_losses[-1] < on_losses[0]


def test_tied_embedding_update_runs_in_the_fused_sgd_tail():
    """GatherGradAdd adds the token gradients into the LM head's weight gradient in place; the
    summed gradient is an ordinary output, so the tied weight's SGDUpdate is in the fused tail
    with every other weight (one ``_fused_sgd_`` call per step, no separate adds)."""
    wrapper = _wrapper(_gpt2())
    batch = _gpt2_batch()
    wrapper(*batch)
    device = wrapper._active.session._device
    updates = [s[5] for s in device.plan.steps if s[5].op_type == "SGDUpdate"]
    assert device._tail is not None and len(device._tail.steps) == len(updates)
    assert "tok.weight" in {s[5].inputs[0].id for s in device._tail.steps}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wrapper(*batch)
    names = [e.name for e in prof.events()]
    assert names.count("aten::_fused_sgd_") == 1
    assert "aten::_foreach_add_" not in names

