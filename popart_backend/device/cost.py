"""Cycle model of the simulated IPU (DESIGN decision 8; spec Appendix A, F56).

Each op is one BSP superstep on its IPU (``OpSettings.ipu``; None is IPU 0):

    compute  = max(FLOPs / rate, bytes moved / SRAM bandwidth) · clock
    exchange = exchanged bytes / exchange bandwidth · clock
    cycles   = compute + exchange + sync latency

with FLOPs and bytes from ``Op.cost()``. ``rate`` is the AMP peak for the op's dtype times
``amp_efficiency`` for ops with ``uses_amp`` (MatMul, Gemm, Conv, ...), else the vector units'
rate; both, and the SRAM bandwidth, are scaled by the share of tiles the op has work on (the
tiles of its largest operand under the linear mapping of device/memory.py). Exchanged bytes:
the computed (non-variable, non-constant) inputs of an AMP op, which are broadcast to the tiles
computing partial products, and of other ops each computed input whose size differs from the
output's (elementwise ops read inputs mapped like their output). Variables and constants are
laid out at compile time for the op that reads them, so they are not exchanged.

A tensor read on another IPU than its producer's crosses the IPU-Links: bytes / link bandwidth
plus an IPU sync. Host streams cross the host link once per micro-batch (inputs) and per step
(anchors), each with a host sync (modelled as an IPU sync).

A step (one ``run()``) executes the schedule serially: ``batchesPerStep × accumulationFactor``
micro-batches of the Normal fragment, ``batchesPerStep`` runs of the accumulate outer fragment,
and the host transfers. Replicas run in parallel on their own IPUs, so they do not lengthen the
step. Pipelining (issue #5) overlaps stages across IPUs: ``step_cycles`` is the one place that
combines per-op cycles into a step, to be replaced by the pipeline schedule there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ..ir.graph import Graph
from ..ir.op import ExecutionContext, Op
from ..ir.tensor import TensorKind
from .spec import IpuSpec

__all__ = ["BatchInfo", "CycleResult", "LinkTransfer", "OpCycles", "compute_cycles", "op_cycles"]

# Tensors whose tile layout is chosen at compile time for the op reading them.
_LAID_OUT = (TensorKind.VARIABLE, TensorKind.CONST)


@dataclass(frozen=True)
class BatchInfo:
    """How often one step runs the schedule, and what crosses the host link."""

    batches_per_step: int = 1
    accumulation_factor: int = 1
    replication_factor: int = 1
    samples_per_micro_batch: int = 1
    input_bytes_per_micro_batch: int = 0  # all input streams of one replica's micro-batch
    anchor_bytes_per_step: int = 0  # all anchor chunks one replica returns per run

    @classmethod
    def from_program(cls, program) -> "BatchInfo":
        """From a lowered ``device.lower.Program``. Samples per micro-batch: the leading dim of
        the first input stream (1 for a scalar input or none)."""
        first = program.inputs[0].info.shape if program.inputs else ()
        rf = program.replication_factor
        return cls(
            batches_per_step=program.batches_per_step,
            accumulation_factor=program.accumulation_factor,
            replication_factor=rf,
            samples_per_micro_batch=first[0] if first else 1,
            input_bytes_per_micro_batch=sum(i.info.num_bytes for i in program.inputs),
            anchor_bytes_per_step=sum(a.fetches_per_run * a.info.num_bytes
                                      for a in program.anchors) // rf,
        )

    @property
    def micro_batches_per_step(self) -> int:
        """Micro-batches one replica runs in a step."""
        return self.batches_per_step * self.accumulation_factor

    @property
    def samples_per_step(self) -> int:
        """Samples all replicas together consume in a step."""
        return self.micro_batches_per_step * self.replication_factor * self.samples_per_micro_batch


@dataclass(frozen=True)
class OpCycles:
    """The cost of one execution of one op."""

    position: int  # in the schedule
    op_id: int
    name: str  # debug name
    op_type: str
    ipu: int
    context: ExecutionContext
    flops: int
    bytes_moved: int
    exchange_bytes: int
    tiles_used: int
    compute_cycles: int
    exchange_cycles: int
    sync_cycles: int

    @property
    def cycles(self) -> int:
        return self.compute_cycles + self.exchange_cycles + self.sync_cycles


@dataclass(frozen=True)
class LinkTransfer:
    """A tensor copied between IPUs before the op at ``position`` reads it."""

    position: int
    tensor_id: str
    src_ipu: int
    dst_ipu: int
    num_bytes: int
    context: ExecutionContext
    cycles: int


@dataclass
class CycleResult:
    """Per-op cycles and the step total of one replica."""

    spec: IpuSpec
    batch: BatchInfo
    ops: list[OpCycles] = field(default_factory=list)
    links: list[LinkTransfer] = field(default_factory=list)
    host_input_cycles: int = 0  # per micro-batch
    host_anchor_cycles: int = 0  # per step

    def fragment_cycles(self, context: ExecutionContext) -> int:
        """Cycles of one execution of a fragment (ops and IPU-Link copies)."""
        return (sum(o.cycles for o in self.ops if o.context is context)
                + sum(t.cycles for t in self.links if t.context is context))

    @property
    def micro_batch_cycles(self) -> int:
        """One micro-batch of the Normal fragment, with its host input transfer."""
        return self.fragment_cycles(ExecutionContext.Normal) + self.host_input_cycles

    @property
    def step_cycles(self) -> int:
        """One ``run()``: micro-batches, weight updates and anchor transfers, serially.

        TODO(#5): pipelined programs overlap stages on different IPUs; combine per-IPU
        timelines here instead of summing.
        """
        b = self.batch
        outer = self.fragment_cycles(ExecutionContext.AccumulateOuterFragment)
        return (b.micro_batches_per_step * self.micro_batch_cycles
                + b.batches_per_step * outer + self.host_anchor_cycles)

    @property
    def step_seconds(self) -> float:
        return self.step_cycles / self.spec.clock_hz

    @property
    def samples_per_second(self) -> float:
        """Simulated throughput: samples per step / step time."""
        return self.batch.samples_per_step / self.step_seconds if self.step_cycles else 0.0

    def ipu_cycles(self) -> dict[int, int]:
        """Compute cycles per IPU for one step (how busy each IPU is)."""
        runs = {ExecutionContext.Normal: self.batch.micro_batches_per_step,
                ExecutionContext.AccumulateOuterFragment: self.batch.batches_per_step}
        busy: dict[int, int] = {}
        for o in self.ops:
            busy[o.ipu] = busy.get(o.ipu, 0) + o.cycles * runs.get(o.context, 0)
        return busy

    def flops_per_step(self) -> int:
        runs = {ExecutionContext.Normal: self.batch.micro_batches_per_step,
                ExecutionContext.AccumulateOuterFragment: self.batch.batches_per_step}
        return sum(o.flops * runs.get(o.context, 0) for o in self.ops)

    def utilisation(self) -> float:
        """Achieved FLOP/s of one replica over the f32 AMP peak of its IPUs."""
        ipus = max(1, len(self.ipu_cycles()))
        peak = self.spec.peak_flops_f32 * ipus
        return self.flops_per_step() / self.step_seconds / peak if self.step_cycles else 0.0


def _seconds_to_cycles(seconds: float, spec: IpuSpec) -> int:
    return math.ceil(seconds * spec.clock_hz)


def _tiles_for(num_bytes: int, spec: IpuSpec) -> int:
    return max(1, min(spec.num_tiles, math.ceil(num_bytes / spec.tile_grain_bytes)))


def op_cycles(op: Op, spec: IpuSpec, position: int = 0) -> OpCycles:
    """The cycles of one execution of ``op`` on an IPU of ``spec``."""
    flops, moved = op.cost()
    ins = [t.info for t in op.inputs if t is not None]
    outs = [t.info for t in op.outputs if t is not None]
    largest = max((i.num_bytes for i in (*ins, *outs)), default=0)
    tiles = _tiles_for(largest, spec)
    share = tiles / spec.num_tiles
    info = outs[0] if outs else (ins[0] if ins else None)
    dtype = info.dtype.short if info is not None else "f32"
    rate = (spec.peak_flops(dtype) * spec.amp_efficiency if op.uses_amp
            else spec.vector_flops(dtype)) * share
    compute_s = max(flops / rate, moved / (spec.sram_bytes_per_s * share))
    out_bytes = outs[0].num_bytes if outs else 0
    exchange = sum(t.info.num_bytes for t in op.inputs
                   if t is not None and t.kind not in _LAID_OUT
                   and (op.uses_amp or t.info.num_bytes != out_bytes))
    return OpCycles(
        position=position,
        op_id=op.id,
        name=op.debug_name,
        op_type=op.op_type,
        ipu=op.settings.ipu or 0,
        context=op.settings.execution_context,
        flops=int(flops),
        bytes_moved=int(moved),
        exchange_bytes=int(exchange),
        tiles_used=tiles,
        compute_cycles=_seconds_to_cycles(compute_s, spec),
        exchange_cycles=_seconds_to_cycles(exchange / spec.exchange_bytes_per_s, spec),
        sync_cycles=spec.sync_latency_cycles,
    )


def compute_cycles(graph: Graph, order: Sequence[Op], spec: IpuSpec,
                   batch: BatchInfo | None = None) -> CycleResult:
    """Per-op and per-step cycles of ``graph`` run in ``order`` (one replica)."""
    batch = batch or BatchInfo()
    result = CycleResult(spec, batch)
    copied: set[tuple[str, int]] = set()
    for position, op in enumerate(order):
        ipu = op.settings.ipu or 0
        for t in op.inputs:
            if t is None or t.producer is None:
                continue
            src = t.producer.settings.ipu or 0
            if src != ipu and (t.id, ipu) not in copied:
                copied.add((t.id, ipu))
                result.links.append(LinkTransfer(
                    position, t.id, src, ipu, t.info.num_bytes, op.settings.execution_context,
                    _seconds_to_cycles(t.info.num_bytes / spec.ipu_link_bytes_per_s, spec)
                    + spec.ipu_sync_latency_cycles,
                ))
        result.ops.append(op_cycles(op, spec, position))
    host = spec.host_link_bytes_per_s
    if batch.input_bytes_per_micro_batch:
        result.host_input_cycles = (_seconds_to_cycles(batch.input_bytes_per_micro_batch / host,
                                                       spec) + spec.ipu_sync_latency_cycles)
    if batch.anchor_bytes_per_step:
        result.host_anchor_cycles = (_seconds_to_cycles(batch.anchor_bytes_per_step / host, spec)
                                     + spec.ipu_sync_latency_cycles)
    return result
