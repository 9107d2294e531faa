"""``getSummaryReport()`` text: memory per IPU and category, top tensors, cycles per step,
throughput and utilisation (spec §4.7, F54).

Profiling is off by default, as in PopART; ``engineOptions["autoReport.all"] = "true"`` turns
it on. When off, the report says "Execution profiling not enabled".
"""

from __future__ import annotations

from ..device.analysis import DeviceModel
from ..device.memory import memory_summary
from ..ir.op import ExecutionContext

__all__ = ["PROFILING_DISABLED", "profiling_enabled", "summary_text"]

PROFILING_DISABLED = "Execution profiling not enabled"


def profiling_enabled(options) -> bool:
    """True when the SessionOptions' engine options ask for the automatic report."""
    return str(options.engineOptions.get("autoReport.all", "false")).lower() == "true"


def summary_text(model: DeviceModel, runs: int = 0, top: int = 5) -> str:
    """The profile summary of ``model``; ``runs`` is how many ``run()`` calls it covers."""
    cycles = model.cycles
    batch = cycles.batch
    spec = model.spec
    outer = cycles.fragment_cycles(ExecutionContext.AccumulateOuterFragment)
    lines = [
        f"Target: {model.device} ({spec.num_tiles} tiles per IPU, clock "
        f"{spec.clock_hz / 1e9:.2f} GHz)",
        memory_summary(model.memory, top),
        "Execution (one replica; replicas run in parallel):",
        f"  cycles per step: {cycles.step_cycles} ({cycles.step_seconds * 1e3:.4f} ms) = "
        f"{batch.micro_batches_per_step} micro-batch(es) x {cycles.micro_batch_cycles} "
        f"+ {batch.batches_per_step} outer fragment(s) x {outer} + anchors "
        f"{cycles.host_anchor_cycles}",
        f"  host input per micro-batch: {cycles.host_input_cycles} cycles; IPU-Link copies: "
        f"{len(cycles.links)}",
        f"  throughput: {cycles.samples_per_second:.1f} samples/s "
        f"({batch.samples_per_step} samples per step)",
        f"  utilisation: {100 * cycles.utilisation():.2f}% of the f32 AMP peak",
    ]
    for ipu, busy in sorted(cycles.ipu_cycles().items()):
        lines.append(f"  IPU {ipu}: {busy} compute cycles per step")
    heavy = sorted(cycles.ops, key=lambda o: -o.cycles)[:top]
    if heavy:
        lines.append("  most expensive ops:")
        lines += [f"    {o.name}: {o.cycles} cycles, {o.flops} FLOPs" for o in heavy]
    lines.append(f"  runs profiled: {runs}, total cycles: {runs * cycles.step_cycles}")
    return "\n".join(lines)
