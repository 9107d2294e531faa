"""Where a run is, for the floating-point exception check (SessionOptions.
enableFloatingPointChecks, PopTorch's ``Precision.enableFloatingPointExceptions``).

The session opens a ``RunPosition`` around each ``run()`` (``track_run``); every checked kernel
(device/plan.py ``floating_point_checked``) counts its own executions in it, so when an output
turns inf or NaN the error can say which ``run()`` call and which micro-batch of it (batch,
accumulation step, replica) produced it. A main-graph op of the Normal fragment runs once per
micro-batch, in host-chunk order (batch, then accumulation step, then replica); an op of the
accumulate-outer fragment once per weight update; an op of a subgraph body as often as its
caller runs it, so for those the count of executions in the run is given instead.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

from ..ir.op import ExecutionContext, Op

__all__ = ["RunPosition", "current_position", "track_run"]


@dataclasses.dataclass
class RunPosition:
    """One ``run()`` call of a session: ``run`` counts from 1."""

    session: str
    run: int
    replicas: int
    accumulation: int
    main_graph: object
    calls: dict[int, int] = dataclasses.field(default_factory=dict)

    def count(self, op: Op) -> int:
        """Record one execution of ``op``; its index (from 0) in this run."""
        index = self.calls.get(id(op), 0)
        self.calls[id(op)] = index + 1
        return index

    def describe(self, op: Op, index: int) -> str:
        where = f"in run() call {self.run} of session '{self.session}'"
        if op.graph is not self.main_graph:
            graph = op.graph.id if op.graph is not None else "?"
            return f"{where}, execution {index + 1} of this op in that call (subgraph '{graph}')"
        if op.settings.execution_context is ExecutionContext.AccumulateOuterFragment:
            return f"{where}, weight update {index + 1} of that call"
        replicas, accumulation = max(1, self.replicas), max(1, self.accumulation)
        replica = index % replicas
        per_replica = index // replicas
        batch, step = divmod(per_replica, accumulation)
        return (f"{where}, micro-batch {index} of that call (batch {batch}, accumulation step "
                f"{step}, replica {replica})")


_POSITION: contextvars.ContextVar[RunPosition | None] = contextvars.ContextVar(
    "popart_run_position", default=None)


def current_position() -> RunPosition | None:
    return _POSITION.get()


@contextlib.contextmanager
def track_run(position: RunPosition | None) -> Iterator[RunPosition | None]:
    """Make ``position`` the current run's (None: nothing tracked, the checks are off)."""
    if position is None:
        yield None
        return
    token = _POSITION.set(position)
    try:
        yield position
    finally:
        _POSITION.reset(token)
