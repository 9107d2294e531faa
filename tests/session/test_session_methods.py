"""The sessions' smaller PopART methods (seed, IR dumps, weight sync flags, engine state,
variables, external-data locations, broadcast), SyntheticDataMode.RandomUniform,
DataFlow.setBatchesPerStep, and the optimizer keys PopART spells without "default"
(SGD "nesterov" against torch, Adam "maxWeightNorm" against the Lamb formula)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

import popart_backend as popart
from popart_backend.ir.dump import ir_to_json
from tests.ops.test_optimizer_updates import (
    ADAM_VALUES,
    _data,
    adam_reference,
    assert_same,
    ov,
    run_backend,
    run_torch,
)
from tests.session.session_models import affine_model, make_session, step_input
from tests.session.training_models import (
    assert_params_close,
    inputs,
    mlp_params,
    read_weights,
    run,
    torch_train,
    training_session,
)


def test_random_seed_and_ir_dumps():
    session = make_session(["y"])
    assert session.getRandomSeed() == 0
    session.setRandomSeed(1234)
    assert session.getRandomSeed() == 1234
    text = session._serializeIr(popart.IrSerializationFormat.JSON)
    assert json.loads(text) == ir_to_json(session.getIr(), "affine")
    assert {op["type"] for op in json.loads(text)["affine"]} >= {"Mul", "Add"}
    assert session.getSerializedGraph() == text.encode()
    with pytest.raises(popart.popart_exception, match="IrSerializationFormat"):
        session._serializeIr("JSON")
    unprepared = make_session(["y"], prepare=False)
    with pytest.raises(popart.popart_exception, match="prepareDevice"):
        unprepared.getSerializedGraph()


def test_check_inplacing_ambiguity_logs(caplog):
    session = make_session(["y"])
    session.checkInplacingAmbiguity()
    assert "nothing to check" in caplog.text


def test_set_engine_is_loaded():
    session = make_session(["y"])
    x = step_input(1)[0]
    session.setEngineIsLoaded(False)
    anchors = session.initAnchorArrays()
    with pytest.raises(popart.popart_exception, match="prepareDevice"):
        session.run(popart.PyStepIO({"x": x}, anchors))
    session.setEngineIsLoaded(True)
    session.run(popart.PyStepIO({"x": x}, anchors))
    np.testing.assert_allclose(anchors["y"], x * 2 + 1)
    with pytest.raises(popart.popart_exception, match="prepareDevice"):
        make_session(["y"], prepare=False).setEngineIsLoaded(True)


def test_host_weight_sync_and_save_variables(tmp_path):
    params = mlp_params()
    session = training_session(params, popart.SGD(0.1))
    assert session.areHostWeightsInSync()
    run(session, inputs(1)[0])
    assert not session.areHostWeightsInSync()
    session.copyDeviceWeightsToHost()
    assert session.areHostWeightsInSync()
    session.markHostWeightsOutOfSync()
    assert not session.areHostWeightsInSync()
    session.markHostWeightsInSync()
    assert session.areHostWeightsInSync()
    path = tmp_path / "vars.npz"
    session.saveVariables(str(path))
    saved = dict(np.load(path))
    want = torch_train(params, inputs(1), lambda p: torch.optim.SGD(p, lr=0.1))
    assert_params_close(saved, want)
    assert_params_close(read_weights(session), want)


def test_broadcast_weights_single_instance(caplog):
    session = training_session(mlp_params(), popart.SGD(0.1))
    before = read_weights(session)
    session.broadcastWeights(0)
    assert "one instance only" in caplog.text
    assert_params_close(read_weights(session), before, rtol=0, atol=0)
    with pytest.raises(popart.popart_exception, match="1 instances"):
        session.broadcastWeights(1)


def test_connect_stream_to_callback_refused():
    session = make_session(["y"])
    with pytest.raises(popart.popart_exception, match="PyStepIOCallback"):
        session.connectStreamToCallback("x", lambda *a: None, 0)


def test_update_externally_saved_tensor_locations(tmp_path):
    builder = popart.Builder(affine_model(with_loss=True))
    builder.saveInitializersExternally(["w", "b"], str(tmp_path / "old.bin"))
    builder.saveModelProto(str(tmp_path / "model.onnx"))
    session = popart.TrainingSession(
        str(tmp_path / "model.onnx"), popart.DataFlow(1, []), "loss", popart.SGD(0.1),
        popart.DeviceManager().createCpuDevice())
    old = (tmp_path / "old.bin").read_bytes()
    session.updateExternallySavedTensorLocations("old.bin", "new.bin")
    assert (tmp_path / "new.bin").read_bytes() == old
    session.prepareDevice()
    session.weightsFromHost()
    run(session, step_input(1)[0])
    session.modelToHost(str(tmp_path / "model.onnx"))  # back into the model's own files
    assert (tmp_path / "old.bin").read_bytes() == old  # the old file is left alone
    trained = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    assert {e.value for i in trained.graph.initializer for e in i.external_data
            if e.key == "location"} == {"new.bin"}
    assert (tmp_path / "new.bin").read_bytes() != old  # trained weights written there
    with pytest.raises(popart.popart_exception, match="no initializer"):
        session.updateExternallySavedTensorLocations("old.bin", "other.bin")


def test_random_uniform_synthetic_data():
    """RandomUniform feeds U(-1, 1) values, not the host data; seeded by setRandomSeed."""
    options = popart.SessionOptions()
    options.syntheticDataMode = popart.SyntheticDataMode.RandomUniform
    model = affine_model(shape=(64, 64), w=1.0, b=0.0)
    results = []
    for _ in range(2):
        session = make_session(["y"], model=model, options=options)
        session.setRandomSeed(7)
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({"x": np.full((64, 64), 5.0, np.float32)}, anchors))
        results.append(anchors["y"].copy())
    y = results[0]
    np.testing.assert_array_equal(results[0], results[1])
    assert y.min() >= -1.0 and y.max() < 1.0
    # Moments of U(-1, 1): mean 0, variance 1/3 (4096 samples).
    assert abs(y.mean()) < 0.05 and abs(y.var() - 1 / 3) < 0.03


def test_set_batches_per_step():
    flow = popart.DataFlow(1, ["y"])
    flow.setBatchesPerStep(3)
    assert flow.batchesPerStep() == 3
    session = popart.InferenceSession(affine_model(), flow,
                                      popart.DeviceManager().createCpuDevice())
    flow.setBatchesPerStep(5)  # the session keeps its copy
    assert session.dataFlow.batchesPerStep() == 3
    session.prepareDevice()
    x = step_input(3)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    np.testing.assert_allclose(anchors["y"], x * 2 + 1)
    with pytest.raises(popart.popart_exception, match="greater than zero"):
        flow.setBatchesPerStep(0)


def test_sgd_nesterov_key_matches_torch():
    """SGD({"nesterov": ...}) is PopART's constructor key: Nesterov momentum as torch."""
    weights, grads = _data(3)
    opt = popart.SGD({"defaultLearningRate": ov(0.1), "defaultMomentum": ov(0.9),
                      "nesterov": ov(1.0), "defaultWeightDecay": ov(0.01)})
    assert opt.nesterov().getDefault().val() == 1.0
    got, _, _ = run_backend(opt, weights, grads)
    want = run_torch(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True,
                                               weight_decay=0.01), weights, grads)
    assert_same(got, want)
    plain = run_torch(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
                      weights, grads)
    assert not np.allclose(got[-1]["w"], plain[-1]["w"])  # the key changed the trajectory


def test_sgd_nesterov_without_momentum_is_plain_sgd():
    """PopART keeps nesterov as a number (non-zero: on); with momentum 0 there is no velocity
    and the Nesterov step is torch's plain SGD step."""
    weights, grads = _data(3)
    opt = popart.SGD({"defaultLearningRate": ov(0.1), "nesterov": (0.5, False)})
    got, _, _ = run_backend(opt, weights, grads)
    want = run_torch(lambda p: torch.optim.SGD(p, lr=0.1), weights, grads)
    assert_same(got, want)


def test_sgd_nesterov_in_training_session():
    params = mlp_params()
    opt = popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True),
                      "nesterov": (1.0, True)})
    session = training_session(params, opt)
    x = inputs(3)
    for step in range(3):
        run(session, x[step, 0])
    want = torch_train(params, x, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9,
                                                            nesterov=True))
    assert_params_close(read_weights(session), want)


@pytest.mark.parametrize("mode", [popart.AdamMode.Lamb, popart.AdamMode.LambNoBias])
def test_adam_max_weight_norm_key(mode):
    """Adam({"maxWeightNorm": ...}) clips the Lamb trust ratio's ‖w‖ as the formula says."""
    weights, grads = _data(8)
    values = dict(ADAM_VALUES, maxWeightNorm=ov(0.5))
    opt = popart.Adam(values, mode)
    assert opt.maxWeightNorms().getDefault().val() == 0.5
    got, _, _ = run_backend(opt, weights, grads)
    want = adam_reference(mode, weights, grads, 0.01, 0.8, 0.95, 1e-5, mwn=0.5)
    assert_same(got, want)
    unclipped = adam_reference(mode, weights, grads, 0.01, 0.8, 0.95, 1e-5)
    assert not np.allclose(got[-1]["w"], unclipped[-1]["w"])
