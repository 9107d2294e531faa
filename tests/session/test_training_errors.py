"""TrainingSession errors (spec §2.1, §2.4, §4.3): each names what is wrong and what to do.

Features: F6, F36, F38, F75.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart
from popart_backend.ir.op import Op
from popart_backend.ops.registry import register_op

from .session_models import affine_model
from .training_models import inputs, mlp_model, mlp_params, run, training_session


def cpu():
    return popart.DeviceManager().createCpuDevice()


def session_of(model, loss="loss", optimizer=None, anchors=(), options=None, bps=1):
    return popart.TrainingSession(
        model, popart.DataFlow(bps, list(anchors)), loss,
        optimizer if optimizer is not None else popart.ConstSGD(0.1), cpu(),
        userOptions=options if options is not None else popart.SessionOptions())


def test_run_before_weights_from_host_F36():
    session = training_session(mlp_params(), popart.ConstSGD(0.1), weights_from_host=False)
    text = ("Must call weightsFromHost before run as the model has initializers and the session "
            "has been created in training mode")
    with pytest.raises(popart.popart_runtime_error, match=f"^{re.escape(text)}$"):
        run(session, inputs(1))


def test_changing_a_const_optimizer_value_F38():
    session = training_session(mlp_params(), popart.SGD({"defaultLearningRate": (0.1, True)}))
    with pytest.raises(popart.popart_exception, match="learningRate"):
        session.updateOptimizerFromHost(popart.SGD({"defaultLearningRate": (0.2, True)}))


def test_changing_the_optimizer_class_F38():
    session = training_session(mlp_params(), popart.ConstSGD(0.1))
    with pytest.raises(popart.popart_exception, match="Adam"):
        session.updateOptimizerFromHost(popart.Adam({}))


def test_optimizer_must_be_an_optimizer_F6():
    with pytest.raises(popart.popart_exception, match="optimizer must be a popart optimizer"):
        session_of(mlp_model(mlp_params()), optimizer=0.1)


def test_accumulation_in_inference_F75():
    options = popart.SessionOptions()
    options.enableGradientAccumulation = True
    options.accumulationFactor = 2
    with pytest.raises(popart.popart_exception,
                       match="^Gradient Accumulation only available when training.$"):
        popart.InferenceSession(affine_model(), popart.DataFlow(1, ["y"]), cpu(),
                                userOptions=options)


def test_accumulation_factor_without_enabling_F75():
    options = popart.SessionOptions()
    options.accumulationFactor = 4
    with pytest.raises(popart.popart_exception,
                       match="enableGradientAccumulation is false, but accumulationFactor > 1"):
        session_of(mlp_model(mlp_params()), options=options)


def test_accumulation_factor_below_one_F75():
    options = popart.SessionOptions()
    options.enableGradientAccumulation = True
    options.accumulationFactor = 0
    with pytest.raises(popart.popart_exception, match="accumulationFactor = 0"):
        session_of(mlp_model(mlp_params()), options=options)


def test_unknown_loss_tensor_names_close_matches_F6():
    with pytest.raises(popart.popart_exception, match=r"'los'.*Did you mean 'loss'"):
        session_of(mlp_model(mlp_params()), loss="los")


def test_loss_that_is_not_a_scalar_F6():
    with pytest.raises(popart.popart_exception, match=r"loss 'y' must be a floating-point scalar"):
        session_of(mlp_model(mlp_params()), loss="y")


@register_op("NoGradient", versions=1, domain="test.training_errors")
class NoGradient(Op):
    """A differentiable-looking op without grad(): autodiff must name it."""

    def infer(self, x):
        return x

    def kernel(self, x):
        return x.clone()


def test_non_differentiable_path_names_the_op_F6():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"]),
        helper.make_node("NoGradient", ["xw"], ["r"], name="opaque",
                         domain="test.training_errors"),
        helper.make_node("L1", ["r"], ["loss"], domain="ai.graphcore"),
    ]
    graph = helper.make_graph(
        nodes, "opaque", [x], [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(np.ones(3, np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 13), helper.make_opsetid("ai.graphcore", 1),
        helper.make_opsetid("test.training_errors", 1)])
    with pytest.raises(popart.popart_exception,
                       match=r"NoGradient 'opaque' has no gradient.*\['xw'\]"):
        session_of(model)


def test_unknown_anchor_in_training_suggests_gradients_F35():
    with pytest.raises(popart.popart_exception, match=r"'Gradient___w3'.*Did you mean"):
        session_of(mlp_model(mlp_params()), anchors=["Gradient___w3"])


def test_anchor_of_an_outer_fragment_tensor_F75():
    options = popart.SessionOptions()
    options.enableGradientAccumulation = True
    options.accumulationFactor = 2
    with pytest.raises(popart.popart_exception, match="UpdatedVar___w1.*once per weight update"):
        session_of(mlp_model(mlp_params()), anchors=["UpdatedVar___w1"], options=options)


def test_no_reduction_type_for_gradients_F73():
    options = popart.SessionOptions()
    options.accumulationAndReplicationReductionType = popart.ReductionType.NoReduction
    with pytest.raises(popart.popart_exception, match="ReductionType.Sum or ReductionType.Mean"):
        session_of(mlp_model(mlp_params()), options=options)


def test_loss_must_be_a_string_F6():
    with pytest.raises(popart.popart_exception, match="loss must be the id"):
        session_of(onnx.ModelProto(), loss=3)
