"""The SessionOptions enums; their values follow the C++ declaration order of
PopART 2.3."""

from __future__ import annotations

import enum

__all__ = [
    "AccumulateOuterFragmentSchedule",
    "AutodiffStitchStrategy",
    "BatchSerializationBatchSchedule",
    "BatchSerializationMethod",
    "BatchSerializationTransformContext",
    "CommGroupType",
    "DotCheck",
    "ExecutionPhaseIOSchedule",
    "ExecutionPhaseSchedule",
    "GradientTensorTrackingMethod",
    "Instrumentation",
    "MeanReductionStrategy",
    "MergeVarUpdateType",
    "RecomputationType",
    "ReductionType",
    "ReplicatedTensorSharding",
    "SubgraphCopyingStrategy",
    "SyntheticDataMode",
    "TensorStorage",
    "VirtualGraphMode",
]

# ----------------------------------------------------------------------------------------------
# Enums (values follow the C++ declaration order of PopART 2.3)
# ----------------------------------------------------------------------------------------------


class VirtualGraphMode(enum.Enum):
    Off = 0
    Manual = 1
    Auto = 2
    ExecutionPhases = 3


class RecomputationType(enum.Enum):
    NoRecompute = 0  # C++ None
    Standard = 1
    NormOnly = 2
    Pipeline = 3
    RecomputeAll = 4


class MergeVarUpdateType(enum.Enum):
    Off = 0  # C++ None
    All = 1
    AutoLoose = 2
    AutoTight = 3


class SyntheticDataMode(enum.Enum):
    Off = 0
    Zeros = 1
    RandomNormal = 2
    RandomUniform = 3


class ReductionType(enum.Enum):
    Sum = 0
    Mean = 1
    NoReduction = 2


class MeanReductionStrategy(enum.Enum):
    Running = 0
    Post = 1
    PostAndLoss = 2


class DotCheck(enum.Enum):
    Fwd0 = 0
    Fwd1 = 1
    Bwd0 = 2
    PreAlias = 3
    Final = 4
    All = 5


class SubgraphCopyingStrategy(enum.Enum):
    OnEnterAndExit = 0
    JustInTime = 1


class Instrumentation(enum.Enum):
    Outer = 0
    Inner = 1


class ExecutionPhaseIOSchedule(enum.Enum):
    Preload = 0
    OnDemand = 1


class ExecutionPhaseSchedule(enum.Enum):
    Interleaving = 0
    Batch = 1
    BatchClusteredIO = 2


class AccumulateOuterFragmentSchedule(enum.Enum):
    Scheduler = 0
    Serial = 1
    OverlapCycleOptimized = 2
    OverlapMemoryOptimized = 3


class BatchSerializationTransformContext(enum.Enum):
    Fwd = 0
    Bwd = 1
    Forward = 0  # the long spellings are aliases of Fwd / Bwd
    Backward = 1


class BatchSerializationMethod(enum.Enum):
    UnrollDynamic = 0
    UnrollStatic = 1
    Loop = 2


class BatchSerializationBatchSchedule(enum.Enum):
    Scheduler = 0
    Isomorphic = 1
    OverlapOnIo = 2
    OverlapOnCompute = 3


class AutodiffStitchStrategy(enum.Enum):
    RecomputeMinimal = 0
    RecomputeAllNonInputs = 1
    AddFwdOutputs = 2
    SafeAddFwdOutputs = 3


class TensorStorage(enum.Enum):
    OnChip = 0
    OffChip = 1


class ReplicatedTensorSharding(enum.Enum):
    Off = 0
    On = 1


class CommGroupType(enum.Enum):
    All = 0
    Consecutive = 1
    Orthogonal = 2
    Ungrouped = 3  # C++ None; the SDK 3 Python name


class GradientTensorTrackingMethod(enum.Enum):
    """Which gradients automatic loss scaling tracks."""

    AllNonViewChangingGradientTensors = 0
    ConvAndMatmulGradients = 1
    GradientsOfUserSpecifiedTensors = 2
