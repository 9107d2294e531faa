"""``getSummaryReport()`` text: memory per IPU and category, top tensors, cycles per step (and,
pipelined, per cycle and per stage), throughput and utilisation per IPU.

Profiling is off by default, as in PopART; ``engineOptions["autoReport.all"] = "true"`` (or the
``POPLAR_ENGINE_OPTIONS`` variable, report/auto.py) turns it on. When off, the report says
"Execution profiling not enabled".
"""

from __future__ import annotations

from ..device.analysis import DeviceModel
from ..device.memory import memory_summary

__all__ = ["PROFILING_DISABLED", "pipeline_lines", "summary_text"]

PROFILING_DISABLED = "Execution profiling not enabled"


def summary_text(model: DeviceModel, runs: int = 0, top: int = 5) -> str:
    """The profile summary of ``model``; ``runs`` is how many ``run()`` calls it covers."""
    cycles = model.cycles
    batch = cycles.batch
    spec = model.spec
    outer = cycles.outer_cycles
    lines = [
        f"Target: {model.device} ({spec.num_tiles} tiles per IPU, clock "
        f"{spec.clock_hz / 1e9:.2f} GHz)",
        memory_summary(model.memory, top),
        "Execution (one replica; replicas run in parallel):",
    ]
    step = f"  cycles per step: {cycles.step_cycles} ({cycles.step_seconds * 1e3:.4f} ms) = "
    pipe = cycles.pipeline
    if pipe is not None:
        lines.append(
            step + f"{pipe.info.runs_per_step} pipeline run(s) x {pipe.run_cycles} "
            f"+ {batch.batches_per_step} outer fragment(s) x {outer} + anchors "
            f"{cycles.host_anchor_cycles}")
        lines += pipeline_lines(model)
    else:
        lines.append(
            step + f"{batch.micro_batches_per_step} micro-batch(es) x "
            f"{cycles.micro_batch_cycles} + {batch.batches_per_step} outer fragment(s) x "
            f"{outer} + anchors {cycles.host_anchor_cycles}")
    if cycles.overlap is not None:
        lines.append(f"  overlapped host IO adds {cycles.overlap.cycles} cycles per step "
                     f"({cycles.overlap.hidden_transfers} transfer(s) hidden)")
    lines += [
        f"  host input per micro-batch: {cycles.host_input_cycles} cycles; IPU-Link copies: "
        f"{len(cycles.links)}",
        f"  throughput: {cycles.samples_per_second:.1f} samples/s "
        f"({batch.samples_per_step} samples per step)",
        f"  utilisation: {100 * cycles.utilisation():.2f}% of the f32 AMP peak",
    ]
    ops = cycles.ipu_cycles()
    use = cycles.ipu_utilisation()
    for ipu, busy in cycles.ipu_busy_cycles().items():
        lines.append(f"  IPU {ipu}: busy {busy} cycles per step ({100 * use[ipu]:.1f}% of the "
                     f"step), ops {ops.get(ipu, 0)}")
    heavy = sorted(cycles.ops, key=lambda o: -o.cycles)[:top]
    if heavy:
        lines.append("  most expensive ops:")
        lines += [f"    {o.name}: {o.cycles} cycles, {o.flops} FLOPs" for o in heavy]
    lines.append(f"  runs profiled: {runs}, total cycles: {runs * cycles.step_cycles}")
    return "\n".join(lines)


def pipeline_lines(model: DeviceModel) -> list[str]:
    """The pipeline's cycle breakdown: fill/main/flush cycles of one run and each stage's
    cost (empty for an unpipelined program)."""
    pipe = model.cycles.pipeline
    if pipe is None:
        return []
    info = pipe.info
    lines = [
        f"  pipeline: {info.num_stages} stages, depth {info.depth}, SyncPattern "
        f"{info.sync_pattern}; one run = {pipe.fill_count} fill + {pipe.main_count} main + "
        f"{pipe.flush_count} flush cycles = {pipe.fill_cycles} + {pipe.main_cycles} + "
        f"{pipe.flush_cycles} cycles; main cycle time {pipe.cycle_time}",
    ]
    for s in range(info.num_stages):
        host = pipe.host_input_cycles[s]
        lines.append(
            f"    stage {s} (IPU {pipe.stage_ipu[s]}): {pipe.stage_cycles[s]} compute + "
            f"{pipe.copy_cycles[s]} copy cycles" + (f" + host input {host}" if host else ""))
    return lines
