"""Chrome-trace (Trace Event Format) timeline of one simulated step, for Perfetto or
chrome://tracing (DESIGN decision 10).

One process, the simulated device, with one track (thread) per IPU, one for the host and one
for the IPU-Links. Times are microseconds of simulated time (cycles / clock), and the last span
ends where the cycle model's step ends.

An unpipelined program (one IPU, or sharded over several) runs serially: the first micro-batch
and the first outer fragment (weight update) are drawn op by op; later ones as one block per
fragment, so the trace stays small for long steps.

A pipelined program is drawn from its cycle table (device/cost.py): the cycles of a pipeline run
lie end to end, each as long as the model says. Within a cycle each IPU track shows what the
model charges it, in the model's order: the wait for the cycle's host inputs (as its
SyncPattern decides), the active stages it hosts one after the other (named with the stage and
the micro-batch it works on), then the copies of those stages it sends or receives; the sync
that ends the cycle closes every IPU track. The IPU-Link track holds one span per cycle over its
copies, the host track the input transfers. The outer fragment (weight update) follows each run
as in the serial case. Long steps are shortened the same way: past a budget of detailed cycles
the middle of the main phase, and later runs, become one block per IPU.
"""

from __future__ import annotations

import json

from ..device.analysis import DeviceModel
from ..device.cost import CycleResult
from ..device.pipeline_cost import PipelineCycle, PipelineCycles
from ..errors import popart_internal_exception
from ..files import write_text_atomic
from ..ir.op import ExecutionContext

__all__ = ["HOST_TRACK", "LINK_TRACK", "chrome_trace", "ipu_track", "write_chrome_trace"]

_PID = 1
HOST_TRACK = 0
LINK_TRACK = 1
_IPU_TRACK_BASE = 10
# Fragments drawn as blocks after the detailed ones; beyond this the rest become one block.
_MAX_BLOCKS = 256
# Pipeline cycles drawn span by span in one step; the rest of the main phase is one block.
_MAX_CYCLES = 256

_NORMAL = ExecutionContext.Normal
_OUTER = ExecutionContext.AccumulateOuterFragment


def ipu_track(ipu: int) -> int:
    return _IPU_TRACK_BASE + ipu


class _Trace:
    """The events of one trace and the drawing position (cycles)."""

    def __init__(self, model: DeviceModel):
        self.cycles = model.cycles
        self.us_per_cycle = 1e6 / model.spec.clock_hz
        self.events: list[dict] = []
        self.now = 0

    def span(self, track: int, name: str, start: int, length: int, cat: str,
             args=None) -> None:
        self.events.append({"ph": "X", "pid": _PID, "tid": track, "name": name, "cat": cat,
                            "ts": start * self.us_per_cycle, "dur": length * self.us_per_cycle,
                            "args": dict(args or {}, cycles=length)})

    def fragment(self, context: ExecutionContext, label: str, detailed: bool) -> None:
        """One execution of a fragment, serially: op by op, or one block per IPU."""
        cycles = self.cycles
        items = sorted(
            [(o.position, 1, o) for o in cycles.ops if o.context is context]
            + [(t.position, 0, t) for t in cycles.links if t.context is context],
            key=lambda x: (x[0], x[1]),
        )
        if not items:
            return
        if not detailed:
            length = cycles.fragment_cycles(context)
            for ipu in sorted({o.ipu for _, kind, o in items if kind == 1}):
                self.span(ipu_track(ipu), label, self.now, length, "fragment")
            self.now += length
            return
        for _, kind, item in items:
            if kind == 0:
                self.span(LINK_TRACK,
                          f"copy {item.tensor_id} ipu{item.src_ipu}->ipu{item.dst_ipu}",
                          self.now, item.cycles, "link", {"bytes": item.num_bytes})
            else:
                self.span(ipu_track(item.ipu), item.name, self.now, item.cycles, "op",
                          {"type": item.op_type, "flops": item.flops,
                           "bytes": item.bytes_moved, "exchange_bytes": item.exchange_bytes,
                           "tiles": item.tiles_used})
            self.now += item.cycles


def chrome_trace(model: DeviceModel) -> dict:
    """The trace of one ``run()`` of ``model`` as a JSON-ready dict."""
    cycles = model.cycles
    ipus = set(cycles.ipu_cycles()) | {m.ipu for m in model.memory.ipus}
    if cycles.pipeline is not None:
        ipus |= set(cycles.pipeline.stage_ipu.values())
        ipus |= {i for cy in cycles.pipeline.cycles for i in cy.busy}
    ipus = sorted(ipus)
    t = _Trace(model)
    t.events += [
        {"ph": "M", "pid": _PID, "name": "process_name", "args": {"name": model.device}},
        *_thread_meta(HOST_TRACK, "host", 0),
        *_thread_meta(LINK_TRACK, "IPU-Link", 1),
    ]
    for i in ipus:
        t.events += _thread_meta(ipu_track(i), f"IPU {i}", 2 + i)
    if cycles.pipeline is not None:
        _pipelined_step(t, ipus)
    else:
        _serial_step(t, ipus)
    if cycles.host_anchor_cycles:
        t.span(HOST_TRACK, "anchors", t.now, cycles.host_anchor_cycles, "host",
               {"bytes": cycles.batch.anchor_bytes_per_step})
    return {"traceEvents": t.events, "displayTimeUnit": "ns",
            "otherData": {"device": model.device, "step_cycles": cycles.step_cycles}}


def _serial_step(t: _Trace, ipus: list[int]) -> None:
    """Micro-batches and weight updates one after the other, up to the anchors."""
    cycles = t.cycles
    batch = cycles.batch
    drawn = 0
    for b in range(batch.batches_per_step):
        for a in range(batch.accumulation_factor):
            k = b * batch.accumulation_factor + a
            if drawn >= _MAX_BLOCKS:
                continue
            if cycles.host_input_cycles:
                t.span(HOST_TRACK, f"inputs {k}", t.now, cycles.host_input_cycles, "host",
                       {"bytes": batch.input_bytes_per_micro_batch})
                t.now += cycles.host_input_cycles
            t.fragment(_NORMAL, f"micro-batch {k}", detailed=k == 0)
            drawn += 1
        if drawn < _MAX_BLOCKS:
            t.fragment(_OUTER, f"weight update {b}", detailed=b == 0)
    _remaining(t, ipus, "remaining micro-batches", cycles.host_anchor_cycles)


def _remaining(t: _Trace, ipus: list[int], label: str, after: int) -> None:
    """One block per IPU for what the step holds beyond the drawn spans and ``after``."""
    remaining = t.cycles.step_cycles - after - t.now
    if remaining > 0:
        for ipu in ipus:
            t.span(ipu_track(ipu), label, t.now, remaining, "fragment")
        t.now += remaining


class _StageWork:
    """Per stage and IPU, the cycles the cycle model charges when the stage is active: compute
    (ops and remote transfers) and copies (IpuCopy ops and link time on both ends), with the
    copies' tensors. Built from the per-op costs exactly as device/cost.py builds the table."""

    def __init__(self, cycles: CycleResult, stages: int):
        self.compute: list[dict[int, int]] = [{} for _ in range(stages)]
        self.copy: list[dict[int, int]] = [{} for _ in range(stages)]
        self.links: list[list] = [[] for _ in range(stages)]
        for o in cycles.ops:
            if o.context is _NORMAL:
                self._add(self.copy if o.between_cycles else self.compute, o.stage, o.ipu,
                          o.cycles)
        for link in cycles.links:
            if link.context is _NORMAL:
                # Both ends take part; the cycle's sync replaces the copy's own.
                self._add(self.copy, link.stage, link.src_ipu, link.link_cycles)
                self._add(self.copy, link.stage, link.dst_ipu, link.link_cycles)
                self.links[link.stage].append(link)
        for r in cycles.remote:
            if r.context is _NORMAL:
                self._add(self.compute, r.stage, r.ipu, r.cycles)

    @staticmethod
    def _add(table: list[dict[int, int]], stage: int, ipu: int, n: int) -> None:
        table[stage][ipu] = table[stage].get(ipu, 0) + n


def _pipelined_step(t: _Trace, ipus: list[int]) -> None:
    """Pipeline runs from the cycle table, each followed by its weight updates, then the
    exposed IO-tile transfers, up to the anchors."""
    cycles = t.cycles
    table = cycles.pipeline
    info = table.info
    work = _StageWork(cycles, info.num_stages)
    runs, bps = info.runs_per_step, cycles.batch.batches_per_step
    # One weight update after each run with accumulation; otherwise all after the last run.
    updates = [1] * runs if runs == bps else [0] * (runs - 1) + [bps]
    budget = _MAX_CYCLES
    update = 0
    for run in range(min(runs, _MAX_BLOCKS)):
        count = len(table.cycles)
        if count <= budget or run == 0:
            budget -= _draw_run(t, table, work, run, ipus, budget)
        else:
            for ipu in ipus:
                t.span(ipu_track(ipu), f"pipeline run {run}", t.now, table.run_cycles,
                       "fragment", {"busy": table.busy().get(ipu, 0)})
            t.now += table.run_cycles
        for _ in range(min(updates[run], _MAX_BLOCKS)):
            t.fragment(_OUTER, f"weight update {update}", detailed=update == 0)
            update += 1
    io = cycles.overlap.cycles if cycles.overlap is not None else 0
    _remaining(t, ipus, "remaining pipeline runs", cycles.host_anchor_cycles + io)
    if io:
        t.span(HOST_TRACK, "IO-tile transfers (not hidden)", t.now, io, "host",
               {"hidden_cycles": cycles.overlap.hidden_cycles})
        t.now += io


def _draw_run(t: _Trace, table: PipelineCycles, work: _StageWork, run: int, ipus: list[int],
              budget: int) -> int:
    """One pipeline run at ``t.now``; returns the cycles drawn in detail. A run longer than
    ``budget`` keeps its fill, flush and first main cycles detailed; the other main cycles are
    one block per IPU."""
    cycles = table.cycles
    keep = len(cycles)
    skip: set[int] = set()
    if keep > budget:
        main = [cy.index for cy in cycles if cy.phase == "main"]
        shown = max(1, budget - (len(cycles) - len(main)))
        skip = set(main[shown:])
        keep = len(cycles) - len(skip)
    block: list[PipelineCycle] = []
    for cy in cycles:
        if cy.index in skip:
            block.append(cy)
            continue
        _main_block(t, block, ipus)
        block = []
        _draw_cycle(t, table, work, cy, run)
    _main_block(t, block, ipus)
    return keep


def _main_block(t: _Trace, block: list[PipelineCycle], ipus: list[int]) -> None:
    if not block:
        return
    length = sum(cy.cycles for cy in block)
    for ipu in ipus:
        t.span(ipu_track(ipu), f"main cycles {block[0].index}-{block[-1].index}", t.now, length,
               "fragment", {"busy": sum(cy.busy.get(ipu, 0) for cy in block)})
    t.now += length


def _draw_cycle(t: _Trace, table: PipelineCycles, work: _StageWork, cy: PipelineCycle,
                run: int) -> None:
    """One cycle of the table at ``t.now``: host inputs, per IPU its stages, copies and the
    sync; the IPU-Link span over the cycle's copies."""
    start, end = t.now, t.now + cy.cycles
    depth = table.info.depth

    def tag(stage: int) -> dict:
        return {"stage": stage, "micro_batch": run * depth + cy.index - stage,
                "cycle": cy.index, "phase": cy.phase, "run": run}

    at = start
    for s in cy.stages:
        n = table.host_input_cycles[s]
        if n:
            t.span(HOST_TRACK, f"inputs mb {tag(s)['micro_batch']}", at, n, "host", tag(s))
            at += n
    copies: list[tuple[int, int]] = []  # (start, end) of each IPU's copies
    for ipu, busy in sorted(cy.busy.items()):
        at = start
        wait = cy.host.get(ipu, 0)
        if wait:
            t.span(ipu_track(ipu), "host inputs", at, wait, "host",
                   {"cycle": cy.index, "run": run})
            at += wait
        for s in cy.stages:
            n = work.compute[s].get(ipu, 0)
            if n:
                args = tag(s)
                t.span(ipu_track(ipu), f"stage {s} mb {args['micro_batch']}", at, n, "stage",
                       args)
                at += n
        first_copy = at
        for s in cy.stages:
            n = work.copy[s].get(ipu, 0)
            if n:
                args = tag(s)
                args["tensors"] = [link.tensor_id for link in work.links[s]
                                   if ipu in (link.src_ipu, link.dst_ipu)]
                t.span(ipu_track(ipu), f"copies stage {s} mb {args['micro_batch']}", at, n,
                       "copy", args)
                at += n
        if at > first_copy:
            copies.append((first_copy, at))
        if at - start - wait != busy or at > end - cy.sync_cycles:
            raise popart_internal_exception(
                f"Chrome trace: pipeline cycle {cy.index} on IPU {ipu} draws "
                f"{at - start - wait} busy cycles but the cycle model has {busy} (of a "
                f"{cy.cycles}-cycle cycle); report/trace.py must charge stages as "
                f"device/cost.py does.")
        t.span(ipu_track(ipu), "sync", end - cy.sync_cycles, cy.sync_cycles, "sync",
               {"cycle": cy.index, "run": run})
    links = [link for s in cy.stages for link in work.links[s]]
    if links and copies:
        first, last = min(a for a, _ in copies), max(b for _, b in copies)
        t.span(LINK_TRACK, f"copies cycle {cy.index}", first, last - first, "link",
               {"cycle": cy.index, "run": run, "bytes": sum(x.num_bytes for x in links),
                "transfers": [f"{x.tensor_id} ipu{x.src_ipu}->ipu{x.dst_ipu}"
                              for x in links]})
    t.now = end


def _thread_meta(track: int, name: str, order: int) -> list[dict]:
    return [{"ph": "M", "pid": _PID, "tid": track, "name": "thread_name", "args": {"name": name}},
            {"ph": "M", "pid": _PID, "tid": track, "name": "thread_sort_index",
             "args": {"sort_index": order}}]


def write_chrome_trace(model: DeviceModel, path) -> None:
    write_text_atomic(path, json.dumps(chrome_trace(model)))
