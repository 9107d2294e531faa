"""Stochastic rounding of every float16 kernel result (SessionOptions.enableStochasticRounding),
not only MatMul and weight updates: 1.0 + 100 × 1e-4 in float16 as a chain of 100 Add ops
moves by the expected amount (100 × float16(1e-4), the exact float32 sum) within 3σ, where
round-to-nearest (numpy float16 reference) stalls at 1.0; the draws are reproducible with the
seed, change with it, and differ per replica."""

from __future__ import annotations

import numpy as np

import popart_backend as popart

N = 2048
STEPS = 100
STEP = np.float16(1e-4)
ULP = 2.0 ** -10  # float16 spacing in [1, 2)
# Each rounding adds a variance of at most ULP²/4; the mean of N independent elements.
SIGMA = ULP * np.sqrt(STEPS / 4) / np.sqrt(N)


def _chain(stochastic: bool, seed: int = 0, replicas: int = 1):
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT16", [N]), "x")
    c = builder.aiOnnx.constant(np.full(N, STEP, np.float16), "step")
    y = x
    for _ in range(STEPS):
        y = builder.aiOnnx.add([y, c])
    builder.addOutputTensor(y)
    options = popart.SessionOptions()
    options.enableStochasticRounding = stochastic
    if replicas > 1:
        options.enableReplicatedGraphs = True
        options.replicatedGraphCount = replicas
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": replicas})
    session = popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, [y]), device,
                                      userOptions=options)
    session.prepareDevice()
    session.setRandomSeed(seed)
    anchors = session.initAnchorArrays()
    ones = np.ones((replicas, N) if replicas > 1 else (N,), np.float16)
    session.run(popart.PyStepIO({x: ones}, anchors))
    return anchors[y]


def _numpy_nearest() -> np.ndarray:
    y = np.ones(N, np.float16)
    for _ in range(STEPS):
        y = y + np.full(N, STEP, np.float16)  # float16 add: round to nearest
    return y


def test_round_to_nearest_stalls():
    out = _chain(False)
    np.testing.assert_array_equal(out, _numpy_nearest())
    assert (out == 1.0).all()


def test_stochastic_rounding_moves_by_the_expected_amount():
    out = _chain(True, seed=11).astype(np.float64)
    expected = 1.0 + STEPS * float(STEP)
    assert abs(out.mean() - expected) <= 3 * SIGMA, (out.mean(), expected, SIGMA)
    # Every value is a float16 and lies on the grid of [1, 2).
    assert ((out - 1.0) / ULP == np.round((out - 1.0) / ULP)).all()


def test_reproducible_with_the_seed_and_changes_with_it():
    first, again, other = _chain(True, seed=5), _chain(True, seed=5), _chain(True, seed=6)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_replicas_round_differently():
    out = _chain(True, seed=3, replicas=2).astype(np.float64)
    assert out.shape == (2, N)
    assert not np.array_equal(out[0], out[1])
    expected = 1.0 + STEPS * float(STEP)
    for replica in out:
        assert abs(replica.mean() - expected) <= 3 * SIGMA


def test_every_float16_value_op_of_a_training_step_is_marked():
    """Forward, backward and update ops of a float16 model: every op computing a float16
    value rounds stochastically; ops that only move elements do not."""
    rng = np.random.default_rng(0)
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT16", [4, 8]), "x")
    w = builder.addInitializedInputTensor(rng.standard_normal((8, 8)).astype(np.float16), "w")
    h = builder.aiOnnx.softmax([builder.aiOnnx.relu([builder.aiOnnx.matmul([x, w])])], axis=-1)
    h = builder.aiOnnx.transpose([builder.aiOnnx.mul([h, h])], perm=[1, 0])
    loss = builder.aiGraphcore.l1loss([h], 0.5, reduction=popart.ReductionType.Sum)
    options = popart.SessionOptions()
    options.enableStochasticRounding = True
    session = popart.TrainingSession(builder.getModelProto(), popart.DataFlow(1, [loss]), loss,
                                     popart.SGD({"defaultLearningRate": (0.01, True)}),
                                     popart.DeviceManager().createCpuDevice(),
                                     userOptions=options)
    marked, unmarked = set(), set()
    for op in session.getIr().main.ops.values():
        if any(t is not None and t.info.dtype is popart.DataType.FLOAT16 for t in op.outputs):
            (marked if op.settings.stochastic_rounding else unmarked).add(op.op_type)
    assert {"Relu", "Softmax", "Mul", "L1"} <= {t.split("Inplace")[0] for t in marked}, marked
    assert any("Grad" in t for t in marked), marked
    assert "Transpose" in unmarked or "TransposeInplace" in unmarked, unmarked
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: rng.standard_normal((4, 8)).astype(np.float16)}, anchors))
    assert np.isfinite(anchors[loss]).all()


def test_cast_to_float16_rounds_stochastically():
    """Cast float32 -> float16 (1 + ULP/4): round to nearest gives 1.0 everywhere; stochastic
    rounding gives 1 + ULP with probability 1/4, so the mean is 1 + ULP/4 within 3σ."""
    value = np.float32(1.0 + ULP / 4)
    results = {}
    for stochastic in (False, True):
        builder = popart.Builder()
        x = builder.addInputTensor(popart.TensorInfo("FLOAT", [N]), "x")
        y = builder.aiOnnx.cast([x], "FLOAT16")
        builder.addOutputTensor(y)
        options = popart.SessionOptions()
        options.enableStochasticRounding = stochastic
        session = popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, [y]),
                                          popart.DeviceManager().createCpuDevice(),
                                          userOptions=options)
        session.prepareDevice()
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({x: np.full(N, value, np.float32)}, anchors))
        results[stochastic] = anchors[y]
    np.testing.assert_array_equal(results[False], np.full(N, value, np.float32).astype(np.float16))
    mean = results[True].astype(np.float64).mean()
    sigma = ULP * np.sqrt(0.25 * 0.75 / N)
    assert abs(mean - float(value)) <= 3 * sigma, (mean, float(value), sigma)


def test_element_movers_are_not_rounded():
    """Ops that only move elements (Reverse, Concat, Gather) have nothing to round: they are
    not marked and their float16 results are the input's elements exactly."""
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT16", [4, 3]), "x")
    r = builder.aiGraphcore.reverse([x], dimensions=[0])
    c = builder.aiOnnx.concat([r, x], axis=0)
    idx = builder.aiOnnx.constant(np.array([2, 0], np.int32), "idx")
    g = builder.aiOnnx.gather([c, idx], axis=1)
    y = builder.aiOnnx.add([g, g])  # computes a value: rounded stochastically
    builder.addOutputTensor(y)
    options = popart.SessionOptions()
    options.enableStochasticRounding = True
    session = popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, [g, y]),
                                      popart.DeviceManager().createIpuModelDevice({}),
                                      userOptions=options)
    session.prepareDevice()
    marked = {op.op_type for op in session._ir.main.topo_order()
              if op.settings.stochastic_rounding}
    assert marked == {"Add"}
    data = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float16)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: data}, anchors))
    expected = np.concatenate([data[::-1], data])[:, [2, 0]]
    np.testing.assert_array_equal(anchors[g], expected)
