"""The enums of ``poptorch_lite.Options``: output modes, reductions,
connection and sync patterns, replica grouping. ``_ENUMS`` maps each name to its class so the
options file loader and ``from_json`` can read ``"OutputMode.All"`` back.
"""

from __future__ import annotations

import enum

__all__ = [
    "CommGroupType",
    "ConnectionType",
    "MeanReductionStrategy",
    "OutputMode",
    "AnchorMode",
    "ReductionType",
    "SyncPattern",
]


class OutputMode(enum.IntEnum):
    """Which micro-batches' outputs a call returns."""

    Final = 0  # PopTorch's values
    EveryN = 1
    All = 2
    Sum = 3
    Default = 4


AnchorMode = OutputMode  # the name PopTorch used before 2022 (deprecated alias)


class ReductionType(enum.IntEnum):
    Sum = 0
    Mean = 1
    NoReduction = 2


class MeanReductionStrategy(enum.IntEnum):
    Running = 0
    Post = 1
    PostAndLoss = 2


class ConnectionType(enum.IntEnum):
    Always = 0
    OnDemand = 1
    Never = 2


class SyncPattern(enum.IntEnum):
    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


class CommGroupType(enum.IntEnum):
    All = 0
    Consecutive = 1
    Orthogonal = 2
    NoGrouping = 3


_ENUMS = {cls.__name__: cls for cls in (OutputMode, ReductionType, MeanReductionStrategy,
                                        ConnectionType, SyncPattern, CommGroupType)}
