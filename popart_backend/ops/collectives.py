"""Cross-replica collectives: ReplicatedAllReduce,
and for replicated tensor sharding (RTS) ReplicatedReduceScatter and ReplicatedAllGather.

A collective reads the same tensor on every replica of its group and writes a result to each.
A kernel sees one replica, so these ops carry ``collective = True`` and the simulated device
runs them as a cross-replica step (``device/plan.py``): every replica's steps up to the op
run first, then ``reduce_replicas`` receives the input of all replicas (all global replicas
when replication spans processes, gathered by ``device/distributed.py``) and returns each
local replica's output. ``kernel()`` is the one-replica case.

Sums run in a fixed order, replica 0 + 1 + 2 + ... of each group, so results are the same
on every replica, every run and every process layout (DESIGN decision 6).

Replica groups (``CommGroup``), for N replicas and group size k, m = N / k:
All = one group; Consecutive = {0..k-1}, {k..2k-1}, ...; Orthogonal = {0, m, 2m, ...},
{1, m+1, ...}, ...; Ungrouped = every replica alone. The builder's ``commGroup`` annotation
(``OpSettings.comm_group``) picks it; none means All.

Sharding: a tensor of n elements split over a group of k replicas gives each replica
``s = ceil(n/k)`` elements. The first ``n − k·(s−1)`` replicas hold s real elements, the others
s − 1 real elements and one zero pad, so every shard has the same shape ``[s]`` and all replicas
run the same code (``ShardLayout``). The reduce-scatter sums over the group, then hands member j
of the group shard j; the all-gather concatenates the shards of the group, drops the pads and
restores the full shape.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Sequence

import torch

from ..errors import ShapeError, popart_exception
from ..ir.op import Op
from ..ir.signature import INT, INTS, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from ..options.enums import CommGroupType
from .graphcore_common import comm_group
from .registry import AI_GRAPHCORE, register_op

GC = AI_GRAPHCORE

__all__ = [
    "ReplicatedAllGather",
    "ReplicatedAllReduce",
    "ReplicatedReduceScatter",
    "ShardLayout",
    "replica_groups",
    "shard_layout",
]


def collective_add_only(value):
    """PopART's ``collectiveOperator``: the simulated collectives sum, so only Add (0, the
    default) is accepted; it is left out of the node."""
    name = value.name if isinstance(value, enum.Enum) else value
    if name not in (None, "Add", 0):
        raise popart_exception(
            f"collectiveOperator {value!r} is not supported: the simulated IPU's replicated "
            f"collectives sum (CollectiveOperator.Add). Scale the result for a mean."
        )


# PopART's order: collectiveOperator, then commGroup.
_COLLECTIVE_ATTRS = (
    AttrSpec("__collectiveOperator", INT, None, param="collectiveOperator",
             convert=collective_add_only),
    AttrSpec("__collectiveCommGroup", INTS, None, param="commGroup", convert=comm_group),
)


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

    builder_method = BuilderMethod("replicatedallreduce", 1, 1, _COLLECTIVE_ATTRS)

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


# --- replicated tensor sharding -----------------------------------------------------------------


@dataclass(frozen=True)
class ShardLayout:
    """How n elements are spread over k equal shards of ``shard_size`` elements.

    ``counts[j]`` / ``starts[j]``: the real elements shard j holds and where they start in the
    flat tensor. ``split_index`` (long [k·s]) picks, from the flat tensor with one zero appended,
    the padded shards one after the other; ``join_index`` (long [n]) picks the real elements
    back out of the k·s concatenated shards. Both are built when first used (a run), so
    planning a big model's memory allocates no index tensors.
    """

    num_elements: int
    num_shards: int
    shard_size: int
    counts: tuple[int, ...]
    starts: tuple[int, ...]

    def _real(self) -> torch.Tensor:
        """[k, s] bool: which positions of the padded shards hold real elements."""
        return torch.arange(self.shard_size)[None, :] < torch.tensor(self.counts)[:, None]

    @cached_property
    def split_index(self) -> torch.Tensor:
        position = torch.tensor(self.starts)[:, None] + torch.arange(self.shard_size)[None, :]
        # index num_elements is the appended zero
        return torch.where(self._real(), position, self.num_elements).reshape(-1)

    @cached_property
    def join_index(self) -> torch.Tensor:
        k, size = self.num_shards, self.shard_size
        return (torch.arange(k)[:, None] * size + torch.arange(size)[None, :])[self._real()]

    def split(self, value: torch.Tensor) -> torch.Tensor:
        """The k padded shards of ``value`` (any shape, n elements) as a [k, s] tensor."""
        flat = value.reshape(-1)
        padded = torch.cat([flat, flat.new_zeros(1)])
        return padded[self.split_index].view(self.num_shards, self.shard_size)

    def join(self, shards: Sequence[torch.Tensor], shape: Sequence[int]) -> torch.Tensor:
        """The full tensor of ``shape`` from the k shards (pads dropped)."""
        return torch.cat([s.reshape(-1) for s in shards])[self.join_index].view(tuple(shape))


@lru_cache(maxsize=256)
def shard_layout(num_elements: int, num_shards: int) -> ShardLayout:
    """The sharded layout of ``num_elements`` over ``num_shards`` replicas (cached: ops and the
    device share it). Example: 30 elements over 4 -> shards of 8 holding 8, 8, 7, 7 elements."""
    n, k = num_elements, num_shards
    if k < 1:
        raise popart_exception(f"Sharding needs at least one shard, got {k}.")
    size = max(1, -(-n // k))
    full = n - k * (size - 1)  # shards holding `size` real elements; the rest hold size - 1
    counts = tuple(size if j < full else size - 1 for j in range(k))
    starts = tuple(sum(counts[:j]) for j in range(k))
    return ShardLayout(n, k, size, counts, starts)


class _ShardingCollective(Op):
    """Shared parts of the two sharding collectives: the group must have ``num_shards``
    replicas, and member j of a group is shard j."""

    foldable = False
    collective = True

    def groups(self, num_replicas: int) -> list[list[int]]:
        groups = replica_groups(self.settings.comm_group, num_replicas, self.debug_name)
        k = self.attrs.num_shards
        if any(len(g) != k for g in groups):
            raise popart_exception(
                f"{self.debug_name}: the tensor is split into {k} shards, but the replica "
                f"groups over {num_replicas} replicas have {sorted({len(g) for g in groups})} "
                f"members; the sharding domain must have {k} replicas."
            )
        return groups

    def _group_size(self) -> int:
        """The replica group size of ``commGroup``: for All (or no commGroup, PopART's
        default) every replica of the session, known once a session builds the graph."""
        group = self.settings.comm_group
        if group is not None and group[0] == CommGroupType.Ungrouped.value:
            return 1
        if group is None or group[0] == CommGroupType.All.value:
            replicas = self.graph.ir.replicas if self.graph is not None else None
            if replicas is None:
                raise popart_exception(
                    f"{self.debug_name}: the shard count of a reduce-scatter over all replicas "
                    f"is the session's replication factor (replicatedGraphCount), unknown "
                    f"before a session builds the graph. Build a session, or pass "
                    f"commGroup=popart.CommGroup(popart.CommGroupType.Consecutive, <size>).")
            return replicas
        if group[1] < 1:
            raise popart_exception(
                f"{self.debug_name}: commGroup (type {group[0]}) needs a replicaGroupSize "
                f">= 1, got {group[1]}.")
        return group[1]

    def _check_shards(self) -> None:
        if self.attrs.num_shards < 1:
            raise ShapeError(f"{self.debug_name}: num_shards must be >= 1, got "
                             f"{self.attrs.num_shards}.")


@register_op("ReplicatedReduceScatter", versions=1, domain=GC)
class ReplicatedReduceScatter(_ShardingCollective):
    """Sum over the replicas of the group, then member j keeps shard j (f[s], ShardLayout).

    Its gradient is the all-gather of the shard gradients. From the Builder
    (``replicatedreducescatter``) the shard count is the size of the ``commGroup``'s groups,
    all the session's replicas by default.
    """

    builder_method = BuilderMethod("replicatedreducescatter", 1, 1, _COLLECTIVE_ATTRS)

    @dataclass(frozen=True)
    class Attrs:
        num_shards: int = 0  # 0: the size of the op's replica groups (set by the Builder)
        # PopART's CollectiveOperator Local: no sum, member j keeps shard j of its own value
        # (the RTS pass slices a whole weight this way; nothing crosses the IPU-Links).
        local: bool = False

    def infer(self, x):
        if self.attrs.num_shards == 0:
            self.attrs = type(self.attrs)(num_shards=self._group_size(), local=self.attrs.local)
        self._check_shards()
        self._layout = shard_layout(x.nelms, self.attrs.num_shards)
        self._shape = tuple(x.shape)
        return TensorInfo(x.dtype, (self._layout.shard_size,))

    def kernel(self, x):
        # One replica holds the only shard: the flat tensor (a shard of one has no pad).
        return x.reshape(-1).clone()

    def reduce_replicas(self, values: Sequence[torch.Tensor], first: int,
                        count: int) -> list[torch.Tensor]:
        """Outputs of replicas ``first .. first + count - 1``: the group sum in ascending
        replica order, split by ``ShardLayout``."""
        out: list[torch.Tensor | None] = [None] * count
        if self.attrs.local:
            k = self.attrs.num_shards
            for r in range(first, first + count):
                out[r - first] = self._layout.split(values[r])[r % k].clone()
            return out
        for group in self.groups(len(values)):
            if not any(first <= r < first + count for r in group):
                continue
            total = values[group[0]].clone()
            for r in group[1:]:
                total.add_(values[r])
            shards = self._layout.split(total)
            for j, r in enumerate(group):
                if first <= r < first + count:
                    out[r - first] = shards[j].clone()
        return out

    def groups(self, num_replicas: int) -> list[list[int]]:
        """A local slice exchanges nothing: every replica is its own group (so the cost model
        counts no IPU-Link traffic); member r keeps shard r mod num_shards."""
        if self.attrs.local:
            return [[r] for r in range(num_replicas)]
        return super().groups(num_replicas)

    def grad(self, g):
        g.set_input_grad(0, g.op("ReplicatedAllGather", g.output_grad(0), domain=GC,
                                 num_shards=self.attrs.num_shards, shape=self._shape))


@register_op("ReplicatedAllGather", versions=1, domain=GC)
class ReplicatedAllGather(_ShardingCollective):
    """The full tensor of ``shape`` from the shards f[s] of every member of the group, pads
    dropped (ShardLayout); every member gets it.

    Its gradient is the reduce-scatter of the output gradient.
    """

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...] = ()
        num_shards: int = 1

    def infer(self, x):
        self._check_shards()
        n = 1
        for d in self.attrs.shape:
            n *= d
        self._layout = shard_layout(n, self.attrs.num_shards)
        if tuple(x.shape) != (self._layout.shard_size,):
            raise ShapeError(
                f"{self.debug_name}: a tensor of shape {list(self.attrs.shape)} split over "
                f"{self.attrs.num_shards} replicas has shards of shape "
                f"[{self._layout.shard_size}], got {x}."
            )
        return x.with_shape(tuple(self.attrs.shape))

    def kernel(self, x):
        return self._layout.join([x], self.attrs.shape)

    def reduce_replicas(self, values: Sequence[torch.Tensor], first: int,
                        count: int) -> list[torch.Tensor]:
        out: list[torch.Tensor | None] = [None] * count
        for group in self.groups(len(values)):
            members = [r for r in group if first <= r < first + count]
            if not members:
                continue
            full = self._layout.join([values[r] for r in group], self.attrs.shape)
            out[members[0] - first] = full
            for r in members[1:]:
                out[r - first] = full.clone()
        return out

    def grad(self, g):
        g.set_input_grad(0, g.op("ReplicatedReduceScatter", g.output_grad(0), domain=GC,
                                 num_shards=self.attrs.num_shards))
