"""Chrome-trace (Trace Event Format) timeline of one simulated step, for Perfetto or
chrome://tracing (DESIGN decision 10).

One process, the simulated device, with one track (thread) per IPU, one for the host and one
for the IPU-Links. Times are microseconds of simulated time (cycles / clock). The first
micro-batch and the first outer fragment (weight update) are drawn op by op; later ones as one
block per fragment, so the trace stays small for long steps.
"""

from __future__ import annotations

import json

from ..device.analysis import DeviceModel
from ..ir.op import ExecutionContext

__all__ = ["HOST_TRACK", "LINK_TRACK", "chrome_trace", "ipu_track", "write_chrome_trace"]

_PID = 1
HOST_TRACK = 0
LINK_TRACK = 1
_IPU_TRACK_BASE = 10
# Fragments drawn as blocks after the detailed ones; beyond this the rest become one block.
_MAX_BLOCKS = 256


def ipu_track(ipu: int) -> int:
    return _IPU_TRACK_BASE + ipu


def chrome_trace(model: DeviceModel) -> dict:
    """The trace of one ``run()`` of ``model`` as a JSON-ready dict."""
    cycles = model.cycles
    batch = cycles.batch
    us_per_cycle = 1e6 / model.spec.clock_hz
    ipus = sorted(set(cycles.ipu_cycles()) | {m.ipu for m in model.memory.ipus})
    events: list[dict] = [
        {"ph": "M", "pid": _PID, "name": "process_name", "args": {"name": model.device}},
        *_thread_meta(HOST_TRACK, "host", 0),
        *_thread_meta(LINK_TRACK, "IPU-Link", 1),
    ]
    for i in ipus:
        events += _thread_meta(ipu_track(i), f"IPU {i}", 2 + i)
    now = 0  # cycles

    def span(track: int, name: str, start: int, length: int, cat: str, args=None) -> None:
        events.append({"ph": "X", "pid": _PID, "tid": track, "name": name, "cat": cat,
                       "ts": start * us_per_cycle, "dur": length * us_per_cycle,
                       "args": dict(args or {}, cycles=length)})

    def fragment(context: ExecutionContext, label: str, detailed: bool) -> None:
        nonlocal now
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
                span(ipu_track(ipu), label, now, length, "fragment")
            now += length
            return
        for _, kind, item in items:
            if kind == 0:
                span(LINK_TRACK, f"copy {item.tensor_id} ipu{item.src_ipu}->ipu{item.dst_ipu}",
                     now, item.cycles, "link", {"bytes": item.num_bytes})
            else:
                span(ipu_track(item.ipu), item.name, now, item.cycles, "op",
                     {"type": item.op_type, "flops": item.flops, "bytes": item.bytes_moved,
                      "exchange_bytes": item.exchange_bytes, "tiles": item.tiles_used})
            now += item.cycles

    normal, outer = ExecutionContext.Normal, ExecutionContext.AccumulateOuterFragment
    drawn = 0
    for b in range(batch.batches_per_step):
        for a in range(batch.accumulation_factor):
            k = b * batch.accumulation_factor + a
            if drawn >= _MAX_BLOCKS:
                continue
            if cycles.host_input_cycles:
                span(HOST_TRACK, f"inputs {k}", now, cycles.host_input_cycles, "host",
                     {"bytes": batch.input_bytes_per_micro_batch})
                now += cycles.host_input_cycles
            fragment(normal, f"micro-batch {k}", detailed=k == 0)
            drawn += 1
        if drawn < _MAX_BLOCKS:
            fragment(outer, f"weight update {b}", detailed=b == 0)
    remaining = cycles.step_cycles - cycles.host_anchor_cycles - now
    if remaining > 0:
        for ipu in ipus:
            span(ipu_track(ipu), "remaining micro-batches", now, remaining, "fragment")
        now += remaining
    if cycles.host_anchor_cycles:
        span(HOST_TRACK, "anchors", now, cycles.host_anchor_cycles, "host",
             {"bytes": batch.anchor_bytes_per_step})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"device": model.device, "step_cycles": cycles.step_cycles}}


def _thread_meta(track: int, name: str, order: int) -> list[dict]:
    return [{"ph": "M", "pid": _PID, "tid": track, "name": "thread_name", "args": {"name": name}},
            {"ph": "M", "pid": _PID, "tid": track, "name": "thread_sort_index",
             "args": {"sort_index": order}}]


def write_chrome_trace(model: DeviceModel, path) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(model), f)
