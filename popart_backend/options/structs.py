"""The option structs SessionOptions holds (spec §2.4, F9, F110): CommGroup, TensorLocation and
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
    "ExecutionPhaseSettings",
    "TensorLocation",
    "TensorLocationSettings",
]

# ----------------------------------------------------------------------------------------------
# Option structs
# ----------------------------------------------------------------------------------------------


@dataclass
class CommGroup(_Typed):
    """Replica grouping for sharding domains and collectives (F110). ``CommGroup()`` = All."""

    type: CommGroupType = CommGroupType.All
    replicaGroupSize: int = 0


@dataclass(init=False)
class TensorLocation(_Typed):
    """Where a tensor lives (spec §10.1). Accepts the 2.3 positional overloads:
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
    """Per tensor-type location defaults (F105); ``location`` may be given as a TensorStorage."""

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
