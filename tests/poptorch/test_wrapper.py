"""Wrapper lifecycle: validation, recompiling, weights, device (spec §2.1-§2.2, P5-P17, P24)."""

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import poptorch_lite as poptorch
from poptorch_lite.testing import assert_allclose, compare_with_cpu

from .conftest import make_mlp


@pytest.fixture(scope="module")
def wrapped():
    """One compiled MLP wrapper (N = 2) shared by the tests of this module."""
    model = make_mlp()
    wrapper = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    wrapper(torch.randn(4, 4))
    yield model, wrapper
    wrapper.destroy()


def test_wrong_combined_batch_error_names_sizes_and_factors():
    opts = poptorch.Options().deviceIterations(4)
    wrapper = poptorch.inferenceModel(make_mlp(), opts)
    with pytest.raises(poptorch.Error) as info:
        wrapper(torch.randn(6, 4))
    text = str(info.value)
    assert "input x: batch dimension 6 is not a multiple of deviceIterations(4)" in text
    assert "gradientAccumulation(1) = 4" in text


def test_new_input_signature_is_an_error_until_destroy(wrapped):
    """P24: as PopTorch, a compiled wrapper refuses other inputs; destroy() recompiles."""
    model, wrapper = wrapped
    x4 = torch.randn(4, 4)
    assert_allclose(actual=wrapper(x4), expected=model(x4).detach())
    x8 = torch.randn(8, 4)
    with pytest.raises(poptorch.Error) as info:
        wrapper(x8)
    message = str(info.value)
    assert "input x: expected float32[4, 4], got float32[8, 4]" in message
    assert message.rstrip().endswith("build a new wrapper or call destroy() to recompile.")
    assert info.value.type == "input_changed"
    with pytest.raises(poptorch.Error, match=r"input x: expected float32\[4, 4\], got float16"):
        wrapper(x4.half())
    assert_allclose(actual=wrapper(x4), expected=model(x4).detach())  # still usable
    wrapper.destroy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_allclose(actual=wrapper(x8), expected=model(x8).detach())
    wrapper.destroy()
    wrapper(x4)  # the module's fixture is compiled for [4, 4] again


def test_bad_call_is_an_error(wrapped):
    _, wrapper = wrapped
    with pytest.raises(poptorch.Error, match=r"forward\(x\)"):
        wrapper(torch.randn(4, 4), torch.randn(4, 4))


def test_weights_round_trip_and_load_state_dict(wrapped):
    model, wrapper = wrapped
    x = torch.randn(4, 4)
    wrapper(x)  # make this signature's executable the active one
    with torch.no_grad():
        model.fc2.bias.add_(1.0)
    stale = wrapper(x)
    assert_allclose(actual=stale + 1.0, expected=model(x).detach(), rtol=1e-5, atol=1e-5)
    wrapper.copyWeightsToDevice()
    assert_allclose(actual=wrapper(x), expected=model(x).detach())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["fc2.bias"] -= 1.0
    wrapper.load_state_dict(state)  # loads into the user model and pushes to the device
    assert_allclose(actual=wrapper(x), expected=model(x).detach())
    with torch.no_grad():
        model.fc1.weight.zero_()
    wrapper.copyWeightsToHost()  # device -> host restores the device values
    assert model.fc1.weight.abs().sum() > 0


def test_attach_detach(wrapped):
    model, wrapper = wrapped
    assert wrapper.isAttached()
    wrapper.detachFromDevice()
    assert not wrapper.isAttachedToDevice()
    with pytest.raises(poptorch.Error, match="not attached"):
        wrapper.detachFromDevice()
    x = torch.randn(4, 4)
    assert_allclose(actual=wrapper(x), expected=model(x).detach())  # reattaches on call
    with pytest.raises(poptorch.Error, match="already attached"):
        wrapper.attachToDevice()


def test_not_compiled_errors_and_compile_twice(mlp):
    wrapper = poptorch.inferenceModel(mlp)
    with pytest.raises(poptorch.Error, match="not been compiled"):
        wrapper.copyWeightsToHost()
    wrapper.compile(torch.randn(2, 4))
    assert wrapper.isCompiled()
    with pytest.warns(UserWarning, match="already compiled"):
        wrapper.compile(torch.randn(2, 4))
    assert "PoplarExecutor(inference, compiled=True" in repr(wrapper)
    assert wrapper.fc1 is mlp.fc1  # attribute access forwards to the user model
    with pytest.raises(poptorch.Error, match="different train/eval flag"):
        wrapper.train()
    wrapper.destroy()
    assert not wrapper.isCompiled()


def test_ipu_model_warns_for_training_mode_model_and_eval_flag_is_snapshotted():
    model = make_mlp().train()
    with pytest.warns(UserWarning, match="inference wrapper"):
        wrapper = poptorch.ipu_model(model)
    model.eval()  # after wrapping: does not reach the wrapper (P15)
    assert wrapper._flags[""] is True


def test_export_and_compare_helper():
    out = compare_with_cpu(make_mlp(3), torch.randn(6, 4),
                           options=poptorch.Options().deviceIterations(3))
    assert out.shape == (6, 3)


def test_upstream_style_script_runs_unchanged(tmp_path):
    script = tmp_path / "upstream.py"
    script.write_text(textwrap.dedent("""
        import torch
        import poptorch_lite as poptorch

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        model.eval()
        opts = poptorch.Options()
        opts.deviceIterations(2)
        opts.outputMode(poptorch.OutputMode.All)
        data = torch.utils.data.TensorDataset(torch.randn(16, 4))
        loader = poptorch.DataLoader(opts, data, batch_size=4)
        poptorch_model = poptorch.inferenceModel(model, opts)
        for (x,) in loader:
            out = poptorch_model(x)
            assert out.shape == (8, 2)
            assert torch.allclose(out, model(x), atol=1e-5)
        poptorch_model.detachFromDevice()
        print("ok")
    """))
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin",
                                           "OMP_NUM_THREADS": "2"}, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")
