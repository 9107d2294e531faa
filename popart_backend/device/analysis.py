"""The device model of a compiled session: memory (device/memory.py) and cycles (device/cost.py).

``analyse()`` is what ``prepareDevice()`` calls once the schedule is fixed; the session keeps the
``DeviceModel`` for ``getSummaryReport()``, ``getReport()`` and ``getCycleCount()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import popart_exception
from ..ir.ir import Ir
from ..ir.op import Op
from .cost import BatchInfo, CycleResult, compute_cycles
from .memory import MemoryResult, check_fits, compute_memory
from .spec import IpuSpec

__all__ = ["DeviceModel", "analyse"]


@dataclass
class DeviceModel:
    """Memory and cycles of one replica of a compiled program."""

    spec: IpuSpec
    device: str  # e.g. "IpuModel ipu2 x1"
    memory: MemoryResult
    cycles: CycleResult

    def check_fits(self, summary_report: str = "") -> None:
        """Raise OutOfMemoryException if some IPU overflows (see ``memory.check_fits``)."""
        check_fits(self.memory, summary_report)

    def cycle_count(self, id: str = "") -> int:  # noqa: A002 - PopART's argument name
        """Cycles of one ``run()`` (F56). ``id`` "" is the whole program; "ipu<N>" is the
        compute cycles of IPU N within it."""
        if id == "":
            return self.cycles.step_cycles
        busy = self.cycles.ipu_cycles()
        if id.startswith("ipu") and id[3:].isdigit() and int(id[3:]) in busy:
            return busy[int(id[3:])]
        known = ", ".join(['""'] + [f'"ipu{i}"' for i in sorted(busy)])
        raise popart_exception(f"getCycleCount: unknown cycle counter id '{id}'. Known: {known}.")


def analyse(ir: Ir, order: Sequence[Op], device_info, options=None,
            batch_info: BatchInfo | None = None, keep: Iterable[str] = ()) -> DeviceModel:
    """Memory and cycle model of ``ir``'s main graph run in ``order`` on ``device_info``.

    ``device_info`` is a ``DeviceInfo`` (its ``spec`` already has the tile count). ``options``
    (SessionOptions) is read for tensor locations once they are built (issue #6); ``keep``
    names tensors read back after the schedule (anchors). Does not raise on overflow: call
    ``check_fits()``.
    """
    spec = device_info.spec
    batch = batch_info or BatchInfo()
    keep = set(keep) | set(ir.anchors)
    # IPUs are reported as far as ops are placed on them (replicas are identical).
    memory = compute_memory(ir.main, order, spec, keep=keep)
    cycles = compute_cycles(ir.main, order, spec, batch)
    name = f"{device_info.type.name} {spec.name} x{device_info.numIpus}"
    return DeviceModel(spec=spec, device=name, memory=memory, cycles=cycles)
