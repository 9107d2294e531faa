"""``InferenceSession.fromIr(ir, deviceInfo, name)``: a session that runs the Ir of an existing
session as it stands (no import, no passes), checked against numpy; a training Ir trains."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart

RNG = np.random.default_rng(3)
X = RNG.standard_normal((2, 3)).astype(np.float32)
W = RNG.standard_normal((3, 4)).astype(np.float32)


def _cpu():
    return popart.DeviceManager().createCpuDevice()


def _model(with_loss: bool = False):
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    w = b.addInitializedInputTensor(W, "w")
    y = b.aiOnnx.relu([b.aiOnnx.matmul([x, w])])
    loss = b.aiGraphcore.l1loss([y], 1.0, reduction=popart.ReductionType.Sum) if with_loss else None
    return b.getModelProto(), y, loss


def _run(session, feeds):
    session.prepareDevice()
    out = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, out))
    return out


def test_from_ir_runs_the_inference_ir():
    proto, y, _ = _model()
    first = popart.InferenceSession(proto, popart.DataFlow(1, [y]),
                                    popart.DeviceManager().createCpuDevice())
    session = popart.InferenceSession.fromIr(first.getIr(), _cpu())
    assert session.name == "fromIr"
    assert session.getIr() is not first.getIr()  # its own copy
    assert len(session.getIr().main.ops) == len(first.getIr().main.ops)
    out = _run(session, {"x": X})
    np.testing.assert_allclose(out[y], np.maximum(X @ W, 0), rtol=1e-6, atol=1e-6)
    # The Ir of a session made by fromIr is itself usable by fromIr.
    again = popart.InferenceSession.fromIr(session.getIr(), _cpu(), name="again")
    np.testing.assert_allclose(_run(again, {"x": X})[y], np.maximum(X @ W, 0), rtol=1e-6)


def test_from_ir_of_a_training_ir_trains():
    proto, y, loss = _model(with_loss=True)
    lr = 0.1
    training = popart.TrainingSession(
        proto, popart.DataFlow(1, [y]), loss, popart.ConstSGD(lr),
        popart.DeviceManager().createCpuDevice())
    session = popart.InferenceSession.fromIr(training.getIr(), _cpu())
    session.prepareDevice()
    session.weightsFromHost()
    out = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": X}, out))
    session.run(popart.PyStepIO({"x": X}, out))
    # numpy: loss = sum |relu(x w)|, dL/dw = x^T (relu'(x w)); two SGD steps.
    w = W.copy()
    for _ in range(2):
        pre = X @ w
        want_y = np.maximum(pre, 0)
        w = w - lr * X.T @ (pre > 0).astype(np.float32)
    np.testing.assert_allclose(out[y], want_y, rtol=1e-5, atol=1e-6)
    weights = {"w": np.zeros_like(W)}
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(weights))
    np.testing.assert_allclose(weights["w"], w, rtol=1e-5, atol=1e-6)


def test_from_ir_refuses_an_ir_no_session_built():
    proto, y, _ = _model()
    first = popart.InferenceSession(proto, popart.DataFlow(1, [y]),
                                    popart.DeviceManager().createCpuDevice())
    with pytest.raises(popart.popart_exception, match="not built by a session"):
        popart.InferenceSession.fromIr(type(first.getIr())(), _cpu())
    with pytest.raises(popart.popart_exception, match="ir must be an Ir"):
        popart.InferenceSession.fromIr(proto, _cpu())
    with pytest.raises(popart.popart_exception, match="deviceInfo is None"):
        popart.InferenceSession.fromIr(first.getIr(), None)
