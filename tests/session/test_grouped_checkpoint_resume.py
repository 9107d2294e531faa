"""Checkpoints of replica-grouped weights resume exactly (F51 with VariableSettings):
``modelToHost`` writes a grouped weight and its optimizer state one value per group
(``[groups, *S]``), and a TrainingSession built from the file with the same VariableSettings
and optimizer takes each group's state back, so N steps + save + load + M steps equal N + M
steps. A stored state whose groups do not fit the session is refused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import popart_backend as popart

D, K, MB = 3, 2, 2
N_STEPS, M_STEPS = 2, 3
CG = popart.CommGroupType


def _model(settings) -> tuple[bytes, str]:
    """loss = sum((x @ w + b)^2), w [2, D, K] and b [2, K] grouped by ``settings``."""
    rng = np.random.default_rng(11)
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    w = builder.addInitializedInputTensor(rng.standard_normal((2, D, K)).astype(np.float32),
                                          settings, "w")
    b = builder.addInitializedInputTensor(rng.standard_normal((2, K)).astype(np.float32),
                                          settings, "b")
    y = builder.aiOnnx.add([builder.aiOnnx.matmul([x, w]), b])
    loss = builder.aiGraphcore.identityloss(
        [builder.aiOnnx.reducesumsquare([y], keepdims=0)], reduction=popart.ReductionType.Sum)
    return builder.getModelProto(), loss


def _optimizer(kind: str):
    if kind == "sgd":
        return popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True),
                           "defaultDampening": (0.2, True)})
    return popart.Adam({"defaultLearningRate": (0.02, True), "defaultWeightDecay": (0.01, True)})


def _session(model, loss, kind, replicas):
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs, opts.replicatedGraphCount = True, replicas
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": replicas})
    session = popart.TrainingSession(model, popart.DataFlow(1, {}), loss, _optimizer(kind),
                                     device, userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    return session


def _run(session, batches) -> None:
    for batch in batches:
        session.run(popart.PyStepIO({"x": batch}, session.initAnchorArrays()))


def _initializers(path) -> dict[str, np.ndarray]:
    return {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


def _batches(count: int, replicas: int) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.standard_normal((replicas, MB, D)).astype(np.float32) for _ in range(count)]


@pytest.mark.parametrize("replicas, settings", [
    (4, popart.VariableSettings(popart.CommGroup(CG.Consecutive, 2))),
    (2, popart.VariableSettings(popart.CommGroup(CG.Ungrouped, 0))),
])
@pytest.mark.parametrize("kind, prefixes", [
    ("sgd", ("Accl___",)),
    ("adam", ("Accl1___", "Accl2___", "Step___")),
])
def test_F51_grouped_save_load_resume_equals_continuous(tmp_path, replicas, settings, kind,
                                                        prefixes):
    model, loss = _model(settings)
    batches = _batches(N_STEPS + M_STEPS, replicas)

    continuous = _session(model, loss, kind, replicas)
    _run(continuous, batches)
    continuous.modelToHost(str(tmp_path / "continuous.onnx"))

    first = _session(model, loss, kind, replicas)
    _run(first, batches[:N_STEPS])
    first.modelToHost(str(tmp_path / "checkpoint.onnx"))
    saved = _initializers(tmp_path / "checkpoint.onnx")
    for prefix in prefixes:  # each group's state, stacked
        for weight, shape in (("w", (D, K)), ("b", (K,))):
            state = saved[prefix + weight]
            assert state.shape[0] == 2 and state.shape[1:] in (shape, ())
            if prefix != "Step___":  # the step counts agree; the moments do not
                assert not np.array_equal(state[0], state[1])  # the groups trained apart

    resumed = _session(str(tmp_path / "checkpoint.onnx"), loss, kind, replicas)
    _run(resumed, batches[N_STEPS:])
    resumed.modelToHost(str(tmp_path / "resumed.onnx"))

    want = _initializers(tmp_path / "continuous.onnx")
    got = _initializers(tmp_path / "resumed.onnx")
    assert set(got) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)

    # Without the stored state the run differs: the test can see a lost state.
    stripped = onnx.load(str(tmp_path / "checkpoint.onnx"))
    keep = [i for i in stripped.graph.initializer if not i.name.startswith(prefixes)]
    del stripped.graph.initializer[:]
    stripped.graph.initializer.extend(keep)
    fresh = _session(stripped.SerializeToString(), loss, kind, replicas)
    _run(fresh, batches[N_STEPS:])
    fresh.modelToHost(str(tmp_path / "fresh.onnx"))
    assert not np.allclose(_initializers(tmp_path / "fresh.onnx")["w"], want["w"])


def test_reset_host_weights_takes_a_grouped_checkpoint(tmp_path):
    """resetHostWeights with the saved model puts back every group's weight and state."""
    settings = popart.VariableSettings(popart.CommGroup(CG.Consecutive, 2))
    model, loss = _model(settings)
    batches = _batches(N_STEPS + M_STEPS, 4)
    continuous = _session(model, loss, "sgd", 4)
    _run(continuous, batches)
    continuous.modelToHost(str(tmp_path / "continuous.onnx"))

    first = _session(model, loss, "sgd", 4)
    _run(first, batches[:N_STEPS])
    first.modelToHost(str(tmp_path / "checkpoint.onnx"))
    other = _session(model, loss, "sgd", 4)
    _run(other, batches[:1])  # some other state, replaced below
    other.resetHostWeights(str(tmp_path / "checkpoint.onnx"))
    other.weightsFromHost()
    _run(other, batches[N_STEPS:])
    other.modelToHost(str(tmp_path / "reset.onnx"))
    want = _initializers(tmp_path / "continuous.onnx")
    got = _initializers(tmp_path / "reset.onnx")
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_grouped_state_of_another_grouping_is_refused(tmp_path):
    settings = popart.VariableSettings(popart.CommGroup(CG.Consecutive, 2))
    model, loss = _model(settings)
    first = _session(model, loss, "sgd", 4)
    _run(first, _batches(1, 4))
    first.modelToHost(str(tmp_path / "checkpoint.onnx"))
    saved = _initializers(tmp_path / "checkpoint.onnx")

    # Three groups of momentum for a weight of two groups.
    wrong = onnx.load(str(tmp_path / "checkpoint.onnx"))
    for init in wrong.graph.initializer:
        if init.name == "Accl___w":
            init.CopyFrom(onnx.numpy_helper.from_array(
                np.concatenate([saved["Accl___w"], saved["Accl___w"][:1]]), "Accl___w"))
    with pytest.raises(popart.popart_exception,
                       match=r"'Accl___w' as float32\[3, 3, 2\].*float32\[2, 3, 2\].*2 groups"):
        _session(wrong.SerializeToString(), loss, "sgd", 4)

    # Per-group momentum for a weight that is not grouped in this session.
    plain, plain_loss = _model(popart.VariableSettings())
    ungrouped = onnx.load_model_from_string(plain)
    for init in ungrouped.graph.initializer:
        if init.name in ("w", "b"):
            init.CopyFrom(onnx.numpy_helper.from_array(saved[init.name][0], init.name))
    ungrouped.graph.initializer.append(
        onnx.numpy_helper.from_array(saved["Accl___w"], "Accl___w"))
    with pytest.raises(popart.popart_exception,
                       match=r"'Accl___w' as float32\[2, 3, 2\].*float32\[3, 2\].*one value "
                             r"per replica group"):
        _session(ungrouped.SerializeToString(), plain_loss, "sgd", 4)


def test_grouped_state_with_one_group_at_another_replication_factor_is_refused(tmp_path):
    """Saved with 4 replicas in 2 groups, loaded with 2 replicas, where the same CommGroup
    makes one group: the per-group state cannot be one value; the message says why."""
    settings = popart.VariableSettings(popart.CommGroup(CG.Consecutive, 2))
    model, loss = _model(settings)
    first = _session(model, loss, "sgd", 4)
    _run(first, _batches(1, 4))
    first.modelToHost(str(tmp_path / "checkpoint.onnx"))
    with pytest.raises(popart.popart_exception,
                       match=r"as float32\[2(, 3, 2)?\].*one value per replica group.*one "
                             r"group at this replication factor"):
        _session(str(tmp_path / "checkpoint.onnx"), loss, "sgd", 2)
