"""Ops torch.onnx cannot convert by itself, translated by poptorch_lite (spec §2.9, P59-P62):
``F.rrelu``, ``scatter_reduce`` ("mean", and the amin/amax gradients), mixed-dtype
``arange``, bool arithmetic and masks. Each compared with eager PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import poptorch_lite as poptorch
from poptorch_lite.testing import assert_allclose

from .training_helpers import compare_training


class Lambda(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _infer(fn, *args):
    return poptorch.inferenceModel(Lambda(fn))(*args)


def test_rrelu_inference_uses_the_mean_slope():
    x = torch.randn(4, 6)
    fn = lambda t: F.rrelu(t, lower=0.1, upper=0.3, training=False)
    assert_allclose(actual=_infer(fn, x), expected=fn(x), rtol=1e-6, atol=1e-6)


def test_rrelu_training_slopes_are_random_and_follow_the_gradient():
    """Random slopes in [lower, upper] for negative inputs (a new draw per call, mean near
    (lower + upper) / 2); the gradient of each element is the slope its forward used."""
    lower, upper = 0.1, 0.3

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.linspace(-2.0, 1.0, 600).reshape(20, 30))

        def forward(self):
            out = F.rrelu(self.p, lower=lower, upper=upper, training=True)
            return out, poptorch.identity_loss(out, reduction="sum")

    model = Model()
    before = model.p.detach().clone()
    wrapper = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0))
    out, _ = wrapper()
    negative = before < 0
    slopes = out[negative] / before[negative]
    assert float(slopes.min()) >= lower - 1e-6 and float(slopes.max()) <= upper + 1e-6
    assert abs(float(slopes.mean()) - (lower + upper) / 2) < 0.02
    assert float(slopes.std()) > 0.03  # not one fixed slope
    assert torch.equal(out[~negative], before[~negative])
    # SGD(lr=1) on sum(out): p_new = p - d(out)/dp, with d(out)/dp = slope (1 if p > 0)
    expected_grad = torch.where(negative, out / before, torch.ones_like(before))
    assert_allclose(actual=model.p.detach(), expected=before - expected_grad, rtol=1e-5,
                    atol=1e-5)
    out2, _ = wrapper()
    assert not torch.allclose(out2[negative] / model.p.detach()[negative], slopes)


INDEX = torch.tensor([[0, 1], [2, 2], [0, 0], [3, 1], [2, 0]])


@pytest.mark.parametrize("reduce", ["mean", "amax", "amin", "sum", "prod"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_forward(reduce, include_self):
    fn = lambda base, src: base.scatter_reduce(
        0, INDEX, src, reduce, include_self=include_self)
    generator = torch.Generator().manual_seed(1)
    base, src = torch.randn(4, 2, generator=generator), torch.randn(5, 2, generator=generator)
    assert_allclose(actual=_infer(fn, base, src), expected=fn(base, src), rtol=1e-5,
                    atol=1e-6)


class ScatterModel(torch.nn.Module):
    """Parameters with ties (equal values in self and src) so amax/amin share the gradient."""

    def __init__(self, reduce, include_self):
        super().__init__()
        self.reduce, self.include_self = reduce, include_self
        self.base = torch.nn.Parameter(torch.tensor(
            [[1.0, 2.0], [0.5, -1.0], [3.0, 0.0], [-2.0, 4.0]]))
        self.src = torch.nn.Parameter(torch.tensor(
            [[1.0, 2.0], [0.5, 0.7], [1.0, -3.0], [-2.5, 2.0], [0.5, 0.0]]))
        self.weight = torch.tensor([[1.0, -2.0], [0.5, 3.0], [2.0, 1.0], [-1.0, 0.25]])

    def forward(self, x):
        out = self.base.scatter_reduce(0, INDEX, self.src * x, self.reduce,
                                       include_self=self.include_self)
        return out, poptorch.identity_loss((out * self.weight).sum(), reduction="sum")


@pytest.mark.parametrize("reduce", ["amax", "amin", "mean", "prod"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_gradients_match_torch(reduce, include_self):
    """The model has zeros in self and in src, which the "prod" gradient must handle."""
    compare_training(ScatterModel(reduce, include_self),
                     lambda p: torch.optim.SGD(p, lr=0.5), [(torch.ones(1),), (torch.ones(1),)],
                     rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", [
    lambda x: x + torch.arange(0, 1.5, 0.5),
    lambda x: x * torch.arange(1, 4.0),
    lambda x: x * torch.arange(0, 1, 0.1)[:3],
    lambda x: x * torch.arange(1, 3.5, dtype=torch.int32),
    lambda x: x * torch.arange(1, 7, 2),
], ids=["int-float-step", "int-start-float-end", "float-step-0.1", "float-args-int-dtype",
        "all-int"])
def test_mixed_dtype_arange(fn):
    x = torch.randn(3)
    expected = fn(x)
    actual = _infer(fn, x)
    assert actual.dtype == expected.dtype
    assert_allclose(actual=actual, expected=expected, rtol=1e-6, atol=1e-6)


def test_bool_arithmetic():
    a = torch.tensor([True, False, True, False, True])
    b = torch.tensor([True, True, False, False, False])

    def fn(a, b):
        return a & b, a | b, a ^ b, a + b, a * b, ~a, a.sum(), (a + b).sum()

    actual, expected = _infer(fn, a, b), fn(a, b)
    for got, want in zip(actual, expected):
        assert got.dtype == (torch.int32 if want.dtype == torch.int64 else want.dtype)
        assert torch.equal(got.to(want.dtype), want)


def test_bool_mask_fill_and_where():
    x = torch.randn(4, 6)
    mask = torch.rand(4, 6) > 0.5
    fn = lambda x, m: (x.masked_fill(m, -1.0), torch.where(m, x, 0.0),
                       x.masked_fill(m.to(torch.uint8).bool(), 2.0))
    for got, want in zip(_infer(fn, x, mask), fn(x, mask)):
        assert_allclose(actual=got, expected=want, rtol=0, atol=0)


def test_uint8_mask_is_refused_like_torch():
    """torch itself refuses a uint8 mask in masked_fill; the wrapper reports it as an Error
    pointing at the user's line."""
    x, mask = torch.randn(2, 3), torch.tensor([[1, 0, 1], [0, 0, 1]], dtype=torch.uint8)
    with pytest.raises(RuntimeError):
        x.masked_fill(mask, 0.0)
    with pytest.raises(poptorch.Error, match="uint8"):
        _infer(lambda x, m: x.masked_fill(m, 0.0), x, mask)


def test_indexing_with_a_constant_mask():
    """A mask known at compile time (a buffer) folds into a fixed-shape gather."""
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mask", torch.tensor([True, False, True, True, False]))

        def forward(self, x):
            return x[:, self.mask] * 2

    x = torch.randn(2, 5)
    model = Model()
    assert_allclose(actual=poptorch.inferenceModel(model)(x), expected=model(x), rtol=0, atol=0)


def test_indexing_with_a_data_dependent_mask_is_an_error():
    x, mask = torch.randn(2, 5), torch.rand(2, 5) > 0.5
    with pytest.raises(poptorch.Error, match="depends on the values"):
        _infer(lambda x, m: x[m], x, mask)


def test_all_untranslatable_ops_are_reported_at_once():
    """P76: every op without a translation, each with the user's source line, in one Error
    (not the exporter's ConversionError for the first one only)."""
    def fn(x):
        a = torch.special.zeta(x, 2.0)
        b = torch.polygamma(2, x)
        return a + b

    with pytest.raises(poptorch.Error) as info:
        _infer(fn, torch.rand(3) + 1)
    message = str(info.value)
    assert "zeta" in message and "aten.polygamma" in message
    assert message.count("test_ops_translations.py:") >= 2
    assert info.value.type == "unsupported_op"
