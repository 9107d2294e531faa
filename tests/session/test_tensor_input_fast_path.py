"""The run of one micro-batch binds torch inputs of the model's dtypes and shapes with one
check per input (``stream_io.bind_tensor_inputs``); anything else takes ``bind_inputs`` and its
errors, conversions and warnings, as before. The reference is the numpy input path and the
affine formula of ``session_models``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.device import simulator

from .session_models import SAMPLE_SHAPE, affine_ref, make_session, step_input


@pytest.fixture
def full_binds(monkeypatch) -> list:
    """Records the runs that took the full ``bind_inputs``."""
    calls = []
    original = simulator.bind_inputs

    def bind_inputs(p, stepio):
        calls.append(sorted(stepio.inputs))
        return original(p, stepio)

    monkeypatch.setattr(simulator, "bind_inputs", bind_inputs)
    return calls


def _run(session, stepio):
    session.run(stepio)
    return stepio.outputs["y"]


def test_matching_torch_input_skips_the_full_bind_and_reads_each_calls_data(full_binds):
    session = make_session({"y": popart.AnchorReturnType("All")})
    stepio = popart.PyStepIO({}, {}, allocate_outputs=True)  # one step IO for every call
    for seed in (1, 2, 3):
        x = step_input(1, seed=seed)[0]
        stepio.inputs = {"x": torch.from_numpy(x.copy())}
        np.testing.assert_allclose(_run(session, stepio).numpy(), affine_ref(x), rtol=1e-6)
    assert full_binds == []


@pytest.mark.parametrize("change", ["shape", "layout", "dtype", "grad"])
def test_other_torch_inputs_take_the_full_bind(full_binds, change):
    session = make_session({"y": popart.AnchorReturnType("All")})
    x = step_input(1, seed=4)[0]
    tensor = torch.from_numpy(x.copy())
    if change == "shape":
        tensor = tensor.reshape(-1)  # same elements: viewed in the model's shape
    elif change == "layout":
        tensor = tensor.t().contiguous().t()  # same values, column-major
        assert not tensor.is_contiguous()
    elif change == "grad":
        tensor.requires_grad_(True)
    if change == "dtype":
        with pytest.raises(popart.popart_exception, match="Type discrepancy for tensor 'x'"):
            _run(session, popart.PyStepIO({"x": tensor.double()}, {}, allocate_outputs=True))
    else:
        y = _run(session, popart.PyStepIO({"x": tensor}, {}, allocate_outputs=True))
        np.testing.assert_allclose(y.numpy(), affine_ref(x), rtol=1e-6)
    assert full_binds == [["x"]]


def test_unknown_input_still_raises(full_binds):
    session = make_session({"y": popart.AnchorReturnType("All")})
    x = torch.from_numpy(step_input(1, seed=5)[0].copy())
    with pytest.raises(popart.popart_exception, match="'z', which is not an input"):
        _run(session, popart.PyStepIO({"x": x, "z": x}, {}, allocate_outputs=True))
    assert len(full_binds) == 1


def test_fast_bound_run_leaves_offsets_at_zero():
    session = make_session({"y": popart.AnchorReturnType("All")})
    stepio = popart.PyStepIO({"x": torch.from_numpy(step_input(1, seed=6)[0].copy())}, {},
                             allocate_outputs=True)
    session.run(stepio)
    assert stepio.input_offsets == {"x": 0}
    assert tuple(stepio.outputs["y"].shape) == SAMPLE_SHAPE
