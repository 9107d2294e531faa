"""Replica-grouped variables (VariableSettings with several groups): each group of replicas
trains its own copy, gradients are all-reduced within the group only, and readWeights returns
what the VariableRetrievalMode asks. Compared with a numpy SGD run per group."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart

D, K, MB, RF = 3, 2, 2, 4
LR = 0.1
Mode = popart.VariableRetrievalMode
CG = popart.CommGroupType


def _groups(kind, size, n=RF):
    """The replica groups by the spec's definition (N replicas, group size k, m = N/k)."""
    if kind is CG.All:
        return [list(range(n))]
    if kind is CG.Ungrouped:
        return [[r] for r in range(n)]
    if kind is CG.Consecutive:
        return [list(range(s, s + size)) for s in range(0, n, size)]
    m = n // size
    return [list(range(first, n, m)) for first in range(m)]


def _build(w_host, b, settings, b_settings=None):
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    w = builder.addInitializedInputTensor(w_host, settings, "w")
    # b: shared by every replica unless b_settings groups it too
    bias = builder.addInitializedInputTensor(b, b_settings or popart.VariableSettings(), "b")
    y = builder.aiOnnx.add([builder.aiOnnx.matmul([x, w]), bias])
    loss = builder.aiGraphcore.identityloss(
        [builder.aiOnnx.reducesumsquare([y], keepdims=0)], reduction=popart.ReductionType.Sum)
    return builder.getModelProto(), loss


def _session(w_host, b, settings, bps=1, mean=False):
    proto, loss = _build(w_host, b, settings)
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = RF
    opts.accumulationAndReplicationReductionType = (
        popart.ReductionType.Mean if mean else popart.ReductionType.Sum)
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": RF})
    flow = popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")})
    s = popart.TrainingSession(proto, flow, loss, popart.ConstSGD(LR), device, userOptions=opts)
    s.prepareDevice()
    s.weightsFromHost()
    return s


def _reference(w_groups, b, xs, groups, mean=False):
    """numpy SGD on loss = sum((x @ w + b)^2) per replica: w_g trained on its group's data
    only, b on every replica's. ``xs``: [steps, RF, MB, D]."""
    w_groups, b = [w.astype(np.float64) for w in w_groups], b.astype(np.float64)
    group_of = {r: g for g, members in enumerate(groups) for r in members}
    for step in xs:
        grads_w = [np.zeros_like(w) for w in w_groups]
        grad_b = np.zeros_like(b)
        for r, x in enumerate(step.astype(np.float64)):
            g = group_of[r]
            dy = 2 * (x @ w_groups[g] + b)
            grads_w[g] += x.T @ dy
            grad_b += dy.sum(axis=0)
        for g, members in enumerate(groups):
            w_groups[g] -= LR * grads_w[g] / (len(members) if mean else 1)
        b -= LR * grad_b / (RF if mean else 1)
    return np.stack(w_groups), b


def _data(steps, seed=1):
    return np.random.default_rng(seed).standard_normal((steps, RF, MB, D)).astype(np.float32)


def _run(s, xs):
    for step in xs:
        s.run(popart.PyStepIO({"x": step}, s.initAnchorArrays()))


def _read(s, shape, dtype=np.float32):
    s.weightsToHost()
    out = {"w": np.zeros(shape, dtype), "b": np.zeros(K, dtype)}
    s.readWeights(popart.PyWeightsIO(out))
    return out


@pytest.mark.parametrize("kind,size", [(CG.Consecutive, 2), (CG.Orthogonal, 2),
                                       (CG.Ungrouped, 0)])
@pytest.mark.parametrize("mean", [False, True])
def test_each_group_trains_on_its_own_data(kind, size, mean):
    groups = _groups(kind, size)
    rng = np.random.default_rng(0)
    w_host = rng.standard_normal((len(groups), D, K)).astype(np.float32)
    b = rng.standard_normal(K).astype(np.float32)
    settings = popart.VariableSettings(popart.CommGroup(kind, size), Mode.OnePerGroup)
    s = _session(w_host, b, settings, mean=mean)
    xs = _data(3)
    _run(s, xs)
    want_w, want_b = _reference(list(w_host), b, xs, groups, mean)
    got = _read(s, w_host.shape)
    np.testing.assert_allclose(got["w"], want_w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["b"], want_b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", list(Mode))
def test_retrieval_modes(mode):
    groups = _groups(CG.Orthogonal, 2)
    rng = np.random.default_rng(2)
    w_host = rng.standard_normal((len(groups), D, K)).astype(np.float32)
    b = np.zeros(K, np.float32)
    s = _session(w_host, b, popart.VariableSettings(popart.CommGroup(CG.Orthogonal, 2), mode))
    # Before any run, what is read is the initial value in the mode's shape.
    every = np.stack([w_host[next(g for g, m in enumerate(groups) if r in m)]
                      for r in range(RF)])
    shape = (RF, D, K) if mode is Mode.AllReplicas else (len(groups), D, K)
    before = {"w": np.zeros(shape, np.float32)}
    s.readWeights(popart.PyWeightsIO(before))
    np.testing.assert_array_equal(before["w"], every if mode is Mode.AllReplicas else w_host)
    xs = _data(1, seed=3)
    _run(s, xs)
    want_w, _ = _reference(list(w_host), b, xs, groups)
    got = _read(s, shape)["w"]
    if mode is Mode.AllReplicas:
        want = np.stack([want_w[next(g for g, m in enumerate(groups) if r in m)]
                         for r in range(RF)])
    else:  # one value per group (AllReduceReplicas: the group's mean, equal in sync)
        want = want_w
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(popart.popart_exception, match="replica-grouped"):
        s.readWeights(popart.PyWeightsIO({"w": np.zeros((D, K), np.float32)}))


def test_write_weights_takes_the_grouped_shape():
    groups = _groups(CG.Consecutive, 2)
    w_host = np.zeros((2, D, K), np.float32)
    b = np.zeros(K, np.float32)
    settings = popart.VariableSettings(popart.CommGroup(CG.Consecutive, 2), Mode.AllReplicas)
    s = _session(w_host, b, settings)
    new = np.random.default_rng(4).standard_normal((2, D, K)).astype(np.float32)
    s.writeWeights(popart.PyWeightsIO({"w": new}))
    s.weightsFromHost()
    xs = _data(1, seed=5)
    _run(s, xs)
    want_w, _ = _reference(list(new), b, xs, groups)
    got = _read(s, (RF, D, K))["w"]
    np.testing.assert_allclose(got, want_w[[0, 0, 1, 1]], rtol=1e-4, atol=1e-5)
    with pytest.raises(popart.popart_exception, match="weight is float32"):
        s.writeWeights(popart.PyWeightsIO({"w": np.zeros((RF, D, K), np.float32)}))


def test_stride_form_and_initial_shape_errors():
    groups = [[0, 2], [1, 3]]  # stride 2, groups of 2: the orthogonal groups of 4 replicas
    rng = np.random.default_rng(6)
    w_host = rng.standard_normal((2, D, K)).astype(np.float32)
    b = np.zeros(K, np.float32)
    s = _session(w_host, b, popart.VariableSettings(2, 2, Mode.OnePerGroup))
    xs = _data(2, seed=7)
    _run(s, xs)
    want_w, _ = _reference(list(w_host), b, xs, groups)
    np.testing.assert_allclose(_read(s, w_host.shape)["w"], want_w, rtol=1e-4, atol=1e-5)
    grouped = popart.VariableSettings(popart.CommGroup(CG.Consecutive, 2))
    with pytest.raises(popart.popart_exception, match="leading dimension of 2"):
        _session(w_host[0], b, grouped)
    with pytest.raises(popart.popart_exception, match="divide the 4 replicas"):
        _session(w_host, b, popart.VariableSettings(popart.CommGroup(CG.Consecutive, 3)))



def _momentum_session(w_host, b, settings, rf):
    proto, loss = _build(w_host, b, settings, settings)
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs, opts.replicatedGraphCount = True, rf
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": rf})
    sgd = popart.SGD({"defaultLearningRate": (LR, True), "defaultMomentum": (0.9, True)})
    s = popart.TrainingSession(proto, popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}),
                               loss, sgd, device, userOptions=opts)
    s.prepareDevice()
    s.weightsFromHost()
    return s


def test_momentum_state_is_per_group_across_weight_writes():
    """Momentum SGD: each group keeps its own velocity, also when weightsToHost /
    weightsFromHost round-trip every variable between steps. Reference: one plain replicated
    session per group (rf = group size) on that group's data only."""
    groups = _groups(CG.Consecutive, 2)
    rng = np.random.default_rng(8)
    w_host = rng.standard_normal((2, D, K)).astype(np.float32)
    b = rng.standard_normal((2, K)).astype(np.float32)
    grouped = popart.VariableSettings(popart.CommGroup(CG.Consecutive, 2))
    s = _momentum_session(w_host, b, grouped, RF)
    alone = [_momentum_session(w_host[g], b[g], popart.VariableSettings(), 2)
             for g in range(2)]
    for step in _data(3, seed=9):
        s.run(popart.PyStepIO({"x": step}, s.initAnchorArrays()))
        s.weightsToHost()
        s.weightsFromHost()  # must not copy group 0's momentum into group 1
        for g, members in enumerate(groups):
            alone[g].run(popart.PyStepIO({"x": step[members]}, alone[g].initAnchorArrays()))
    want = [_read(a, (D, K)) for a in alone]
    s.weightsToHost()
    got = {"w": np.zeros_like(w_host), "b": np.zeros_like(b)}
    s.readWeights(popart.PyWeightsIO(got))
    for key in got:
        np.testing.assert_allclose(got[key], np.stack([w[key] for w in want]), rtol=1e-5,
                                   atol=1e-6, err_msg=key)
