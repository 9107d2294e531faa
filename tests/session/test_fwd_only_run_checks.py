"""The forward-only program (``run("implicitPipeliningFwdOnly", stepio)``) applies the same
per-run checks as ``run(stepio)``: the 64-bit input range check of
``enableSupportedDataTypeCasting`` and the run position in floating-point exceptions
(``enableFloatingPointChecks``)."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart
from tests.session.pipeline_models import MB, D, chain_model, chain_weights, device, options

HANDLE = "implicitPipeliningFwdOnly"
BPS = 4


def _int_model():
    """x INT64 [MB, D] -> Cast -> two matmuls on two IPUs / stages -> L1 loss."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("INT64", [MB, D]), "x")
    weights = chain_weights(2, seed=3)
    h = x
    for k, w in enumerate(weights):
        w_id = builder.addInitializedInputTensor(w, f"w{k}")
        with builder.virtualGraph(k), builder.pipelineStage(k):
            if k == 0:
                h = builder.aiOnnx.cast([h], "FLOAT")
            h = builder.aiOnnx.matmul([h, w_id])
    with builder.virtualGraph(1), builder.pipelineStage(1):
        loss = builder.aiGraphcore.l1loss([h], 0.5, reduction=popart.ReductionType.Mean)
    return builder.getModelProto(), loss


def _session(proto, loss, **values):
    opts = options(2, True, createImplicitPipeliningFwdOnlyProgram=True, **values)
    flow = popart.DataFlow(BPS, {loss: popart.AnchorReturnType("All")})
    session = popart.TrainingSession(proto, flow, loss, popart.ConstSGD(0.1), device(2),
                                     userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    return session


def test_fwd_only_run_checks_64bit_input_range_as_run_does():
    proto, loss = _int_model()
    session = _session(proto, loss)
    x = np.ones((BPS, MB, D), dtype=np.int64)
    x[2, 1, 3] = 2**40  # outside INT32, the type the IPU streams INT64 inputs as
    for call in (lambda io: session.run(io), lambda io: session.run(HANDLE, io)):
        stepio = popart.PyStepIO({"x": x}, session.initAnchorArrays())
        with pytest.raises(popart.StepIOError, match="INT32 range"):
            call(stepio)


def test_fwd_only_run_names_the_run_position_of_a_floating_point_exception():
    proto, loss, _ = chain_model(chain_weights(4, seed=7), 2)
    session = _session(proto, loss, enableFloatingPointChecks=True)
    x = np.zeros((BPS, MB, D), dtype=np.float32)
    x[1] = np.finfo(np.float32).max  # finite; its matmul with w0 (a column sum -1.12) overflows
    for call in (lambda io: session.run(io), lambda io: session.run(HANDLE, io)):
        stepio = popart.PyStepIO({"x": x}, session.initAnchorArrays())
        with pytest.raises(popart.popart_runtime_error, match="micro-batch 1 of that call"):
            call(stepio)


def _random_model():
    """x -> MatMul (IPU 0) -> + RandomUniformLike -> MatMul (IPU 1) -> L1 loss."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    h = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    w0, w1 = (builder.addInitializedInputTensor(w, f"w{k}")
              for k, w in enumerate(chain_weights(2, seed=5)))
    with builder.virtualGraph(0), builder.pipelineStage(0):
        h = builder.aiOnnx.matmul([h, w0])
        h = builder.aiOnnx.add([h, builder.aiOnnx.randomuniformlike([h])])
    with builder.virtualGraph(1), builder.pipelineStage(1):
        h = builder.aiOnnx.matmul([h, w1])
        loss = builder.aiGraphcore.l1loss([h], 0.5, reduction=popart.ReductionType.Mean)
    return builder.getModelProto(), loss


def test_set_random_seed_reaches_the_fwd_only_program():
    proto, loss = _random_model()
    session = _session(proto, loss)
    x = np.random.default_rng(0).standard_normal((BPS, MB, D)).astype(np.float32)

    def fwd_loss():
        anchors = session.initAnchorArrays()
        session.run(HANDLE, popart.PyStepIO({"x": x}, anchors))
        return anchors[loss]

    session.setRandomSeed(11)
    first = fwd_loss()
    second = fwd_loss()  # the generator moved on: other draws
    assert not np.array_equal(first, second)
    session.setRandomSeed(11)  # restarts the draws, as for run(stepio)
    np.testing.assert_array_equal(fwd_loss(), first)
    session.setRandomSeed(12)
    assert not np.array_equal(fwd_loss(), first)
