"""Pipeline timing in the cycle model (device/cost.py; spec §5.1, §5.3, §5.4, F56, F62, F77).

A pipelined step is timed by its cycle table: per cycle, each IPU runs the active stages it
hosts serially, the cycle lasts as long as the busiest IPU plus one sync, and the device's
SyncPattern decides which IPUs wait for host transfers. The references below are written from
the spec's cycle table and the per-op costs the model reports, not from the model's own
per-cycle numbers. Sharded (unpipelined) programs stay serial; replicas add the ring
all-reduce over the IPU-Links.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.ir.op import ExecutionContext
from popart_backend.report.report import Report
from popart_backend.report.summary import summary_text
from tests.session import replication_models as rm

NORMAL = ExecutionContext.Normal


def _chain(d: int, mb: int, layers: int, staged: bool, loss: bool):
    """``layers`` x (MatMul, Tanh) on [mb, d]; layer k on IPU/stage k when ``staged``.
    Returns (ModelProto, the loss (training) or the last activation (inference))."""
    b = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    h = b.addInputTensor(popart.TensorInfo("FLOAT", [mb, d]), "x")
    rng = np.random.default_rng(0)
    out = h
    for k in range(layers):
        w = b.addInitializedInputTensor(
            (rng.standard_normal((d, d)) * 0.1).astype(np.float32), f"w{k}")
        with b.virtualGraph(k), b.pipelineStage(k) if staged else contextlib.nullcontext():
            h = b.aiOnnx.tanh([b.aiOnnx.matmul([h, w])])
            out = b.aiGraphcore.l1loss([h], 0.5) if loss and k == layers - 1 else h
    return b.getModelProto(), out


def _options(pipelined: bool, af: int = 1) -> popart.SessionOptions:
    opts = popart.SessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    opts.enablePipelining = pipelined
    if af > 1:
        opts.enableGradientAccumulation = True
        opts.accumulationFactor = af
    return opts


def _device(ipus: int, tiles: int, pattern: str | None = None):
    if pattern is None:
        return popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus, "tilesPerIPU": tiles})
    return popart.DeviceManager().createOfflineIPUDevice(
        {"numIPUs": ipus, "tilesPerIPU": tiles, "syncPattern": pattern})


def _training(af: int = 16, d: int = 256, tiles: int = 4, pattern: str | None = None,
              pipelined: bool = True, bps: int = 1):
    proto, loss = _chain(d, 16, 4, staged=pipelined, loss=True)
    s = popart.TrainingSession(
        proto, popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")}), loss,
        popart.ConstSGD(0.1), _device(4, tiles, pattern), userOptions=_options(pipelined, af))
    s.prepareDevice()
    return s


def _stage_costs(cycles) -> tuple[dict[int, int], dict[int, int]]:
    """(per stage: cycles of its compute ops, per stage: its IPU) from the op list."""
    cost: dict[int, int] = {}
    ipu: dict[int, int] = {}
    for o in cycles.ops:
        if o.context is NORMAL and not o.between_cycles:
            cost[o.stage] = cost.get(o.stage, 0) + o.cycles
            ipu[o.stage] = o.ipu
    return cost, ipu


def _spec_table(cost: dict[int, int], ipu: dict[int, int], depth: int) -> tuple[int, dict]:
    """The spec's cycle table with per-stage costs only: cycle c runs stages s <= c < s + G;
    an IPU's stages of a cycle run one after the other; the cycle is its busiest IPU.
    Returns (cycles of one run, busy cycles per IPU in one run)."""
    stages = len(cost)
    total = 0
    for c in range(depth + stages - 1):
        per_ipu: dict[int, int] = {}
        for s in range(stages):
            if s <= c < s + depth:
                per_ipu[ipu[s]] = per_ipu.get(ipu[s], 0) + cost[s]
        total += max(per_ipu.values())
    busy: dict[int, int] = {}
    for s, n in cost.items():
        busy[ipu[s]] = busy.get(ipu[s], 0) + depth * n
    return total, busy


def test_F62_balanced_inference_pipeline_utilisation_is_G_over_G_plus_P_minus_1():
    """Four equal stages on four IPUs, G = 16: every IPU is busy G of the G + P - 1 cycles."""
    proto, out = _chain(1024, 16, 4, staged=True, loss=False)
    s = popart.InferenceSession(proto, popart.DataFlow(16, {out: popart.AnchorReturnType("All")}),
                                _device(4, 8), userOptions=_options(True))
    s.prepareDevice()
    c = s._device_model.cycles
    p = c.pipeline
    assert (p.info.num_stages, p.info.depth) == (4, 16)
    assert (p.fill_count, p.main_count, p.flush_count) == (3, 13, 3)
    ideal = 16 / (16 + 4 - 1)
    use = c.ipu_utilisation()
    assert sorted(use) == [0, 1, 2, 3]
    for u in use.values():
        # Below the ideal only by the copies, host input, syncs and anchors (a few %).
        assert ideal * 0.95 < u < ideal


def test_F62_training_pipeline_af16_follows_the_cycle_table_of_its_stage_costs():
    """Four IPUs, training, af = 16: P = 7 forward and backward stages (stage s and 6 - s share
    an IPU). The utilisation per IPU is G · (its stages' cost) over the table's step, computed
    here from the per-op costs; copies, host input and syncs add a few %."""
    s = _training(af=16)
    c = s._device_model.cycles
    p = c.pipeline
    assert (p.info.num_stages, p.info.depth, p.info.runs_per_step) == (7, 16, 1)
    assert (p.fill_count, p.main_count, p.flush_count) == (6, 10, 6)
    cost, ipu = _stage_costs(c)
    assert ipu == {0: 0, 1: 1, 2: 2, 3: 3, 4: 2, 5: 1, 6: 0}
    assert p.stage_cycles == [cost[st] for st in range(7)]
    run, busy = _spec_table(cost, ipu, 16)
    step = run + c.outer_cycles
    use = c.ipu_utilisation()
    for i in range(4):
        assert use[i] == pytest.approx(busy[i] / step, rel=0.04)
    # The most loaded IPU is busy at least G of the G + P - 1 cycles.
    assert max(use.values()) >= 16 / (16 + 7 - 1)
    # The pipeline overlaps stages: far shorter than running the micro-batches one by one.
    serial = 16 * c.fragment_cycles(NORMAL) + c.outer_cycles
    assert c.step_cycles < 0.6 * serial


def test_pipeline_step_is_runs_times_cycles_plus_weight_updates():
    """Each cycle lasts its busiest IPU plus the sync; a step is bps pipeline runs (one per
    weight update), each followed by the optimizer, plus the anchors."""
    s = _training(af=8, bps=3)
    c = s._device_model.cycles
    p = c.pipeline
    assert p.info.runs_per_step == 3 and p.info.depth == 8
    spec = s._device_model.spec
    for cy in p.cycles:
        assert cy.stages == tuple(st for st in range(7) if st <= cy.index < st + 8)
        assert cy.cycles == max(cy.busy[i] + cy.host[i] for i in cy.busy) + (
            spec.ipu_sync_latency_cycles)
    assert c.step_cycles == 3 * (p.run_cycles + c.outer_cycles) + c.host_anchor_cycles
    # Busy cycles: G runs of every stage, per pipeline run.
    busy = p.busy()
    for i in range(4):
        mine = [st for st in range(7) if p.stage_ipu[st] == i]
        own = sum(p.stage_cycles[st] for st in mine)
        assert busy[i] >= 8 * own
    assert c.ipu_busy_cycles()[0] >= 3 * busy[0]


@pytest.mark.parametrize("pattern, waiting", [("full", {0, 1, 2, 3}),
                                              ("singlePipeline", {0}),
                                              ("replicaAndLadder", {0, 2})])
def test_F77_sync_pattern_decides_which_ipus_wait_for_host_inputs(pattern, waiting):
    s = _training(af=8, pattern=pattern)
    p = s._device_model.cycles.pipeline
    host = p.host_input_cycles[0]
    assert host > 0 and not any(p.host_input_cycles[1:])
    first = p.cycles[0]  # only stage 0 (IPU 0) runs, and reads the host input
    assert {i for i, n in first.host.items() if n} == waiting
    assert all(first.host[i] == host for i in waiting)


def test_single_pipeline_sync_is_no_slower_than_full():
    full = _training(af=8, pattern="full")._device_model.cycles.step_cycles
    single = _training(af=8, pattern="singlePipeline")._device_model.cycles.step_cycles
    assert single <= full


def test_sharded_ipus_run_one_after_the_other():
    """Virtual graphs without pipelining: the schedule runs serially, one IPU at a time."""
    s = _training(af=2, pipelined=False)
    c = s._device_model.cycles
    assert c.pipeline is None
    links = sum(t.cycles for t in c.links if t.context is NORMAL)
    normal = sum(o.cycles for o in c.ops if o.context is NORMAL)
    assert c.step_cycles == (2 * (normal + links + c.host_input_cycles) + c.outer_cycles
                             + c.host_anchor_cycles)
    busy = c.ipu_busy_cycles()
    assert sorted(busy) == [0, 1, 2, 3]
    # Only the copies involve two IPUs at once.
    overlap = sum(t.cycles for t in c.links) * 2
    assert sum(busy.values()) <= c.step_cycles + overlap
    assert sum(c.ipu_utilisation().values()) < 1.1


@pytest.mark.parametrize("rf", [2, 4])
def test_F71_gradient_all_reduce_is_a_ring_over_the_ipu_links(rf):
    s, _ = rm.session(rm.params(), 2, 1, rm.options(rf))
    model = s._device_model
    spec = model.spec
    reduces = [o for o in model.cycles.ops if o.op_type == "ReplicatedAllReduce"]
    assert reduces
    graph = s.getIr().main
    for o in reduces:
        nbytes = next(op for op in graph.ops.values() if op.id == o.op_id).inputs[0].info.num_bytes
        ring = 2 * (rf - 1) / rf * nbytes
        assert o.collective_cycles == (math.ceil(ring / spec.ipu_link_bytes_per_s * spec.clock_hz)
                                       + spec.ipu_sync_latency_cycles)
    one, _ = rm.session(rm.params(), 2, 1, rm.options(1))
    assert not any(o.op_type == "ReplicatedAllReduce" for o in one._device_model.cycles.ops)


def test_summary_and_report_show_the_pipeline_and_utilisation(tmp_path):
    s = _training(af=16)
    model = s._device_model
    text = summary_text(model)
    assert "pipeline: 7 stages, depth 16, SyncPattern Full; one run = 6 fill + 10 main + 6 flush" \
        in text
    assert "stage 3 (IPU 3)" in text and "main cycle time" in text
    for i, u in model.cycles.ipu_utilisation().items():
        assert f"IPU {i}: busy" in text and f"({100 * u:.1f}% of the step)" in text
    execution = Report(model).to_dict()["execution"]
    pipe = execution["pipeline"]
    assert (pipe["fillCycles"], pipe["mainCycles"], pipe["flushCycles"]) == (6, 10, 6)
    assert pipe["cycleTime"] == model.cycles.pipeline.cycle_time > 0
    assert len(pipe["cycles"]) == 22 and len(pipe["stageList"]) == 7
    assert [e["ipu"] for e in execution["ipus"]] == [0, 1, 2, 3]
    assert all(0 < e["utilisation"] < 1 for e in execution["ipus"])
    Report(model).to_json(tmp_path / "r.json")  # JSON-serialisable
