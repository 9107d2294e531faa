"""Tiny ONNX models for the hardening tests, built with onnx.helper, and a runner that loads
and runs a model the way an application given an untrusted file would."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart

SHAPE = (2, 3)


def make_model(nodes, inits=(), inputs=(), outputs=(), opset: int = 13) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def value(name: str, shape=SHAPE, dtype=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, list(shape) if shape is not None else None)


def affine(w: float = 2.0, b: float = 1.0) -> onnx.ModelProto:
    """y = x * w + b with initializers w, b of SHAPE."""
    inits = [numpy_helper.from_array(np.full(SHAPE, w, np.float32), "w"),
             numpy_helper.from_array(np.full(SHAPE, b, np.float32), "b")]
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"], name="mul"),
             helper.make_node("Add", ["xw", "b"], ["y"], name="add")]
    return make_model(nodes, inits, [value("x")], [value("y")])


def shapes_and_constants() -> onnx.ModelProto:
    """Constant, Shape, Reshape, ConstantOfShape, Concat, Relu: folding and shape operands."""
    shape = numpy_helper.from_array(np.array([3, 2], np.int64), "shape")
    nodes = [
        helper.make_node("Constant", [], ["c"], name="const",
                         value=numpy_helper.from_array(np.ones(SHAPE, np.float32))),
        helper.make_node("Add", ["x", "c"], ["xc"], name="add"),
        helper.make_node("Reshape", ["xc", "shape"], ["r"], name="reshape"),
        helper.make_node("ConstantOfShape", ["shape"], ["z"], name="zeros",
                         value=numpy_helper.from_array(np.array([0.5], np.float32))),
        helper.make_node("Concat", ["r", "z"], ["cat"], name="concat", axis=0),
        helper.make_node("Relu", ["cat"], ["y"], name="relu"),
    ]
    return make_model(nodes, [shape], [value("x")], [value("y", (6, 2))])


def control_flow() -> onnx.ModelProto:
    """An If on a data condition and a Loop with a constant trip count, both with bodies."""
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"], name="neg")], "then", [],
                               [value("t")])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["e"], name="abs")], "else", [],
                               [value("e")])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"),
         helper.make_node("Add", ["acc_in", "one"], ["acc_out"], name="inc")],
        "body",
        [value("i", (), TensorProto.INT64), value("cond_in", (), TensorProto.BOOL),
         value("acc_in")],
        [value("cond_out", (), TensorProto.BOOL), value("acc_out")],
        [numpy_helper.from_array(np.ones(SHAPE, np.float32), "one")],
    )
    inits = [numpy_helper.from_array(np.array(3, np.int64), "trips"),
             numpy_helper.from_array(np.array(True), "go"),
             numpy_helper.from_array(np.zeros((), np.float32), "zero")]
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["pos"], name="gt"),
        helper.make_node("If", ["pos"], ["f"], name="if", then_branch=then_g, else_branch=else_g),
        helper.make_node("Loop", ["trips", "go", "f"], ["y"], name="loop", body=body),
    ]
    return make_model(nodes, inits, [value("x")], [value("y")])


SEEDS = {"affine": affine, "shapes_and_constants": shapes_and_constants,
         "control_flow": control_flow}


def load_and_run(model, steps: int = 1) -> dict[str, np.ndarray]:
    """Build an InferenceSession of ``model`` (bytes or proto), prepare it and run ``steps``
    batches of zeros; returns the anchors. Any error must be a popart_exception."""
    proto = model
    if not isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(bytes(model))
        except Exception:  # the session reports it (ModelError)
            proto = onnx.ModelProto()
    outputs = [o.name for o in proto.graph.output if o.name]
    initializers = {i.name for i in proto.graph.initializer}
    inputs = [i.name for i in proto.graph.input if i.name and i.name not in initializers]
    anchors = {o: popart.AnchorReturnType("All") for o in dict.fromkeys(outputs)}
    session = popart.InferenceSession(model, popart.DataFlow(steps, anchors),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    feeds = {}
    for tensor_id in dict.fromkeys(inputs):
        info = session.getInfo(tensor_id)
        shape = [steps, *info.shape()] if steps > 1 else info.shape()
        feeds[tensor_id] = np.zeros(shape, info.data_type_lcase())
    out = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, out))
    return out
