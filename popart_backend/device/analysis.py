"""The device model of a compiled session: memory (device/memory.py) and cycles (device/cost.py).

``analyse()`` is what ``prepareDevice()`` calls once the schedule is fixed; the session keeps the
``DeviceModel`` for ``getSummaryReport()``, ``getReport()`` and ``getCycleCount()``. It resolves
the tensor locations (transforms/tensor_locations.py) and gathers the host streams with their
tile sets and exchange strategies, which both models read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import onnx

from ..errors import popart_exception
from ..ir.ir import Ir
from ..ir.op import Op
from ..tensorinfo import ExchangeStrategy, InputSettings, input_settings_from_model
from ..transforms.tensor_locations import (
    ResolvedLocation,
    output_locations_from_model,
    resolve_tensor_locations,
)
from .cost import CycleResult, collective_replicas, compute_cycles
from .io_overlap import HostIO, HostStream
from .memory import IoBuffer, MemoryResult, check_fits, compute_memory, storage_roots
from .option_model import option_model
from .pipeline_cost import PipelineInfo
from .spec import IpuSpec
from .transfers import BatchInfo

__all__ = ["DeviceModel", "analyse", "host_io"]

# Buffers an IO-tile stream keeps per strategy (device/memory.py explains why).
_IO_BUFFER_DEPTH = {
    ExchangeStrategy.JustInTime: 1,
    ExchangeStrategy.OverlapInnerLoop: 2,
    ExchangeStrategy.OverlapLoops: 3,
}


@dataclass
class DeviceModel:
    """Memory and cycles of one replica of a compiled program."""

    spec: IpuSpec
    device: str  # e.g. "IpuModel ipu2 x1"
    memory: MemoryResult
    cycles: CycleResult
    # Where each tensor lives and why (empty without session options).
    locations: dict[str, ResolvedLocation] = field(default_factory=dict)
    io: HostIO | None = None

    def check_fits(self, summary_report: str = "") -> None:
        """Raise OutOfMemoryException if some IPU overflows (see ``memory.check_fits``)."""
        check_fits(self.memory, summary_report)

    def cycle_count(self, id: str = "") -> int:  # noqa: A002 - PopART's argument name
        """Cycles of one ``run()``. ``id`` "" is the whole program (the step). "ipu<N>"
        is the cycles IPU N is busy within the step: its ops (compute, exchange, syncs,
        collectives), the IPU-Link copies it sends or receives and the streaming-memory
        transfers of its tensors; not its waits for other IPUs or the host. On one IPU that is
        its op and remote-transfer cycles. In a sharded program the IPUs take turns, so their
        counts add up to about the step (a copy counts on both ends); in a pipelined one they
        overlap, following the cycle table (``CycleResult.ipu_busy_cycles``)."""
        if id == "":
            return self.cycles.step_cycles
        busy = self.cycles.ipu_busy_cycles()
        if id.startswith("ipu") and id[3:].isdigit() and int(id[3:]) in busy:
            return busy[int(id[3:])]
        known = ", ".join(['""'] + [f'"ipu{i}"' for i in sorted(busy)])
        raise popart_exception(f"getCycleCount: unknown cycle counter id '{id}'. Known: {known}.")

    def off_chip(self) -> list[str]:
        """Ids of the tensors kept in streaming memory (not their in-place aliases)."""
        return sorted(tid for tid, r in self.locations.items()
                      if r.off_chip and r.alias_of is None)


def host_io(program, model: onnx.ModelProto | None, num_io_tiles: int,
            batch: BatchInfo) -> HostIO:
    """The host streams of a lowered ``Program`` for one replica: inputs with the
    ``InputSettings`` the builder recorded in ``model``, anchors with their AnchorReturnType's
    tile set and exchange strategy."""
    settings = input_settings_from_model(model) if model is not None else {}
    graph = program.graph
    streams = []
    for stream in program.inputs:
        tensor = graph.tensors[stream.id]
        ipu = min((op.settings.ipu or 0 for op in tensor.consumers), default=0)
        s = settings.get(stream.id) or InputSettings()
        streams.append(HostStream(
            stream.id, True, stream.info.num_bytes, batch.micro_batches_per_step,
            s.tileSet(), s.exchangeStrategy(), ipu, str(stream.info)))
    for anchor in program.anchors:
        producer = graph.tensors[anchor.id].producer
        ipu = (producer.settings.ipu or 0) if producer is not None else 0
        streams.append(HostStream(
            anchor.id, False, anchor.info.num_bytes,
            anchor.fetches_per_run // program.replication_factor,
            anchor.art.tileSet(), anchor.art.exchangeStrategy(), ipu, str(anchor.info)))
    return HostIO(num_io_tiles, tuple(streams))


def analyse(ir: Ir, order: Sequence[Op], device_info, options=None,
            batch_info: BatchInfo | None = None, keep: Iterable[str] = (), program=None,
            model: onnx.ModelProto | None = None) -> DeviceModel:
    """Memory and cycle model of ``ir``'s main graph run in ``order`` on ``device_info``.

    ``device_info`` is a ``DeviceInfo`` (its ``spec`` already has the tile count). ``options``
    (SessionOptions) gives the tensor locations and IO tiles; ``keep`` names tensors read back
    after the schedule (anchors). ``program`` (the lowered Program) and ``model`` (the ONNX
    model, for InputSettings and builder ``outputTensorLocation`` attributes) describe the
    host streams; without ``program`` every stream is JustInTime. Does not raise on overflow:
    call ``check_fits()``.
    """
    spec = device_info.spec
    batch = batch_info or BatchInfo()
    keep = set(keep) | set(ir.anchors)
    num_io_tiles = options.numIOTiles if options is not None else 0
    io = host_io(program, model, num_io_tiles, batch) if program is not None else None
    locations: dict[str, ResolvedLocation] = {}
    if options is not None:
        outputs = output_locations_from_model(model) if model is not None else {}
        locations = resolve_tensor_locations(ir.main, order, options, outputs,
                                             spec.streaming_memory_bytes > 0, storage_roots(order),
                                             sharded=ir.sharded_variables)
    # Storage roots only: an in-place output follows the tensor it writes.
    off_chip = {tid for tid, r in locations.items() if r.off_chip and r.alias_of is None}
    on_io = {tid for tid in off_chip if locations[tid].on_io_tiles}
    buffers = [
        IoBuffer(s.id, s.info, s.num_bytes, _IO_BUFFER_DEPTH[s.strategy], s.ipu)
        for s in (io.streams if io is not None else ()) if io.on_io_tiles(s)
    ]
    # IPUs are reported as far as ops are placed on them (replicas are identical).
    effects = option_model(ir, order, options, keep)  # batch serialisation, buffering ...
    memory = compute_memory(ir.main, order, spec, keep=keep, off_chip=off_chip,
                            io_tile_buffers=on_io, num_io_tiles=num_io_tiles, io_streams=buffers,
                            effects=effects)
    # A pipelined program is timed by its cycle table, with the device's SyncPattern deciding
    # which IPUs wait for host transfers.
    pipeline = (PipelineInfo.from_program(program, getattr(device_info, "syncPattern", None))
                if program is not None else None)
    # Collectives span every replica of every process under global replication.
    replicas = collective_replicas(options, batch.replication_factor)
    cycles = compute_cycles(ir.main, order, spec, batch, io, off_chip, pipeline, replicas,
                            effects)
    name = f"{device_info.type.name} {spec.name} x{device_info.numIpus}"
    return DeviceModel(spec=spec, device=name, memory=memory, cycles=cycles,
                       locations=locations, io=io)
