"""Replicated tensor sharding: the shard layout, the sharding collectives and the IR rewrite of
``transforms/rts.py`` (spec §10.2 step 4, §10.3, §10.4; F109-F111). Training results are in
tests/session/test_rts_training.py."""

from __future__ import annotations

import logging

import pytest
import torch

import popart_backend as popart
from popart_backend.dtypes import DataType
from popart_backend.importer.onnx_model import import_model
from popart_backend.ir.graph import Graph
from popart_backend.ir.op import OpSettings
from popart_backend.ir.tensor import TensorInfo, TensorKind
from popart_backend.ops.collectives import shard_layout
from popart_backend.ops.registry import AI_GRAPHCORE, create_op
from popart_backend.options.enums import CommGroupType, ReplicatedTensorSharding
from popart_backend.options.structs import CommGroup
from popart_backend.transforms.pipeline import inference_passes, run_passes, training_passes
from tests.session import replication_models as rm

ON = ReplicatedTensorSharding.On


def test_F109_spec_example_5x2x3_over_4_replicas():
    layout = shard_layout(30, 4)
    assert layout.shard_size == 8
    assert layout.counts == (8, 8, 7, 7)  # two full shards, two with 7 elements + 1 pad
    x = torch.arange(1, 31, dtype=torch.float32).reshape(5, 2, 3)
    shards = layout.split(x)
    flat = x.reshape(-1)
    assert torch.equal(shards[0], flat[0:8]) and torch.equal(shards[1], flat[8:16])
    assert torch.equal(shards[2], torch.cat([flat[16:23], torch.zeros(1)]))
    assert torch.equal(shards[3], torch.cat([flat[23:30], torch.zeros(1)]))
    assert torch.equal(layout.join(list(shards), (5, 2, 3)), x)


@pytest.mark.parametrize("n, k", [(1, 4), (7, 2), (8, 4), (9, 4), (100, 3), (5, 5)])
def test_F109_layout_round_trips_and_pads_at_most_one_per_shard(n, k):
    layout = shard_layout(n, k)
    s = -(-n // k)
    assert layout.shard_size == s and sum(layout.counts) == n
    assert all(c in (s, s - 1) for c in layout.counts)
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    assert torch.equal(layout.join(list(layout.split(x)), (n,)), x)


def _collective(op_type, input_shape, comm_group=None, **attrs):
    """A one-op graph around a sharding collective: (op, output info)."""
    graph = Graph("g")
    graph.add_tensor("x", TensorInfo(DataType.FLOAT, input_shape), TensorKind.ACT_GRAD)
    op = create_op(op_type, attrs, OpSettings(name="c", comm_group=comm_group),
                   domain=AI_GRAPHCORE)
    graph.add_op(op, ["x"], ["y"])
    return op, graph.tensors["y"].info


def test_F110_reduce_scatter_sums_in_replica_order_and_scatters_within_groups():
    op, info = _collective("ReplicatedReduceScatter", (5, 2, 3),
                           (CommGroupType.Consecutive.value, 2), num_shards=2)
    assert info.shape == (15,)
    values = [torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(r)) for r in range(4)]
    out = op.reduce_replicas(values, 0, 4)
    for group in ([0, 1], [2, 3]):
        total = (values[group[0]] + values[group[1]]).reshape(-1)
        assert torch.equal(out[group[0]], total[:15]) and torch.equal(out[group[1]], total[15:])
    # A process holding replicas 2..3 gets only theirs.
    assert [t.shape for t in op.reduce_replicas(values, 2, 2)] == [(15,), (15,)]


def test_F110_local_reduce_scatter_keeps_each_replicas_own_shard_without_summing():
    """PopART's Local collective operator: replica r keeps shard r mod k of its own value."""
    op, info = _collective("ReplicatedReduceScatter", (5, 2, 3),
                           (CommGroupType.Consecutive.value, 4), num_shards=4, local=True)
    assert info.shape == (8,)
    values = [torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(r)) for r in range(4)]
    out = op.reduce_replicas(values, 0, 4)
    starts, counts = (0, 8, 16, 23), (8, 8, 7, 7)  # 30 elements: the last two shards pad once
    for r in range(4):
        real = values[r].reshape(-1)[starts[r]:starts[r] + counts[r]]
        assert torch.equal(out[r], torch.cat([real, torch.zeros(8 - counts[r])]))
    assert op.groups(4) == [[0], [1], [2], [3]]  # no exchange between replicas
    assert [t.shape for t in op.reduce_replicas(values, 2, 2)] == [(8,), (8,)]


def test_F110_all_gather_rebuilds_the_tensor_and_checks_the_group():
    op, info = _collective("ReplicatedAllGather", (8,), None, shape=(5, 2, 3), num_shards=4)
    assert info.shape == (5, 2, 3)
    x = torch.arange(30, dtype=torch.float32).reshape(5, 2, 3)
    shards = list(shard_layout(30, 4).split(x))
    for y in op.reduce_replicas(shards, 0, 4):
        assert torch.equal(y, x)
    with pytest.raises(popart.popart_exception, match="4 shards.*2 replicas"):
        op.reduce_replicas(shards[:2], 0, 2)
    with pytest.raises(popart.popart_exception, match=r"shards of shape \[8\]"):
        _collective("ReplicatedAllGather", (7,), None, shape=(5, 2, 3), num_shards=4)


def _rts_options(rf, af=1, domain=None, kinds=("weight", "optimizerState"), min_elements=4):
    opts = rm.options(rf, af)
    for kind in kinds:
        settings = getattr(opts, f"{kind}TensorLocationSettings")
        settings.minElementsForReplicatedTensorSharding = min_elements
        settings.location.replicatedTensorSharding = ON
        if domain is not None:
            settings.location.shardingDomain = domain
    return opts


def _ir(opts, rf, af=1, optimizer=None, mb=2):
    proto, loss = rm.model(rm.params(), mb)
    ir = import_model(proto)
    run_passes(ir, training_passes(opts, loss, optimizer or rm.momentum_sgd(), af, rf),
               debug=True)
    return ir


def _types(ir):
    return sorted(op.op_type for op in ir.main.ops.values())


def test_F110_optimizer_state_and_update_are_sharded_weights_stay_whole():
    """PopART's RTS: the gradient is reduce-scattered, each replica updates its shard of the
    weight (a local slice) with its shard of the state, and the updated shards are all-gathered
    and copied into the whole weight once per update."""
    ir = _ir(_rts_options(2), 2)
    sharded = ir.sharded_variables
    assert sorted(sharded) == ["Accl___b0", "Accl___w0", "Accl___w1"]
    graph = ir.main
    assert graph.tensors["w0"].info.shape == (rm.D_IN, rm.D_HID)
    assert graph.tensors["Accl___w1"].info.shape == (8,)  # 15 elements over 2
    assert graph.tensors["UpdatedVar___w0"].info.shape == (10,)
    assert sharded["Accl___w0"].full_info.shape == (rm.D_IN, rm.D_HID)
    types = _types(ir)
    assert "ReplicatedAllReduce" not in types
    # Per weight: the gradient's reduce-scatter, the local slice of the weight, one gather.
    assert types.count("ReplicatedReduceScatter") == 6 and types.count("ReplicatedAllGather") == 3
    update = graph.tensors["UpdatedVar___w0"].producer
    scatter, local = update.inputs[1].producer, update.inputs[0].producer
    assert scatter.op_type == local.op_type == "ReplicatedReduceScatter"
    assert not scatter.attrs.local and local.attrs.local and local.inputs[0].id == "w0"
    assert local.groups(2) == [[0], [1]]  # nothing crosses the links
    (gather,) = update.outputs[0].consumers
    assert gather.op_type == "ReplicatedAllGather"
    (copy,) = gather.outputs[0].consumers
    assert copy.op_type == "CopyVarUpdate" and copy.inputs[0].id == "w0"
    assert ir.optimizer_tensors.updated["w0"] == copy.outputs[0].id
    # Forward and backward ops read the whole weight, not a gathered copy.
    readers = {op.op_type for op in graph.tensors["w0"].consumers}
    assert "ReplicatedAllGather" not in readers
    assert graph.tensors["w0"].data.shape == (rm.D_IN, rm.D_HID)


def test_F110_rts_collectives_run_once_per_weight_update_in_the_outer_fragment():
    ir = _ir(_rts_options(2, 3), 2, 3)
    outer = {"ReplicatedReduceScatter", "ReplicatedAllGather", "CopyVarUpdate", "SGDUpdate"}
    for op in ir.main.ops.values():
        if op.op_type in outer:
            assert op.settings.execution_context.name == "AccumulateOuterFragment", op.name


def test_F111_consecutive_domain_reduce_scatters_in_groups_then_all_reduces_across():
    ir = _ir(_rts_options(4, domain=CommGroup(CommGroupType.Consecutive, 2)), 4)
    assert ir.sharded_variables["Accl___w0"].num_shards == 2
    update = ir.main.tensors["UpdatedVar___w0"].producer
    across = update.inputs[1].producer
    assert across.op_type == "ReplicatedAllReduce"
    assert across.settings.comm_group == (CommGroupType.Orthogonal.value, 2)
    scatter = across.inputs[0].producer
    assert scatter.op_type == "ReplicatedReduceScatter"
    assert scatter.groups(4) == [[0, 1], [2, 3]]


def test_F110_accumulators_shard_on_their_own_and_reduce_every_micro_batch():
    ir = _ir(_rts_options(2, 3, kinds=("accumulator",)), 2, 3)
    assert sorted(ir.sharded_variables) == ["Accum___b0", "Accum___w0", "Accum___w1"]
    graph = ir.main
    accumulate = next(op for op in graph.tensors["Accum___w0"].consumers
                      if op.op_type == "Accumulate")
    assert accumulate.inputs[1].producer.op_type == "ReplicatedReduceScatter"
    assert accumulate.inputs[1].producer.settings.execution_context.name == "Normal"
    # The update is not sharded: it reads the gathered accumulator, whole.
    update = graph.tensors["UpdatedVar___w0"].producer
    assert update.inputs[1].producer.op_type == "ReplicatedAllGather"
    assert update.inputs[1].info.shape == (rm.D_IN, rm.D_HID)


def test_F109_small_tensors_and_no_replication_stay_whole(caplog):
    ir = _ir(_rts_options(2, min_elements=16), 2)
    assert sorted(ir.sharded_variables) == ["Accl___w0"]  # 20 elements; b0 5, w1 15
    with caplog.at_level(logging.WARNING, logger="popart:transform"):
        ir = _ir(_rts_options(1), 1)
    assert ir.sharded_variables == {}
    assert "Unable to shard tensor w0 due to lack of replication" in caplog.text


def test_F109_weight_sharding_shards_its_optimizer_state_and_update():
    ir = _ir(_rts_options(2, kinds=("weight",)), 2)
    assert {"Accl___w0", "Accl___w1"} <= set(ir.sharded_variables)
    assert "w0" not in ir.sharded_variables
    assert ir.main.tensors["UpdatedVar___w0"].info.shape == (10,)


def test_F109_weights_without_an_update_stay_whole_and_say_so(caplog):
    opts = _rts_options(2, kinds=("weight",))
    proto, _ = rm.model(rm.params(), 2)
    ir = import_model(proto)
    with caplog.at_level(logging.WARNING, logger="popart:transform"):
        run_passes(ir, inference_passes(opts), debug=True)
    assert ir.sharded_variables == {}
    assert ir.main.tensors["w0"].info.shape == (rm.D_IN, rm.D_HID)
    assert "replicatedTensorSharding has no effect" in caplog.text and "w0" in caplog.text


def _distributed(opts, global_rf):
    opts.enableDistributedReplicatedGraphs = True
    opts.globalReplicationFactor = global_rf
    opts.globalReplicaOffset = 0
    return opts


def test_F111_sharding_domain_constraints_with_several_instances():
    with pytest.raises(popart.popart_exception, match=r"CommGroup\(All\) is not supported with 2 "
                                                      r"instances.*Consecutive, 2\)"):
        _ir(_distributed(_rts_options(2), 4), 4)
    opts = _distributed(_rts_options(2, domain=CommGroup(CommGroupType.Consecutive, 4)), 8)
    with pytest.raises(popart.popart_exception, match="must have the size of the local "
                                                      "replicas, 2"):
        _ir(opts, 8)
    opts = _distributed(_rts_options(2, domain=CommGroup(CommGroupType.Consecutive, 2)), 4)
    ir = _ir(opts, 4)
    assert ir.sharded_variables["Accl___w0"].num_shards == 2


def test_F111_unsupported_domains_and_mismatched_domains_raise():
    with pytest.raises(popart.popart_exception, match="not Orthogonal"):
        _ir(_rts_options(4, domain=CommGroup(CommGroupType.Orthogonal, 2)), 4)
    with pytest.raises(popart.popart_exception, match="replicaGroupSize=3.*divides 4"):
        _ir(_rts_options(4, domain=CommGroup(CommGroupType.Consecutive, 3)), 4)
    opts = _rts_options(4)
    opts.optimizerStateTensorLocationSettings.location.shardingDomain = CommGroup(
        CommGroupType.Consecutive, 2)
    with pytest.raises(popart.popart_exception, match="must share a sharding domain"):
        _ir(opts, 4)


def test_F110_sharded_lamb_sums_its_shard_norms_over_the_domain():
    lamb = popart.Adam({"defaultLearningRate": (0.01, True)}, mode=popart.AdamMode.Lamb)
    ir = _ir(_rts_options(4, domain=CommGroup(CommGroupType.Consecutive, 2)), 4, optimizer=lamb)
    graph = ir.main
    probes = list(graph.ops_of_type("LambSquareNorms"))
    assert len(probes) == len(ir.sharded_variables) // 2  # one per weight (Accl1, Accl2)
    for probe in probes:
        reduce_op = probe.outputs[0].consumers[0]
        assert reduce_op.op_type == "ReplicatedAllReduce"
        assert reduce_op.settings.comm_group == (CommGroupType.Consecutive.value, 2)
        (update,) = reduce_op.outputs[0].consumers
        assert update.op_type == "AdamUpdate" and update.attrs.sharded_norms
        assert update.inputs[-1] is reduce_op.outputs[0]
        assert probe.inputs == update.inputs[:-1] and not probe.modifies_inputs


def test_F110_clipping_sharded_gradients_all_reduces_their_square_sums():
    clipped = popart.SGD({"defaultLearningRate": (0.1, True)},
                         clip_norm_settings=[popart.ClipNormSettings.clipAllWeights(1.0)])
    ir = _ir(_rts_options(2), 2, optimizer=clipped)
    (clip,) = ir.main.ops_of_type("GlobalNormClipFactor")
    (squares,) = ir.main.ops_of_type("GradientSquareSum")
    assert clip.attrs.square_sums == 1
    summed = squares.outputs[0].consumers[0]
    assert summed.op_type == "ReplicatedAllReduce" and summed.outputs[0] in clip.inputs
    # The sharded gradients (reduce-scattered) feed the sum of squares, not the factor.
    assert {t.producer.op_type for t in squares.inputs} == {"ReplicatedReduceScatter"}
    assert all(t.producer.op_type != "ReplicatedReduceScatter" for t in clip.inputs)
