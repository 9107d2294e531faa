"""A custom operator in Python: LeakyRelu with its gradient, trained for one step.

Run it with ``python examples/custom_op_leaky_relu.py``. It registers the op, builds

    x [1,2,4,4] -> custom.ops::LeakyRelu -> Conv (w [3,2,3,3], pads 1) -> l1loss

trains it for one step with ConstSGD(0.001) and compares the output, the loss and the updated
weight with the same model in PyTorch (``nn.LeakyReLU()``: slope 0.01, the op's default alpha).
It exits with status 1 on a mismatch.

A custom op is two classes: the op (shape inference in ``setup``, the numpy ``compute``,
``grad_ops``) and its grad op (which forward tensors it reads, which input gradient it makes).
The decorators register them, so importing this file (or ``popart.loadCustomOpModule(path)``)
makes ``custom.ops::LeakyRelu`` usable from the Builder, from ONNX files and from
``poptorch_lite.custom_op``.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

import popart_backend as popart
from popart_backend.custom import GradOp, GradOpInType, Op, register_grad_op, register_op

LEAKY = popart.OperatorIdentifier("custom.ops", "LeakyRelu", 1)
LEAKY_GRAD = popart.OperatorIdentifier("custom.ops", "LeakyReluGrad", 1)


@register_op(LEAKY, definition=popart.OpDefinition(
    inputs=[("input", ["FLOAT16", "FLOAT"])],
    outputs=[("output", ["FLOAT16", "FLOAT"])],
    attributes={"alpha": "*"}), public=True)
class LeakyRelu(Op):
    """y = x for x >= 0, alpha * x otherwise."""

    subgraph_value = Op.LOW

    def __init__(self, opid, attributes, settings):
        super().__init__(opid, settings)
        self.alpha = float(attributes.get("alpha", 1e-2))

    def setup(self, in_infos):
        return [in_infos[0]]  # same shape and type as the input

    def attributes(self):
        return {"alpha": self.alpha}

    def grad_ops(self):
        return [LeakyReluGrad(self)]

    def compute(self, ctx, x):
        return np.where(x < 0, self.alpha * x, x)

    def cost(self, in_infos):
        nelms = in_infos[0].nelms()
        return 2 * nelms, 2 * in_infos[0].nbytes()  # (FLOPs, bytes moved)


@register_grad_op(LEAKY_GRAD)
class LeakyReluGrad(GradOp):
    """dx = dy * (1 if x >= 0 else alpha): reads the output gradient and the forward input."""

    grad_input_info = [(0, 0, GradOpInType.GradOut), (1, 0, GradOpInType.In)]
    grad_out_to_non_grad_in = {0: 0}

    def __init__(self, fwd):
        super().__init__(LEAKY_GRAD, fwd.settings)
        self.alpha = fwd.alpha

    def setup(self, in_infos):
        return [in_infos[0]]

    def attributes(self):
        return {"alpha": self.alpha}

    def compute(self, ctx, dy, x):
        return (dy * np.where(x < 0, self.alpha, 1.0)).astype(dy.dtype)


def run_popart(x_value: np.ndarray, w_value: np.ndarray, learning_rate: float = 0.001):
    """One training step on the simulated IPU; returns the anchors and the shape check."""
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [1, 2, 4, 4]), "x")
    leaky_relu = builder.customOp(opName="LeakyRelu", opVersion=1, domain="custom.ops",
                                  inputs=[x], attributes={"alpha": 0.01})[0]
    w = builder.addInitializedInputTensor(w_value, "w")
    y = builder.aiOnnx.conv([leaky_relu, w], pads=[1, 1, 1, 1])
    l1 = builder.aiGraphcore.l1loss([y], 1.0)
    # The registered setup() gives the shape, ONNX knows nothing about custom.ops.
    shape = builder.getTensorShape(leaky_relu)

    anchors = {t: popart.AnchorReturnType("All") for t in (y, leaky_relu, w, l1)}
    session = popart.TrainingSession(
        fnModel=builder.getModelProto(),
        dataFlow=popart.DataFlow(1, anchors),
        loss=l1,
        optimizer=popart.ConstSGD(learning_rate),
        deviceInfo=popart.DeviceManager().createIpuModelDevice({}),
    )
    session.prepareDevice()
    session.weightsFromHost()
    arrays = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: x_value}, arrays))
    session.weightsToHost()
    updated = np.empty_like(w_value)
    session.readWeights(popart.PyWeightsIO({w: updated}))
    return {"leaky_relu": arrays[leaky_relu], "y": arrays[y], "loss": arrays[l1],
            "w_anchor": arrays[w], "w_updated": updated, "shape": shape}


def run_torch(x_value: np.ndarray, w_value: np.ndarray, learning_rate: float = 0.001):
    """The same step in PyTorch: LeakyReLU, Conv2d without bias, mean L1 loss, SGD."""
    weight = torch.nn.Parameter(torch.from_numpy(w_value.copy()))
    activation = torch.nn.LeakyReLU()(torch.from_numpy(x_value))
    y = torch.nn.functional.conv2d(activation, weight, padding=1)
    loss = y.abs().mean()
    loss.backward()
    with torch.no_grad():
        updated = weight - learning_rate * weight.grad
    return {"leaky_relu": activation.detach().numpy(), "y": y.detach().numpy(),
            "loss": loss.detach().numpy(), "w_updated": updated.numpy()}


def main() -> int:
    rng = np.random.default_rng(0)
    x_value = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    w_value = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    ours = run_popart(x_value, w_value)
    ref = run_torch(x_value, w_value)
    print(f"getTensorShape(leaky_relu) = {ours['shape']}")
    ok = ours["shape"] == [1, 2, 4, 4]
    for name in ("leaky_relu", "y", "loss", "w_updated"):
        error = float(np.abs(ours[name] - ref[name]).max())
        print(f"  {name:<10} max |popart - torch| = {error:.2e}")
        ok &= error < 1e-5
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
