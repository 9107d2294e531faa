"""Random ops (spec §6.1 RandomNormal/RandomUniform and *Like; Bernoulli, Multinomial), F36.

Values are random, so the references are their definitions checked statistically (moments,
frequencies), plus the seeding contract of docs/training.md "Randomness": new values each
micro-batch, replay with setRandomSeed, and the ``seed`` attribute fixing the stream.
"""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart
from tests.helpers import one_op_model, rand, run_popart


def run(build, feeds=None, bps=1, seed=None, dtypes=None):
    """Build with ``build(builder, *input ids)``; run one step of ``bps`` micro-batches."""
    feeds = feeds or {}
    builder = popart.Builder()
    ids = [builder.addInputTensor(popart.TensorInfo("FLOAT", list(a.shape[1:] if bps > 1 else
                                                                   a.shape)))
           for a in feeds.values()]
    out = build(builder, *ids)
    builder.addOutputTensor(out)
    session = popart.InferenceSession(builder.getModelProto(),
                                      popart.DataFlow(bps, {out: popart.AnchorReturnType("All")}),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    if seed is not None:
        session.setRandomSeed(seed)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(dict(zip(ids, feeds.values())), anchors))
    return anchors[out], session, ids, out


def test_random_normal_moments_and_dtype():
    values, *_ = run(lambda b: b.aiOnnx.randomnormal(shape=[200, 100], mean=2.0, scale=0.5))
    assert values.shape == (200, 100) and values.dtype == np.float32
    assert abs(values.mean() - 2.0) < 0.01 and abs(values.std() - 0.5) < 0.01


def test_random_uniform_range_and_moments():
    values, *_ = run(lambda b: b.aiOnnx.randomuniform(shape=[20000], low=-1.0, high=3.0))
    assert values.min() >= -1.0 and values.max() < 3.0
    assert abs(values.mean() - 1.0) < 0.05 and abs(values.var() - 16 / 12) < 0.05


def test_like_ops_take_the_input_shape():
    x = rand(300, 40)
    normal, *_ = run(lambda b, a: b.aiOnnx.randomnormallike([a], scale=3.0), {"x": x})
    assert normal.shape == x.shape and abs(normal.std() - 3.0) < 0.05
    uniform, *_ = run(lambda b, a: b.aiOnnx.randomuniformlike([a], dtype=11), {"x": x})
    assert uniform.dtype == np.float64 and 0 <= uniform.min() and uniform.max() < 1


def test_bernoulli_frequency():
    p = np.linspace(0.05, 0.95, 10, dtype=np.float32)
    p = np.broadcast_to(p, (4000, 10)).copy()
    values, *_ = run(lambda b, a: b.aiOnnxOpset15.bernoulli([a]), {"p": p})
    assert values.dtype == np.float32 and set(np.unique(values)) <= {0.0, 1.0}
    np.testing.assert_allclose(values.mean(0), p[0], atol=0.03)


def test_multinomial_frequency():
    logits = np.log(np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]], np.float32))
    values, *_ = run(lambda b, a: b.aiOnnx.multinomial([a], sample_size=20000), {"x": logits})
    assert values.shape == (2, 20000) and values.dtype == np.int32
    for row in range(2):
        freq = np.bincount(values[row], minlength=3) / 20000
        np.testing.assert_allclose(freq, np.exp(logits[row]), atol=0.02)


def test_session_seed_changes_per_micro_batch_and_replays():
    def build(b):
        return b.aiOnnx.randomuniform(shape=[4])

    first, session, _, out = run(build, bps=3, seed=7)
    assert first.shape == (3, 4)
    assert not np.array_equal(first[0], first[1])  # a new draw each micro-batch
    again, *_ = run(build, bps=3, seed=7)
    np.testing.assert_array_equal(first, again)
    other, *_ = run(build, bps=3, seed=8)
    assert not np.array_equal(first, other)
    # setRandomSeed restarts the counter: the same session replays its first step.
    session.setRandomSeed(7)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({}, anchors))
    np.testing.assert_array_equal(anchors[out], first)


def test_two_ops_draw_different_values():
    def build(b):
        first = b.aiOnnx.randomnormal(shape=[8])
        second = b.aiOnnx.randomnormal(shape=[8])
        return b.aiOnnx.sub([first, second])

    values, *_ = run(build)
    assert np.all(values != 0)


def test_seed_attribute_is_deterministic_whatever_the_session_seed():
    def build(b):
        return b.aiOnnx.randomnormal(shape=[6], seed=3.0)

    a, *_ = run(build, seed=1)
    b, *_ = run(build, seed=99)
    np.testing.assert_array_equal(a, b)
    c, *_ = run(lambda bl: bl.aiOnnx.randomnormal(shape=[6], seed=4.0), seed=1)
    assert not np.array_equal(a, c)
    # Outside a session (no seed tensor) the attribute alone fixes the values too.
    model, feeds = one_op_model("RandomNormal", [], {"shape": [6], "seed": 3.0})
    np.testing.assert_array_equal(run_popart(model, feeds)["out0"], a)


def test_errors():
    model, feeds = one_op_model("RandomNormal", [], {"shape": [2]})
    with pytest.raises(popart.popart_runtime_error, match="RandomNormal.*seed"):
        run_popart(model, feeds)
    with pytest.raises(popart.popart_exception, match="Multinomial.*batch, classes"):
        run(lambda b, a: b.aiOnnx.multinomial([a]), {"x": rand(3)})
    with pytest.raises(popart.popart_exception, match="RandomUniform.*dtype"):
        run(lambda b: b.aiOnnx.randomuniform(shape=[2], dtype=6))
