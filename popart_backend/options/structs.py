"""The option structs SessionOptions holds: CommGroup, TensorLocation and
the settings groups (execution phases, batch serialisation, autodiff, loss scaling ...)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import popart_exception
from ..tensorinfo import TileSet
from .enums import (
    AccumulateOuterFragmentSchedule,
    AutodiffStitchStrategy,
    BatchSerializationBatchSchedule,
    BatchSerializationMethod,
    BatchSerializationTransformContext,
    CommGroupType,
    ExecutionPhaseIOSchedule,
    ExecutionPhaseSchedule,
    GradientTensorTrackingMethod,
    ReplicatedTensorSharding,
    TensorStorage,
)
from .typed import _Typed

__all__ = [
    "AccumulateOuterFragmentSettings",
    "AutodiffSettings",
    "AutomaticLossScalingSettings",
    "BatchSerializationSettings",
    "CommGroup",
    "ReplicaGrouping",
    "ExecutionPhaseSettings",
    "ExperimentalSettings",
    "NumIOTiles",
    "ReplicatedCollectivesSettings",
    "TensorLocation",
    "TensorLocationSettings",
]

# ----------------------------------------------------------------------------------------------
# Option structs
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaGrouping:
    """``numReplicas`` replicas in groups of ``groupSize``; the members of a group are ``stride``
    apart (stride 1: consecutive blocks)."""

    numReplicas: int
    stride: int = 1
    groupSize: int = 0  # 0: one group of every replica

    def __post_init__(self):
        size = self.groupSize or self.numReplicas
        ok = self.numReplicas > 0 and self.stride > 0 and size > 0
        if not ok or self.numReplicas % (size * self.stride):
            raise popart_exception(
                f"ReplicaGrouping(numReplicas={self.numReplicas}, stride={self.stride}, "
                f"groupSize={self.groupSize}) does not tile the replicas: numReplicas must be a "
                f"multiple of groupSize * stride."
            )

    def getGroupSize(self) -> int:  # noqa: N802 - PopART's names
        return self.groupSize or self.numReplicas

    def getNumGroups(self) -> int:  # noqa: N802
        return self.numReplicas // self.getGroupSize()

    def getStride(self) -> int:  # noqa: N802
        return self.stride

    def getNumReplicas(self) -> int:  # noqa: N802
        return self.numReplicas

    def getGroupAt(self, replica: int) -> int:  # noqa: N802
        """Index of the group holding ``replica``."""
        size, stride = self.getGroupSize(), self.stride
        return (replica % stride) + stride * (replica // (stride * size))

    def groups(self) -> list[list[int]]:
        """The replica ids of each group, in group order."""
        out: list[list[int]] = [[] for _ in range(self.getNumGroups())]
        for replica in range(self.numReplicas):
            out[self.getGroupAt(replica)].append(replica)
        return out


@dataclass
class CommGroup(_Typed):
    """Replica grouping for sharding domains and collectives. ``CommGroup()`` = All."""

    type: CommGroupType = CommGroupType.All
    replicaGroupSize: int = 0

    def toReplicaGrouping(self, numReplicas: int) -> ReplicaGrouping:  # noqa: N802,N803
        """The grouping this CommGroup means for ``numReplicas`` replicas: All = one group,
        Consecutive = blocks of ``replicaGroupSize``, Orthogonal = groups of
        ``replicaGroupSize`` members ``numReplicas / replicaGroupSize`` apart, Ungrouped (None)
        = one group per replica."""
        size = self.replicaGroupSize
        if self.type is CommGroupType.All:
            return ReplicaGrouping(numReplicas, 1, numReplicas)
        if self.type is CommGroupType.Ungrouped:
            return ReplicaGrouping(numReplicas, 1, 1)
        if size <= 0 or numReplicas % size:
            raise popart_exception(
                f"CommGroup({self.type.name}, replicaGroupSize={size}): the group size must "
                f"divide the {numReplicas} replicas."
            )
        if self.type is CommGroupType.Consecutive:
            return ReplicaGrouping(numReplicas, 1, size)
        return ReplicaGrouping(numReplicas, numReplicas // size, size)


@dataclass(init=False)
class TensorLocation(_Typed):
    """Where a tensor lives. Accepts the 2.3 positional overloads:
    ``()``, ``(storage)``, ``(storage, rts)``, ``(storage, rts, shardingDomain)``,
    ``(storage, loadTileSet, storageTileSet, rts)``, ``(..., rts, shardingDomain)``.
    """

    storage: TensorStorage
    loadTileSet: TileSet
    storageTileSet: TileSet
    replicatedTensorSharding: ReplicatedTensorSharding
    shardingDomain: CommGroup

    def __init__(self, *args: Any, **kwargs: Any):
        names = ["storage", "loadTileSet", "storageTileSet", "replicatedTensorSharding"]
        if len(args) in (2, 3):  # (storage, rts[, domain]) has no tile sets
            names = ["storage", "replicatedTensorSharding", "shardingDomain"]
        else:
            names.append("shardingDomain")
        if len(args) > len(names):
            raise popart_exception(
                f"TensorLocation takes at most 5 positional arguments, got {len(args)}."
            )
        values = dict(
            storage=TensorStorage.OnChip,
            loadTileSet=TileSet.Compute,
            storageTileSet=TileSet.Compute,
            replicatedTensorSharding=ReplicatedTensorSharding.Off,
        )
        values.update(zip(names, args))
        values.update(kwargs)
        values.setdefault("shardingDomain", CommGroup())
        for name, value in values.items():
            setattr(self, name, value)


@dataclass(init=False)
class TensorLocationSettings(_Typed):
    """Per tensor-type location defaults; ``location`` may be given as a TensorStorage."""

    location: TensorLocation
    minElementsForOffChip: int
    minElementsForReplicatedTensorSharding: int

    def __init__(
        self,
        location: TensorLocation | TensorStorage | None = None,
        minElementsForOffChip: int = 2,  # noqa: N803 - PopART's keyword names
        minElementsForReplicatedTensorSharding: int = 8192,  # noqa: N803
    ):
        if location is None:
            location = TensorLocation()
        elif isinstance(location, TensorStorage):
            location = TensorLocation(location)
        self.location = location
        self.minElementsForOffChip = minElementsForOffChip
        self.minElementsForReplicatedTensorSharding = minElementsForReplicatedTensorSharding


@dataclass
class ExecutionPhaseSettings(_Typed):
    phases: int = 0
    stages: int = 2
    weightIOSchedule: ExecutionPhaseIOSchedule = ExecutionPhaseIOSchedule.Preload
    activationIOSchedule: ExecutionPhaseIOSchedule = ExecutionPhaseIOSchedule.Preload
    optimizerStateIOSchedule: ExecutionPhaseIOSchedule = ExecutionPhaseIOSchedule.OnDemand
    accumulatorIOSchedule: ExecutionPhaseIOSchedule = ExecutionPhaseIOSchedule.Preload
    schedule: ExecutionPhaseSchedule = ExecutionPhaseSchedule.Interleaving


@dataclass
class AccumulateOuterFragmentSettings(_Typed):
    schedule: AccumulateOuterFragmentSchedule = AccumulateOuterFragmentSchedule.Serial
    excludedVirtualGraphs: list[int] = field(default_factory=list)


@dataclass
class BatchSerializationSettings(_Typed):
    factor: int = 0
    concatOnVirtualGraphChange: bool = True
    concatOnExecutionPhaseChange: bool = True
    concatOnPipelineStageChange: bool = True
    transformContext: BatchSerializationTransformContext = BatchSerializationTransformContext.Fwd
    method: BatchSerializationMethod = BatchSerializationMethod.UnrollDynamic
    batchSchedule: BatchSerializationBatchSchedule = BatchSerializationBatchSchedule.Isomorphic


@dataclass
class AutodiffSettings(_Typed):
    stitchStrategy: AutodiffStitchStrategy = AutodiffStitchStrategy.RecomputeAllNonInputs


@dataclass
class AutomaticLossScalingSettings(_Typed):
    enabled: bool = False
    binEdgeLocation: float = 1.0
    thresholdUpperCountProportion: float = 1e-7
    toTrackTensors: list[str] | None = None
    updatePeriod: int = 1
    gradientTensorTrackingMethod: GradientTensorTrackingMethod = (
        GradientTensorTrackingMethod.AllNonViewChangingGradientTensors
    )


@dataclass
class ReplicatedCollectivesSettings(_Typed):
    """Whether replicated collectives of the same kind are merged into one."""

    prepareScheduleForMergingCollectives: bool = False
    mergeAllReduceCollectives: bool = False
    mergeReduceScatterCollectives: bool = False
    mergeAllGatherCollectives: bool = False


@dataclass
class ExperimentalSettings(_Typed):
    """Settings of features PopART marks experimental."""

    createHostTransferableTensorWithOffset: bool = False


class NumIOTiles(int):
    """PopART's type of ``SessionOptions.numIOTiles``: an int (``NumIOTiles()`` is 0)."""

    def __new__(cls, value: int = 0):
        if isinstance(value, bool) or not isinstance(value, int):
            raise popart_exception(f"NumIOTiles expects an int, got {type(value).__name__} "
                                   f"{value!r}.")
        return super().__new__(cls, value)
