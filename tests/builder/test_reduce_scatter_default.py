"""``aiGraphcore.replicatedreducescatter`` without a commGroup (or with ``CommGroup()``)
reduce-scatters over all the session's replicas, as in PopART; checked against numpy for the
forward and, through a gradient anchor, for its gradient (the all-gather)."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart

GRAD = popart.reservedGradientPrefix()


def _options(replicas: int) -> popart.SessionOptions:
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs = replicas > 1
    opts.replicatedGraphCount = replicas
    return opts


def _shards(total: np.ndarray, replicas: int) -> np.ndarray:
    """numpy, the sharded layout of ops/collectives.py: shards of s = ceil(n/k) elements; the
    first n - k(s-1) hold s real elements, the others s - 1 and one zero pad."""
    flat, k = total.reshape(-1), replicas
    s = -(-flat.size // k)
    full = flat.size - k * (s - 1)
    rows, start = [], 0
    for j in range(k):
        count = s if j < full else s - 1
        rows.append(np.concatenate([flat[start:start + count], np.zeros(s - count, np.float32)]))
        start += count
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("replicas", [1, 2, 4])
@pytest.mark.parametrize("group", ["none", "CommGroup()"])
def test_reduce_scatter_defaults_to_all_replicas(replicas, group):
    x = np.random.default_rng(replicas).standard_normal((replicas, 2, 3)).astype(np.float32)
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    a = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    kwargs = {} if group == "none" else {"commGroup": popart.CommGroup()}
    y = builder.aiGraphcore.replicatedreducescatter([a], **kwargs)
    session = popart.InferenceSession(
        builder.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}),
        popart.DeviceManager().createIpuModelDevice({"numIPUs": replicas}),
        userOptions=_options(replicas))
    assert session.getInfo(y).shape() == [-(-6 // replicas)]
    session.prepareDevice()
    out = session.initAnchorArrays()
    feed = x if replicas > 1 else x[0]
    session.run(popart.PyStepIO({"x": feed}, out))
    want = _shards(x.sum(axis=0), replicas)
    np.testing.assert_allclose(out[y].reshape(want.shape), want, rtol=1e-6, atol=1e-6)


def test_reduce_scatter_default_gradient_is_the_all_gather():
    replicas = 2
    rng = np.random.default_rng(7)
    x = rng.standard_normal((replicas, 5)).astype(np.float32)
    w0 = rng.standard_normal(5).astype(np.float32)
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    a = builder.addInputTensor(popart.TensorInfo("FLOAT", [5]), "x")
    w = builder.addInitializedInputTensor(w0, "w")
    h = builder.aiOnnx.mul([a, w])
    y = builder.aiGraphcore.replicatedreducescatter([h])
    loss = builder.aiGraphcore.l1loss([y], 1.0, reduction=popart.ReductionType.Sum)
    session = popart.TrainingSession(
        builder.getModelProto(),
        popart.DataFlow(1, {y: popart.AnchorReturnType("All"),
                            GRAD + h: popart.AnchorReturnType("All")}),
        loss, popart.ConstSGD(0.0),
        popart.DeviceManager().createIpuModelDevice({"numIPUs": replicas}),
        userOptions=_options(replicas))
    session.prepareDevice()
    session.weightsFromHost()
    out = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, out))
    shards = _shards((x * w0).sum(axis=0), replicas)  # shards of 3 and 2 + a pad
    np.testing.assert_allclose(out[y], shards, rtol=1e-6, atol=1e-6)
    # d loss / d shard = sign(shard) on each replica; the all-gather hands every replica the
    # whole gradient (pad dropped), the same on each.
    full = np.concatenate([np.sign(shards[0]), np.sign(shards[1][:2])])
    np.testing.assert_allclose(out[GRAD + h], np.stack([full, full]), rtol=1e-6, atol=1e-6)
