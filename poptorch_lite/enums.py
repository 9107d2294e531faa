"""``poptorch_lite.enums``: PopTorch's enums (``from poptorch.enums import ...``), each also
re-exported at the package top level as PopTorch does.

The enums of the options, the DataLoader and the execution strategies live with the code that
reads them and are only re-exported here. The others are defined here with PopTorch's members
and values; they belong to APIs that accept them (``DataLoader``'s sharing strategy, serialised
matmuls, IO overlap, multi-convolutions, per-replica variables), and each of those APIs decides
what the value does in the simulated model.
"""

from __future__ import annotations

import enum

from .blocks import AutoStage, Liveness
from .data import DataLoaderMode
from .options.enums import (
    AnchorMode,
    CommGroupType,
    ConnectionType,
    MeanReductionStrategy,
    OutputMode,
    ReductionType,
    SyncPattern,
)

__all__ = [
    "AnchorMode",
    "AutoStage",
    "CommGroupType",
    "ConnectionType",
    "DataLoaderMode",
    "HalfFloatCastingBehavior",
    "Liveness",
    "MatMulSerializationMode",
    "MeanReductionStrategy",
    "MultiConvPlanType",
    "OutputMode",
    "OverlapMode",
    "ReductionType",
    "SharingStrategy",
    "SyncPattern",
    "VariableRetrievalMode",
]


class SharingStrategy(enum.IntEnum):
    """How DataLoader worker processes hand tensors to the main process (torch's
    ``multiprocessing`` sharing strategies)."""

    SharedMemory = 0
    FileSystem = 1
    Fork = 2
    ForkServer = 3


class HalfFloatCastingBehavior(enum.IntEnum):
    """Argument of the deprecated ``Options.Precision.halfFloatCasting`` (no effect)."""

    FloatDowncastToHalf = 0
    HalfUpcastToFloat = 1
    Default = 2


class MatMulSerializationMode(enum.Enum):
    """Which dimension ``serializedMatMul`` splits."""

    InputChannels = "input_channels"
    ReducingDim = "reducing_dim"
    OutputChannels = "output_channels"
    Disabled = "none"


class OverlapMode(enum.Enum):
    """IO overlap of an input or output stream (``set_overlap_for_input/output``)."""

    NoOverlap = "no_overlap"
    OverlapAccumulationLoop = "overlap_accumulation_loop"
    OverlapDeviceIterationLoop = "overlap_device_iteration_loop"


class MultiConvPlanType(enum.IntEnum):
    """How ``MultiConv`` plans its convolutions."""

    Parallel = 0
    Serial = 1


class VariableRetrievalMode(enum.IntEnum):
    """Which replicas' copies of a per-replica variable the host reads back."""

    OnePerGroup = 0
    AllReplicas = 2
