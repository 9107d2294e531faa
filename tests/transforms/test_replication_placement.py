"""Where the replication passes put the gradient collectives (spec §5.3, §10.4; F71, F109): in a
pipelined model over 2 IPUs per replica, each weight's all-reduce (and, with replicated tensor
sharding, its reduce-scatter) runs on the weight's IPU, and the memory and cycle models charge
it there."""

from __future__ import annotations

import pytest

import popart_backend as popart
from popart_backend.ir.tensor import TensorKind
from tests.session.pipeline_models import chain_weights, device, options, chain_model

COLLECTIVES = ("ReplicatedAllReduce", "ReplicatedReduceScatter")


def _session(rts: bool):
    proto, loss, ids = chain_model(chain_weights(4, seed=3), 2)
    opts = options(ipus=2, pipelined=True, af=4, enableReplicatedGraphs=True,
                   replicatedGraphCount=2, engineOptions={"autoReport.all": "true"})
    optimizer = popart.ConstSGD(0.1)
    if rts:
        optimizer = popart.SGD({"defaultLearningRate": (0.1, True),
                                "defaultMomentum": (0.9, True)})
        opts.optimizerStateTensorLocationSettings = popart.TensorLocationSettings(
            popart.TensorLocation(popart.TensorStorage.OnChip,
                                  popart.ReplicatedTensorSharding.On), 0, 0)
    flow = popart.DataFlow(1, {loss: popart.AnchorReturnType("All")})
    session = popart.TrainingSession(proto, flow, loss, optimizer, device(4), userOptions=opts)
    session.prepareDevice()
    return session, ids


def _weight_of(op, weights) -> str:
    """The weight whose gradient (or accumulator) the collective reduces."""
    source = op.inputs[0].id
    return next(w for w in weights if source == w or source.endswith(f"___{w}")
                or f"___{w}/" in source)


def _weight_ipu(graph, weight: str) -> int:
    ipus = {op.settings.ipu for op in graph.tensors[weight].consumers
            if op.op_type in ("MatMul", "ReplicatedAllGather")}
    assert len(ipus) == 1, (weight, ipus)
    return ipus.pop()


@pytest.mark.parametrize("rts", [False, True])
def test_gradient_collectives_run_on_their_weights_ipu_F71(rts):
    session, weights = _session(rts)
    graph = session.getIr().main
    collectives = [op for op in graph.ops.values() if op.op_type in COLLECTIVES
                   and not (op.op_type == "ReplicatedReduceScatter" and op.attrs.local)]
    if rts:  # the sharded update: local slice, update, all-gather, copy into the weight
        for w in weights:
            (local,) = [op for op in graph.tensors[w].consumers
                        if op.op_type == "ReplicatedReduceScatter"]
            (update,) = local.outputs[0].consumers
            (gather,) = update.outputs[0].consumers
            (copy,) = gather.outputs[0].consumers
            for op in (local, update, gather, copy):
                assert op.settings.ipu == _weight_ipu(graph, w), (w, op)
                # Once per weight update, not per micro-batch: nothing gathered is stashed.
                assert op.settings.execution_context.name == "AccumulateOuterFragment"
            cycles = {c.op_id: c for c in session.getReport().model.cycles.ops}
            assert cycles[local.id].collective_cycles == 0  # a local slice
            assert cycles[gather.id].collective_cycles > 0
        assert not [op for op in graph.ops_of_type("Stash")
                    if op.inputs[-1].producer is not None
                    and op.inputs[-1].producer.op_type == "ReplicatedAllGather"]
    reduced = {_weight_of(op, weights) for op in collectives}
    assert reduced == set(weights)
    expected = {0: {"w0", "w1"}, 1: {"w2", "w3"}}  # chain_model: 2 layers per IPU
    assert {w: _weight_ipu(graph, w) for w in weights} == {
        w: ipu for ipu, ws in expected.items() for w in ws}
    for op in collectives:
        assert op.settings.ipu == _weight_ipu(graph, _weight_of(op, weights)), op

    report = session.getReport().model
    by_ipu = {m.ipu: {t.id for t in m.tensors} for m in report.memory.ipus}
    for op in collectives:
        ipu = _weight_ipu(graph, _weight_of(op, weights))
        other = 1 - ipu
        # Its input and output are stored on the weight's IPU only.
        for t in (*op.inputs, *op.outputs):
            assert t.id in by_ipu[ipu], (t.id, ipu)
            assert t.id not in by_ipu[other], (t.id, other)
        if op.inputs[0].kind is TensorKind.VARIABLE:  # the accumulator
            assert op.inputs[0].id not in by_ipu[other]
    cycles = {c.op_id: c for c in report.cycles.ops}
    for op in collectives:
        assert cycles[op.id].ipu == op.settings.ipu
        assert cycles[op.id].collective_cycles > 0  # busy on the IPU-Links of that IPU
