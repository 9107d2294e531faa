"""A two-layer model for the replication tests, and a helper that trains it (spec §5.3).

``y = tanh(relu(x @ w0 + b0) @ w1)``, loss ``l1loss(y, 0.5)`` with Mean or Sum reduction over
the micro-batch. With ``stages`` the first layer sits on IPU/stage 0 and the second with the
loss on IPU/stage 1 (pipelining). ``train`` runs one step and returns the weights and the
session; a single-replica run on the combined batch is the same call with rf = af = 1 and a
micro-batch ``af·rf`` times larger: the ``[bps, af, rf, mb, *S]`` layout makes that batch the
same samples.
"""

from __future__ import annotations

import contextlib

import numpy as np

import popart_backend as popart

D_IN, D_HID, D_OUT = 4, 5, 3


def params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w0": (rng.standard_normal((D_IN, D_HID)) * 0.5).astype(np.float32),
            "b0": (rng.standard_normal(D_HID) * 0.1).astype(np.float32),
            "w1": (rng.standard_normal((D_HID, D_OUT)) * 0.5).astype(np.float32)}


def model(p: dict[str, np.ndarray], mb: int, stages: bool = False, mean: bool = True):
    """(ModelProto, loss id)."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [mb, D_IN]), "x")
    ids = {k: builder.addInitializedInputTensor(v, k) for k, v in p.items()}

    def place(ipu: int):
        stack = contextlib.ExitStack()
        if stages:
            stack.enter_context(builder.virtualGraph(ipu))
            stack.enter_context(builder.pipelineStage(ipu))
        return stack

    with place(0):
        h = builder.aiOnnx.matmul([x, ids["w0"]])
        h = builder.aiOnnx.relu([builder.aiOnnx.add([h, ids["b0"]])])
    with place(1):
        y = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, ids["w1"]])])
        reduction = popart.ReductionType.Mean if mean else popart.ReductionType.Sum
        loss = builder.aiGraphcore.l1loss([y], 0.5, reduction=reduction)
    return builder.getModelProto(), loss


def options(rf: int = 1, af: int = 1, stages: bool = False, mean: bool = True,
            strategy=popart.MeanReductionStrategy.Post) -> popart.SessionOptions:
    opts = popart.SessionOptions()
    if rf > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = rf
    if af > 1:
        opts.enableGradientAccumulation = True
        opts.accumulationFactor = af
    if stages:
        opts.virtualGraphMode = popart.VirtualGraphMode.Manual
        opts.enablePipelining = True
    opts.accumulationAndReplicationReductionType = (
        popart.ReductionType.Mean if mean else popart.ReductionType.Sum)
    opts.meanAccumulationAndReplicationReductionStrategy = strategy
    return opts


def momentum_sgd():
    return popart.SGD({"defaultLearningRate": (0.1, False), "defaultMomentum": (0.9, True),
                       "defaultWeightDecay": (0.01, True)})


def session(p, mb: int, bps: int, opts: popart.SessionOptions, stages: bool = False,
            mean: bool = True, optimizer=None, anchors=(), ipus: int | None = None,
            device=None):
    """A prepared TrainingSession with its weights written: (session, loss id). Default
    device: an IPU model with ``ipus`` IPUs (default rf, times 2 when pipelined)."""
    proto, loss = model(p, mb, stages, mean)
    rf = opts.replicatedGraphCount if opts.enableReplicatedGraphs else 1
    ipus = ipus or rf * (2 if stages else 1)
    if device is None:
        device = popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus})
    flow = popart.DataFlow(bps, {a: popart.AnchorReturnType("All") for a in (loss, *anchors)})
    s = popart.TrainingSession(proto, flow, loss, optimizer or momentum_sgd(), device,
                               userOptions=opts)
    s.prepareDevice()
    s.weightsFromHost()
    return s, loss


def read_weights(s, p) -> dict[str, np.ndarray]:
    s.weightsToHost()
    out = {k: np.zeros_like(v) for k, v in p.items()}
    s.readWeights(popart.PyWeightsIO(out))
    return out


def train(p, x: np.ndarray, mb: int, bps: int, opts: popart.SessionOptions,
          stages: bool = False, mean: bool = True, optimizer=None, anchors=()):
    """One run on ``x``: (weights by id, anchors, session)."""
    s, _ = session(p, mb, bps, opts, stages, mean, optimizer, anchors)
    out = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": np.ascontiguousarray(x)}, out))
    return read_weights(s, p), out, s


def assert_weights_close(got: dict, want: dict, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=atol, err_msg=key)
