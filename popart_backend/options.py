"""SessionOptions, Patterns and the option enums/structs of spec §2.2–§2.4 and §10 (F8–F10).

Every option is a typed dataclass field carrying its PopART 2.3 default. Assignments are checked:
an unknown name or a value of the wrong type raises ``popart_exception`` instead of being
silently kept. The backend string dicts (``engineOptions`` ...) are ``OptionDict`` objects, so
``opts.engineOptions["k"] = "v"`` persists (F10).

Which options the session implements, and the checks of their values, are in
``option_checks.py``.
"""

from __future__ import annotations

import collections.abc
import difflib
import enum
import logging
import numbers
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .errors import popart_exception
from .tensorinfo import TileSet

__all__ = [
    "AccumulateOuterFragmentSchedule",
    "AccumulateOuterFragmentSettings",
    "AutodiffSettings",
    "AutodiffStitchStrategy",
    "AutomaticLossScalingSettings",
    "BatchSerializationBatchSchedule",
    "BatchSerializationMethod",
    "BatchSerializationSettings",
    "BatchSerializationTransformContext",
    "CommGroup",
    "CommGroupType",
    "DotCheck",
    "ExecutionPhaseIOSchedule",
    "ExecutionPhaseSchedule",
    "ExecutionPhaseSettings",
    "Instrumentation",
    "MeanReductionStrategy",
    "MergeVarUpdateType",
    "Patterns",
    "PatternsLevel",
    "RecomputationType",
    "ReductionType",
    "ReplicatedTensorSharding",
    "SessionOptions",
    "SubgraphCopyingStrategy",
    "SyntheticDataMode",
    "TensorLocation",
    "TensorLocationSettings",
    "TensorStorage",
    "VirtualGraphMode",
]

_log = logging.getLogger("popart:session")


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
    Ungrouped = 3  # C++ None; SDK 3 Python name (spec App. C 7)


# ----------------------------------------------------------------------------------------------
# Type-checked assignment
# ----------------------------------------------------------------------------------------------


class _Mismatch(Exception):
    """Internal signal from _coerce: the value does not fit the hint (turned into a message)."""


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_describe(a) for a in args)
    if origin is collections.abc.Callable:
        return "callable"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_describe(a) for a in args)}]"
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint))


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Return ``value`` converted to the type ``hint`` describes, or raise _Mismatch."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return _coerce(value, arg, where)
            except _Mismatch:
                continue
        raise _Mismatch
    if hint is type(None):
        if value is None:
            return None
        raise _Mismatch
    if hint is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise _Mismatch
    if hint is int:
        # bool is an Integral too; True as a count is almost always a slip.
        if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
            return int(value)
        raise _Mismatch
    if hint is float:
        if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
            return float(value)
        raise _Mismatch
    if origin is collections.abc.Callable:
        if callable(value):
            return value
        raise _Mismatch
    if origin in (set, frozenset):
        if not isinstance(value, (set, frozenset, list, tuple)):
            raise _Mismatch
        return {_coerce(v, args[0], where) for v in value}
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        return [_coerce(v, args[0], where) for v in value]
    if origin is dict:
        if not isinstance(value, collections.abc.Mapping):
            raise _Mismatch
        return OptionDict(where, args[0], args[1], value)
    if isinstance(hint, type):
        if isinstance(value, hint):
            return value
        raise _Mismatch
    raise TypeError(f"options.py cannot check type hint {hint!r} of {where}")


def _checked(value: Any, hint: Any, where: str) -> Any:
    try:
        return _coerce(value, hint, where)
    except _Mismatch:
        raise popart_exception(
            f"{where} expects {_describe(hint)}, got {type(value).__name__} {value!r}."
        ) from None


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = {
            name: hint
            for name, hint in typing.get_type_hints(cls).items()
            if typing.get_origin(hint) is not typing.ClassVar
        }
    return _HINTS[cls]


class _Typed:
    """Base of the option structs: assigning checks the field name and the value's type."""

    def __setattr__(self, name: str, value: Any) -> None:
        hints = _hints(type(self))
        cls_name = type(self).__name__
        if name not in hints:
            close = difflib.get_close_matches(name, hints, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise popart_exception(f"{cls_name} has no option '{name}'.{hint}")
        object.__setattr__(self, name, _checked(value, hints[name], f"{cls_name}.{name}"))


class OptionDict(dict):
    """A dict option that checks key and value types on every write.

    SessionOptions stores this object itself, so item assignment on the value read from the
    options writes through (F10).
    """

    def __init__(self, where: str, key_type: type, value_type: type, items=()):
        super().__init__()
        self._where = where
        self._key_type = key_type
        self._value_type = value_type
        self.update(items)

    def __setitem__(self, key, value) -> None:
        key = _checked(key, self._key_type, f"key of {self._where}")
        super().__setitem__(key, _checked(value, self._value_type, f"{self._where}[{key!r}]"))

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def __ior__(self, other):
        self.update(other)
        return self

    def copy(self) -> dict:
        return dict(self)


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


# ----------------------------------------------------------------------------------------------
# SessionOptions
# ----------------------------------------------------------------------------------------------


def _str_dict():
    return field(default_factory=dict)


@dataclass
class SessionOptions(_Typed):
    """All 2.3 session options with their defaults (spec §2.4, F9)."""

    # Debug / DOT
    logDir: str = ""
    dotChecks: set[DotCheck] = field(default_factory=set)
    firstDotOp: int = 0
    finalDotOp: int = 10000
    dotOpNames: bool = False
    separateCallOpPdfs: bool = True
    exportPoplarComputationGraph: bool = False
    exportPoplarVertexGraph: bool = False
    # Outlining / scheduling
    enableOutlining: bool = True
    enableOutliningCopyCostPruning: bool = True
    outlineThreshold: float = 1.0
    outlineSequenceBreakCost: float = 10000.0
    subgraphCopyingStrategy: SubgraphCopyingStrategy = SubgraphCopyingStrategy.OnEnterAndExit
    timeLimitScheduler: float = 1e9
    swapLimitScheduler: int = 1_000_000_000
    kahnTieBreaker: str = "greedy"
    transitiveClosureOptimizationThreshold: int = 100000
    serializedPoprithmsShiftGraphsDir: str = ""
    delayVarUpdates: bool = True
    scheduleNonWeightUpdateGradientConsumersEarly: bool = False
    decomposeGradSum: bool = False
    aliasZeroCopy: bool = False
    # Recomputation / variable updates
    autoRecomputation: RecomputationType = RecomputationType.NoRecompute
    explicitRecomputation: bool = False
    mergeVarUpdate: MergeVarUpdateType = MergeVarUpdateType.Off
    mergeVarUpdateMemThreshold: int = 1000000
    looseThresholdAtPeak: int = 8000
    # Host streams
    rearrangeAnchorsOnHost: bool = True
    rearrangeStreamsOnHost: bool = False
    enablePrefetchDatastreams: bool = True
    defaultPrefetchBufferingDepth: int = 1
    prefetchBufferingDepthMap: dict[str, int] = _str_dict()
    groupHostSync: bool = False
    syntheticDataMode: SyntheticDataMode = SyntheticDataMode.Off
    useHostCopyOps: bool = False
    enableExplicitMainLoops: bool = False
    enableMergeExchange: bool = True
    numIOTiles: int = 0
    # Parallelism
    virtualGraphMode: VirtualGraphMode = VirtualGraphMode.Off
    enablePipelining: bool = False
    enableReplicatedGraphs: bool = False
    replicatedGraphCount: int = 1
    enableGradientAccumulation: bool = False
    accumulationFactor: int = 1
    accumulationAndReplicationReductionType: ReductionType = ReductionType.Sum
    meanAccumulationAndReplicationReductionStrategy: MeanReductionStrategy = (
        MeanReductionStrategy.PostAndLoss
    )
    enableDistributedReplicatedGraphs: bool = False
    globalReplicationFactor: int = 1
    globalReplicaOffset: int = 0
    executionPhaseSettings: ExecutionPhaseSettings = field(default_factory=ExecutionPhaseSettings)
    accumulateOuterFragmentSettings: AccumulateOuterFragmentSettings = field(
        default_factory=AccumulateOuterFragmentSettings
    )
    batchSerializationSettings: BatchSerializationSettings = field(
        default_factory=BatchSerializationSettings
    )
    autodiffSettings: AutodiffSettings = field(default_factory=AutodiffSettings)
    # Tensor locations (spec §10)
    activationTensorLocationSettings: TensorLocationSettings = field(
        default_factory=TensorLocationSettings
    )
    weightTensorLocationSettings: TensorLocationSettings = field(
        default_factory=TensorLocationSettings
    )
    optimizerStateTensorLocationSettings: TensorLocationSettings = field(
        default_factory=TensorLocationSettings
    )
    accumulatorTensorLocationSettings: TensorLocationSettings = field(
        default_factory=TensorLocationSettings
    )
    tensorLocationSettingsOverride: dict[str, TensorLocation] = _str_dict()
    # Numerics / engine
    enableNonStableSoftmax: bool = False
    enableStableNorm: bool = False
    enableStochasticRounding: bool = False
    enableFloatingPointChecks: bool = False
    partialsTypeMatMuls: str = ""
    enableFullyConnectedPass: bool = True
    enableSerializedMatmuls: bool = True
    groupNormStridedChannelGrouping: bool = False
    enableSupportedDataTypeCasting: bool = True
    strictOpVersions: bool = True
    opxAliasChecking: bool = False
    opxModifyChecking: bool = False
    automaticLossScalingSettings: AutomaticLossScalingSettings = field(
        default_factory=AutomaticLossScalingSettings
    )
    enableLoadAndOffloadRNGState: bool = False
    customCodelets: list[str] = field(default_factory=list)
    customCodeletCompileFlags: str = ""
    # Engine / caching / instrumentation
    compileEngine: bool = True
    constantWeights: bool = True
    enableEngineCaching: bool = False
    cachePath: str = "session_cache"
    instrumentWithHardwareCycleCounter: bool = False
    hardwareInstrumentations: set[Instrumentation] = field(
        default_factory=lambda: {Instrumentation.Outer}
    )
    disableGradAccumulationTensorStreams: bool = False
    compilationProgressLogger: Callable[[int, int], None] | None = None
    compilationProgressTotal: int = 100
    # Backend option dicts (F10)
    engineOptions: dict[str, str] = _str_dict()
    convolutionOptions: dict[str, str] = _str_dict()
    lstmOptions: dict[str, str] = _str_dict()
    matmulOptions: dict[str, str] = _str_dict()
    reportOptions: dict[str, str] = _str_dict()
    gclOptions: dict[str, str] = _str_dict()

    def getGlobalReplicationFactor(self) -> int:  # noqa: N802 - PopART's name
        """Replicas over all instances: grf if distributed, else the local count if replicated."""
        if self.enableDistributedReplicatedGraphs:
            return self.globalReplicationFactor
        if self.enableReplicatedGraphs:
            return self.replicatedGraphCount
        return 1

    def getAccumulationFactor(self) -> int:  # noqa: N802
        """``accumulationFactor`` if accumulation is on, else 1; raises if the two disagree."""
        if not self.enableGradientAccumulation:
            if self.accumulationFactor > 1:
                raise popart_exception(
                    "enableGradientAccumulation is false, but accumulationFactor > 1 "
                    f"(accumulationFactor = {self.accumulationFactor}). Either enable gradient "
                    "accumulation, or set the accumulation factor to 1."
                )
            return 1
        return self.accumulationFactor

    def explicitPipeliningEnabled(self) -> bool:  # noqa: N802
        """Pipelining is explicit iff pipelining, host-copy ops and explicit main loops are on."""
        return self.enablePipelining and self.useHostCopyOps and self.enableExplicitMainLoops

    def implicitPipeliningEnabled(self) -> bool:  # noqa: N802
        return self.enablePipelining and not self.explicitPipeliningEnabled()


# ----------------------------------------------------------------------------------------------
# Patterns (F8)
# ----------------------------------------------------------------------------------------------


class PatternsLevel(enum.Enum):
    NoPatterns = 0
    Minimal = 1
    Default = 2
    All = 3


# Pattern name -> lowest level that enables it. Patterns never change results (spec §2.2), only
# IR dumps and estimates. Which 2.3 patterns were "mandatory" (Minimal) is not recorded in the
# spec; the MatMul rewrites are the ones 2.3 lowering needed, so they are Minimal here.
PATTERN_LEVELS: dict[str, PatternsLevel] = {
    "PreUniRepl": PatternsLevel.Default,
    "PostNRepl": PatternsLevel.Default,
    "SoftMaxGradDirect": PatternsLevel.Default,
    "NlllWithSoftMaxGradDirect": PatternsLevel.Default,
    "OpToIdentity": PatternsLevel.Default,
    "SubtractArg1GradOp": PatternsLevel.Default,
    "MulArgGradOp": PatternsLevel.Default,
    "MatMulOp": PatternsLevel.Minimal,
    "MatMulLhsGradOp": PatternsLevel.Minimal,
    "MatMulRhsGradOp": PatternsLevel.Minimal,
    "InPlace": PatternsLevel.Default,
}


def register_pattern(name: str, level: PatternsLevel = PatternsLevel.Default) -> None:
    """Make a pattern name known; Patterns built afterwards include it (spec §2.1)."""
    if name in PATTERN_LEVELS:
        raise popart_exception(f"Pattern '{name}' is already registered.")
    PATTERN_LEVELS[name] = level


class Patterns:
    """The enabled IR patterns: ``Patterns()``, ``Patterns(level)``, ``Patterns([names])``."""

    def __init__(self, arg: PatternsLevel | list[str] | tuple[str, ...] = PatternsLevel.Default):
        if isinstance(arg, PatternsLevel):
            self._enabled = {
                name: arg != PatternsLevel.NoPatterns and level.value <= arg.value
                for name, level in PATTERN_LEVELS.items()
            }
        elif isinstance(arg, (list, tuple)):
            self._enabled = dict.fromkeys(PATTERN_LEVELS, False)
            for name in arg:
                self.enablePattern(name, True)
        else:
            raise popart_exception(
                f"Patterns expects a PatternsLevel or a list of pattern names, got {arg!r}."
            )
        self.runtimeAssertsOn = True

    def _known(self, name: str) -> str:
        if name not in self._enabled:
            raise popart_exception(
                f"Unknown pattern '{name}'. Known patterns: {', '.join(sorted(self._enabled))}."
            )
        return name

    def isPatternEnabled(self, name: str) -> bool:  # noqa: N802
        return self._enabled[self._known(name)]

    def enablePattern(self, name: str, enabled: bool) -> Patterns:  # noqa: N802
        self._enabled[self._known(name)] = _checked(enabled, bool, f"Patterns '{name}'")
        return self

    def enableRuntimeAsserts(self, enabled: bool) -> Patterns:  # noqa: N802
        self.runtimeAssertsOn = _checked(enabled, bool, "Patterns.enableRuntimeAsserts")
        return self

    def enabledPatterns(self) -> list[str]:  # noqa: N802
        return [name for name, on in self._enabled.items() if on]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Patterns) and self._enabled == other._enabled

    def __repr__(self) -> str:
        return f"Patterns({self.enabledPatterns()})"


def _pattern_property(name: str) -> property:
    return property(
        lambda self: self.isPatternEnabled(name),
        lambda self, on: self.enablePattern(name, on),
        doc=f"Whether the {name} pattern is enabled.",
    )


for _name in (
    "PreUniRepl",
    "PostNRepl",
    "SoftMaxGradDirect",
    "NlllWithSoftMaxGradDirect",
    "OpToIdentity",
    "SubtractArg1GradOp",
    "MulArgGradOp",
    "MatMulOp",
    "MatMulLhsGradOp",
    "MatMulRhsGradOp",
    "InPlace",
):
    setattr(Patterns, _name, _pattern_property(_name))
del _name
