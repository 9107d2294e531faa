"""A tiny MLP for the training-session tests and the torch eager loop they are compared with.

``y = Relu(x @ w1 + b1) @ w2 + b2`` on micro-batches ``x`` f32[mb, 3], followed by a loss:
``l1`` (ai.graphcore L1, lambda 0.5) or ``square`` (ai.graphcore IdentityLoss of y·y), with
PopART reduction Mean (1) or Sum (0). The torch reference trains the same parameters with
torch.optim, one optimizer step per ``af`` micro-batches whose gradients are summed (Sum) or
averaged (Mean), as spec §5.3 defines.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart

MB, IN, HIDDEN, OUT = 4, 3, 5, 2
WEIGHTS = ("w1", "b1", "w2", "b2")


def mlp_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": rng.standard_normal((IN, HIDDEN)).astype(np.float32) * 0.5,
        "b1": rng.standard_normal((HIDDEN,)).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((HIDDEN, OUT)).astype(np.float32) * 0.5,
        "b2": rng.standard_normal((OUT,)).astype(np.float32) * 0.1,
    }


def mlp_model(params: dict[str, np.ndarray], loss: str = "l1", reduction: int = 1,
              mb: int = MB) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [mb, IN])
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="bias1"),
        helper.make_node("Relu", ["h1"], ["h"], name="relu"),
        helper.make_node("MatMul", ["h", "w2"], ["y0"], name="fc2"),
        helper.make_node("Add", ["y0", "b2"], ["y"], name="bias2"),
    ]
    if loss == "l1":
        nodes.append(helper.make_node("L1", ["y"], ["loss"], name="l1", domain="ai.graphcore",
                                      reduction=reduction, **{"lambda": 0.5}))
    elif loss == "square":
        nodes.append(helper.make_node("Mul", ["y", "y"], ["y2"], name="square"))
        nodes.append(helper.make_node("IdentityLoss", ["y2"], ["loss"], name="identity_loss",
                                      domain="ai.graphcore", reduction=reduction))
    else:
        raise ValueError(loss)
    inits = [numpy_helper.from_array(v, k) for k, v in params.items()]
    graph = helper.make_graph(
        nodes, "mlp", [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [mb, OUT]),
         helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("ai.graphcore", 1)])
    model.ir_version = 8
    return model


def torch_loss(p: dict[str, torch.Tensor], x: np.ndarray, loss: str = "l1",
               reduction: int = 1) -> torch.Tensor:
    y = torch.relu(torch.from_numpy(x) @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
    per_element = 0.5 * y.abs() if loss == "l1" else y * y
    return per_element.mean() if reduction == 1 else per_element.sum()


def torch_params(params: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}


def torch_train(params: dict[str, np.ndarray], x: np.ndarray, make_optimizer, af: int = 1,
                mean: bool = False, loss: str = "l1", reduction: int = 1,
                lr_schedule: dict[int, float] | None = None, grads_out: list | None = None):
    """Train a copy of ``params`` on ``x`` [updates, af, mb, IN]; returns the final params.

    ``lr_schedule`` sets every param group's lr before the given update index.
    ``grads_out`` receives, per micro-batch, the gradient of ``w1``.
    """
    p = torch_params(params)
    optimizer = make_optimizer(list(p.values()))
    for step in range(x.shape[0]):
        if lr_schedule and step in lr_schedule:
            for group in optimizer.param_groups:
                group["lr"] = lr_schedule[step]
        optimizer.zero_grad()
        for a in range(af):
            before = p["w1"].grad.clone() if p["w1"].grad is not None else torch.zeros_like(p["w1"])
            torch_loss(p, x[step, a], loss, reduction).backward()
            if grads_out is not None:
                grads_out.append((p["w1"].grad - before).numpy().copy())
        if mean:
            for t in p.values():
                t.grad /= af
        optimizer.step()
    return {k: v.detach().numpy() for k, v in p.items()}


def training_session(params, optimizer, bps: int = 1, af: int = 1, anchors=(),
                     options: popart.SessionOptions | None = None, loss: str = "l1",
                     reduction: int = 1, art: str = "All", weights_from_host: bool = True,
                     **option_values) -> popart.TrainingSession:
    """A prepared TrainingSession of the MLP (weights written unless told otherwise)."""
    options = options if options is not None else popart.SessionOptions()
    if af > 1 or option_values.pop("accumulate", False):
        options.enableGradientAccumulation = True
        options.accumulationFactor = af
    for key, value in option_values.items():
        setattr(options, key, value)
    flow = popart.DataFlow(bps, {a: popart.AnchorReturnType(art) for a in anchors})
    session = popart.TrainingSession(
        mlp_model(params, loss, reduction), flow, "loss", optimizer,
        popart.DeviceManager().createCpuDevice(), userOptions=options)
    session.prepareDevice()
    if weights_from_host:
        session.weightsFromHost()
    return session


def read_weights(session, ids=WEIGHTS) -> dict[str, np.ndarray]:
    session.weightsToHost()
    info = {i: session.getInfo(i) for i in ids}
    out = {i: np.zeros(info[i].shape(), np.float32) for i in ids}
    session.readWeights(popart.PyWeightsIO(out))
    return out


def run(session, x: np.ndarray) -> dict[str, np.ndarray]:
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": np.ascontiguousarray(x)}, anchors))
    return anchors


def inputs(updates: int, af: int = 1, seed: int = 1, mb: int = MB) -> np.ndarray:
    """Seeded input in the [bps, af, mb, IN] layout (rf = 1)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((updates, af, mb, IN)).astype(np.float32)


def assert_params_close(got: dict, want: dict, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=k)
