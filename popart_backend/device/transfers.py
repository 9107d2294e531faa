"""What a step moves besides the work of its ops, as the cycle model counts it: how often a step
runs the schedule and what crosses the host link (``BatchInfo``), tensors copied between IPUs
over the IPU-Links (``LinkTransfer``) and the streaming-memory loads and stores of off-chip
tensors (``RemoteTransfer``), and which off-chip tensors the IR moves with explicit RemoteLoad /
RemoteStore ops (``explicitly_streamed``, execution phases).

device/cost.py fills them in; device/io_overlap.py and device/pipeline_cost.py read them, so they
sit below all three (the cycle model's layering: op_cost, transfers -> io_overlap,
pipeline_cost -> cost).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..ir.op import ExecutionContext, Op


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


def explicitly_streamed(order: Sequence[Op], root: dict[str, str]) -> set[str]:
    """Storage roots that only RemoteLoad / RemoteStore ops touch (besides an input-less op
    making the buffer): execution phases stream them explicitly, so the on-chip copies are
    tensors of their own and the root takes no transient SRAM."""
    only_remote: dict[str, bool] = {}
    remote: set[str] = set()
    for op in order:
        for t in (*op.outputs, *op.inputs):
            if t is None:
                continue
            base = root.get(t.id, t.id)
            makes_buffer = not op.inputs and any(o is t for o in op.outputs)
            only_remote[base] = only_remote.get(base, True) and (
                op.remote_transfer or makes_buffer)
            if op.remote_transfer:
                remote.add(base)
    return {b for b, ok in only_remote.items() if ok and b in remote}
