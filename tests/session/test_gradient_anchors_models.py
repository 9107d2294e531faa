"""Gradient anchors (F35) of the inputs and activations of each real model of
test_gradient_anchors.py (MLP, small CNN, transformer-style layer) with gradient accumulation
and replication together, compared with torch.autograd per micro-batch and replica."""

from __future__ import annotations

import pytest

import popart_backend as popart
from tests.session.test_gradient_anchors import (
    GRAD,
    assert_close,
    attention_layer,
    cnn,
    feeds,
    mlp,
    run,
    session_of,
    torch_grads,
)


@pytest.mark.parametrize("make", [mlp, cnn, attention_layer], ids=["mlp", "cnn", "attention"])
def test_gradients_with_accumulation_and_replication_equal_torch_F35(make):
    model, bps, af, rf = make(), 1, 2, 2
    art = popart.AnchorReturnType("All")
    session = session_of(model, {GRAD + tid: art for tid in model.watched.values()}, bps=bps,
                         af=af, rf=rf)
    data = feeds(model, (bps, af, rf), seed=21)
    got = run(session, data)
    want = torch_grads(model, data, list(model.watched), lead=3)
    for name, tid in model.watched.items():
        # Host shape [af, rf, *T] (the size-1 batches-per-step dimension dropped).
        assert_close(got[GRAD + tid], want[name].reshape(af, rf, *want[name].shape[3:]),
                     GRAD + tid)
