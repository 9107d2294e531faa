"""for_loop and cond inside forward (P62): ONNX Loop / If on the simulated IPU, forward and
gradient against the same model run eagerly in torch."""

from __future__ import annotations

import pytest
import torch

import poptorch_lite as poptorch
from poptorch_lite.testing import assert_allclose

from .training_helpers import compare_training


def _node_types(wrapper):
    return [n.op_type for n in wrapper._active.traced.proto.graph.node]


class LoopModel(torch.nn.Module):
    """Two carried tensors; the body reads a trained Linear from the enclosing scope."""

    def __init__(self, count=3):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.count = count

    def forward(self, x, target):
        def body(h, acc):
            h = torch.tanh(self.lin(h))
            return h, acc + h

        h, acc = poptorch.for_loop(self.count, body, [x, torch.zeros_like(x)])
        loss = torch.nn.functional.mse_loss(acc, target)
        return acc, loss


def _batches(calls=2):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(2, 4, generator=generator), torch.randn(2, 4, generator=generator))
            for _ in range(calls)]


def test_for_loop_inference_is_one_loop_node_and_matches_eager():
    model = LoopModel().eval()
    x, target = _batches(1)[0]
    expected = model(x, target)
    wrapper = poptorch.inferenceModel(model)
    actual = wrapper(x, target)
    assert_allclose(actual=actual, expected=expected)
    assert _node_types(wrapper).count("Loop") == 1  # not unrolled
    assert "Gemm" not in _node_types(wrapper)  # the body's Linear is inside the Loop


def test_for_loop_training_matches_torch_autograd():
    model = LoopModel()
    before = model.lin.weight.detach().clone()
    compare_training(model, lambda p: torch.optim.SGD(p, lr=0.1), _batches(2))
    assert not torch.equal(model.lin.weight.detach(), before)  # training did move the weights


def test_for_loop_zero_count_returns_inputs():
    model = LoopModel(count=0).eval()
    x, target = _batches(1)[0]
    assert_allclose(actual=poptorch.inferenceModel(model)(x, target), expected=model(x, target))


def test_for_loop_rejects_bad_count_and_mismatched_body():
    x = torch.ones(2)
    with pytest.raises(poptorch.Error, match="count must be a non-negative"):
        poptorch.for_loop(2.0, lambda a: a, [x])
    with pytest.raises(poptorch.Error, match="must match the loop inputs"):
        poptorch.for_loop(2, lambda a: (a, a), [x])
    with pytest.raises(poptorch.Error, match="must match the loop inputs"):
        poptorch.for_loop(2, lambda a: a.sum(), [x])
    with pytest.raises(poptorch.Error, match="only tensors"):
        poptorch.for_loop(2, lambda a: a, [1.0])


def test_for_loop_mismatched_body_is_refused_when_tracing():
    class Bad(torch.nn.Module):
        def forward(self, x):
            return poptorch.for_loop(2, lambda a: a[:1], [x])[0]

    with pytest.raises(poptorch.Error, match="must match the loop inputs"):
        poptorch.inferenceModel(Bad())(torch.ones(2, 3))


class CondModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(3, 3)
        self.b = torch.nn.Linear(3, 3)

    def forward(self, x, flag, target):
        out = poptorch.cond(flag, lambda h: torch.relu(self.a(h)), [x],
                            lambda h, s: self.b(h) * s, [x, target])[0]
        return out, torch.nn.functional.mse_loss(out, target)


def test_cond_inference_both_branches_match_eager():
    model = CondModel().eval()
    x, target = torch.randn(2, 3), torch.randn(2, 3)
    wrapper = poptorch.inferenceModel(model)
    for value in (True, False):  # one compiled If serves both values
        condition = torch.tensor([value])
        assert_allclose(actual=wrapper(x, condition, target), expected=model(x, condition, target))
    assert "If" in _node_types(wrapper)


def test_cond_training_matches_torch_autograd():
    generator = torch.Generator().manual_seed(2)
    batches = [(torch.randn(2, 3, generator=generator), torch.tensor([flag]),
                torch.randn(2, 3, generator=generator)) for flag in (True, False, True)]
    compare_training(CondModel(), lambda p: torch.optim.SGD(p, lr=0.1), batches)


def test_cond_rejects_bad_condition_and_mismatched_branches():
    x = torch.ones(2)
    with pytest.raises(poptorch.Error, match="one-element tensor"):
        poptorch.cond(torch.ones(2), lambda a: a, [x], lambda a: a, [x])

    class Bad(torch.nn.Module):
        def forward(self, x, flag):
            return poptorch.cond(flag, lambda a: a * 2, [x], lambda a: a[:1], [x])[0]

    with pytest.raises(poptorch.Error, match="cond"):
        poptorch.inferenceModel(Bad())(torch.ones(2, 3), torch.tensor([True]))
