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

A step (one ``run()``) executes the schedule serially: ``batchesPerStep × accumulationFactor``
micro-batches of the Normal fragment, ``batchesPerStep`` runs of the accumulate outer fragment,
and the host transfers. Replicas run in parallel on their own IPUs, so they do not lengthen the
step. Pipelining (issue #5) overlaps stages across IPUs: ``step_cycles`` is the one place that
combines per-op cycles into a step, to be replaced by the pipeline schedule there.

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

from ..ir.graph import Graph
from ..ir.op import ExecutionContext, Op
from ..ir.tensor import TensorKind
from ..tensorinfo import ExchangeStrategy, TileSet
from .memory import storage_roots
from .spec import IpuSpec

__all__ = [
    "BatchInfo", "CycleResult", "HostIO", "HostStream", "LinkTransfer", "OpCycles", "OverlapIO",
    "RemoteTransfer", "compute_cycles", "op_cycles", "overlap_io",
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

    def fragment_cycles(self, context: ExecutionContext) -> int:
        """Cycles of one execution of a fragment (ops, IPU-Link copies, remote loads/stores)."""
        return (sum(o.cycles for o in self.ops if o.context is context)
                + sum(t.cycles for t in self.links if t.context is context)
                + sum(r.cycles for r in self.remote if r.context is context))

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
        io = self.overlap.cycles if self.overlap is not None else 0
        return (b.micro_batches_per_step * self.micro_batch_cycles
                + b.batches_per_step * outer + self.host_anchor_cycles + io)

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


def compute_cycles(graph: Graph, order: Sequence[Op], spec: IpuSpec,
                   batch: BatchInfo | None = None, io: HostIO | None = None,
                   off_chip: Iterable[str] = ()) -> CycleResult:
    """Per-op and per-step cycles of ``graph`` run in ``order`` (one replica).

    ``io``: the host streams with their tile sets and exchange strategies and the IO tiles per
    IPU; None means every stream is JustInTime on the compute tiles, with the stream bytes of
    ``batch``. ``off_chip``: tensors in streaming memory (storage roots).
    """
    batch = batch or BatchInfo()
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
                    _seconds_to_cycles(t.info.num_bytes / spec.ipu_link_bytes_per_s, spec)
                    + spec.ipu_sync_latency_cycles,
                ))
        result.ops.append(op_cycles(op, compute_spec, position))
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
    if any(io.on_io_tiles(s) for s in io.streams):
        result.overlap = overlap_io(io, batch, spec,
                                    result.fragment_cycles(ExecutionContext.Normal))
    return result


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
    # (tensor, ipu, context) -> [ops reading it, ops writing it (producer or in place)]
    uses: dict[tuple[str, int, ExecutionContext], list[set[int]]] = {}
    for op in order:
        key_of = lambda t: (root.get(t.id, t.id), op.settings.ipu or 0,  # noqa: E731
                            op.settings.execution_context)
        for t in op.inputs:
            if t is not None and root.get(t.id, t.id) in off_chip:
                uses.setdefault(key_of(t), [set(), set()])[0].add(op.id)
        written = [op.inputs[i] for i in op.modifies_inputs if i < len(op.inputs)]
        for t in (*op.outputs, *written):
            if t is not None and root.get(t.id, t.id) in off_chip:
                uses.setdefault(key_of(t), [set(), set()])[1].add(op.id)
    transfers = []
    for (tid, ipu, context), (readers, writers) in uses.items():
        tensor = graph.tensors[tid]
        if tensor.kind is TensorKind.VARIABLE:
            # Loaded once before the fragment uses it, stored once if the fragment updates it.
            loads, stores = 1, 1 if writers else 0
        else:
            loads, stores = len(readers - writers), 1 if writers else 0
        cost = _host_transfer_cycles(tensor.info.num_bytes, spec)
        transfers.append(RemoteTransfer(tid, ipu, context, tensor.info.num_bytes, loads, stores,
                                        (loads + stores) * cost))
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
    from ..errors import popart_exception  # only on this error path

    raise popart_exception(f"Unknown SyncPattern {pattern!r}; use SyncPattern.Full, "
                           f"SinglePipeline or ReplicaAndLadder.")
