"""TrainingSession (spec §2.1, §4.2, §4.3, §4.5): weights trained on the simulated device equal a
torch eager loop doing the same steps.

Features: F6, F35, F36, F37, F38, F50.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart
from popart_backend.ir.op import Op
from popart_backend.ops.registry import register_op

from .training_models import (
    MB,
    OUT,
    WEIGHTS,
    assert_params_close,
    inputs,
    mlp_params,
    read_weights,
    run,
    torch_loss,
    torch_params,
    torch_train,
    training_session,
)


def sgd(lr: float = 0.05):
    return lambda params: torch.optim.SGD(params, lr=lr)


@pytest.mark.parametrize("loss,reduction", [("l1", 1), ("l1", 0), ("square", 1)])
def test_sgd_bps_matches_torch_F6_F50(loss, reduction):
    params, x = mlp_params(), inputs(3)
    session = training_session(params, popart.ConstSGD(0.05), bps=3, loss=loss,
                               reduction=reduction)
    for _ in range(2):  # two runs continue from the device weights
        run(session, x)
    want = torch_train(params, np.concatenate([x, x]), sgd(), loss=loss, reduction=reduction)
    assert_params_close(read_weights(session), want)


def test_sgd_momentum_matches_torch_F39_F50():
    params, x = mlp_params(1), inputs(4, seed=3)
    optimizer = popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True),
                            "defaultWeightDecay": (0.01, True)})
    session = training_session(params, optimizer, bps=2)
    run(session, x[:2])
    run(session, x[2:])
    want = torch_train(params, x, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9,
                                                            weight_decay=0.01))
    assert_params_close(read_weights(session), want)


def test_adam_matches_torch_F39_F50():
    params, x = mlp_params(2), inputs(4, seed=4)
    optimizer = popart.Adam({"defaultLearningRate": (0.01, False), "defaultBeta1": (0.8, True),
                             "defaultBeta2": (0.95, True), "defaultEps": (1e-6, True)})
    session = training_session(params, optimizer, bps=4)
    run(session, x)
    want = torch_train(params, x, lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.95),
                                                             eps=1e-6))
    assert_params_close(read_weights(session), want)


def test_gradient_and_loss_anchors_equal_torch_F35():
    params, x = mlp_params(), inputs(2, seed=5)
    session = training_session(params, popart.ConstSGD(0.05), bps=2,
                               anchors=("loss", "Gradient___w1", "y"))
    anchors = run(session, x)
    assert anchors["Gradient___w1"].shape == (2, 3, 5)
    assert anchors["loss"].shape == (2,)
    assert anchors["y"].shape == (2, MB, OUT)
    p = torch_params(params)
    optimizer = torch.optim.SGD(list(p.values()), lr=0.05)
    for b in range(2):
        optimizer.zero_grad()
        value = torch_loss(p, x[b, 0])
        value.backward()
        np.testing.assert_allclose(anchors["loss"][b], value.item(), rtol=1e-5)
        np.testing.assert_allclose(anchors["Gradient___w1"][b], p["w1"].grad.numpy(),
                                   rtol=1e-5, atol=1e-6)
        optimizer.step()


def test_update_optimizer_from_host_changes_lr_mid_training_F38():
    params, x = mlp_params(3), inputs(4, seed=6)

    def optimizer(lr):
        return popart.SGD({"defaultLearningRate": (lr, False), "defaultMomentum": (0.5, True)})

    session = training_session(params, optimizer(0.05), bps=2)
    run(session, x[:2])
    session.updateOptimizerFromHost(optimizer(0.01))
    run(session, x[2:])
    want = torch_train(params, x, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.5),
                       lr_schedule={2: 0.01})
    assert_params_close(read_weights(session), want)


def test_update_optimizer_before_prepare_is_used_by_weights_from_host_F38():
    params, x = mlp_params(3), inputs(2, seed=7)
    flow = popart.DataFlow(2, [])
    from .training_models import mlp_model

    session = popart.TrainingSession(
        mlp_model(params), flow, "loss", popart.SGD({"defaultLearningRate": (0.5, False)}),
        popart.DeviceManager().createCpuDevice())
    session.updateOptimizerFromHost(popart.SGD({"defaultLearningRate": (0.02, False)}))
    session.prepareDevice()
    session.weightsFromHost()
    run(session, x)
    assert_params_close(read_weights(session), torch_train(params, x, sgd(0.02)))


def test_non_const_loss_scaling_keeps_the_trajectory_F38():
    params, x = mlp_params(4), inputs(3, seed=8)
    optimizer = popart.SGD({"defaultLearningRate": (0.05, True), "lossScaling": (128.0, False)})
    session = training_session(params, optimizer, bps=3, anchors=("Gradient___w2",))
    anchors = run(session, x)
    assert_params_close(read_weights(session), torch_train(params, x, sgd()))
    # The gradient anchor is loss-scaled, as on the IPU.
    p = torch_params(params)
    torch_loss(p, x[0, 0]).backward()
    np.testing.assert_allclose(anchors["Gradient___w2"][0], 128.0 * p["w2"].grad.numpy(),
                               rtol=1e-5)
    session.updateOptimizerFromHost(
        popart.SGD({"defaultLearningRate": (0.05, True), "lossScaling": (4.0, False)}))
    anchors = run(session, x)
    assert_params_close(read_weights(session),
                        torch_train(params, np.concatenate([x, x]), sgd()), rtol=2e-5)


def test_const_loss_scaling_matches_torch_F50():
    params, x = mlp_params(5), inputs(2, seed=9)
    session = training_session(params, popart.ConstSGD(0.05, loss_scaling=64.0), bps=2)
    run(session, x)
    assert_params_close(read_weights(session), torch_train(params, x, sgd()))


def test_weights_io_round_trip_and_optimizer_state_F37():
    params, x = mlp_params(), inputs(1, seed=10)
    optimizer = popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True)})
    session = training_session(params, optimizer)
    run(session, x)
    trained = read_weights(session)
    velocity = read_weights(session, ["Accl___w1"])["Accl___w1"]
    assert np.abs(velocity).sum() > 0
    # writeWeights + weightsFromHost restore the initial weights on the device.
    session.writeWeights(popart.PyWeightsIO({k: params[k].copy() for k in WEIGHTS}))
    session.weightsFromHost()
    assert_params_close(read_weights(session), params, rtol=0, atol=0)
    assert not np.allclose(trained["w1"], params["w1"])


def test_model_to_host_after_training_F51(tmp_path):
    params, x = mlp_params(), inputs(2, seed=11)
    session = training_session(params, popart.ConstSGD(0.05), bps=2)
    run(session, x)
    path = tmp_path / "trained.onnx"
    session.modelToHost(str(path))
    saved = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}
    assert_params_close(saved, torch_train(params, x, sgd()))


def test_callback_step_io_trains_like_arrays_F6():
    params, x = mlp_params(), inputs(3, seed=12)
    session = training_session(params, popart.ConstSGD(0.05), bps=3, anchors=("loss",))
    chunks = iter(x.reshape(-1, MB, 3))
    losses = []
    stepio = popart.PyStepIOCallback(
        lambda tensor_id, prefetch: np.ascontiguousarray(next(chunks)),
        lambda tensor_id: None,
        lambda tensor_id: (losses.append(np.zeros((), np.float32)), losses[-1])[1],
        lambda tensor_id: None,
    )
    session.run(stepio)
    assert len(losses) == 3
    assert_params_close(read_weights(session), torch_train(params, x, sgd()))


def test_properties_and_get_ir_F6():
    options = popart.SessionOptions()
    options.enableGradientAccumulation = True
    options.accumulationFactor = 3
    session = training_session(mlp_params(), popart.ConstSGD(0.1), bps=2, af=3,
                               options=options)
    assert session.accumulationFactor == 3
    assert session.replicationFactor == 1
    assert session.dataFlow.batchesPerStep() == 2
    ir = session.getIr()
    assert "Gradient___w1" in ir.main.tensors and "UpdatedVar___w1" in ir.main.tensors
    assert session.getInfo("Gradient___w2").shape() == [5, OUT]


def test_training_runs_only_fusions_with_gradients():
    # MatMul + bias Add becomes LinearBias (it has a gradient); nothing inference-only runs.
    session = training_session(mlp_params(), popart.ConstSGD(0.1))
    types = {op.op_type for op in session.getIr().main.ops.values()}
    assert "LinearBias" in types and "LinearBiasWeightGrad" in types
    assert "MatMul" not in types and "ConvBiasAct" not in types and "Gemm" not in types


@register_op("SeedProbe", versions=1, domain="test.training")
class SeedProbe(Op):
    """Test op reading the session seed: y = x·0 + 1000·seed + micro-batch counter."""

    requires_random_seed = True
    foldable = False

    def infer(self, x, seed=None):
        return x

    def kernel(self, x, seed=None):
        return x * 0 + (seed[0] * 1000 + seed[1]).to(x.dtype)


def seed_probe_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    nodes = [
        helper.make_node("SeedProbe", ["x"], ["probe"], domain="test.training"),
        helper.make_node("Mul", ["probe", "w"], ["y"]),
        helper.make_node("L1", ["y"], ["loss"], domain="ai.graphcore", reduction=0),
    ]
    graph = helper.make_graph(
        nodes, "probe", [x], [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(np.ones(2, np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 13), helper.make_opsetid("ai.graphcore", 1),
        helper.make_opsetid("test.training", 1)])
    model.ir_version = 8
    return model


def test_random_seed_tensor_holds_seed_and_micro_batch_counter():
    """Ops with requires_random_seed read randomSeed___ = (user seed, micro-batch counter) as
    their last input; the counter runs on across runs and restarts at setRandomSeed
    (docs/training.md)."""
    options = popart.SessionOptions()
    options.enableGradientAccumulation = True
    options.accumulationFactor = 2
    session = popart.TrainingSession(
        seed_probe_model(), popart.DataFlow(3, ["probe"]), "loss", popart.ConstSGD(0.0),
        popart.DeviceManager().createCpuDevice(), userOptions=options)
    probe = next(op for op in session.getIr().main.ops.values() if op.op_type == "SeedProbe")
    assert probe.inputs[-1].id == popart.reservedRandomSeedPrefix()
    session.setRandomSeed(5)
    session.prepareDevice()
    session.weightsFromHost()
    x = np.zeros((3, 2, 2), np.float32)

    def probes():
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({"x": x}, anchors))
        assert anchors["probe"].shape == (3, 2, 2)
        return anchors["probe"][..., 0].reshape(-1)

    np.testing.assert_array_equal(probes(), 5000 + np.arange(6))
    np.testing.assert_array_equal(probes(), 5000 + np.arange(6, 12))
    session.setRandomSeed(7)
    np.testing.assert_array_equal(probes(), 7000 + np.arange(6))


def dropout_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])
    ratio = numpy_helper.from_array(np.array(0.5, np.float32), "ratio")
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"]),
        helper.make_node("Dropout", ["xw", "ratio"], ["d"], name="drop"),
        helper.make_node("L1", ["d"], ["loss"], domain="ai.graphcore", reduction=0),
    ]
    graph = helper.make_graph(
        nodes, "dropout", [x], [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(np.ones(64, np.float32), "w"), ratio])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("ai.graphcore", 1)])
    model.ir_version = 8
    return model


def test_dropout_is_active_and_replays_with_the_same_seed():
    """Training Dropout draws a new mask every micro-batch from randomSeed___ and the same
    masks again after setRandomSeed with the same value (DESIGN decision 5)."""
    def masks(seed):
        session = popart.TrainingSession(
            dropout_model(), popart.DataFlow(3, ["d"]), "loss", popart.ConstSGD(0.0),
            popart.DeviceManager().createCpuDevice())
        session.setRandomSeed(seed)
        session.prepareDevice()
        session.weightsFromHost()
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({"x": np.ones((3, 64), np.float32)}, anchors))
        return anchors["d"]

    first = masks(11)
    assert set(np.unique(first)) <= {0.0, 2.0}
    assert not np.array_equal(first[0], first[1])
    np.testing.assert_array_equal(masks(11), first)
    assert not np.array_equal(masks(12), first)
