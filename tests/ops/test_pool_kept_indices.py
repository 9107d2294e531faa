"""MaxPool's forward keeps the positions of its maxima for MaxPoolGrad (issue #4 performance):
the kept indices belong to one tensor value, and any change to it makes the grad op pool
again (F49)."""

import numpy as np
import torch
import torch.nn.functional as F

from popart_backend.ops import pool
from tests.helpers import check_grad

ARGS = ((2, 2), (2, 2), (0, 0), (1, 1), False)


def _pooled(x):
    return F.max_pool2d(x, *ARGS, True)


def test_indices_are_kept_per_tensor_value_and_window():
    x = torch.randn(2, 3, 4, 4)
    _, idx = _pooled(x)
    pool._keep_indices(x, ARGS, idx)
    assert pool._kept_indices(x, ARGS) is idx
    assert pool._kept_indices(x.clone(), ARGS) is None  # another tensor: nothing kept
    other_window = ((2, 2), (1, 1), (0, 0), (1, 1), False)
    assert pool._kept_indices(x, other_window) is None
    x.add_(1.0)  # changed in place after the forward: the indices may be stale
    assert pool._kept_indices(x, ARGS) is None


def test_inference_tensors_keep_nothing():
    with torch.inference_mode():
        x = torch.randn(1, 1, 4, 4)
        _, idx = _pooled(x)
    pool._keep_indices(x, ARGS, idx)
    assert pool._kept_indices(x, ARGS) is None


def test_grad_uses_the_kept_indices(monkeypatch):
    """In a training graph the grad op finds the forward's indices and never pools again,
    and the gradient still equals torch's."""
    pooled_in_grad = []
    original = pool._kept_indices

    def spy(x, args):
        found = original(x, args)
        pooled_in_grad.append(found is None)
        return found

    monkeypatch.setattr(pool, "_kept_indices", spy)
    x = (np.random.default_rng(0).permutation(2 * 3 * 6 * 6).reshape(2, 3, 6, 6) / 216.0)
    check_grad("MaxPool", [x.astype(np.float32)], {"kernel_shape": [2, 2], "strides": [2, 2]},
               ref=lambda t: F.max_pool2d(t, 2, 2), rtol=1e-4, atol=1e-5)
    assert pooled_in_grad and not any(pooled_in_grad)
