"""Planner temporaries of the matmuls and convolutions whose plan the user constrains: a
per-op available memory proportion (``OpSettings.available_memory_proportion``, the builder's
setAvailableMemoryProportion / MultiConv's availableMemoryProportions) or a matmul
serialisation (``OpSettings.serialize_matmul``, setSerializeMatMul / serializedMatMul).

The model of an AMP op (``uses_amp``) with such a setting:

    partials  = output elements · partials size     (2 bytes with half partials, else 4; a
                                                     serialised float16 product that does not
                                                     keep precision sums its slices in float16)
    slices    = the serialisation factor (1 when not serialised, or when
                SessionOptions.enableSerializedMatmuls is False)
    per slice = partials / slices
    budget    = proportion · compute tiles · tile bytes   (no proportion: no bound)
    passes    = slices · ceil(per slice / budget)
    temporary = min(per slice, budget) bytes, live at the op's position
                ("planner temporaries" in device/memory.py)

and each pass is one superstep: the op pays ``passes`` syncs instead of one
(device/cost.py). FLOPs and bytes moved, and every value, are those of the plain op. Ops
without a per-op setting keep the default plan, whose partials the model takes to be held in
the output's own storage: no temporaries, one superstep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.op import Op
from .spec import IpuSpec

__all__ = ["PlannerPlan", "planner_plan"]


@dataclass(frozen=True)
class PlannerPlan:
    """The planner's choice for one op: its temporary bytes and supersteps."""

    temporary_bytes: int
    passes: int


def planner_plan(op: Op, spec: IpuSpec, compute_tiles: int | None = None,
                 serialized_matmuls: bool = True) -> PlannerPlan | None:
    """The plan of ``op`` on an IPU of ``spec`` with ``compute_tiles`` compute tiles (default
    all), or None for an op on the default plan (see the module docstring)."""
    s = op.settings
    serial = s.serialize_matmul if serialized_matmuls else None
    if not op.uses_amp or (s.available_memory_proportion is None and serial is None):
        return None
    out = next((t for t in op.outputs if t is not None), None)
    if out is None:
        return None
    half_out = out.info.dtype.short == "f16"
    half = s.half_partials or (serial is not None and half_out and not serial.keep_precision)
    partials = out.info.nelms * (2 if half else 4)
    slices = serial.factor if serial is not None else 1
    per_slice = math.ceil(partials / slices)
    passes = slices
    temporary = per_slice
    if s.available_memory_proportion is not None:
        tiles = spec.num_tiles if compute_tiles is None else compute_tiles
        budget = max(1, int(s.available_memory_proportion * tiles * spec.tile_bytes))
        passes *= max(1, math.ceil(per_slice / budget))
        temporary = min(per_slice, budget)
    return PlannerPlan(temporary_bytes=temporary, passes=passes)
