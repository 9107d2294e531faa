"""``getReport()``: the profile of a compiled session as an object.

PopART returns libpva's ``Report``; the simulator's report holds what its device model knows:
memory per IPU, per category and per tile, the largest tensors, the op-by-op cycles of one step,
and the runs profiled so far. ``to_json(path)`` saves it; ``to_chrome_trace(path)`` writes the
timeline of one step (report/trace.py); ``to_html(path)`` writes a self-contained page with
plots (report/html.py).
"""

from __future__ import annotations

import json

from ..device.analysis import DeviceModel
from ..files import write_text_atomic
from .html import write_html
from .summary import summary_text
from .trace import chrome_trace

__all__ = ["Report"]


def _pipeline(p) -> dict | None:
    """The cycle table of one pipeline run (``device.pipeline_cost.PipelineCycles``), None unpipelined."""
    if p is None:
        return None
    info = p.info
    return {
        "stages": info.num_stages, "depth": info.depth, "runsPerStep": info.runs_per_step,
        "syncPattern": info.sync_pattern,
        "fillCycles": p.fill_count, "mainCycles": p.main_count, "flushCycles": p.flush_count,
        "fillCycleTotal": p.fill_cycles, "mainCycleTotal": p.main_cycles,
        "flushCycleTotal": p.flush_cycles, "cyclesPerRun": p.run_cycles,
        "cycleTime": p.cycle_time,
        "stageList": [
            {"stage": s, "ipu": p.stage_ipu[s], "computeCycles": p.stage_cycles[s],
             "copyCycles": p.copy_cycles[s], "hostInputCycles": p.host_input_cycles[s]}
            for s in range(info.num_stages)
        ],
        "cycles": [
            {"index": cy.index, "phase": cy.phase, "stages": list(cy.stages),
             "cycles": cy.cycles, "busy": {str(i): n for i, n in cy.busy.items()},
             "host": {str(i): n for i, n in cy.host.items() if n}}
            for cy in p.cycles
        ],
    }


class Report:
    """The profile of one session: ``compilation`` (memory) and ``execution`` (cycles)."""

    def __init__(self, model: DeviceModel, runs: int = 0):
        self.model = model
        self.runs = runs

    @property
    def compilation(self) -> dict:
        """Target and memory: per IPU totals, categories, per-tile peaks, largest tensors."""
        spec = self.model.spec
        return {
            "target": {"device": self.model.device, "architecture": spec.name,
                       "tilesPerIpu": spec.num_tiles, "bytesPerTile": spec.tile_bytes,
                       "clockHz": spec.clock_hz},
            "ipus": [
                {
                    "ipu": m.ipu,
                    "totalBytes": m.total_bytes,
                    "capacityBytes": m.capacity_bytes,
                    "fits": m.fits,
                    "categories": dict(m.categories),
                    "worstTile": m.worst_tile,
                    "worstTileBytes": m.worst_tile_bytes,
                    "tileBytes": [int(b) for b in m.tile_peak_bytes],
                    "peakOp": m.peak_op,
                    "peakLive": list(m.peak_live),
                    "largestTensors": [
                        {"id": t.id, "info": t.info, "bytes": t.num_bytes,
                         "category": t.category}
                        for t in m.largest(20)
                    ],
                }
                for m in self.model.memory.ipus
            ],
        }

    @property
    def execution(self) -> dict:
        """Cycles: per step, per op (one execution each), throughput and the runs so far."""
        c = self.model.cycles
        b = c.batch
        ops, use = c.ipu_cycles(), c.ipu_utilisation()
        return {
            "runs": self.runs,
            "cyclesPerStep": c.step_cycles,
            "totalCycles": self.runs * c.step_cycles,
            "secondsPerStep": c.step_seconds,
            "samplesPerSecond": c.samples_per_second,
            "utilisation": c.utilisation(),
            "batch": {"batchesPerStep": b.batches_per_step,
                      "accumulationFactor": b.accumulation_factor,
                      "replicationFactor": b.replication_factor,
                      "samplesPerMicroBatch": b.samples_per_micro_batch},
            "hostInputCyclesPerMicroBatch": c.host_input_cycles,
            "hostAnchorCyclesPerStep": c.host_anchor_cycles,
            "outerCyclesPerWeightUpdate": c.outer_cycles,
            "ipus": [
                {"ipu": i, "busyCycles": busy, "opCycles": ops.get(i, 0),
                 "utilisation": use[i]}
                for i, busy in c.ipu_busy_cycles().items()
            ],
            "pipeline": _pipeline(c.pipeline),
            "ops": [
                {"position": o.position, "name": o.name, "type": o.op_type, "ipu": o.ipu,
                 "context": o.context.name, "stage": o.stage, "flops": o.flops,
                 "bytes": o.bytes_moved, "exchangeBytes": o.exchange_bytes,
                 "collectiveCycles": o.collective_cycles, "cycles": o.cycles}
                for o in c.ops
            ],
            "links": [
                {"position": t.position, "tensor": t.tensor_id, "src": t.src_ipu,
                 "dst": t.dst_ipu, "bytes": t.num_bytes, "cycles": t.cycles}
                for t in c.links
            ],
        }

    def to_dict(self) -> dict:
        return {"compilation": self.compilation, "execution": self.execution}

    def to_json(self, path) -> None:
        write_text_atomic(path, json.dumps(self.to_dict(), indent=1))

    def to_chrome_trace(self, path) -> None:
        write_text_atomic(path, json.dumps(chrome_trace(self.model)))

    def to_html(self, path) -> None:
        """A self-contained HTML page: summary numbers, plots of memory per IPU, per tile and
        over the schedule, the timeline of one step, and the largest tensors."""
        write_html(self.model, path, self.runs)

    def summary(self) -> str:
        return summary_text(self.model, self.runs)

    def __repr__(self) -> str:
        return (f"<Report {self.model.device}: {self.runs} run(s), "
                f"{self.model.cycles.step_cycles} cycles per step>")
