"""Comparison helpers for users' own models.

``assert_allclose(actual=..., expected=...)`` compares nested outputs with the per-dtype
tolerances of STYLE.md; ``compare_with_cpu(model, inputs, ...)`` wraps a copy of a model,
runs it and the eager model on the same inputs and checks outputs (and, after
``copyWeightsToHost()``, every parameter and buffer by name); ``run_reference(model,
optimizer, batches, options)`` trains an eager model the way a training wrapper does (micro-batch
order, gradient accumulation, one optimizer step per device iteration) and returns
what the wrapper would return for each call.
"""

from __future__ import annotations

import copy

import torch
from torch.utils import _pytree as pytree

from .executor.executor import inferenceModel
from .options.enums import OutputMode, ReductionType
from .options.options import Options

__all__ = ["allclose", "assert_allclose", "assert_allequal", "compare_with_cpu", "run_reference"]

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


def run_reference(model: torch.nn.Module, optimizer, batches, options=None, loss_index=None):
    """Train ``model`` eagerly like a training wrapper with ``options``; per-call outputs.

    ``batches``: one tuple of positional inputs per wrapper call (combined batches of
    ``B·N·G`` rows). For each of the N device iterations the G micro-batches (rows
    ``(n·G + g)·B …``) run forward and backward with the loss divided by G (Mean reduction; Sum
    keeps it), then ``optimizer.step()`` runs once. The loss is the output at ``loss_index``
    of the flattened result (default: the last 0-d float output). Returned outputs follow the
    options' output mode (default Final), stacked by output mode. Replication is not modelled.
    """
    options = Options() if options is None else options
    n = options.device_iterations
    g = options.Training.gradient_accumulation
    mean = options.Training.reduction_type is ReductionType.Mean
    mode = options.resolved_output_mode(True)
    period = options.output_return_period
    results = []
    for call_inputs in batches:
        rows = next(t.shape[0] for t in call_inputs if isinstance(t, torch.Tensor) and t.dim())
        b = rows // (n * g)
        per_micro = []
        for i in range(n):
            optimizer.zero_grad()
            for j in range(g):
                start = (i * g + j) * b
                micro = [t[start:start + b] if isinstance(t, torch.Tensor) and t.dim() else t
                         for t in call_inputs]
                out = model(*micro)
                leaves, spec = pytree.tree_flatten(out)
                index = loss_index if loss_index is not None else max(
                    k for k, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)
                    and leaf.dim() == 0 and leaf.is_floating_point())
                (leaves[index] / g if mean else leaves[index]).backward()
                per_micro.append([leaf.detach() if isinstance(leaf, torch.Tensor) else leaf
                                  for leaf in leaves])
            optimizer.step()
        results.append(pytree.tree_unflatten(_stack(per_micro, mode, period, g), spec))
    return results


def _stack(per_micro: list, mode, period: int, g: int) -> list:
    if mode is OutputMode.Final:
        chosen = [per_micro[-1]]
    elif mode is OutputMode.Sum:
        return [sum(m[k] for m in per_micro) if isinstance(per_micro[0][k], torch.Tensor)
                else per_micro[0][k] for k in range(len(per_micro[0]))]
    elif mode is OutputMode.EveryN:
        chosen = [m for index, m in enumerate(per_micro) if (index // g) % period == period - 1]
    else:
        chosen = per_micro
    if len(chosen) == 1:
        return chosen[0]
    out = []
    for k, leaf in enumerate(chosen[0]):
        if not isinstance(leaf, torch.Tensor):
            out.append(leaf)
        elif leaf.dim() == 0:
            out.append(torch.stack([m[k] for m in chosen]))
        else:
            out.append(torch.cat([m[k] for m in chosen]))
    return out
