"""``getCycleCount("ipu<N>")`` counts the cycles IPU N is busy in a step (F56; device/analysis.py),
and collectives under global replication span every process's replicas (spec §5.3, F71;
device/cost.py).

References: busy cycles summed here from the per-op, per-copy costs the model reports and the
number of times the spec runs each fragment (a pipeline stage G times per run, a micro-batch
bps·af times, the weight update bps times); the ring all-reduce formula 2(k−1)/k · bytes over
the IPU-Link bandwidth plus an IPU sync.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.device.analysis import analyse
from popart_backend.device.cost import collective_replicas
from popart_backend.device.transfers import BatchInfo
from popart_backend.ir.op import ExecutionContext

NORMAL = ExecutionContext.Normal
OUTER = ExecutionContext.AccumulateOuterFragment
D, MB = 128, 16


def _run(af: int, bps: int, pipelined: bool):
    """A 3-layer MatMul/Tanh chain over 3 IPUs, trained, one run with the cycle counter on."""
    b = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    h = b.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    rng = np.random.default_rng(0)
    for k in range(3):
        w = b.addInitializedInputTensor(
            (rng.standard_normal((D, D)) * 0.1).astype(np.float32), f"w{k}")
        with b.virtualGraph(k), b.pipelineStage(k) if pipelined else contextlib.nullcontext():
            h = b.aiOnnx.tanh([b.aiOnnx.matmul([h, w])])
            if k == 2:
                loss = b.aiGraphcore.l1loss([h], 0.5)
    opts = popart.SessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    opts.enablePipelining = pipelined
    opts.enableGradientAccumulation = True
    opts.accumulationFactor = af
    opts.instrumentWithHardwareCycleCounter = True
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": 3, "tilesPerIPU": 4})
    s = popart.TrainingSession(
        b.getModelProto(), popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")}), loss,
        popart.ConstSGD(0.1), device, userOptions=opts)
    s.prepareDevice()
    s.weightsFromHost()
    anchors = s.initAnchorArrays()
    x = rng.standard_normal((bps, af, MB, D)).astype(np.float32)
    s.run(popart.PyStepIO({"x": x}, anchors))
    return s


def _fragment_busy(c, context, ipu: int, link_sync: bool) -> int:
    """One execution of a fragment on ``ipu``: its ops, the copies it sends or receives (with
    their own sync unless a pipeline cycle's sync covers them), its remote transfers."""
    ops = sum(o.cycles for o in c.ops if o.context is context and o.ipu == ipu)
    links = sum(t.link_cycles + (t.sync_cycles if link_sync else 0) for t in c.links
                if t.context is context and ipu in (t.src_ipu, t.dst_ipu))
    remote = sum(r.cycles for r in c.remote if r.context is context and r.ipu == ipu)
    return ops + links + remote


def test_F56_pipelined_ipu_counts_are_busy_cycles_of_the_cycle_table():
    af, bps = 6, 2
    s = _run(af, bps, pipelined=True)
    c = s._device_model.cycles
    p = c.pipeline
    assert (p.info.num_stages, p.info.depth, p.info.runs_per_step) == (5, af, bps)
    for i in range(3):
        # Every stage runs G times per run; the weight update once per run.
        want = (bps * af * _fragment_busy(c, NORMAL, i, link_sync=False)
                + bps * _fragment_busy(c, OUTER, i, link_sync=True))
        assert s.getCycleCount(f"ipu{i}") == want > 0
        # Each IPU is busy only part of the step; the IPUs overlap.
        assert want < s.getCycleCount()
    assert sum(s.getCycleCount(f"ipu{i}") for i in range(3)) > s.getCycleCount()


def test_F56_sharded_ipu_counts_take_turns_and_count_copies_on_both_ends():
    af, bps = 2, 2
    s = _run(af, bps, pipelined=False)
    c = s._device_model.cycles
    assert c.pipeline is None
    busy = {i: s.getCycleCount(f"ipu{i}") for i in range(3)}
    for i in range(3):
        assert busy[i] == (bps * af * _fragment_busy(c, NORMAL, i, link_sync=True)
                           + bps * _fragment_busy(c, OUTER, i, link_sync=True))
    # Serial: the IPUs' counts add up to the step without its host transfers, plus each copy
    # once more (both ends count it).
    step = s.getCycleCount()
    host = bps * af * c.host_input_cycles + c.host_anchor_cycles
    twice = (bps * af * sum(t.cycles for t in c.links if t.context is NORMAL)
             + bps * sum(t.cycles for t in c.links if t.context is OUTER))
    assert twice > 0
    assert sum(busy.values()) == step - host + twice
    # The op-only view leaves the copies out.
    ops = c.ipu_cycles()
    assert all(ops[i] < busy[i] for i in range(3))


def test_F56_unknown_ipu_id_names_the_known_counters():
    s = _run(2, 1, pipelined=False)
    with pytest.raises(popart.popart_exception,
                       match=r"unknown cycle counter id 'ipu3'. Known: \"\", \"ipu0\", \"ipu1\", "
                             r"\"ipu2\""):
        s.getCycleCount("ipu3")


def _options(local: int, distributed: int | None) -> popart.SessionOptions:
    opts = popart.SessionOptions()
    if local > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = local
    if distributed is not None:
        opts.enableDistributedReplicatedGraphs = True
        opts.globalReplicationFactor = distributed
        opts.globalReplicaOffset = 0
    return opts


def test_collective_replicas_follow_the_global_replication_factor():
    assert collective_replicas(None, 2) == 2
    assert collective_replicas(_options(2, None), 2) == 2
    assert collective_replicas(_options(2, 8), 2) == 8
    assert collective_replicas(_options(1, 4), 1) == 4


def _replicated(rf: int):
    """y = tanh(x @ w) with w [256, 256], l1 loss, SGD, ``rf`` local replicas on one IPU each:
    (session, its program's schedule). The gradient of w (256 KiB) is all-reduced."""
    b = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 256]), "x")
    w = b.addInitializedInputTensor(
        np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32), "w")
    loss = b.aiGraphcore.l1loss([b.aiOnnx.tanh([b.aiOnnx.matmul([x, w])])], 0.5)
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": rf, "tilesPerIPU": 16})
    s = popart.TrainingSession(
        b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
        popart.ConstSGD(0.1), device, userOptions=_options(rf, None))
    s.prepareDevice()
    return s


@pytest.mark.parametrize("grf", [4, 8])
def test_F71_global_replication_all_reduce_rings_over_all_replicas(grf):
    """Two local replicas of a ``grf``-replica job: the gradient all-reduce's ring spans all
    ``grf`` replicas (options only; no other process is started)."""
    s = _replicated(2)
    program = s._program
    local = s._device_model
    model = analyse(s._ir, s._device.plan.order, s._device_info, _options(2, grf),
                    BatchInfo.from_program(program), program=program)
    spec = model.spec
    nbytes = 256 * 256 * 4

    def ring(k: int) -> int:
        return (math.ceil(2 * (k - 1) / k * nbytes / spec.ipu_link_bytes_per_s * spec.clock_hz)
                + spec.ipu_sync_latency_cycles)

    (mine,) = [o for o in local.cycles.ops if o.op_type == "ReplicatedAllReduce"]
    (glob,) = [o for o in model.cycles.ops if o.op_type == "ReplicatedAllReduce"]
    assert mine.collective_cycles == ring(2) < glob.collective_cycles == ring(grf)
    # Host data stay per process: the batch (and samples per step) are the local replicas'.
    assert model.cycles.batch.replication_factor == 2
    assert model.cycle_count() - local.cycle_count() == ring(grf) - ring(2)
