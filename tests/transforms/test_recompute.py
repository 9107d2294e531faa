"""Recomputation (spec §5.2; F70): every RecomputationType and the manual annotation leave the
trained weights unchanged, and the IR shows the recomputed forward ops as clones read by the
backward pass."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.ir.op import RecomputeType
from tests.session.pipeline_models import MB, D, assert_weights_close, chain_weights, options, train

R = popart.RecomputationType


def _x(bps: int, af: int = 1, seed: int = 12) -> np.ndarray:
    shape = (bps, af, MB, D) if af > 1 else (bps, MB, D)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _clones(session):
    graph = session.getIr().main
    return [op for op in graph.ops.values() if op.settings.recompute is RecomputeType.Recomputed]


def _check_clones_feed_the_backward(session):
    clones = _clones(session)
    ids = {op.id for op in clones}
    for op in clones:
        assert op.settings.name.endswith("/recomputed")
        readers = [c for t in op.outputs if t is not None for c in t.consumers]
        assert readers and all(c.grad_of is not None or c.id in ids for c in readers), op
    return clones


@pytest.mark.parametrize("kind", [R.Standard, R.NormOnly, R.RecomputeAll])
def test_recomputation_keeps_the_numbers_and_shows_clones_F70(kind):
    weights, x = chain_weights(3, seed=1), _x(3)
    want, want_loss, baseline = train(weights, x, 1, options(), bps=3, place=False, norm=True)
    assert not _clones(baseline)
    got, got_loss, session = train(weights, x, 1, options(autoRecomputation=kind), bps=3,
                                   place=False, norm=True)
    assert_weights_close(got, want, rtol=1e-6)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    clones = _check_clones_feed_the_backward(session)
    types = {op.op_type for op in clones}
    if kind is R.NormOnly:
        assert types == {"LayerNormalization", "Tanh"}
    elif kind is R.RecomputeAll:
        assert types == {"MatMul", "LayerNormalization", "Tanh"}
    else:
        assert clones and len(clones) < len(baseline.getIr().main.ops)


def test_manual_recompute_annotation_F70():
    weights, x = chain_weights(3, seed=2), _x(2)
    want, _, _ = train(weights, x, 1, options(), bps=2, place=False)
    got, _, session = train(weights, x, 1, options(explicitRecomputation=True), bps=2,
                            place=False, recompute=(1,))
    assert_weights_close(got, want, rtol=1e-6)
    clones = _check_clones_feed_the_backward(session)
    assert [op.op_type for op in clones] == ["Tanh"]
    assert clones[0].settings.name.startswith("Tanh")


def test_pipeline_recomputation_stashes_only_stage_inputs_F70():
    weights, x = chain_weights(3, seed=3), _x(1, af=5)
    want, _, _ = train(weights, x, 1, options(af=5), bps=1, model_ipus=3, place=False)
    got, _, session = train(weights, x, 3, options(3, True, af=5, autoRecomputation=R.Pipeline),
                            bps=1)
    assert_weights_close(got, want)
    clones = _check_clones_feed_the_backward(session)
    # Stages 0 and 1 recompute in stages 4 and 3; the loss stage 2 does not.
    assert {op.settings.pipeline_stage for op in clones} == {3, 4}
    graph = session.getIr().main
    for stash in graph.ops_of_type("Stash"):
        value = stash.inputs[2]
        assert value.producer is None or value.producer.op_type == "IpuCopy", value.id
