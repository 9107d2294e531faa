"""Small ONNX models for the session tests, built with onnx.helper.

The affine model computes ``y = x * w + b`` with ``w = 2`` and ``b = 1`` initializers of the
sample shape, so every anchor element can be predicted from the input with numpy.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart

SAMPLE_SHAPE = (2, 3)  # T = [mb, *S] with mb = 2, S = [3]


def affine_model(shape=SAMPLE_SHAPE, w: float = 2.0, b: float = 1.0, with_loss: bool = False,
                 opset: int = 13) -> onnx.ModelProto:
    """``xw = x * w``, ``y = xw + b``; with_loss adds ``loss = L1(y, lambda=0.5, Sum)``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    inits = [
        numpy_helper.from_array(np.full(shape, w, np.float32), "w"),
        numpy_helper.from_array(np.full(shape, b, np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"], name="mul"),
        helper.make_node("Add", ["xw", "b"], ["y"], name="add"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))]
    opsets = [helper.make_opsetid("", opset)]
    if with_loss:
        nodes.append(helper.make_node("L1", ["y"], ["loss"], name="l1", domain="ai.graphcore",
                                      reduction=0, **{"lambda": 0.5}))
        outputs.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
        opsets.append(helper.make_opsetid("ai.graphcore", 1))
    graph = helper.make_graph(nodes, "affine", [x], outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def affine_ref(x: np.ndarray, w: float = 2.0, b: float = 1.0) -> np.ndarray:
    return (x * np.float32(w) + np.float32(b)).astype(np.float32)


def cpu_device():
    return popart.DeviceManager().createCpuDevice()


def ipu_model_device(num_ipus: int):
    return popart.DeviceManager().createIpuModelDevice({"numIPUs": num_ipus})


def make_session(anchors, bps: int = 1, model=None, device=None, options=None, prepare=True,
                 **kwargs) -> popart.InferenceSession:
    """An InferenceSession of ``model`` (default: the affine model); anchors as for DataFlow."""
    data_flow = popart.DataFlow(bps, anchors)
    session = popart.InferenceSession(
        model if model is not None else affine_model(),
        data_flow,
        device if device is not None else cpu_device(),
        userOptions=options if options is not None else popart.SessionOptions(),
        **kwargs,
    )
    if prepare:
        session.prepareDevice()
    return session


def step_input(steps: int, shape=SAMPLE_SHAPE, seed: int = 0) -> np.ndarray:
    """Seeded float32 input of ``steps`` micro-batches, shape [steps, *T]."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((steps, *shape)).astype(np.float32)
