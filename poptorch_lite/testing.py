"""Comparison helpers for users' own models (spec §2.13, P73-P74).

``assert_allclose(actual=..., expected=...)`` compares nested outputs with the per-dtype
tolerances of STYLE.md §4; ``compare_with_cpu(model, inputs, ...)`` wraps a copy of a model,
runs it and the eager model on the same inputs and checks outputs (and, after
``copyWeightsToHost()``, every parameter and buffer by name).
"""

from __future__ import annotations

import copy

import torch

__all__ = ["allclose", "assert_allclose", "assert_allequal", "compare_with_cpu"]

# (rtol, atol) per dtype; integers and bools compare exactly.
_TOLERANCES = {torch.float32: (1e-5, 1e-6), torch.float16: (1e-3, 1e-3),
               torch.bfloat16: (1e-2, 1e-2), torch.float64: (1e-7, 1e-7)}


def allclose(ref, other) -> bool:
    """Structure-aware ``torch.allclose`` over tuples/lists/dicts."""
    if isinstance(ref, (tuple, list)):
        return (type(ref) is type(other) and len(ref) == len(other)
                and all(allclose(a, b) for a, b in zip(ref, other)))
    if isinstance(ref, dict):
        return (isinstance(other, dict) and ref.keys() == other.keys()
                and all(allclose(ref[k], other[k]) for k in ref))
    if isinstance(ref, torch.Tensor):
        return (isinstance(other, torch.Tensor) and ref.shape == other.shape
                and torch.allclose(ref, other.to(ref.dtype)))
    return ref == other


def assert_allclose(*, actual, expected, rtol=None, atol=None, equal_nan=False, msg=None):
    """Recursive ``torch.testing.assert_close`` with the per-dtype tolerance table.

    Keyword-only so ``actual`` and ``expected`` cannot be swapped. ``expected``'s dtype picks
    the tolerances unless ``rtol``/``atol`` are given; ``actual`` is cast to it first (the
    device returns int32/float32 for 64-bit results).
    """
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), (
            msg or f"structure differs: expected {type(expected).__name__} of {len(expected)}, "
                   f"got {type(actual).__name__}")
        for a, e in zip(actual, expected):
            assert_allclose(actual=a, expected=e, rtol=rtol, atol=atol, equal_nan=equal_nan,
                            msg=msg)
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), (
            msg or f"dict keys differ: expected {sorted(expected)}, got "
                   f"{sorted(actual) if isinstance(actual, dict) else type(actual)}")
        for key in expected:
            assert_allclose(actual=actual[key], expected=expected[key], rtol=rtol, atol=atol,
                            equal_nan=equal_nan, msg=msg)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected, msg or f"expected {expected!r}, got {actual!r}"
        return
    default = _TOLERANCES.get(expected.dtype, (0.0, 0.0))
    rtol = default[0] if rtol is None else rtol
    atol = default[1] if atol is None else atol
    torch.testing.assert_close(actual.to(expected.dtype), expected, rtol=rtol, atol=atol,
                               equal_nan=equal_nan, msg=msg)


def assert_allequal(*, actual, expected, msg=None):
    assert_allclose(actual=actual, expected=expected, rtol=0.0, atol=0.0, msg=msg)


def compare_with_cpu(model: torch.nn.Module, *inputs, options=None, rtol=None, atol=None,
                     wrapper_fn=None):
    """Run a copy of ``model`` on the simulated IPU and the model itself on CPU; compare.

    ``inputs`` are the per-call combined batches. For inference wrappers the CPU reference
    is the eager model on the same batch (output mode All). Returns the wrapper's outputs.
    """
    from . import inferenceModel

    device_model = copy.deepcopy(model)
    wrapper = (wrapper_fn or inferenceModel)(device_model, options)
    try:
        actual = wrapper(*inputs)
        with torch.no_grad():
            expected = model(*inputs)
        assert_allclose(actual=actual, expected=expected, rtol=rtol, atol=atol)
        wrapper.copyWeightsToHost()
        reference = dict(model.named_parameters())
        reference.update(model.named_buffers())
        state = dict(device_model.named_parameters())
        state.update(device_model.named_buffers())
        for name, value in reference.items():
            assert_allclose(actual=state[name].detach(), expected=value.detach(), rtol=rtol,
                            atol=atol, msg=f"parameter/buffer '{name}' differs")
    finally:
        wrapper.destroy()
    return actual
