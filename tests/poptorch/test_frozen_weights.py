"""Frozen weights (requires_grad=False parameters, float buffers read in forward) are not
trained on the device, as in eager torch: no gradient, update, optimizer state or accumulator
(the wrapper marks them ``__frozen_variable:<id>`` in the ONNX model). References: eager torch
training (weights, optimizer ``state_dict()``), and the IR of the same model with the
parameter trainable."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import poptorch_lite as poptorch
from poptorch_lite.testing import assert_allclose

from tests.tiny_transformers import BATCH, SEQ, TinyGpt2
from .training_helpers import assert_state_equal, classification_batches, compare_training

BATCHES = classification_batches(3, 8, (6,), 4, seed=21)
STATE_PREFIXES = ("Gradient___", "Accl___", "Accl1___", "Accl2___", "Step___", "Accum___")


class _Frozen(nn.Module):
    """A frozen first layer weight, a float buffer scaling the hidden units, and a counter
    buffer updated in place in forward."""

    def __init__(self, freeze: bool = True, count: bool = True):
        super().__init__()
        self.count = count
        torch.manual_seed(3)
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 4)
        self.fc1.weight.requires_grad_(not freeze)
        self.register_buffer("scale", torch.rand(8) + 0.5)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x, y):
        if self.count:
            with torch.no_grad():
                self.calls += 1.0
        logits = self.fc2(F.relu(self.fc1(x) * self.scale))
        return logits, F.cross_entropy(logits, y)


def _ir(wrapper):
    return wrapper._active.session.getIr()


def _frozen_ids(wrapper) -> list[str]:
    names = wrapper.getTensorNames()
    return [n for n in ("fc1.weight", "scale") if n in names]


def _train(model, make_optimizer, batches=BATCHES):
    reference = copy.deepcopy(model)
    ref_optimizer = make_optimizer(reference.parameters())
    optimizer = make_optimizer(model.parameters())
    wrapper = poptorch.trainingModel(model, poptorch.Options(), optimizer)
    for x, y in batches:
        _step_both(wrapper, reference, ref_optimizer, x, y)
    return wrapper, optimizer, reference, ref_optimizer


def _step_both(wrapper, reference, ref_optimizer, x, y):
    """One device step and the same eager step; their outputs agree."""
    out, _ = wrapper(x, y)
    ref_optimizer.zero_grad()
    ref_out, ref_loss = reference(x, y)
    ref_loss.backward()
    ref_optimizer.step()
    assert_allclose(actual=out, expected=ref_out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make_optimizer", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=0.01),
], ids=["sgd_momentum", "adam"])
def test_frozen_parameter_and_buffer_train_like_eager(make_optimizer):
    model = _Frozen()
    wrapper, optimizer, reference, ref_optimizer = _train(model, make_optimizer)
    assert_state_equal(model, reference)
    assert model.calls.item() == len(BATCHES)  # the in-place buffer update persists
    state, expected = optimizer.state_dict(), ref_optimizer.state_dict()
    assert sorted(state["state"]) == sorted(expected["state"])  # no state for fc1.weight
    for index, entry in expected["state"].items():
        assert sorted(state["state"][index]) == sorted(entry)
        for key, value in entry.items():
            assert_allclose(actual=torch.as_tensor(state["state"][index][key]),
                            expected=torch.as_tensor(value), rtol=1e-4, atol=1e-6,
                            msg=f"state[{index}][{key!r}]")
    wrapper.destroy()


def test_ir_has_no_gradient_update_or_state_for_frozen_weights():
    model = _Frozen()
    frozen = poptorch.trainingModel(model, poptorch.Options(), torch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.9))
    frozen(*BATCHES[0])
    trained_model = _Frozen(freeze=False)
    trained = poptorch.trainingModel(trained_model, poptorch.Options(), torch.optim.SGD(
        trained_model.parameters(), lr=0.1, momentum=0.9))
    trained(*BATCHES[0])
    ids = _frozen_ids(frozen)
    assert sorted(_ir(frozen).frozen_variables) == sorted(ids) == ["fc1.weight", "scale"]
    assert sorted(_ir(trained).frozen_variables) == ["scale"]
    for wrapper, untrained in ((frozen, ids), (trained, ["scale"])):
        names = wrapper.getTensorNames()
        for tid in untrained:
            assert not [n for n in names if n.startswith(STATE_PREFIXES) and n.endswith(tid)]
    counts = {name: Counter(op.op_type for op in _ir(w).main.ops.values())
              for name, w in (("frozen", frozen), ("trained", trained))}
    updates = {name: sum(n for t, n in c.items() if t.startswith("SGD"))
               for name, c in counts.items()}
    assert updates == {"frozen": 3, "trained": 4}  # fc1.bias, fc2.weight, fc2.bias (+fc1.weight)
    # fc1's weight-gradient product is gone with the weight's training.
    assert sum(counts["frozen"].values()) < sum(counts["trained"].values())
    assert "Accl___fc1.weight" in trained.getTensorNames()
    frozen.destroy()
    trained.destroy()


def test_gpt2_like_causal_mask_buffer_fuses_attention_in_training():
    """The causal-mask buffer is frozen, so it needs no gradient and the attention chain
    becomes the fused flash-attention op (and its gradient) in training."""
    g = torch.Generator().manual_seed(2)
    vocab = 37
    batches = [(torch.randint(0, vocab, (BATCH, SEQ), generator=g),
                torch.randint(0, vocab, (BATCH, SEQ), generator=g)) for _ in range(2)]
    wrapper, _, _ = compare_training(
        TinyGpt2(vocab), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), batches)
    ir = _ir(wrapper)
    counts = Counter(op.op_type for op in ir.main.ops.values())
    assert counts["Attention"] == 1 and counts["AttentionGrad"] == 1
    assert "causal" in ir.frozen_variables
    assert not [n for n in wrapper.getTensorNames()
                if n.startswith(STATE_PREFIXES) and n.endswith("causal")]
    wrapper.destroy()


def test_frozen_weights_are_written_from_the_host():
    """load_state_dict + copyWeightsToDevice still reach frozen weights and buffers."""
    model = _Frozen()
    wrapper, _, reference, ref_optimizer = _train(
        model, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), BATCHES[:1])
    with torch.no_grad():
        for m in (model, reference):
            m.fc1.weight.mul_(-0.5)
            m.scale.add_(1.0)
    wrapper.copyWeightsToDevice()
    _step_both(wrapper, reference, ref_optimizer, *BATCHES[1])
    assert_state_equal(model, reference)
    wrapper.destroy()


def test_unfreezing_after_compile_needs_a_new_wrapper():
    model = _Frozen()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    wrapper = poptorch.trainingModel(model, poptorch.Options(), optimizer)
    wrapper(*BATCHES[0])
    model.fc1.weight.requires_grad_(True)
    with pytest.raises(poptorch.Error, match="different parameters.*new wrapper"):
        wrapper.setOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    with pytest.raises(poptorch.Error, match="requires_grad of 'fc1.weight' changed"):
        wrapper(*BATCHES[1])  # a call would keep training the compiled set: refused
    model.fc1.weight.requires_grad_(False)
    wrapper(*BATCHES[1])  # back as compiled: runs
    model.fc1.weight.requires_grad_(True)
    wrapper.destroy()
    # A new wrapper trains the unfrozen weight like eager.
    compare_training(model, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                     BATCHES[1:])[0].destroy()


def _accumulation():
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    return opts, None


def _replication():
    return poptorch.Options().replicationFactor(2), None


def _pipelined():
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    return opts, lambda model: poptorch.BeginBlock(model.fc2, "second", ipu_id=1)


@pytest.mark.parametrize("setup", [_accumulation, _replication, _pipelined],
                         ids=["accumulation", "replication", "pipelined"])
def test_frozen_weights_with_accumulation_replication_and_pipelining(setup):
    """No accumulator, all-reduce or pipelined update for the frozen weights; the trained
    ones equal eager (the reference runs the same micro-batches and mean reduction)."""
    model = _Frozen(count=False)
    opts, annotate = setup()
    if annotate is not None:
        annotate(model)
    wrapper, _, _ = compare_training(
        model, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        classification_batches(2, 8, (6,), 4, seed=22), opts,
        check_outputs=setup is not _replication)  # (per-replica losses; weights compared)
    names = wrapper.getTensorNames()
    for tid in ("fc1.weight", "scale"):
        assert not [n for n in names if tid in n and n != tid and not n.startswith("fwd")], tid
    wrapper.destroy()


def test_anchored_gradient_of_a_frozen_parameter_is_returned_not_applied():
    """Options.anchorTensor of a frozen weight's gradient: computed (as eager's gradient of
    that tensor would be), the weight stays unchanged."""
    model = _Frozen(count=False)
    start = model.fc1.weight.detach().clone()
    opts = poptorch.Options().anchorTensor("g", "Gradient___fc1.weight")
    wrapper = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = BATCHES[0]
    reference = copy.deepcopy(model)
    reference.fc1.weight.requires_grad_(True)
    reference(x, y)[1].backward()
    wrapper(x, y)
    assert_allclose(actual=wrapper.getAnchoredTensor("g"), expected=reference.fc1.weight.grad,
                    rtol=1e-4, atol=1e-6)
    assert torch.equal(model.fc1.weight.detach(), start)
    wrapper.destroy()
