"""Session.getRNGState / setRNGState with SessionOptions.enableLoadAndOffloadRNGState (spec §2.1
"Both sessions", §2.4).

The RNG state is [seed, micro-batch counter] per local replica (docs/training.md "Randomness"):
the reference is the session's own earlier draws - after setRNGState(s) the runs repeat exactly
what they drew after the getRNGState() that returned s.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart


def rng_options(replicas: int = 1) -> popart.SessionOptions:
    options = popart.SessionOptions()
    options.enableLoadAndOffloadRNGState = True
    if replicas > 1:
        options.enableReplicatedGraphs = True
        options.replicatedGraphCount = replicas
    return options


def normal_session(options: popart.SessionOptions, bps: int = 2):
    """Inference: y = RandomNormal([8]) (drawn from the session seed every micro-batch)."""
    builder = popart.Builder()
    y = builder.aiOnnx.randomnormal(shape=[8])
    builder.addOutputTensor(y)
    replicas = options.replicatedGraphCount if options.enableReplicatedGraphs else 1
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": replicas})
    session = popart.InferenceSession(builder.getModelProto(),
                                      popart.DataFlow(bps, {y: popart.AnchorReturnType("All")}),
                                      device, userOptions=options)
    session.setRandomSeed(11)
    session.prepareDevice()
    anchors = session.initAnchorArrays()

    def run() -> np.ndarray:
        session.run(popart.PyStepIO({}, anchors))
        return anchors[y].copy()

    return session, run


def dropout_session(options: popart.SessionOptions):
    """Training: d = Dropout(x * w, 0.5), L1 loss; learning rate 0 keeps w fixed, so the
    anchored d differs between runs only through the dropout masks."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [32])
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]),
             helper.make_node("Dropout", ["xw", "ratio"], ["d"], name="drop"),
             helper.make_node("L1", ["d"], ["loss"], domain="ai.graphcore", reduction=0)]
    graph = helper.make_graph(
        nodes, "dropout", [x], [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(np.ones(32, np.float32), "w"),
                     numpy_helper.from_array(np.array(0.5, np.float32), "ratio")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("ai.graphcore", 1)])
    model.ir_version = 8
    session = popart.TrainingSession(model, popart.DataFlow(3, ["d"]), "loss",
                                     popart.ConstSGD(0.0),
                                     popart.DeviceManager().createCpuDevice(),
                                     userOptions=options)
    session.setRandomSeed(5)
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    feed = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)

    def run() -> np.ndarray:
        session.run(popart.PyStepIO({"x": feed}, anchors))
        return anchors["d"].copy()

    return session, run


def test_dropout_training_replays_after_set_rng_state():
    session, run = dropout_session(rng_options())
    run()
    state = session.getRNGState()
    assert all(isinstance(v, int) for v in state)
    after = [run(), run()]
    assert not np.array_equal(after[0], after[1])  # masks change every micro-batch
    session.setRNGState(state)
    np.testing.assert_array_equal(run(), after[0])
    np.testing.assert_array_equal(run(), after[1])


def test_random_normal_inference_replays_and_state_is_seed_and_counter():
    session, run = normal_session(rng_options(), bps=2)
    assert session.getRNGState() == [11, 0]
    first = run()
    state = session.getRNGState()
    assert state == [11, 2]  # two micro-batches drawn
    second = run()
    assert not np.array_equal(first, second)
    session.setRNGState(state)
    np.testing.assert_array_equal(run(), second)
    # The state of the very start replays the first run; setRandomSeed resets it too.
    session.setRNGState([11, 0])
    np.testing.assert_array_equal(run(), first)
    session.setRandomSeed(11)
    assert session.getRNGState() == [11, 0]
    np.testing.assert_array_equal(run(), first)


def test_replicated_state_is_per_replica():
    session, run = normal_session(rng_options(replicas=2), bps=2)
    state = session.getRNGState()
    assert state == [11, 0, 11, 1]  # replica r draws micro-batch counter c + r
    first = run()  # [bps, replica, 8]
    assert not np.array_equal(first[:, 0], first[:, 1])
    after = session.getRNGState()
    second = run()
    session.setRNGState(after)
    np.testing.assert_array_equal(run(), second)
    # Swap the two replicas' states: each draws what the other drew.
    session.setRNGState([state[2], state[3], state[0], state[1]])
    swapped = run()
    np.testing.assert_array_equal(swapped[0, 0], first[0, 1])
    np.testing.assert_array_equal(swapped[0, 1], first[0, 0])
    # A replica with its own seed draws that seed's values.
    session.setRNGState([11, 0, 12, 0])
    mixed = run()
    np.testing.assert_array_equal(mixed[0, 0], first[0, 0])
    assert not np.array_equal(mixed[0, 1], first[0, 0])


def test_rng_state_needs_the_option():
    session, _run = normal_session(popart.SessionOptions())
    with pytest.raises(popart.popart_exception, match="getRNGState.*enableLoadAndOffloadRNGState"):
        session.getRNGState()
    with pytest.raises(popart.popart_exception, match="setRNGState.*enableLoadAndOffloadRNGState"):
        session.setRNGState([11, 0])


def test_set_rng_state_rejects_a_state_of_the_wrong_size():
    session, _run = normal_session(rng_options(replicas=2))
    with pytest.raises(popart.popart_exception, match="3 values.*2 local replica.*4 in all"):
        session.setRNGState([1, 2, 3])
    with pytest.raises(popart.popart_exception, match="list of ints"):
        session.setRNGState(["a", "b", "c", "d"])
