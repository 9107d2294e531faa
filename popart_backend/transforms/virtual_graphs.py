"""Virtual graphs: which IPU of a replica runs each op.

``AssignVirtualGraphs`` runs on the forward graph (before autodiff, so every gradient op
inherits its forward op's IPU) and applies ``SessionOptions.virtualGraphMode``:

- ``Off``: IPU annotations are ignored (cleared); the replica is one IPU.
- ``Manual``: the builder's ``virtualGraph`` annotations; all ops or none must have one, and
  each must name an IPU of the replica.
- ``Auto``: the forward ops, in schedule order, are cut into at most ``ipus per replica``
  contiguous parts of balanced estimated cost (``Op.cost()``: FLOPs + bytes moved).
- ``ExecutionPhases``: every forward op has an execution phase (the builder's
  ``executionPhase``) below ``executionPhaseSettings.phases``, and phase p runs on IPU
  ``p % executionPhaseSettings.stages``; transforms/execution_phases.py does the rest.

It also records which ops form the forward graph (``Ir.forward_op_ids``), for the pipelining
and recomputation passes.
``PlaceRemainingOps`` runs after the training passes: ops they added without a placement
(weight-gradient sums, optimizer updates, accumulators) go to the IPU of the tensors they read.

Before (Auto, 2 IPUs):   h = MatMul(x, w1)          After:  h = MatMul(x, w1)   # ipu0
                         y = MatMul(h, w2)                  y = MatMul(h, w2)   # ipu1
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable

from ..errors import popart_exception
from ..ir.graph import Graph
from ..ir.op import ExecutionContext, Op
from ..options.enums import VirtualGraphMode

_log = logging.getLogger("popart:transform")


@dataclass(frozen=True)
class Placement:
    """How the session places ops on IPUs (its options and device); what the placement passes
    find out (forward ops, stages) they write to the Ir."""

    mode: VirtualGraphMode
    ipus_per_replica: int
    pipelining: bool = False
    # SessionOptions.virtualGraphSplitRatios: Auto's share of the cost per IPU (empty: balance).
    split_ratios: tuple[float, ...] = ()
    # SessionOptions.executionPhaseSettings (VirtualGraphMode.ExecutionPhases only).
    phases: int = 0
    phase_stages: int = 2

    @property
    def sharded(self) -> bool:
        return self.mode is not VirtualGraphMode.Off


def set_placement(op: Op, **changes) -> None:
    """Replace fields of the op's (frozen) settings."""
    op.settings = dataclasses.replace(op.settings, **changes)


class AssignVirtualGraphs:
    """Pass: apply ``virtualGraphMode`` to the forward graph and remember its ops."""

    name = "assign_virtual_graphs"

    def __init__(self, placement: Placement):
        self.placement = placement

    def run(self, ir) -> bool:
        graph = ir.main
        order = graph.topo_order()
        ir.forward_op_ids = frozenset(op.id for op in order)
        mode = self.placement.mode
        if self.placement.pipelining and (mode is VirtualGraphMode.Off
                                          or self.placement.ipus_per_replica < 2):
            raise popart_exception(
                "Pipelining requires more than 1 IPU and the 'virtualGraphMode' session option "
                "to not be VirtualGraphMode::Off. This session has "
                f"{self.placement.ipus_per_replica} IPU(s) per replica and virtualGraphMode = "
                f"{mode}."
            )
        if mode is VirtualGraphMode.Off:
            changed = False
            for op in order:
                if op.settings.ipu is not None:
                    set_placement(op, ipu=None)
                    changed = True
            return changed
        if mode is VirtualGraphMode.ExecutionPhases:
            self._phases(order)
            return True
        if self.placement.split_ratios and mode is not VirtualGraphMode.Auto:
            _log.warning("SessionOptions.virtualGraphSplitRatios = %s has no effect: only "
                         "VirtualGraphMode.Auto splits the graph (this session uses %s).",
                         list(self.placement.split_ratios), mode)
        if mode is VirtualGraphMode.Manual:
            self._check_manual(order)
        else:
            self._auto(order)
        return True

    def _phases(self, order: list[Op]) -> None:
        """ExecutionPhases: check the forward ops' phases, place phase p on IPU p % stages."""
        phases, stages = self.placement.phases, self.placement.phase_stages
        n = self.placement.ipus_per_replica
        if self.placement.pipelining:
            raise popart_exception(
                "enablePipelining = True cannot be combined with virtualGraphMode = "
                "VirtualGraphMode.ExecutionPhases: phases run one after another. Turn one off."
            )
        if not 1 <= stages <= n:
            raise popart_exception(
                f"executionPhaseSettings.stages = {stages}, but the device has {n} IPU(s) per "
                f"replica: phase p runs on IPU p % stages, so stages must be between 1 and {n}. "
                f"Lower executionPhaseSettings.stages or acquire more IPUs."
            )
        unphased = [op for op in order if op.settings.execution_phase is None]
        if unphased:
            names = ", ".join(op.debug_name for op in unphased[:5])
            raise popart_exception(
                f"virtualGraphMode = VirtualGraphMode.ExecutionPhases needs an execution phase on "
                f"every op; {len(unphased)} of {len(order)} have none: {names}"
                f"{' ...' if len(unphased) > 5 else ''}. Annotate them with "
                f"builder.executionPhase(...)."
            )
        for op in order:
            if not 0 <= op.settings.execution_phase < phases:
                raise popart_exception(
                    f"{op.debug_name} is in execution phase {op.settings.execution_phase}, but "
                    f"executionPhaseSettings.phases = {phases} (phases 0..{phases - 1}). Set "
                    f"executionPhaseSettings.phases to the number of phases the model uses."
                )
        moved = [op for op in order if op.settings.ipu is not None
                 and op.settings.ipu != op.settings.execution_phase % stages]
        if moved:
            _log.warning("virtualGraphMode = ExecutionPhases places phase p on IPU p %% %d: the "
                         "virtualGraph annotation of %d op(s) (%s ...) is replaced.", stages,
                         len(moved), moved[0].debug_name)
        for op in order:
            set_placement(op, ipu=op.settings.execution_phase % stages)

    def _check_manual(self, order: list[Op]) -> None:
        n = self.placement.ipus_per_replica
        unplaced = [op for op in order if op.settings.ipu is None]
        if unplaced and len(unplaced) != len(order):
            counts: dict[str, int] = {}
            for op in order:
                key = "unset" if op.settings.ipu is None else str(op.settings.ipu)
                counts[key] = counts.get(key, 0) + 1
            names = ", ".join(op.debug_name for op in unplaced[:5])
            raise popart_exception(
                "Either all ops in the main graph must have their virtual graph ids set, or none "
                f"must. Ops per virtual graph id: {counts}. Without one: {names}"
                f"{' ...' if len(unplaced) > 5 else ''}. Annotate them with "
                "builder.virtualGraph(...) (virtualGraphMode = Manual), or use "
                "VirtualGraphMode.Auto."
            )
        for op in order:
            if op.settings.ipu is None:
                set_placement(op, ipu=0)
            elif not 0 <= op.settings.ipu < n:
                raise popart_exception(
                    f"{op.debug_name} is placed on virtual graph {op.settings.ipu}, but the device "
                    f"has {n} IPU(s) per replica (ids 0..{n - 1}). Acquire a device with more "
                    f"IPUs or change the builder.virtualGraph annotation."
                )

    def _auto(self, order: list[Op]) -> None:
        costs = [op_cost(op) for op in order]
        ratios = self.placement.split_ratios
        if ratios:
            parts = ratio_split(costs, ratios, self.placement.ipus_per_replica)
        else:
            parts = balanced_split(costs, self.placement.ipus_per_replica)
        for op, ipu in zip(order, parts):
            set_placement(op, ipu=ipu)
        _log.debug("assign_virtual_graphs: Auto split %d ops over %d IPU(s)", len(order),
                   max(parts, default=0) + 1)


def op_cost(op: Op) -> float:
    """The scalar Auto balances: FLOPs plus bytes moved of one execution (``Op.cost()``)."""
    flops, moved = op.cost()
    return float(flops) + float(moved)


def ratio_split(costs: list[float], ratios: tuple[float, ...], ipus: int) -> list[int]:
    """Part index per item: contiguous runs whose shares of the total cost follow ``ratios``
    (``virtualGraphSplitRatios``, one positive ratio per IPU, normalised). An item goes to the
    part whose cumulative share holds the middle of the item's cost."""
    if len(ratios) != ipus or any(r <= 0 for r in ratios):
        raise popart_exception(
            f"SessionOptions.virtualGraphSplitRatios = {list(ratios)}: give one positive ratio "
            f"per IPU of the replica ({ipus} IPU(s)), e.g. {[round(1 / ipus, 3)] * ipus}."
        )
    total_cost = sum(max(c, 0.0) for c in costs) or 1.0
    total_ratio = sum(ratios)
    bounds, running = [], 0.0
    for r in ratios:
        running += r / total_ratio
        bounds.append(running * total_cost)
    out, done, part = [], 0.0, 0
    for c in costs:
        middle = done + max(c, 0.0) / 2
        while part < ipus - 1 and middle > bounds[part]:
            part += 1
        out.append(part)
        done += max(c, 0.0)
    return out


def balanced_split(costs: list[float], parts: int) -> list[int]:
    """Part index per item: at most ``parts`` contiguous runs minimising the largest run's sum.

    Binary search on the capacity with greedy packing, which is optimal for contiguous runs.
    """
    if not costs:
        return []
    costs = [max(c, 0.0) for c in costs]

    def pack(capacity: float) -> list[int] | None:
        index, total, out = 0, 0.0, []
        for c in costs:
            if total + c > capacity and total > 0:
                index, total = index + 1, 0.0
            if index >= parts:
                return None
            total += c
            out.append(index)
        return out

    low, high = max(costs), sum(costs)
    best = pack(high)
    for _ in range(60):
        if high - low <= 1e-9 * max(high, 1.0):
            break
        middle = (low + high) / 2
        packed = pack(middle)
        if packed is None:
            low = middle
        else:
            best, high = packed, middle
    return best


def fill_placement(graph: Graph, order: list[Op], get: Callable[[Op], int | None],
                   put: Callable[[Op, int], None], default: int,
                   contexts=(ExecutionContext.Normal,)) -> None:
    """Place the ops of ``contexts`` that ``get`` says are unplaced, from their neighbours.

    In order of preference: the largest placement of the producers of their inputs (an op runs
    once what it reads is there), the smallest of the consumers of their outputs, the largest of
    the ops scheduled before them by constraints, else ``default``.
    """
    pending = [op for op in order if op.settings.execution_context in contexts and get(op) is None]
    for op in pending:
        found = [get(t.producer) for t in op.inputs if t is not None and t.producer is not None]
        found = [p for p in found if p is not None]
        if found:
            put(op, max(found))
    for op in reversed(pending):
        if get(op) is not None:
            continue
        found = [get(c) for t in op.outputs if t is not None for c in t.consumers]
        found = [p for p in found if p is not None]
        if found:
            put(op, min(found))
    for op in pending:
        if get(op) is not None:
            continue
        found = [get(graph.ops[i]) for i in graph.constraints.get(op.id, ())]
        found = [p for p in found if p is not None]
        put(op, max(found) if found else default)


class PlaceRemainingOps:
    """Pass: give every op the training passes added without an IPU the IPU of its neighbours.

    Before:  UpdatedVar___w1 = SGDUpdate(w1, Gradient___w1)        # no IPU
    After:   UpdatedVar___w1 = SGDUpdate(w1, Gradient___w1)        # ipu1, like Gradient___w1
    """

    name = "place_remaining_ops"

    def __init__(self, placement: Placement):
        self.placement = placement

    def run(self, ir) -> bool:
        if not self.placement.sharded:
            return False
        graph = ir.main
        order = graph.topo_order()
        before = sum(op.settings.ipu is None for op in order)
        fill_placement(graph, order, lambda op: op.settings.ipu,
                       lambda op, ipu: set_placement(op, ipu=ipu), 0,
                       contexts=tuple(ExecutionContext))
        return before > 0
