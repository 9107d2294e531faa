"""The Chrome trace and the HTML timeline of a pipelined step follow the cycle table (spec §5.1,
§4.7, F55, F56, F62; report/trace.py).

The references: the cycle model's table (``CycleResult.pipeline``: the active stages and the
length of each cycle, each IPU's busy cycles), the spec's rule that cycle c of a run executes
stage s on micro-batch c − s, and the step length the model reports.
"""

from __future__ import annotations

import contextlib
import itertools
import json

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.report import trace as trace_mod
from popart_backend.report.html import html_report, timeline_spans
from popart_backend.report.report import Report
from popart_backend.report.trace import HOST_TRACK, LINK_TRACK, chrome_trace, ipu_track

STAGES = 7  # 4 forward stages on IPUs 0-3, 3 backward ones back down (stage s and 6 - s share)


def _session(af: int = 8, bps: int = 2, pipelined: bool = True, d: int = 64):
    """A 4-layer MatMul/Tanh chain over 4 IPUs (one layer per IPU and stage when pipelined),
    trained with SGD; prepared, not run."""
    b = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    h = b.addInputTensor(popart.TensorInfo("FLOAT", [8, d]), "x")
    rng = np.random.default_rng(0)
    for k in range(4):
        w = b.addInitializedInputTensor(
            (rng.standard_normal((d, d)) * 0.1).astype(np.float32), f"w{k}")
        with b.virtualGraph(k), b.pipelineStage(k) if pipelined else contextlib.nullcontext():
            h = b.aiOnnx.tanh([b.aiOnnx.matmul([h, w])])
            if k == 3:
                loss = b.aiGraphcore.l1loss([h], 0.5)
    opts = popart.SessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    opts.enablePipelining = pipelined
    opts.enableGradientAccumulation = True
    opts.accumulationFactor = af
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": 4, "tilesPerIPU": 4})
    s = popart.TrainingSession(
        b.getModelProto(), popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")}), loss,
        popart.ConstSGD(0.1), device, userOptions=opts)
    s.prepareDevice()
    return s


@pytest.fixture(scope="module")
def model():
    return _session()._device_model


def _spans(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def _to_cycles(us: float, model) -> float:
    return us * model.spec.clock_hz / 1e6


def _tracks(trace: dict) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def test_F62_trace_ends_with_the_modelled_step_and_has_one_track_per_ipu(model, tmp_path):
    c = model.cycles
    assert c.pipeline is not None and c.pipeline.info.runs_per_step == 2
    Report(model).to_chrome_trace(tmp_path / "t.json")
    trace = json.loads((tmp_path / "t.json").read_text())
    spans = _spans(trace)
    end = max(e["ts"] + e["dur"] for e in spans)
    assert _to_cycles(end, model) == pytest.approx(c.step_cycles, rel=1e-9)
    tracks = _tracks(trace)
    assert sorted(tracks.values()) == ["IPU 0", "IPU 1", "IPU 2", "IPU 3", "IPU-Link", "host"]
    assert {e["tid"] for e in spans} == {HOST_TRACK, LINK_TRACK, *map(ipu_track, range(4))}
    # Far shorter than the serial drawing of the same micro-batches.
    serial = 16 * c.micro_batch_cycles
    assert c.step_cycles < 0.7 * serial
    # Spans on one track never overlap.
    for tid in tracks:
        mine = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["tid"] == tid)
        for (_, a_end), (b_start, _) in itertools.pairwise(mine):
            assert b_start >= a_end - 1e-9


def _run_cycles(model, spans: list[dict], run: int) -> list[dict]:
    """Per cycle of ``run``: {ipu: [spans]} from the trace, by the cycle boundaries of the
    model's table (the run starts after the previous runs and their weight updates)."""
    c = model.cycles
    table = c.pipeline
    start = run * (table.run_cycles + c.outer_cycles)
    out = []
    for cy in table.cycles:
        lo, hi = start, start + cy.cycles
        per_ipu: dict[int, list[dict]] = {}
        for e in spans:
            s0, s1 = _to_cycles(e["ts"], model), _to_cycles(e["ts"] + e["dur"], model)
            if e["tid"] >= ipu_track(0) and lo - 1e-6 <= s0 and s1 <= hi + 1e-6:
                per_ipu.setdefault(e["tid"] - ipu_track(0), []).append(e)
        out.append(per_ipu)
        start = hi
    return out


@pytest.mark.parametrize("run", [0, 1])
def test_F62_each_cycle_runs_its_stages_on_their_ipus_for_the_modelled_time(model, run):
    """Cycle c: stage s (on its IPU) works on micro-batch run·G + c − s; an IPU's stages and
    copies add up to its busy cycles; every IPU ends the cycle with the sync."""
    c = model.cycles
    table = c.pipeline
    depth = table.info.depth
    spans = _spans(chrome_trace(model))
    for cy, per_ipu in zip(table.cycles, _run_cycles(model, spans, run)):
        stages = {(e["args"]["stage"], e["args"]["micro_batch"], ipu)
                  for ipu, es in per_ipu.items() for e in es if e["cat"] == "stage"}
        assert stages == {(s, run * depth + cy.index - s, table.stage_ipu[s])
                          for s in range(STAGES) if s <= cy.index < s + depth}
        assert stages and all(f"stage {s} mb {m}" in {e["name"] for e in per_ipu[i]}
                              for s, m, i in stages)
        for ipu, busy in cy.busy.items():
            es = per_ipu.get(ipu, [])
            work = sum(e["args"]["cycles"] for e in es if e["cat"] in ("stage", "copy"))
            assert work == busy
            (sync,) = [e for e in es if e["cat"] == "sync"]
            assert sync["args"]["cycles"] == cy.sync_cycles
            wait = sum(e["args"]["cycles"] for e in es if e["cat"] == "host")
            assert wait == cy.host.get(ipu, 0)
        # The busiest IPU fills the cycle up to the sync.
        assert max(b + cy.host.get(i, 0) for i, b in cy.busy.items()) + cy.sync_cycles == (
            cy.cycles)


def test_copies_and_host_inputs_are_drawn_where_the_model_charges_them(model):
    c = model.cycles
    table = c.pipeline
    spans = _spans(chrome_trace(model))
    copies = [e for e in spans if e["cat"] == "copy"]
    # Stage 0's activation crosses from IPU 0 to IPU 1: both ends draw the copy.
    first = [e for e in copies if e["args"]["stage"] == 0 and e["args"]["micro_batch"] == 0]
    assert {e["tid"] for e in first} == {ipu_track(0), ipu_track(1)}
    assert all(e["args"]["tensors"] for e in first)
    links = [e for e in spans if e["tid"] == LINK_TRACK]
    per_run = sum(1 for cy in table.cycles if any(s < STAGES - 1 for s in cy.stages))
    assert len(links) == 2 * per_run  # every cycle with a forwarding stage copies
    inputs = [e for e in spans if e["tid"] == HOST_TRACK and e["name"].startswith("inputs")]
    # One input transfer per micro-batch, in the cycle stage 0 works on it.
    assert [e["args"]["micro_batch"] for e in inputs] == list(range(16))
    assert all(e["args"]["cycles"] == table.host_input_cycles[0] for e in inputs)
    # The weight update follows each run: op by op after run 0, a block after run 1.
    run, outer = table.run_cycles, c.outer_cycles
    first = min((e for e in spans if e["args"].get("type") == "SGDUpdate"),
                key=lambda e: e["ts"])
    assert _to_cycles(first["ts"], model) >= run - 1e-6
    assert _to_cycles(first["ts"] + first["dur"], model) <= run + outer + 1e-6
    (second,) = {e["ts"] for e in spans if e["name"] == "weight update 1"}
    assert _to_cycles(second, model) == pytest.approx(2 * run + outer, rel=1e-9)


def test_long_pipelined_steps_are_shortened_but_keep_their_length(monkeypatch):
    """Past the detailed budget the middle main cycles and later runs become blocks."""
    monkeypatch.setattr(trace_mod, "_MAX_CYCLES", 16)
    model = _session(af=16, bps=3)._device_model
    c = model.cycles
    spans = _spans(chrome_trace(model))
    end = max(e["ts"] + e["dur"] for e in spans)
    assert _to_cycles(end, model) == pytest.approx(c.step_cycles, rel=1e-9)
    names = {e["name"] for e in spans}
    assert any(n.startswith("main cycles") for n in names)
    assert {"pipeline run 1", "pipeline run 2"} <= names
    # The fill and flush of the first run stay detailed.
    assert "stage 6 mb 15" in names and "stage 0 mb 0" in names
    # Past the block budget the rest of the step is one block per IPU.
    monkeypatch.setattr(trace_mod, "_MAX_BLOCKS", 1)
    spans = _spans(chrome_trace(model))
    end = max(e["ts"] + e["dur"] for e in spans)
    assert _to_cycles(end, model) == pytest.approx(c.step_cycles, rel=1e-9)
    rest = [e for e in spans if e["name"] == "remaining pipeline runs"]
    assert len(rest) == 4
    assert rest[0]["args"]["cycles"] == 2 * (c.pipeline.run_cycles + c.outer_cycles)


def test_sharded_trace_is_unchanged_serial_op_by_op():
    """Without pipelining the first micro-batch is drawn op by op, one IPU at a time."""
    model = _session(af=2, bps=1, pipelined=False)._device_model
    c = model.cycles
    assert c.pipeline is None
    spans = _spans(chrome_trace(model))
    assert not any(e["cat"] in ("stage", "copy", "sync") for e in spans)
    ops = [e for e in spans if e["cat"] == "op"]
    normal = [o for o in c.ops if o.context.name == "Normal"]
    assert [e["name"] for e in ops[:len(normal)]] == [o.name for o in normal]
    # The detailed ops: one IPU at a time (later micro-batches are blocks on every IPU).
    ipu_spans = sorted(ops, key=lambda e: e["ts"])
    for a, b in itertools.pairwise(ipu_spans):
        assert b["ts"] >= a["ts"] + a["dur"] - 1e-9  # serial: no two IPUs at once
    end = max(e["ts"] + e["dur"] for e in spans)
    assert _to_cycles(end, model) == pytest.approx(c.step_cycles, rel=1e-9)


def test_html_timeline_draws_the_trace_spans(model):
    names, spans = timeline_spans(model)
    trace = _spans(chrome_trace(model))
    assert sum(len(v) for cats in spans.values() for v in cats.values()) == len(trace)
    for i in range(4):
        assert {"stage", "copy", "sync", "host"} <= set(spans[ipu_track(i)])
        assert names[ipu_track(i)] == f"IPU {i}"
    end = max(ts + dur for cats in spans.values() for v in cats.values() for ts, dur in v)
    assert _to_cycles(end, model) == pytest.approx(model.cycles.step_cycles, rel=1e-9)
    page = html_report(model)
    assert "Timeline of one step" in page and page.count("<svg") == 4
