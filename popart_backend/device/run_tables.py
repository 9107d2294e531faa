"""Tables of a Program that need no device storage: the order the execution plan runs its
ops (which the memory and cycle models walk without building the plan), and the anchor write
table (which anchor value each micro-batch copies, or adds, into which host chunk), built
when the simulated device allocates its storage."""

from __future__ import annotations

import torch

from ..dataflow import AnchorReturnTypeId, anchor_fetch_index
from ..ir.op import ExecutionContext, Op
from .lower import Program

# Anchor write kinds, per micro-batch.
COPY = 0  # copy the value into the host chunk
ACC_SET = 1  # first micro-batch of a Sum: start the accumulator
ACC_ADD = 2  # add to the accumulator
ACC_FLUSH = 3  # add, then copy the accumulator into the host chunk


def execution_order(program: Program) -> list[Op]:
    """The order the execution plan runs the program's ops (its fragments in the order of one
    weight update, stable within each), found without building the plan or any storage."""
    contexts = list(ExecutionContext)
    return sorted(program.schedule,
                  key=lambda op: contexts.index(op.settings.execution_context))


def anchor_actions(p: Program, slot: dict[str, int]):
    """(per micro-batch k: tuple of (kind, source slot, anchor index, host chunk index);
    per anchor: each local replica's accumulator of a Sum anchor, or None)."""
    bps, af, rf = p.batches_per_step, p.accumulation_factor, p.replication_factor
    per_replica = bps * af
    actions: list[list[tuple]] = [[] for _ in range(p.micro_batches_per_run)]
    accumulators: list[list[torch.Tensor] | None] = []
    for index, anchor in enumerate(p.anchors):
        source = slot[anchor.id]
        is_sum = anchor.art.id() is AnchorReturnTypeId.Sum
        accumulators.append(
            [torch.zeros(anchor.info.shape, dtype=anchor.info.dtype.torch) for _ in range(rf)]
            if is_sum and per_replica > 1 else None
        )
        for b in range(bps):
            for a in range(af):
                for r in range(rf):
                    k = (b * af + a) * rf + r
                    j = anchor_fetch_index(anchor.art, b, a, r, bps, af, rf)
                    if j is None:
                        continue
                    if is_sum and per_replica > 1:
                        step = b * af + a
                        kind = (ACC_SET if step == 0
                                else ACC_FLUSH if step == per_replica - 1 else ACC_ADD)
                    else:
                        kind = COPY
                    actions[k].append((kind, source, index, j))
    return [tuple(a) for a in actions], accumulators
