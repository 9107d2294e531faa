"""Cycle model of the simulated IPU (DESIGN decision 8; published IPU figures).

Each op is one BSP superstep on its IPU (``OpSettings.ipu``; None is IPU 0):

    compute  = max(FLOPs / rate, bytes moved / SRAM bandwidth) · clock
    exchange = exchanged bytes / exchange bandwidth · clock
    cycles   = compute + exchange + sync latency

with FLOPs and bytes from ``Op.cost()``; device/op_cost.py holds the rates, the exchange rule
and the collective ring of one op.

A tensor read on another IPU than its producer's crosses the IPU-Links: bytes / link bandwidth
plus an IPU sync. Host streams cross the host link once per micro-batch (inputs) and per step
(anchors), each with a host sync (modelled as an IPU sync).

Off-chip tensors (tensor locations) cross to streaming memory: a RemoteLoad before
each fragment execution that uses an off-chip variable and a RemoteStore after one that writes it;
an off-chip activation is stored once and loaded for each reader. Each transfer costs bytes / the
host link bandwidth (streaming memory is reached over the host / gateway link; no separate figure
is published) plus an IPU sync, and belongs to the fragment it runs in. Execution phases
(transforms/execution_phases.py) put explicit RemoteLoad / RemoteStore ops in the IR: then each
of those ops is one transfer, and a load prefetched on an IPU that computes nothing in its phase
(the Preload IO schedule) hides behind that phase's compute (``phase_prefetch_cycles``), in the
micro-batch fragment and, with gradient accumulation, in the phased weight update (the accumulate
outer fragment) alike.

A step (one ``run()``) of an unpipelined program executes the schedule serially:
``batchesPerStep × accumulationFactor`` micro-batches of the Normal fragment, ``batchesPerStep``
runs of the accumulate outer fragment, and the host transfers. A sharded program (ops on several
IPUs, no pipelining) is serial too: one IPU works while the others wait for its results.
Replicas run in parallel on their own IPUs, so they do not lengthen the step; their collectives
cross the IPU-Links as a ring (``collective_cycles`` in device/op_cost.py). The groups are
drawn from all replicas of all processes under global replication (``globalReplicationFactor``),
since a collective reduces over every instance's replicas.

A pipelined program follows the cycle table of device/pipeline_cost.py; host streams
on IO tiles overlap compute as device/io_overlap.py describes. This module runs the
schedule, adds the IPU-Link copies, streaming-memory and host transfers (the records of
device/transfers.py), and sums the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

from ..ir.graph import Graph
from ..ir.op import ExecutionContext, Op
from ..ir.tensor import TensorKind
from .io_overlap import HostIO, HostStream, OverlapIO, overlap_io
from .memory import storage_roots
from .op_cost import (
    OpCycles,
    _host_transfer_cycles,
    _seconds_to_cycles,
    _with_tiles,
    op_cycles,
)
from .option_model import OptionModel
from .planner import planner_plan
from .pipeline_cost import (
    PipelineCycles,
    PipelineInfo,
    _pipeline_cycles,
)
from .spec import IpuSpec
from .transfers import BatchInfo, LinkTransfer, RemoteTransfer

__all__ = ["CycleResult", "collective_replicas", "compute_cycles"]


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
    # accumulateOuterFragmentSettings with an Overlap schedule: the IPUs whose outer-fragment
    # ops run in parallel with each other (empty: serial, the default).
    outer_overlap_ipus: frozenset[int] = frozenset()
    # Execution phases: RemoteLoad transfer cycles hidden behind the compute of the phase they
    # are prefetched in (an IPU loading the next phase's tensors while another IPU computes).
    phase_prefetch_cycles: int = 0
    # The same in the accumulate outer fragment (the phased weight update).
    outer_phase_prefetch_cycles: int = 0

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
        return (self.fragment_cycles(ExecutionContext.Normal) - self.phase_prefetch_cycles
                + self.host_input_cycles)

    @property
    def outer_cycles(self) -> int:
        """One run of the accumulate outer fragment (the weight update). With an Overlap
        schedule the ops of the IPUs in ``outer_overlap_ipus`` run in parallel (the slowest
        IPU counts); the other IPUs' ops, the copies and remote transfers stay serial."""
        outer = ExecutionContext.AccumulateOuterFragment
        serial = self.fragment_cycles(outer) - self.outer_phase_prefetch_cycles
        if len(self.outer_overlap_ipus) < 2:
            return serial
        per_ipu: dict[int, int] = {}
        for o in self.ops:
            if o.context is outer and o.ipu in self.outer_overlap_ipus:
                per_ipu[o.ipu] = per_ipu.get(o.ipu, 0) + o.cycles
        return serial - sum(per_ipu.values()) + max(per_ipu.values(), default=0)

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
                   replicas: int | None = None,
                   effects: OptionModel | None = None) -> CycleResult:
    """Per-op and per-step cycles of ``graph`` run in ``order`` (one replica).

    ``io``: the host streams with their tile sets and exchange strategies and the IO tiles per
    IPU; None means every stream is JustInTime on the compute tiles, with the stream bytes of
    ``batch``. ``off_chip``: tensors in streaming memory (storage roots). ``pipeline``: the
    stages and depth of a pipelined program, whose step follows its cycle table. ``replicas``:
    the replicas collectives span (``collective_replicas``; default the batch's local
    replication factor). ``effects``: what the session options ask of the model
    (device/option_model.py: batch-serialised ops' syncs, merged collectives, grouped host
    syncs).
    """
    effects = effects or OptionModel()
    batch = batch or BatchInfo()
    if replicas is None:
        replicas = batch.replication_factor
    result = CycleResult(spec, batch, outer_overlap_ipus=effects.outer_overlap_ipus)
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
        plan = planner_plan(op, compute_spec, None, effects.serialized_matmuls,
                            effects.matmul_proportion, effects.conv_proportion)
        result.ops.append(op_cycles(op, compute_spec, position, replicas, plan))
    _apply_option_effects(result.ops, order, effects, spec, compute_spec.num_tiles)
    result.remote = _remote_transfers(graph, order, spec, set(off_chip))
    if pipeline is None:
        result.phase_prefetch_cycles = phase_prefetch_cycles(order, result.ops, spec)
        result.outer_phase_prefetch_cycles = phase_prefetch_cycles(
            order, result.ops, spec, ExecutionContext.AccumulateOuterFragment)
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
        if effects.group_host_sync and input_bytes:
            # groupHostSync: the anchors ride the step's last input sync.
            result.host_anchor_cycles -= spec.ipu_sync_latency_cycles
    if pipeline is not None:
        result.pipeline = _pipeline_cycles(spec, result.ops, result.links, result.remote,
                                           pipeline, [s for s in serial if s.is_input])
    if any(io.on_io_tiles(s) for s in io.streams):
        # Overlapped streams hide behind one iteration: a micro-batch, or a pipeline cycle.
        iteration = (result.pipeline.cycle_time if result.pipeline is not None
                     else result.fragment_cycles(ExecutionContext.Normal))
        result.overlap = overlap_io(io, batch, spec, iteration)
    return result


def _apply_option_effects(ops: list[OpCycles], order: Sequence[Op], effects: OptionModel,
                          spec: IpuSpec, compute_tiles: int | None = None) -> None:
    """A batch-serialised op pays one sync per slice, an op with a constrained plan one per
    planner pass (device/planner.py); of the collectives of a merged kind in
    one fragment on one IPU only the first pays the IPU sync (device/option_model.py)."""
    merged_seen: set[tuple[str, ExecutionContext, int]] = set()
    for i, (op, oc) in enumerate(zip(order, ops)):
        syncs = effects.op_syncs(op)
        plan = planner_plan(op, spec, compute_tiles, effects.serialized_matmuls,
                            effects.matmul_proportion, effects.conv_proportion)
        if plan is not None:  # one superstep per planner pass (device/planner.py)
            syncs *= plan.passes
        if syncs > 1:
            oc = replace(oc, sync_cycles=oc.sync_cycles * syncs)
        if effects.merged_updates and effects.merged_follower(op):  # mergeVarUpdate
            oc = replace(oc, sync_cycles=0)
        if op.op_type in effects.merged_collectives and oc.collective_cycles:
            key = (op.op_type, oc.context, oc.ipu)
            if key in merged_seen:
                oc = replace(oc, collective_cycles=max(
                    0, oc.collective_cycles - spec.ipu_sync_latency_cycles))
            merged_seen.add(key)
        ops[i] = oc


def _normal_stage(op: Op) -> int | None:
    return (op.settings.pipeline_stage
            if op.settings.execution_context is ExecutionContext.Normal else None)


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
        explicit = explicit_transfers(graph, readers, writers)
        if explicit is not None:  # execution phases: one transfer per RemoteLoad / RemoteStore
            loads, stores = explicit
        elif tensor.kind is TensorKind.VARIABLE:
            # Loaded once before the fragment uses it, stored once if the fragment updates it.
            loads, stores = 1, 1 if writers else 0
        else:
            loads, stores = len(readers - writers), 1 if writers else 0
        cost = _host_transfer_cycles(tensor.info.num_bytes, spec)
        transfers.append(RemoteTransfer(tid, ipu, context, tensor.info.num_bytes, loads, stores,
                                        (loads + stores) * cost, stage))
    return transfers


def explicit_transfers(graph: Graph, readers: set[int],
                       writers: set[int]) -> tuple[int, int] | None:
    """(loads, stores) of an off-chip tensor the IR moves with explicit RemoteLoad /
    RemoteStore ops (execution phases), None when it has none (the transfers are implied)."""
    remote = {i for i in readers | writers if graph.ops[i].remote_transfer}
    if not remote:
        return None
    return len((remote & readers) - writers), len(remote & writers)


def phase_prefetch_cycles(order: Sequence[Op], ops: Sequence[OpCycles], spec: IpuSpec,
                          context: ExecutionContext = ExecutionContext.Normal) -> int:
    """Cycles of the RemoteLoads of fragment ``context`` that overlap compute: a load scheduled
    in an execution phase on an IPU that computes nothing in that phase (the Preload IO schedule
    fetching the next phase's tensors) runs while the phase's IPUs compute. Per phase the hidden
    part is the smaller of the two; loads on a computing IPU (OnDemand) are not hidden. Ops
    that only set up a buffer (``Op.allocates_only``: Init) are no compute to hide behind."""
    compute: dict[int, dict[int, int]] = {}  # phase -> ipu -> op cycles
    prefetch: dict[int, list[tuple[int, int]]] = {}  # phase -> [(ipu, transfer cycles)]
    for op, oc in zip(order, ops):
        phase = op.settings.execution_phase
        if phase is None or op.settings.execution_context is not context:
            continue
        if op.remote_transfer and not op.modifies_inputs:  # a load
            prefetch.setdefault(phase, []).append(
                (oc.ipu, _host_transfer_cycles(op.outputs[0].info.num_bytes, spec)))
        elif not op.remote_transfer and not op.allocates_only:  # Init computes nothing
            by_ipu = compute.setdefault(phase, {})
            by_ipu[oc.ipu] = by_ipu.get(oc.ipu, 0) + oc.cycles
    hidden = 0
    for phase, loads in prefetch.items():
        busy = compute.get(phase, {})
        idle = sum(c for ipu, c in loads if ipu not in busy)
        hidden += min(idle, max(busy.values(), default=0))
    return hidden
