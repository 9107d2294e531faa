"""The gradient all-reduce pass and the ReplicatedAllReduce collective (spec §5.3, §10.4;
F71, F73, F110): where the pass puts the collective, the CommGroup replica groups, and the
builder's ``replicatedallreduce`` on a replicated device, checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.ir.op import ExecutionContext
from popart_backend.ops.collectives import replica_groups
from popart_backend.transforms.replication import ALLREDUCED_SUFFIX
from tests.session.replication_models import options, params, session

ALL, CONSECUTIVE, ORTHOGONAL, UNGROUPED = (t.value for t in (
    popart.CommGroupType.All, popart.CommGroupType.Consecutive, popart.CommGroupType.Orthogonal,
    popart.CommGroupType.Ungrouped))


def _reduces(s):
    return [op for op in s.getIr().main.ops.values() if op.op_type == "ReplicatedAllReduce"]


def test_all_reduce_feeds_the_optimizer_every_micro_batch_without_accumulation():
    s, _ = session(params(), 2, 1, options(rf=2))
    reduces = _reduces(s)
    assert sorted(op.inputs[0].id for op in reduces) == [
        "Gradient___b0", "Gradient___w0", "Gradient___w1"]
    for op in reduces:
        assert op.settings.execution_context is ExecutionContext.Normal
        out = op.outputs[0]
        assert out.id == op.inputs[0].id + ALLREDUCED_SUFFIX
        assert out.consumers and all("SGD" in c.op_type for c in out.consumers)


def test_all_reduce_runs_once_per_update_on_the_accumulator():
    s, _ = session(params(), 2, 1, options(rf=2, af=3))
    reduces = _reduces(s)
    assert sorted(op.inputs[0].id for op in reduces) == ["Accum___b0", "Accum___w0",
                                                         "Accum___w1"]
    assert all(op.settings.execution_context is ExecutionContext.AccumulateOuterFragment
               for op in reduces)


def test_no_all_reduce_with_one_replica():
    s, _ = session(params(), 2, 1, options(af=2))
    assert not _reduces(s)


@pytest.mark.parametrize("group,expected", [
    (None, [[0, 1, 2, 3, 4, 5, 6, 7]]),
    ((ALL, 0), [[0, 1, 2, 3, 4, 5, 6, 7]]),
    ((CONSECUTIVE, 2), [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ((CONSECUTIVE, 4), [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ((ORTHOGONAL, 2), [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ((ORTHOGONAL, 4), [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ((UNGROUPED, 0), [[r] for r in range(8)]),
])
def test_comm_group_replica_groups_F110(group, expected):
    assert replica_groups(group, 8) == expected


@pytest.mark.parametrize("group", [(CONSECUTIVE, 3), (ORTHOGONAL, 0), (CONSECUTIVE, -1)])
def test_comm_group_size_must_divide_the_replicas_F110(group):
    with pytest.raises(popart.popart_exception, match="does not split the 8 replicas"):
        replica_groups(group, 8)


def _allreduce_inference(rf: int, comm_group, x: np.ndarray) -> np.ndarray:
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    a = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    y = builder.aiGraphcore.replicatedallreduce([a], commGroup=comm_group)
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = rf
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": rf})
    s = popart.InferenceSession(builder.getModelProto(),
                                popart.DataFlow(2, {y: popart.AnchorReturnType("All")}), device,
                                userOptions=opts)
    s.prepareDevice()
    out = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": x}, out))
    return out[y]


@pytest.mark.parametrize("comm_group", [
    None,
    popart.CommGroup(popart.CommGroupType.Consecutive, 2),
    popart.CommGroup(popart.CommGroupType.Orthogonal, 2),
    popart.CommGroup(popart.CommGroupType.Ungrouped, 0),
], ids=["All", "Consecutive2", "Orthogonal2", "Ungrouped"])
def test_builder_replicatedallreduce_sums_over_its_group_F110(comm_group):
    rf, bps = 4, 2
    x = np.random.default_rng(0).standard_normal((bps, rf, 2, 3)).astype(np.float32)
    got = _allreduce_inference(rf, comm_group, x)
    key = None if comm_group is None else (comm_group.type.value, comm_group.replicaGroupSize)
    want = np.zeros_like(x)
    for group in replica_groups(key, rf):
        total = x[:, group].sum(axis=1)
        for r in group:
            want[:, r] = total
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_builder_replicatedallreduce_on_one_replica_is_the_identity():
    x = np.arange(12, dtype=np.float32).reshape(2, 1, 2, 3)
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    a = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    y = builder.aiGraphcore.replicatedallreduce([a])
    s = popart.InferenceSession(builder.getModelProto(),
                                popart.DataFlow(2, {y: popart.AnchorReturnType("All")}),
                                popart.DeviceManager().createCpuDevice())
    s.prepareDevice()
    out = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": x}, out))
    np.testing.assert_array_equal(out[y], x.reshape(2, 2, 3))


def test_replicatedallreduce_gradient_is_the_all_reduce_of_the_output_gradient():
    # y_r = allreduce(x_r @ w); loss_r = sum(y_r) (Sum). dL/dy_r = 1 on every replica, so the
    # gradient of w on replica r is x_r^T @ allreduce(1) = x_r^T @ rf; summed over replicas:
    # rf · sum_r x_r^T @ 1.
    rf, lr = 2, 0.01
    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 2)).astype(np.float32)
    x = rng.standard_normal((1, rf, 4, 3)).astype(np.float32)
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    a = builder.addInputTensor(popart.TensorInfo("FLOAT", [4, 3]), "x")
    w_id = builder.addInitializedInputTensor(w, "w")
    with builder.commGroup(popart.CommGroupType.All, 0):
        y = builder.aiGraphcore.replicatedallreduce([builder.aiOnnx.matmul([a, w_id])])
    loss = builder.aiGraphcore.identityloss([y], reduction=popart.ReductionType.Sum)
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = rf
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": rf})
    s = popart.TrainingSession(builder.getModelProto(),
                               popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}),
                               loss, popart.ConstSGD(lr), device, userOptions=opts)
    s.prepareDevice()
    s.weightsFromHost()
    s.run(popart.PyStepIO({"x": x}, s.initAnchorArrays()))
    s.weightsToHost()
    got = np.zeros_like(w)
    s.readWeights(popart.PyWeightsIO({"w": got}))
    grad = sum(x[0, r].T @ np.full((4, 2), rf, np.float32) for r in range(rf))
    np.testing.assert_allclose(got, w - lr * grad, rtol=1e-5, atol=1e-6)
