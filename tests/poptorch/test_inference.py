"""Inference wrappers equal eager PyTorch for every output mode (spec §2.4, P2, P21, P25)."""

import pytest
import torch

import poptorch_lite as poptorch
from poptorch_lite.testing import assert_allclose

from .conftest import make_cnn, make_mlp

B = 2  # micro-batch


def expected_for(mode, full, n, period=2):
    """The §2.4 stacking rule for inference (G = R = 1) applied to eager outputs."""
    per_iter = full.reshape(n, B, *full.shape[1:])
    if mode is poptorch.OutputMode.All:
        return full
    if mode is poptorch.OutputMode.Final:
        return per_iter[-1]
    if mode is poptorch.OutputMode.Sum:
        return per_iter.sum(0)
    return per_iter[period - 1::period].reshape(-1, *full.shape[1:])


MODES = [poptorch.OutputMode.All, poptorch.OutputMode.Final, poptorch.OutputMode.Sum,
         poptorch.OutputMode.EveryN]


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_mlp_output_modes(mode, n):
    model = make_mlp()
    opts = poptorch.Options().deviceIterations(n)
    period = 2 if n % 2 == 0 else 1
    opts.outputMode(mode, period if mode is poptorch.OutputMode.EveryN else None)
    wrapper = poptorch.inferenceModel(model, opts)
    torch.manual_seed(1)
    x = torch.randn(n * B, 4)
    try:
        out = wrapper(x)
        with torch.no_grad():
            ref = expected_for(mode, model(x), n, period)
        assert out.shape == ref.shape
        assert_allclose(actual=out, expected=ref)
    finally:
        wrapper.destroy()


@pytest.mark.parametrize("n,mode", [(1, poptorch.OutputMode.All), (4, poptorch.OutputMode.All),
                                    (4, poptorch.OutputMode.Final),
                                    (4, poptorch.OutputMode.Sum)], ids=str)
def test_cnn_eval(n, mode):
    model = make_cnn()
    opts = poptorch.Options().deviceIterations(n).outputMode(mode)
    wrapper = poptorch.inferenceModel(model, opts)
    torch.manual_seed(2)
    x = torch.randn(n * B, 2, 4, 4)
    try:
        out = wrapper(x)
        with torch.no_grad():
            ref = expected_for(mode, model(x), n)
        assert_allclose(actual=out, expected=ref, rtol=1e-5, atol=1e-5)
    finally:
        wrapper.destroy()


def test_default_mode_is_all_for_inference_and_scalar_outputs_stack():
    class Stats(torch.nn.Module):
        def forward(self, x):
            return x.sum(), {"double": x * 2}

    opts = poptorch.Options().deviceIterations(3)
    wrapper = poptorch.inferenceModel(Stats(), opts)
    x = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    try:
        total, extra = wrapper(x)
        # A scalar per micro-batch becomes a 1-D tensor of N values; dict structure is kept.
        assert_allclose(actual=total, expected=x.reshape(3, 2, 2).sum((1, 2)))
        assert_allclose(actual=extra["double"], expected=x * 2)
    finally:
        wrapper.destroy()


def test_int64_outputs_come_back_int32():
    class ArgMax(torch.nn.Module):
        def forward(self, x):
            return torch.argmax(x, dim=1)

    wrapper = poptorch.inferenceModel(ArgMax())
    x = torch.randn(4, 5)
    try:
        out = wrapper(x)
        assert out.dtype == torch.int32
        assert torch.equal(out, torch.argmax(x, 1).int())
    finally:
        wrapper.destroy()
