"""SessionOptions.mergeVarUpdate (training): the weight updates merged into fewer update ops.

PopART concatenates the gradients (and views the weights) of a group of variable updates into
one buffer and updates them with one op. The values are the same (the updates are
elementwise); the device model sees, per group of two or more updates on one IPU in one
fragment:

- cycles: one superstep for the group, so only its first update pays the sync;
- memory: the concatenated gradient buffer (the sum of the group's weight bytes), live from the
  group's first update to its last, as an activation ``MergedVarUpdate/<k>``.

Groups follow the schedule order of the updates of each (IPU, fragment):

- ``All``: every update in one group.
- ``AutoTight``: a group closes before it would exceed ``mergeVarUpdateMemThreshold`` bytes (a
  variable is never sliced, so a larger one is a group of its own).
- ``AutoLoose``: a group closes once it reaches its threshold, min(mergeVarUpdateMemThreshold,
  peak live activation bytes − live bytes at the update + ``looseThresholdAtPeak``): updates
  far from the peak merge freely, those near it stay small.
- ``Off``: no merging.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import popart_exception
from ..ir.graph import Graph
from ..ir.op import Op
from ..ir.tensor import TensorKind, TensorRole
from ..options.enums import MergeVarUpdateType

__all__ = ["group_bytes", "merge_groups"]


def _updated_weight(op: Op):
    for i in op.modifies_inputs:
        t = op.inputs[i] if i < len(op.inputs) else None
        if t is not None and t.kind is TensorKind.VARIABLE and t.role is TensorRole.WEIGHT:
            return t
    return None


def _live_bytes(graph: Graph, order: Sequence[Op]) -> list[int]:
    """Activation bytes live at each position of ``order`` (producer to last reader)."""
    position = {op.id: i for i, op in enumerate(order)}
    live = [0] * len(order)
    for t in graph.tensors.values():
        if t.kind is not TensorKind.ACT_GRAD or t.producer is None:
            continue
        start = position.get(t.producer.id)
        if start is None:
            continue
        end = max((position[c.id] for c in t.consumers if c.id in position), default=start)
        for p in range(start, end + 1):
            live[p] += t.info.num_bytes
    return live


def merge_groups(graph: Graph, order: Sequence[Op], options) -> list[tuple[int, ...]]:
    """The groups (op ids, in schedule order) of two or more weight updates that run merged."""
    kind = options.mergeVarUpdate
    if kind is MergeVarUpdateType.Off:
        return []
    threshold = options.mergeVarUpdateMemThreshold
    loose = options.looseThresholdAtPeak
    if threshold < 0 or loose < 0:
        raise popart_exception(
            f"SessionOptions.mergeVarUpdateMemThreshold = {threshold} and looseThresholdAtPeak "
            f"= {loose} must be byte counts >= 0."
        )
    live = _live_bytes(graph, order) if kind is MergeVarUpdateType.AutoLoose else []
    peak = max(live, default=0)
    groups: list[tuple[int, ...]] = []
    current: dict[tuple, tuple[list[int], int]] = {}
    for pos, op in enumerate(order):
        weight = _updated_weight(op)
        if weight is None:
            continue
        key = (op.settings.ipu or 0, op.settings.execution_context)
        ids, size = current.get(key, ([], 0))
        size_with = size + weight.info.num_bytes
        if kind is MergeVarUpdateType.AutoTight and ids and size_with > threshold:
            groups.append(tuple(ids))
            ids, size_with = [], weight.info.num_bytes
        ids = [*ids, op.id]
        if kind is MergeVarUpdateType.AutoLoose and size_with >= min(
                threshold, peak - live[pos] + loose):
            groups.append(tuple(ids))
            ids, size_with = [], 0
        current[key] = (ids, size_with)
    groups += [tuple(ids) for ids, _ in current.values() if ids]
    return [g for g in groups if len(g) > 1]


def group_bytes(graph: Graph, group: Sequence[int]) -> int:
    """Bytes of the concatenated gradient buffer of a merged group (its weights' bytes)."""
    return sum(_updated_weight(graph.ops[i]).info.num_bytes for i in group)
