"""A chain model annotated for virtual graphs and pipelining, and helpers to run it.

``h_{k+1} = tanh(h_k @ W_k)`` for ``layers`` layers, then an L1 loss (lambda 0.5, Mean). Layer
k sits on IPU ``k * ipus // layers`` and, when ``stages`` is set, on pipeline stage = its IPU;
the loss shares the last layer's IPU and stage. Used by the virtual-graph, pipelining and
recomputation tests (spec §3.4, §5.1, §5.2).
"""

from __future__ import annotations

import numpy as np
import onnx

import popart_backend as popart

D, MB = 4, 2
LAMBDA = 0.5


def chain_weights(layers: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((D, D)).astype(np.float32) * 0.5 for _ in range(layers)]


def chain_model(weights: list[np.ndarray], ipus: int, stages: bool = True, place: bool = True,
                recompute: tuple[int, ...] = (), norm: bool = False):
    """(ModelProto, loss id, weight ids). ``recompute`` lists layers whose tanh output is
    annotated RecomputeType.Recompute; ``norm`` puts a LayerNormalization before each tanh."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    h = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    ids = []
    layers = len(weights)
    ipu = 0
    for k, w in enumerate(weights):
        ipu = k * ipus // layers
        w_id = builder.addInitializedInputTensor(w, f"w{k}")
        ids.append(w_id)
        with _placed(builder, ipu, stages, place):
            h = builder.aiOnnx.matmul([h, w_id])
            if norm:
                scale = builder.addInitializedInputTensor(np.ones(D, np.float32), f"g{k}")
                bias = builder.addInitializedInputTensor(np.zeros(D, np.float32), f"b{k}")
                h = builder.aiOnnx.layernormalization([h, scale, bias], num_outputs=1)[0]
            h = builder.aiOnnx.tanh([h])
            if k in recompute:
                builder.recomputeOutputInBackwardPass(h)
    with _placed(builder, ipu, stages, place):
        loss = builder.aiGraphcore.l1loss([h], LAMBDA, reduction=popart.ReductionType.Mean)
    return builder.getModelProto(), loss, ids


class _placed:
    """``virtualGraph(ipu)`` and ``pipelineStage(ipu)`` contexts, as asked."""

    def __init__(self, builder, ipu: int, stages: bool, place: bool):
        self.contexts = []
        if place:
            self.contexts.append(builder.virtualGraph(ipu))
            if stages:
                self.contexts.append(builder.pipelineStage(ipu))

    def __enter__(self):
        for c in self.contexts:
            c.__enter__()

    def __exit__(self, *exc):
        for c in reversed(self.contexts):
            c.__exit__(*exc)


def options(ipus: int = 1, pipelined: bool = False, af: int = 1,
            mode=popart.VirtualGraphMode.Manual, **values) -> popart.SessionOptions:
    opts = popart.SessionOptions()
    if ipus > 1:
        opts.virtualGraphMode = mode
    opts.enablePipelining = pipelined
    if af > 1:
        opts.enableGradientAccumulation = True
        opts.accumulationFactor = af
    for key, value in values.items():
        setattr(opts, key, value)
    return opts


def device(ipus: int):
    return popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus})


def training_session(weights, ipus: int, opts: popart.SessionOptions, bps: int, lr=0.1,
                     model_ipus: int | None = None, **model_args):
    """A prepared TrainingSession of the chain with its weights written: (session, loss, ids)."""
    proto, loss, ids = chain_model(weights, model_ipus or ipus, **model_args)
    flow = popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")})
    session = popart.TrainingSession(proto, flow, loss, popart.ConstSGD(lr), device(ipus),
                                     userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    return session, loss, ids


def read_weights(session, ids) -> dict[str, np.ndarray]:
    session.weightsToHost()
    out = {i: np.zeros((D, D), np.float32) for i in ids}
    session.readWeights(popart.PyWeightsIO(out))
    return out


def train(weights, x: np.ndarray, ipus: int, opts: popart.SessionOptions, bps: int, lr=0.1,
          model_ipus: int | None = None, **model_args):
    """Train on ``x`` (one run); returns (final weights by id, loss anchor, session)."""
    session, loss, ids = training_session(weights, ipus, opts, bps, lr, model_ipus, **model_args)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": np.ascontiguousarray(x)}, anchors))
    return read_weights(session, ids), anchors[loss], session


def infer(weights, x: np.ndarray, ipus: int, opts: popart.SessionOptions, bps: int, **model_args):
    """Run inference on ``x``; returns (the last tanh output per micro-batch, session)."""
    proto, loss, _ = chain_model(weights, ipus, **model_args)
    builder_out = _last_activation(proto)
    flow = popart.DataFlow(bps, {builder_out: popart.AnchorReturnType("All")})
    session = popart.InferenceSession(proto, flow, device(ipus), userOptions=opts)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": np.ascontiguousarray(x)}, anchors))
    return anchors[builder_out], session


def _last_activation(proto: bytes) -> str:
    graph = onnx.load_from_string(proto).graph
    return next(n for n in reversed(graph.node) if n.op_type == "Tanh").output[0]


def assert_weights_close(got: dict, want: dict, rtol: float = 1e-5, atol: float = 1e-7) -> None:
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=atol, err_msg=key)
