"""``SessionOptions.createImplicitPipeliningFwdOnlyProgram``: an implicitly pipelined
TrainingSession also runs its forward pass alone through
``run("implicitPipeliningFwdOnly", stepio)``. Its anchors are those of a numpy forward pass and
of an InferenceSession holding the current weights; it leaves the weights and the optimizer
state as they were (the training trajectory is that of a session that never ran it); its cycles
are those of the forward-only pipeline."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart
from tests.session.pipeline_models import (LAMBDA, MB, D, chain_model, chain_weights, device,
                                           options, read_weights)

IPUS, LAYERS = 2, 4
HANDLE = "implicitPipeliningFwdOnly"


def _x(shape, seed):
    return np.random.default_rng(seed).standard_normal((*shape, MB, D)).astype(np.float32)


def _numpy_loss(weights, x):
    """Per micro-batch L1 loss (Mean) of the chain: x [..., MB, D] -> [...]."""
    h = x
    for w in weights:
        h = np.tanh(h @ w)
    return LAMBDA * np.abs(h).mean(axis=(-2, -1))


def _optimizer():
    return popart.SGD({"defaultLearningRate": (0.1, False), "defaultMomentum": (0.9, True)})


def _session(weights, bps, af, fwd_only=True, **values):
    proto, loss, ids = chain_model(weights, IPUS)
    opts = options(IPUS, True, af=af, createImplicitPipeliningFwdOnlyProgram=fwd_only, **values)
    flow = popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")})
    session = popart.TrainingSession(proto, flow, loss, _optimizer(), device(IPUS),
                                     userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    return session, loss, ids


def _run(session, x, handle=None):
    anchors = session.initAnchorArrays()
    stepio = popart.PyStepIO({"x": x}, anchors)
    if handle is None:
        session.run(stepio)
    else:
        session.run(handle, stepio)
    return anchors


@pytest.mark.parametrize("bps, af", [(4, 1), (2, 3)])
def test_fwd_only_program_matches_numpy_and_inference_and_leaves_training_state(bps, af):
    weights = chain_weights(LAYERS, seed=7)
    shape = (bps, af) if af > 1 else (bps,)
    x_train, x_val, x_train2 = (_x(shape, s) for s in (1, 2, 3))
    session, loss, ids = _session(weights, bps, af)
    reference, _, _ = _session(weights, bps, af, fwd_only=False)  # never runs the forward-only
    _run(session, x_train)
    _run(reference, x_train)
    before = read_weights(session, ids)

    got = _run(session, x_val, HANDLE)[loss]
    current = [before[i] for i in ids]
    np.testing.assert_allclose(got, _numpy_loss(current, x_val), rtol=1e-5, atol=1e-7)
    # An InferenceSession of the current weights gives the same anchor.
    proto, _, _ = chain_model(current, IPUS)
    flow = popart.DataFlow(bps * af, {loss: popart.AnchorReturnType("All")})
    inference = popart.InferenceSession(proto, flow, device(IPUS), userOptions=options(IPUS, True))
    inference.prepareDevice()
    want = _run(inference, x_val.reshape(bps * af, MB, D))[loss]
    np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-6, atol=1e-7)

    # Weights untouched by the forward-only run, and the next training step (which reads the
    # momentum state and stash indices) is the one of the session that never ran it.
    after = read_weights(session, ids)
    for i in ids:
        np.testing.assert_array_equal(after[i], before[i])
    l1 = _run(session, x_train2)[loss]
    l2 = _run(reference, x_train2)[loss]
    np.testing.assert_array_equal(l1, l2)
    w1, w2 = read_weights(session, ids), read_weights(reference, ids)
    for i in ids:
        np.testing.assert_array_equal(w1[i], w2[i])
    assert not np.array_equal(w1[ids[0]], after[ids[0]])  # the training step did train


def test_fwd_only_cycles_are_those_of_the_forward_pipeline():
    weights, bps = chain_weights(LAYERS, seed=4), 4
    session, loss, _ = _session(weights, bps, 1, instrumentWithHardwareCycleCounter=True)
    x = _x((bps,), 5)
    _run(session, x)
    training_cycles = session.getCycleCount()
    _run(session, x, HANDLE)
    fwd_cycles = session.getCycleCount()
    # The same forward pipeline in an InferenceSession.
    proto, _, _ = chain_model(weights, IPUS)
    opts = options(IPUS, True, instrumentWithHardwareCycleCounter=True)
    flow = popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")})
    inference = popart.InferenceSession(proto, flow, device(IPUS), userOptions=opts)
    inference.prepareDevice()
    _run(inference, x)
    assert fwd_cycles == inference.getCycleCount()
    assert 0 < fwd_cycles < training_cycles
    _run(session, x)
    assert session.getCycleCount() == training_cycles  # back to the training program


def test_handle_without_the_option_says_to_set_it():
    session, _, _ = _session(chain_weights(LAYERS), 4, 1, fwd_only=False)
    with pytest.raises(popart.popart_exception,
                       match="Set SessionOptions.createImplicitPipeliningFwdOnlyProgram = True"):
        _run(session, _x((4,), 1), HANDLE)


def test_unknown_handle_lists_the_known_ones():
    session, _, _ = _session(chain_weights(LAYERS), 4, 1)
    with pytest.raises(popart.popart_exception,
                       match="unknown program handle.*'implicitPipeliningFwdOnly'"):
        _run(session, _x((4,), 1), "validation")


def test_option_needs_implicit_pipelining():
    proto, loss, _ = chain_model(chain_weights(LAYERS), IPUS)
    opts = options(IPUS, False, createImplicitPipeliningFwdOnlyProgram=True)
    flow = popart.DataFlow(4, {loss: popart.AnchorReturnType("All")})
    with pytest.raises(popart.popart_exception, match="needs implicit pipelining.*enablePipelin"):
        popart.TrainingSession(proto, flow, loss, _optimizer(), device(IPUS), userOptions=opts)
