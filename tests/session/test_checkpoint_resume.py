"""Checkpoints that resume exactly (F51): ``modelToHost`` writes the optimizer state (momenta,
Adam moments, step counters) under PopART's reserved names, and a TrainingSession built from
the written file starts from it, so N steps + save + load + M steps equal N + M steps."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest

import popart_backend as popart

N_STEPS, M_STEPS = 3, 4


def _model() -> tuple[bytes, str, str]:
    """y = relu(x @ w1) @ w2, loss = L1(y); returns (proto, input id, loss id)."""
    rng = np.random.default_rng(7)
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 4]), "x")
    w1 = builder.addInitializedInputTensor(rng.standard_normal((4, 3)).astype(np.float32), "w1")
    w2 = builder.addInitializedInputTensor(rng.standard_normal((3, 2)).astype(np.float32), "w2")
    h = builder.aiOnnx.relu([builder.aiOnnx.matmul([x, w1])])
    y = builder.aiOnnx.matmul([h, w2])
    loss = builder.aiGraphcore.l1loss([y], 0.5, reduction=popart.ReductionType.Sum)
    builder.addOutputTensor(loss)
    return builder.getModelProto(), x, loss


def _optimizer(kind: str):
    if kind == "sgd":
        return popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True),
                           "defaultDampening": (0.2, True), "defaultWeightDecay": (0.01, True)})
    return popart.Adam({"defaultLearningRate": (0.02, True), "defaultWeightDecay": (0.01, True)})


def _session(model, loss, kind, options=None):
    session = popart.TrainingSession(
        fnModel=model, dataFlow=popart.DataFlow(1, {}), loss=loss,
        optimizer=_optimizer(kind), userOptions=options or popart.SessionOptions(),
        deviceInfo=popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    return session


def _run(session, x_id, batches) -> None:
    for batch in batches:
        session.run(popart.PyStepIO({x_id: batch}, session.initAnchorArrays()))


def _weights(path: str) -> dict[str, np.ndarray]:
    model = onnx.load(path)
    return {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}


def _batches(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.standard_normal((2, 4)).astype(np.float32) for _ in range(count)]


@pytest.mark.parametrize("kind, state_prefixes", [
    ("sgd", ("Accl___", "Step___")),
    ("adam", ("Accl1___", "Accl2___", "Step___")),
])
def test_save_load_resume_equals_continuous(tmp_path, kind, state_prefixes):
    """F51: N steps, modelToHost, a new session from the file, M steps == N+M steps."""
    model, x_id, loss = _model()
    batches = _batches(N_STEPS + M_STEPS)

    continuous = _session(model, loss, kind)
    _run(continuous, x_id, batches)
    continuous.modelToHost(str(tmp_path / "continuous.onnx"))

    first = _session(model, loss, kind)
    _run(first, x_id, batches[:N_STEPS])
    first.modelToHost(str(tmp_path / "checkpoint.onnx"))
    saved = _weights(str(tmp_path / "checkpoint.onnx"))
    for prefix in state_prefixes:
        for weight in ("w1", "w2"):
            assert prefix + weight in saved, sorted(saved)
    # The state is real: momenta / moments are non-zero after N steps, step counters count N.
    assert np.abs(saved[state_prefixes[0] + "w1"]).max() > 0
    assert float(saved["Step___w1"]) == N_STEPS

    resumed = _session(str(tmp_path / "checkpoint.onnx"), loss, kind)
    _run(resumed, x_id, batches[N_STEPS:])
    resumed.modelToHost(str(tmp_path / "resumed.onnx"))

    expected, actual = _weights(str(tmp_path / "continuous.onnx")), _weights(
        str(tmp_path / "resumed.onnx"))
    assert set(expected) == set(actual)
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=0, atol=1e-6, err_msg=name)


def test_resume_without_state_differs(tmp_path):
    """The test above can fail: dropping the saved momentum changes the trajectory."""
    model, x_id, loss = _model()
    batches = _batches(N_STEPS + M_STEPS)
    continuous = _session(model, loss, "sgd")
    _run(continuous, x_id, batches)
    continuous.modelToHost(str(tmp_path / "continuous.onnx"))
    first = _session(model, loss, "sgd")
    _run(first, x_id, batches[:N_STEPS])
    first.modelToHost(str(tmp_path / "checkpoint.onnx"))
    stripped = onnx.load(str(tmp_path / "checkpoint.onnx"))
    keep = [i for i in stripped.graph.initializer if not i.name.startswith(("Accl", "Step"))]
    del stripped.graph.initializer[:]
    stripped.graph.initializer.extend(keep)
    resumed = _session(stripped.SerializeToString(), loss, "sgd")
    _run(resumed, x_id, batches[N_STEPS:])
    resumed.modelToHost(str(tmp_path / "resumed.onnx"))
    diff = np.abs(_weights(str(tmp_path / "resumed.onnx"))["w1"]
                  - _weights(str(tmp_path / "continuous.onnx"))["w1"]).max()
    assert diff > 1e-4


def test_state_of_another_optimizer_is_refused_or_reported(tmp_path, caplog):
    """A checkpoint of Adam loaded with SGD: the Adam moments are unused and reported; SGD
    state of the wrong dtype is refused with the names and types."""
    model, x_id, loss = _model()
    first = _session(model, loss, "adam")
    _run(first, x_id, _batches(1))
    first.modelToHost(str(tmp_path / "adam.onnx"))
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        _session(str(tmp_path / "adam.onnx"), loss, "sgd")
    assert "Accl1___w1" in caplog.text and "not used" in caplog.text

    bad = onnx.load(str(tmp_path / "adam.onnx"))
    for init in bad.graph.initializer:
        if init.name == "Accl1___w1":
            init.CopyFrom(onnx.numpy_helper.from_array(np.zeros((4, 3), np.float16), init.name))
    with pytest.raises(popart.popart_exception, match="Accl1___w1.*float16"):
        _session(bad.SerializeToString(), loss, "adam")


def test_inference_session_ignores_training_state(tmp_path):
    """An inference session of a checkpoint runs the forward pass on the saved weights."""
    model, x_id, loss = _model()
    first = _session(model, loss, "adam")
    _run(first, x_id, _batches(2))
    first.modelToHost(str(tmp_path / "adam.onnx"))
    session = popart.InferenceSession(
        str(tmp_path / "adam.onnx"), popart.DataFlow(1, [loss]),
        popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    batch = _batches(1)[0]
    session.run(popart.PyStepIO({x_id: batch}, anchors))
    w = _weights(str(tmp_path / "adam.onnx"))
    y = np.maximum(batch @ w["w1"], 0) @ w["w2"]
    np.testing.assert_allclose(anchors[loss], 0.5 * np.abs(y).sum(), rtol=1e-5)
