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

Off-chip tensors (tensor locations, spec §10) cross to streaming memory: a RemoteLoad before
each fragment execution that uses an off-chip variable and a RemoteStore after one that writes it;
an off-chip activation is stored once and loaded for each reader. Each transfer costs bytes / the
host link bandwidth (streaming memory is reached over the host / gateway link; no separate figure
is published) plus an IPU sync, and belongs to the fragment it runs in.

A step (one ``run()``) of an unpipelined program executes the schedule serially:
``batchesPerStep × accumulationFactor`` micro-batches of the Normal fragment, ``batchesPerStep``
runs of the accumulate outer fragment, and the host transfers. A sharded program (ops on several
IPUs, no pipelining) is serial too: one IPU works while the others wait for its results.
Replicas run in parallel on their own IPUs, so they do not lengthen the step; their collectives
(``ReplicatedAllReduce`` and the sharding collectives) cross the IPU-Links as a ring: an
all-reduce over a group of k replicas moves 2(k−1)/k of the tensor's bytes through each IPU's
links, a reduce-scatter or all-gather (k−1)/k of the whole tensor, plus one IPU sync. The groups
are drawn from all replicas of all processes under global replication (spec §5.3:
``globalReplicationFactor``), since a collective reduces over every instance's replicas.

A pipelined program (spec §5.1) is timed as the simulator runs it. One pipeline run has
G + P − 1 cycles (G = depth, P = stages counting forward and backward ones): P − 1 fill cycles,
G − P + 1 main cycles and P − 1 flush cycles; cycle c runs every stage s with s ≤ c < s + G.
In a cycle each IPU works serially through the stages it hosts that are active (their ops and
remote transfers), then through the cycle's inter-IPU copies it sends or receives (the IpuCopy
ops on the sending IPU, the link time on both ends). Stages whose host inputs arrive this cycle
transfer them over the host link; which IPUs wait for that depends on the device's
``SyncPattern`` (``host_sync_ipus``). The cycle lasts as long as its busiest IPU, plus one IPU
sync that ends it (the copies need it). A step is ``runs`` pipeline runs (one per weight update
with accumulation, else one over ``batchesPerStep``), each followed by the accumulate outer
fragment (serial, as the simulator runs it), plus the anchor transfers. An IPU's utilisation is
its busy cycles (ops, copies, remote transfers) over the step.

Overlapped IO (spec §9, F100-F104). With ``numIOTiles`` = n, ops compute on the remaining
tilesPerIPU − n tiles. A host stream on ``TileSet.IO`` with ``ExchangeStrategy`` OverlapInnerLoop
or OverlapLoops is prefetched by the IO tiles while the compute tiles work. The loops of a step
are an outer loop of M = batchesPerStep and an inner loop of N = accumulationFactor iterations
(a loop of fewer than 2 iterations is omitted: then N = batchesPerStep, M = 1). Of a stream's
transfers, OverlapInnerLoop hides all but 2 per inner loop (M·(N−2) of M·N), OverlapLoops all
but 2 per step (M·N−2). A hidden transfer costs nothing while the compute of the iterations it
runs behind is longer; the rest is added to the step. Every other transfer is serial, as with
JustInTime, and each transfer on the IO tiles is also copied to the compute tiles (on-chip
exchange). The simulator computes the same values either way: only the timeline changes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ..errors import popart_exception, popart_internal_exception
from ..ir.graph import Graph
from ..ir.op import ExecutionContext, Op
from ..ir.tensor import TensorKind
from ..tensorinfo import ExchangeStrategy, TileSet
from .memory import storage_roots
from .spec import IpuSpec

__all__ = [
    "BatchInfo", "CycleResult", "HostIO", "HostStream", "LinkTransfer", "OpCycles", "OverlapIO",
    "PipelineCycle", "PipelineCycles", "PipelineInfo", "RemoteTransfer", "collective_cycles",
    "collective_replicas", "compute_cycles", "host_sync_ipus", "op_cycles", "overlap_io",
]

_OVERLAP = (ExchangeStrategy.OverlapInnerLoop, ExchangeStrategy.OverlapLoops)

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
    # Cross-replica traffic of a collective over the IPU-Links (0 for other ops).
    collective_cycles: int = 0
    stage: int | None = None  # pipeline stage (None: not pipelined, or outer fragment)
    between_cycles: bool = False  # an IpuCopy: runs in the exchange at the end of a cycle

    @property
    def cycles(self) -> int:
        return (self.compute_cycles + self.exchange_cycles + self.sync_cycles
                + self.collective_cycles)


@dataclass(frozen=True)
class LinkTransfer:
    """A tensor copied between IPUs before the op at ``position`` reads it."""

    position: int
    tensor_id: str
    src_ipu: int
    dst_ipu: int
    num_bytes: int
    context: ExecutionContext
    link_cycles: int  # bytes over the IPU-Links
    sync_cycles: int  # the IPU sync before it (a pipeline cycle's own sync replaces it)
    stage: int | None = None  # the sending stage: the copy runs at the end of its cycle

    @property
    def cycles(self) -> int:
        return self.link_cycles + self.sync_cycles


@dataclass(frozen=True)
class RemoteTransfer:
    """The streaming-memory traffic of one off-chip tensor in one execution of a fragment."""

    tensor_id: str
    ipu: int
    context: ExecutionContext
    num_bytes: int  # one transfer
    loads: int
    stores: int
    cycles: int
    stage: int | None = None  # the pipeline stage whose fragment loads / stores it


@dataclass(frozen=True)
class HostStream:
    """One host stream of one replica: an input (host -> IPU) or an anchor (IPU -> host)."""

    id: str
    is_input: bool
    num_bytes: int  # one transfer
    transfers_per_step: int
    tile_set: TileSet = TileSet.Compute
    strategy: ExchangeStrategy = ExchangeStrategy.JustInTime
    ipu: int = 0
    info: str = ""  # e.g. "f32[4,8]"


@dataclass(frozen=True)
class HostIO:
    """The host streams of a program and the IO tiles per IPU that may serve them."""

    num_io_tiles: int = 0
    streams: tuple[HostStream, ...] = ()

    def on_io_tiles(self, stream: HostStream) -> bool:
        return self.num_io_tiles > 0 and stream.tile_set is TileSet.IO

    def overlapped(self, stream: HostStream) -> bool:
        """Whether the stream's transfers can run behind compute (IO tiles and a strategy)."""
        return self.on_io_tiles(stream) and stream.strategy in _OVERLAP


@dataclass(frozen=True)
class OverlapIO:
    """The host transfers of overlapped streams in one step (module docstring)."""

    outer_iterations: int  # M
    inner_iterations: int  # N
    exposed_transfers: int
    hidden_transfers: int
    exposed_cycles: int  # transfers that do not overlap, at full cost
    hidden_cycles: int  # transfer cycles run behind compute
    excess_cycles: int  # the part of the hidden transfers longer than the compute they hide behind
    io_copy_cycles: int  # IO tiles -> compute tiles (and back) for every IO-tile transfer

    @property
    def cycles(self) -> int:
        """What the overlapped streams add to a step."""
        return self.exposed_cycles + self.excess_cycles + self.io_copy_cycles


@dataclass(frozen=True)
class PipelineInfo:
    """What the cycle model needs of a pipelined program (``device.lower.Program``)."""

    num_stages: int  # P, forward and backward stages
    depth: int  # G, micro-batches per pipeline run
    runs_per_step: int  # batchesPerStep with gradient accumulation, else 1
    input_stages: tuple[tuple[str, int], ...] = ()  # (host input stream id, stage reading it)
    sync_pattern: str = "Full"  # the device's SyncPattern name

    @classmethod
    def from_program(cls, program, sync_pattern=None) -> PipelineInfo | None:
        """None for an unpipelined program. ``sync_pattern``: a ``SyncPattern`` or its name
        (default Full)."""
        if not program.num_stages:
            return None
        return cls(
            num_stages=program.num_stages,
            depth=program.pipeline_depth,
            runs_per_step=program.batches_per_step if program.has_outer_fragment else 1,
            input_stages=tuple((i.id, st) for i, st in zip(program.inputs,
                                                            program.input_stages)),
            sync_pattern=getattr(sync_pattern, "name", sync_pattern or "Full"),
        )

    def active_stages(self, cycle: int) -> tuple[int, ...]:
        """The stages cycle ``cycle`` of a run executes (stage s on micro-batch cycle - s)."""
        return tuple(s for s in range(self.num_stages) if s <= cycle < s + self.depth)

    def phase(self, cycle: int) -> str:
        """'fill' (the first P − 1 cycles), 'flush' (the last P − 1) or 'main'."""
        if cycle < self.num_stages - 1:
            return "fill"
        return "main" if cycle < self.depth else "flush"


@dataclass(frozen=True)
class PipelineCycle:
    """One cycle of a pipeline run."""

    index: int
    phase: str  # "fill", "main" or "flush"
    stages: tuple[int, ...]  # active stages
    busy: dict[int, int]  # per IPU: its stages' ops and remote transfers, its copies
    host: dict[int, int]  # per IPU: host transfers it makes or waits for (SyncPattern)
    sync_cycles: int  # the barrier that ends the cycle

    @property
    def cycles(self) -> int:
        """The cycle's length: its busiest IPU, then the sync."""
        return max((b + self.host.get(i, 0) for i, b in self.busy.items()), default=0) + (
            self.sync_cycles)


@dataclass
class PipelineCycles:
    """The cycle table of one pipeline run and the per-stage costs it was built from."""

    info: PipelineInfo
    stage_ipu: dict[int, int]
    stage_cycles: list[int]  # one execution of each stage's compute (ops, remote transfers)
    copy_cycles: list[int]  # its end-of-cycle copies: IpuCopy ops and link time, both ends
    host_input_cycles: list[int]  # its host inputs (0 when it reads none, or they overlap)
    cycles: list[PipelineCycle] = field(default_factory=list)

    def _phase(self, phase: str) -> list[PipelineCycle]:
        return [c for c in self.cycles if c.phase == phase]

    @property
    def fill_count(self) -> int:
        return len(self._phase("fill"))

    @property
    def main_count(self) -> int:
        return len(self._phase("main"))

    @property
    def flush_count(self) -> int:
        return len(self._phase("flush"))

    @property
    def fill_cycles(self) -> int:
        return sum(c.cycles for c in self._phase("fill"))

    @property
    def main_cycles(self) -> int:
        return sum(c.cycles for c in self._phase("main"))

    @property
    def flush_cycles(self) -> int:
        return sum(c.cycles for c in self._phase("flush"))

    @property
    def run_cycles(self) -> int:
        """One pipeline run: fill, main and flush."""
        return sum(c.cycles for c in self.cycles)

    @property
    def cycle_time(self) -> int:
        """The length of a main (steady-state) cycle, when every stage runs."""
        main = self._phase("main")
        return max(c.cycles for c in main) if main else 0

    def busy(self) -> dict[int, int]:
        """Busy cycles per IPU in one run."""
        out: dict[int, int] = {}
        for c in self.cycles:
            for i, b in c.busy.items():
                out[i] = out.get(i, 0) + b
        return out


@dataclass
class CycleResult:
    """Per-op cycles and the step total of one replica."""

    spec: IpuSpec
    batch: BatchInfo
    ops: list[OpCycles] = field(default_factory=list)
    links: list[LinkTransfer] = field(default_factory=list)
    remote: list[RemoteTransfer] = field(default_factory=list)
    host_input_cycles: int = 0  # per micro-batch (streams not overlapped)
    host_anchor_cycles: int = 0  # per step (streams not overlapped)
    overlap: OverlapIO | None = None  # streams on IO tiles, when there are any
    pipeline: PipelineCycles | None = None  # the cycle table of a pipelined program

    def fragment_cycles(self, context: ExecutionContext) -> int:
        """Cycles of one execution of a fragment (ops, IPU-Link copies, remote loads/stores),
        serially."""
        return (sum(o.cycles for o in self.ops if o.context is context)
                + sum(t.cycles for t in self.links if t.context is context)
                + sum(r.cycles for r in self.remote if r.context is context))

    @property
    def micro_batch_cycles(self) -> int:
        """One micro-batch of the Normal fragment, with its host input transfer, run serially
        (a pipelined program overlaps micro-batches: see ``pipeline``)."""
        return self.fragment_cycles(ExecutionContext.Normal) + self.host_input_cycles

    @property
    def outer_cycles(self) -> int:
        """One run of the accumulate outer fragment (the weight update)."""
        return self.fragment_cycles(ExecutionContext.AccumulateOuterFragment)

    @property
    def step_cycles(self) -> int:
        """One ``run()``: micro-batches (or pipeline runs), weight updates and anchor
        transfers (module docstring)."""
        b = self.batch
        io = self.overlap.cycles if self.overlap is not None else 0
        if self.pipeline is not None:
            runs = self.pipeline.info.runs_per_step
            compute = runs * self.pipeline.run_cycles + b.batches_per_step * self.outer_cycles
        else:
            compute = (b.micro_batches_per_step * self.micro_batch_cycles
                       + b.batches_per_step * self.outer_cycles)
        return compute + self.host_anchor_cycles + io

    @property
    def step_seconds(self) -> float:
        return self.step_cycles / self.spec.clock_hz

    @property
    def samples_per_second(self) -> float:
        """Simulated throughput: samples per step / step time."""
        return self.batch.samples_per_step / self.step_seconds if self.step_cycles else 0.0

    def _runs(self) -> dict[ExecutionContext, int]:
        return {ExecutionContext.Normal: self.batch.micro_batches_per_step,
                ExecutionContext.AccumulateOuterFragment: self.batch.batches_per_step}

    def ipu_cycles(self) -> dict[int, int]:
        """Op cycles per IPU for one step (compute, exchange, syncs and collectives of its ops;
        ``getCycleCount("ipu<N>")`` is ``ipu_busy_cycles``, which adds copies and remote
        transfers)."""
        runs = self._runs()
        busy: dict[int, int] = {}
        for o in self.ops:
            busy[o.ipu] = busy.get(o.ipu, 0) + o.cycles * runs.get(o.context, 0)
        return busy

    def ipu_busy_cycles(self) -> dict[int, int]:
        """Cycles per IPU in one step when it is not waiting: its ops, the IPU-Link copies it
        sends or receives, and the remote transfers of its tensors (host transfers and the
        waits for other IPUs are not counted; ``getCycleCount("ipu<N>")``)."""
        runs = self._runs()
        # A pipelined Normal fragment is counted by the cycle table (copies without their own
        # sync: the cycle's sync covers them).
        skip = ExecutionContext.Normal if self.pipeline is not None else None
        busy: dict[int, int] = {}

        def add(ipu: int, cycles: int) -> None:
            busy[ipu] = busy.get(ipu, 0) + cycles

        for o in self.ops:
            if o.context is not skip:
                add(o.ipu, o.cycles * runs.get(o.context, 0))
        for t in self.links:
            if t.context is not skip:
                for i in {t.src_ipu, t.dst_ipu}:
                    add(i, t.cycles * runs.get(t.context, 0))
        for r in self.remote:
            if r.context is not skip:
                add(r.ipu, r.cycles * runs.get(r.context, 0))
        if self.pipeline is not None:
            for i, n in self.pipeline.busy().items():
                add(i, n * self.pipeline.info.runs_per_step)
        return dict(sorted(busy.items()))

    def ipu_utilisation(self) -> dict[int, float]:
        """Per IPU: the fraction of the step it is busy (``ipu_busy_cycles`` / step)."""
        step = self.step_cycles
        return {i: (b / step if step else 0.0) for i, b in self.ipu_busy_cycles().items()}

    def flops_per_step(self) -> int:
        runs = self._runs()
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


def collective_cycles(op: Op, spec: IpuSpec, replicas: int) -> int:
    """IPU-Link cycles of a cross-replica collective over ``replicas`` replicas (0 for other
    ops, or one replica): a ring over each group of k replicas moves 2(k−1)/k of the bytes for
    an all-reduce, (k−1)/k of the whole tensor for a reduce-scatter or all-gather, plus one
    IPU sync."""
    if not getattr(op, "collective", False) or replicas <= 1:
        return 0
    k = max(len(g) for g in op.groups(replicas))
    if k <= 1:
        return 0
    if op.op_type == "ReplicatedAllReduce":
        moved = 2 * (k - 1) / k * op.inputs[0].info.num_bytes
    else:
        # The whole tensor: the reduce-scatter's input, the all-gather's output.
        whole = max(op.inputs[0].info.num_bytes, op.outputs[0].info.num_bytes)
        moved = (k - 1) / k * whole
    return _seconds_to_cycles(moved / spec.ipu_link_bytes_per_s, spec) + (
        spec.ipu_sync_latency_cycles)


def op_cycles(op: Op, spec: IpuSpec, position: int = 0, replicas: int = 1) -> OpCycles:
    """The cycles of one execution of ``op`` on an IPU of ``spec``, in a program of
    ``replicas`` replicas (collectives cross the IPU-Links between them)."""
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
        collective_cycles=collective_cycles(op, spec, replicas),
        stage=(op.settings.pipeline_stage
               if op.settings.execution_context is ExecutionContext.Normal else None),
        between_cycles=bool(getattr(op, "runs_between_cycles", False)),
    )


def _with_tiles(spec: IpuSpec, tiles: int) -> IpuSpec:
    """``spec`` with only ``tiles`` tiles computing: whole-IPU rates scale with the tiles."""
    if tiles == spec.num_tiles:
        return spec
    share = tiles / spec.num_tiles
    return dataclasses.replace(
        spec, num_tiles=tiles,
        peak_flops_f32=spec.peak_flops_f32 * share, peak_flops_f16=spec.peak_flops_f16 * share,
        exchange_bytes_per_s=spec.exchange_bytes_per_s * share,
        sram_bytes_per_s=spec.sram_bytes_per_s * share,
        vector_flops_f32=spec.vector_flops_f32 * share,
        vector_flops_f16=spec.vector_flops_f16 * share,
    )


def _host_transfer_cycles(num_bytes: int, spec: IpuSpec) -> int:
    """One transfer over the host link (or to streaming memory) with its sync."""
    return (_seconds_to_cycles(num_bytes / spec.host_link_bytes_per_s, spec)
            + spec.ipu_sync_latency_cycles)


def collective_replicas(options, local: int) -> int:
    """The replicas a collective's groups are drawn from: with global replication
    (``enableDistributedReplicatedGraphs``) all replicas of all processes
    (``globalReplicationFactor``), else the ``local`` replicas of this process. ``options``:
    SessionOptions or None."""
    if options is not None and options.enableDistributedReplicatedGraphs:
        return max(local, options.globalReplicationFactor)
    return local


def compute_cycles(graph: Graph, order: Sequence[Op], spec: IpuSpec,
                   batch: BatchInfo | None = None, io: HostIO | None = None,
                   off_chip: Iterable[str] = (),
                   pipeline: PipelineInfo | None = None,
                   replicas: int | None = None) -> CycleResult:
    """Per-op and per-step cycles of ``graph`` run in ``order`` (one replica).

    ``io``: the host streams with their tile sets and exchange strategies and the IO tiles per
    IPU; None means every stream is JustInTime on the compute tiles, with the stream bytes of
    ``batch``. ``off_chip``: tensors in streaming memory (storage roots). ``pipeline``: the
    stages and depth of a pipelined program, whose step follows its cycle table. ``replicas``:
    the replicas collectives span (``collective_replicas``; default the batch's local
    replication factor).
    """
    batch = batch or BatchInfo()
    if replicas is None:
        replicas = batch.replication_factor
    result = CycleResult(spec, batch)
    compute_spec = _with_tiles(spec, spec.num_tiles - (io.num_io_tiles if io else 0))
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
                    _seconds_to_cycles(t.info.num_bytes / spec.ipu_link_bytes_per_s, spec),
                    spec.ipu_sync_latency_cycles,
                    _normal_stage(t.producer),
                ))
        result.ops.append(op_cycles(op, compute_spec, position, replicas))
    result.remote = _remote_transfers(graph, order, spec, set(off_chip))
    if io is None:
        io = HostIO(streams=(
            HostStream("inputs", True, batch.input_bytes_per_micro_batch,
                       batch.micro_batches_per_step),
            HostStream("anchors", False, batch.anchor_bytes_per_step, 1),
        ))
    serial = [s for s in io.streams if not io.overlapped(s)]
    input_bytes = sum(s.num_bytes for s in serial if s.is_input)
    anchor_bytes = sum(s.num_bytes * s.transfers_per_step for s in serial if not s.is_input)
    if input_bytes:
        result.host_input_cycles = _host_transfer_cycles(input_bytes, spec)
    if anchor_bytes:
        result.host_anchor_cycles = _host_transfer_cycles(anchor_bytes, spec)
    if pipeline is not None:
        result.pipeline = _pipeline_cycles(result, pipeline, [s for s in serial if s.is_input])
    if any(io.on_io_tiles(s) for s in io.streams):
        # Overlapped streams hide behind one iteration: a micro-batch, or a pipeline cycle.
        iteration = (result.pipeline.cycle_time if result.pipeline is not None
                     else result.fragment_cycles(ExecutionContext.Normal))
        result.overlap = overlap_io(io, batch, spec, iteration)
    return result


def _normal_stage(op: Op) -> int | None:
    return (op.settings.pipeline_stage
            if op.settings.execution_context is ExecutionContext.Normal else None)


def _pipeline_cycles(result: CycleResult, info: PipelineInfo,
                     inputs: Sequence[HostStream]) -> PipelineCycles:
    """The cycle table of one pipeline run (module docstring) from the per-op costs of
    ``result``; ``inputs``: the host input streams not overlapped by IO tiles."""
    spec = result.spec
    normal = ExecutionContext.Normal
    stages = info.num_stages
    work: list[dict[int, int]] = [{} for _ in range(stages)]  # per stage, per IPU
    compute, copies = [0] * stages, [0] * stages
    stage_ipu: dict[int, int] = {}

    def add(stage: int | None, ipu: int, cycles: int, copy: bool) -> None:
        if stage is None or not 0 <= stage < stages:
            raise popart_internal_exception(
                f"Cycle model: a Normal-fragment item on IPU {ipu} has pipeline stage {stage}, "
                f"outside 0..{stages - 1}; every per-micro-batch op of a pipelined program "
                f"needs a stage (transforms/pipelining.py).")
        work[stage][ipu] = work[stage].get(ipu, 0) + cycles
        (copies if copy else compute)[stage] += cycles

    for o in result.ops:
        if o.context is normal:
            add(o.stage, o.ipu, o.cycles, o.between_cycles)
            if not o.between_cycles:
                stage_ipu.setdefault(o.stage, o.ipu)
    for t in result.links:
        if t.context is normal:
            # Both ends take part in the transfer; the cycle's sync replaces the copy's own.
            add(t.stage, t.src_ipu, t.link_cycles, True)
            work[t.stage][t.dst_ipu] = work[t.stage].get(t.dst_ipu, 0) + t.link_cycles
    for r in result.remote:
        if r.context is normal:
            add(r.stage, r.ipu, r.cycles, False)
    stage_of_input = dict(info.input_stages)
    first_input_stage = min(stage_of_input.values(), default=0)
    host_bytes = [0] * stages
    for stream in inputs:
        host_bytes[stage_of_input.get(stream.id, first_input_stage)] += stream.num_bytes
    host = [_host_transfer_cycles(n, spec) if n else 0 for n in host_bytes]
    for s in range(stages):
        stage_ipu.setdefault(s, min(work[s], default=0))
    ipus = sorted({*stage_ipu.values(), *(i for w in work for i in w)})
    num_ipus = max(ipus) + 1
    # One barrier across the replica's IPUs ends each cycle (a tile sync on a single IPU).
    sync = spec.ipu_sync_latency_cycles if len(ipus) > 1 else spec.sync_latency_cycles
    table = PipelineCycles(info, dict(sorted(stage_ipu.items())), compute, copies, host)
    for c in range(info.depth + stages - 1):
        active = info.active_stages(c)
        busy = dict.fromkeys(ipus, 0)
        for s in active:
            for i, n in work[s].items():
                busy[i] += n
        waits = dict.fromkeys(ipus, 0)
        senders = {s for s in active if host[s]}
        if senders:
            hosts = {stage_ipu[s] for s in senders}
            stalled = host_sync_ipus(info.sync_pattern, num_ipus, hosts)
            joint = sum(host[s] for s in senders)
            for i in stalled:
                # A joint host sync (Full, ReplicaAndLadder) waits for every transfer of the
                # cycle; with SinglePipeline an IPU waits only for its own.
                own = sum(host[s] for s in senders if stage_ipu[s] == i)
                waits[i] = own if info.sync_pattern == "SinglePipeline" else joint
        table.cycles.append(PipelineCycle(c, info.phase(c), active, busy, waits, sync))
    return table


def overlap_io(io: HostIO, batch: BatchInfo, spec: IpuSpec, iteration_cycles: int) -> OverlapIO:
    """The cycles the IO-tile streams of ``io`` add to a step whose micro-batches compute for
    ``iteration_cycles`` each (module docstring)."""
    af, bps = batch.accumulation_factor, batch.batches_per_step
    outer, inner = (bps, af) if af >= 2 else (1, bps)
    exposed = hidden = exposed_cycles = hidden_cycles = copy_cycles = 0
    most_hidden = 0
    for stream in io.streams:
        if not io.on_io_tiles(stream):
            continue
        count = stream.transfers_per_step
        copy_cycles += count * _seconds_to_cycles(stream.num_bytes / spec.exchange_bytes_per_s,
                                                  spec)
        if not io.overlapped(stream):
            continue
        loops = outer if stream.strategy is ExchangeStrategy.OverlapInnerLoop else 1
        shown = min(count, 2 * loops)
        cost = _host_transfer_cycles(stream.num_bytes, spec)
        exposed += shown
        hidden += count - shown
        exposed_cycles += shown * cost
        hidden_cycles += (count - shown) * cost
        most_hidden = max(most_hidden, count - shown)
    # Streams not overlapped are in host_input_cycles / host_anchor_cycles already.
    return OverlapIO(
        outer_iterations=outer,
        inner_iterations=inner,
        exposed_transfers=exposed,
        hidden_transfers=hidden,
        exposed_cycles=exposed_cycles,
        hidden_cycles=hidden_cycles,
        excess_cycles=max(0, hidden_cycles - most_hidden * iteration_cycles),
        io_copy_cycles=copy_cycles,
    )


def _remote_transfers(graph: Graph, order: Sequence[Op], spec: IpuSpec,
                      off_chip: set[str]) -> list[RemoteTransfer]:
    """RemoteLoad / RemoteStore traffic of the off-chip tensors, per IPU and fragment."""
    if not off_chip:
        return []
    root = storage_roots(order)
    # (tensor, ipu, context, pipeline stage) -> [ops reading it, ops writing it (producer or
    # in place)]. Each pipeline stage is a fragment of its own, run once per cycle.
    uses: dict[tuple[str, int, ExecutionContext, int | None], list[set[int]]] = {}
    for op in order:
        key_of = lambda t: (root.get(t.id, t.id), op.settings.ipu or 0,  # noqa: E731
                            op.settings.execution_context, _normal_stage(op))
        for t in op.inputs:
            if t is not None and root.get(t.id, t.id) in off_chip:
                uses.setdefault(key_of(t), [set(), set()])[0].add(op.id)
        written = [op.inputs[i] for i in op.modifies_inputs if i < len(op.inputs)]
        for t in (*op.outputs, *written):
            if t is not None and root.get(t.id, t.id) in off_chip:
                uses.setdefault(key_of(t), [set(), set()])[1].add(op.id)
    transfers = []
    for (tid, ipu, context, stage), (readers, writers) in uses.items():
        tensor = graph.tensors[tid]
        if tensor.kind is TensorKind.VARIABLE:
            # Loaded once before the fragment uses it, stored once if the fragment updates it.
            loads, stores = 1, 1 if writers else 0
        else:
            loads, stores = len(readers - writers), 1 if writers else 0
        cost = _host_transfer_cycles(tensor.info.num_bytes, spec)
        transfers.append(RemoteTransfer(tid, ipu, context, tensor.info.num_bytes, loads, stores,
                                        (loads + stores) * cost, stage))
    return transfers


def host_sync_ipus(pattern, num_ipus: int, host_ipus: Iterable[int]) -> frozenset[int]:
    """The IPUs that stall while ``host_ipus`` exchange with the host, under sync pattern
    ``pattern`` (a ``device.manager.SyncPattern``; spec §5.4, F77).

    Full: every IPU of the device joins each host sync. SinglePipeline: each IPU syncs with the
    host on its own, so only the IPUs doing the transfer stall. ReplicaAndLadder: the IPUs form
    two ladder halves (even and odd IPU ids, A+C and B+D of a 2×2 ladder) that alternate between
    host IO and compute, so the halves holding a transferring IPU stall. The values computed
    never depend on it; only the timeline does.
    """
    host = frozenset(host_ipus)
    name = getattr(pattern, "name", str(pattern))
    if name == "Full":
        return frozenset(range(num_ipus))
    if name == "SinglePipeline":
        return host
    if name == "ReplicaAndLadder":
        halves = {ipu % 2 for ipu in host}
        return frozenset(i for i in range(num_ipus) if i % 2 in halves)
    raise popart_exception(f"Unknown SyncPattern {pattern!r}; use SyncPattern.Full, "
                           f"SinglePipeline or ReplicaAndLadder.")
