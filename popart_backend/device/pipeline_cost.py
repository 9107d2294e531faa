"""Cycle table of a pipelined program and the host syncs of a ``SyncPattern``, built from the
per-op costs and transfers that ``device/cost.py`` collects in a
``CycleResult``.

A pipelined program is timed as the simulator runs it. One pipeline run has
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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ..errors import popart_exception, popart_internal_exception
from ..ir.op import ExecutionContext
from .io_overlap import HostStream
from .op_cost import OpCycles, _host_transfer_cycles
from .spec import IpuSpec
from .transfers import LinkTransfer, RemoteTransfer


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
            runs_per_step=program.batches_per_step if program.windowed else 1,
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


def _pipeline_cycles(spec: IpuSpec, ops: Sequence[OpCycles], links: Sequence[LinkTransfer],
                     remote: Sequence[RemoteTransfer], info: PipelineInfo,
                     inputs: Sequence[HostStream]) -> PipelineCycles:
    """The cycle table of one pipeline run (module docstring) from the per-op costs, IPU-Link
    copies and remote transfers of one step (``device.cost.CycleResult``); ``inputs``: the host
    input streams not overlapped by IO tiles."""
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

    for o in ops:
        if o.context is normal:
            add(o.stage, o.ipu, o.cycles, o.between_cycles)
            if not o.between_cycles:
                stage_ipu.setdefault(o.stage, o.ipu)
    for t in links:
        if t.context is normal:
            # Both ends take part in the transfer; the cycle's sync replaces the copy's own.
            add(t.stage, t.src_ipu, t.link_cycles, True)
            work[t.stage][t.dst_ipu] = work[t.stage].get(t.dst_ipu, 0) + t.link_cycles
    for r in remote:
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


def host_sync_ipus(pattern, num_ipus: int, host_ipus: Iterable[int]) -> frozenset[int]:
    """The IPUs that stall while ``host_ipus`` exchange with the host, under sync pattern
    ``pattern`` (a ``device.manager.SyncPattern``).

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
