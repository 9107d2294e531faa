"""Export-and-compare for training wrappers (spec §2.13, P74): the wrapper against
``poptorch_lite.testing.run_reference`` on a deep copy of the same model."""

from __future__ import annotations

import copy

import torch

import poptorch_lite as poptorch
from poptorch_lite.testing import assert_allclose, run_reference


def compare_training(model, optimizer_fn, batches, options=None, rtol=1e-4, atol=1e-5,
                     check_outputs=True):
    """Train ``model`` on the wrapper and a copy eagerly; assert outputs (per call) and every
    parameter and buffer agree. Returns (wrapper, reference model, reference optimizer)."""
    reference = copy.deepcopy(model)
    ref_optimizer = optimizer_fn(reference.parameters())
    options = poptorch.Options() if options is None else options
    wrapper = poptorch.trainingModel(model, options, optimizer_fn(model.parameters()))
    expected = run_reference(reference, ref_optimizer, batches, options)
    for index, inputs in enumerate(batches):
        actual = wrapper(*inputs)
        if check_outputs:
            assert_allclose(actual=actual, expected=expected[index], rtol=rtol, atol=atol,
                            msg=f"outputs of call {index} differ")
    assert_state_equal(model, reference, rtol=rtol, atol=atol)
    return wrapper, reference, ref_optimizer


def assert_state_equal(model, reference, rtol=1e-4, atol=1e-5):
    """Every parameter and buffer of ``model`` (host-synced lazily) equals ``reference``'s."""
    actual = model.state_dict()  # pulls device weights first (P10)
    for name, value in reference.state_dict().items():
        assert_allclose(actual=actual[name], expected=value, rtol=rtol, atol=atol,
                        msg=f"'{name}' differs after training")


def classification_batches(calls, rows, features, classes, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, *features, generator=generator),
             torch.randint(0, classes, (rows,), generator=generator)) for _ in range(calls)]
