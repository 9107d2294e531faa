"""Cross-replica collectives (spec §5.3, §10.3, §10.4; F71, F73, F110): ReplicatedAllReduce.

A collective reads the same tensor on every replica of its group and writes a result to each.
A kernel sees one replica, so these ops carry ``collective = True`` and the simulated device
runs them as a cross-replica step (``device/plan.py``): every replica's steps up to the op
run first, then ``reduce_replicas`` receives the input of all replicas (all global replicas
when replication spans processes, gathered by ``device/distributed.py``) and returns each
local replica's output. ``kernel()`` is the one-replica case.

Sums run in a fixed order, replica 0 + 1 + 2 + ... of each group, so results are the same
on every replica, every run and every process layout (DESIGN decision 6).

Replica groups (``CommGroup``, spec §10.4), for N replicas and group size k, m = N / k:
All = one group; Consecutive = {0..k-1}, {k..2k-1}, ...; Orthogonal = {0, m, 2m, ...},
{1, m+1, ...}, ...; Ungrouped = every replica alone. The builder's ``commGroup`` annotation
(``OpSettings.comm_group``) picks it; none means All.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..errors import popart_exception
from ..ir.op import Op
from ..options import CommGroupType
from .registry import AI_GRAPHCORE, register_op

GC = AI_GRAPHCORE

__all__ = ["ReplicatedAllReduce", "replica_groups"]


def replica_groups(comm_group: tuple[int, int] | None, num_replicas: int,
                   where: str = "collective") -> list[list[int]]:
    """The replica groups of ``comm_group`` ((CommGroupType value, group size) or None = All)
    over ``num_replicas`` replicas, each group in ascending replica order."""
    n = num_replicas
    if comm_group is None:
        return [list(range(n))]
    kind, size = comm_group
    try:
        kind = CommGroupType(kind)
    except ValueError:
        raise popart_exception(
            f"{where}: unknown CommGroupType {kind}; use All (0), Consecutive (1), "
            f"Orthogonal (2) or Ungrouped (3)."
        ) from None
    if kind is CommGroupType.All:
        return [list(range(n))]
    if kind is CommGroupType.Ungrouped:
        return [[r] for r in range(n)]
    if size < 1 or n % size:
        raise popart_exception(
            f"{where}: CommGroup({kind.name}, replicaGroupSize={size}) does not split the "
            f"{n} replicas into equal groups; the group size must be >= 1 and divide the "
            f"replication factor {n}."
        )
    if kind is CommGroupType.Consecutive:
        return [list(range(start, start + size)) for start in range(0, n, size)]
    stride = n // size  # Orthogonal: m groups, members m apart
    return [list(range(first, n, stride)) for first in range(stride)]


@register_op("ReplicatedAllReduce", versions=1, domain=GC)
class ReplicatedAllReduce(Op):
    """Sum of the input over the replicas of its group; every member gets the sum.

    Its gradient is the all-reduce of the output gradient over the same group.
    """

    foldable = False
    collective = True

    def infer(self, x):
        return x

    def kernel(self, x):
        # One replica: the sum over a group of one.
        return x

    def groups(self, num_replicas: int) -> list[list[int]]:
        return replica_groups(self.settings.comm_group, num_replicas, self.debug_name)

    def reduce_replicas(self, values: Sequence[torch.Tensor], first: int,
                        count: int) -> list[torch.Tensor]:
        """Outputs of replicas ``first .. first + count - 1`` from the inputs of all replicas
        (``values[r]`` for global replica r), summed in ascending replica order."""
        out: list[torch.Tensor | None] = [None] * count
        for group in self.groups(len(values)):
            members = [r for r in group if first <= r < first + count]
            if not members:
                continue
            total = values[group[0]].clone()
            for r in group[1:]:
                total.add_(values[r])
            out[members[0] - first] = total
            for r in members[1:]:
                # Each replica owns its result: a later in-place op on one must not touch another.
                out[r - first] = total.clone()
        return out

    def grad(self, g):
        # Grad ops inherit the forward op's settings, its replica grouping included.
        g.set_input_grad(0, g.op("ReplicatedAllReduce", g.output_grad(0), domain=GC))
