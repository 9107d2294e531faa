"""SessionOptions, Patterns and the option enums/structs of spec §2.2–§2.4 and §10 (F8–F10).

Every option is a typed dataclass field carrying its PopART 2.3 default. Assignments are checked:
an unknown name or a value of the wrong type raises ``popart_exception`` instead of being
silently kept. The backend string dicts (``engineOptions`` ...) are ``OptionDict`` objects, so
``opts.engineOptions["k"] = "v"`` persists (F10).

``OPTION_STATUS`` records, per field, whether the session implements it (BUILT), whether by
design it cannot change a simulated result or estimate (NO_EFFECT, with the reason), or which
issue will build it (PENDING). ``check_buildable()`` turns every non-default PENDING field into
one ``NotImplementedOptionError``, so no option is ever silently ignored.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import enum
import logging
import numbers
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .errors import NotImplementedOptionError, popart_exception
from .tensorinfo import ExchangeStrategy, TileSet

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


# ----------------------------------------------------------------------------------------------
# Build status of every option ("nothing silently ignored")
# ----------------------------------------------------------------------------------------------


class BuildState(enum.Enum):
    BUILT = "built"
    NO_EFFECT = "no effect"
    PENDING = "pending"


@dataclass(frozen=True)
class OptionStatus:
    """How the session treats a non-default value of one option."""

    state: BuildState
    issue: int | None = None
    note: str = ""  # PENDING: what will be built; NO_EFFECT: why nothing can change


@dataclass(frozen=True)
class ByMode:
    """An option whose status differs between inference and training sessions."""

    inference: OptionStatus
    training: OptionStatus


BUILT = OptionStatus(BuildState.BUILT)


def pending(issue: int, what: str) -> OptionStatus:
    return OptionStatus(BuildState.PENDING, issue, what)


def no_effect(why: str) -> OptionStatus:
    return OptionStatus(BuildState.NO_EFFECT, None, why)


_TRAINING = pending(3, "training")
_NO_OUTLINING = no_effect("the simulator does not outline; code size is a fixed estimate")
_SCHEDULER_SEARCH = no_effect("tunes the scheduler's search budget, not the schedule's meaning")
_INFERENCE_ONLY_GRADS = "inference has no gradients"

# Issues: #3 training/optimizer/accumulation, #5 pipelining/virtual graphs/replication/
# recomputation/sync, #6 memory and cycle model/IO tiles/tensor locations/profiling/DOT and IR
# dumps, #7 op coverage and strictness edge cases, #8 custom codelets.
OPTION_STATUS: dict[str, OptionStatus | ByMode] = {
    "logDir": BUILT,
    "dotChecks": BUILT,
    "firstDotOp": BUILT,
    "finalDotOp": BUILT,
    "dotOpNames": BUILT,
    "separateCallOpPdfs": BUILT,
    "exportPoplarComputationGraph": no_effect("there is no Poplar graph to export"),
    "exportPoplarVertexGraph": no_effect("there is no Poplar vertex graph to export"),
    "enableOutlining": _NO_OUTLINING,
    "enableOutliningCopyCostPruning": _NO_OUTLINING,
    "outlineThreshold": _NO_OUTLINING,
    "outlineSequenceBreakCost": _NO_OUTLINING,
    "subgraphCopyingStrategy": no_effect("subgraph copies are not modelled separately"),
    "timeLimitScheduler": _SCHEDULER_SEARCH,
    "swapLimitScheduler": _SCHEDULER_SEARCH,
    "kahnTieBreaker": _SCHEDULER_SEARCH,
    "transitiveClosureOptimizationThreshold": _SCHEDULER_SEARCH,
    "serializedPoprithmsShiftGraphsDir": no_effect("there is no poprithms shift graph"),
    "delayVarUpdates": pending(6, "schedule order in the liveness/memory model"),
    "scheduleNonWeightUpdateGradientConsumersEarly": pending(
        6, "schedule order in the liveness/memory model"
    ),
    "decomposeGradSum": ByMode(
        no_effect(_INFERENCE_ONLY_GRADS), pending(3, "decomposed grad sums")
    ),
    "aliasZeroCopy": pending(6, "zero-copy aliasing in the memory model"),
    # Recomputation clones forward ops into the backward pass; the IR is always explicit.
    "autoRecomputation": ByMode(no_effect("inference has no backward pass"), BUILT),
    "explicitRecomputation": ByMode(no_effect("inference has no backward pass"), BUILT),
    "mergeVarUpdate": ByMode(no_effect("inference has no variable updates"), _TRAINING),
    "mergeVarUpdateMemThreshold": ByMode(no_effect("inference has no variable updates"), _TRAINING),
    "looseThresholdAtPeak": ByMode(no_effect("inference has no variable updates"), _TRAINING),
    "rearrangeAnchorsOnHost": no_effect("simulated tensors have no tile layout to rearrange"),
    "rearrangeStreamsOnHost": no_effect("simulated tensors have no tile layout to rearrange"),
    "enablePrefetchDatastreams": pending(6, "host-stream prefetch in the cycle model"),
    "defaultPrefetchBufferingDepth": pending(6, "host-stream prefetch in the cycle model"),
    "prefetchBufferingDepthMap": pending(6, "host-stream prefetch in the cycle model"),
    "groupHostSync": pending(6, "grouped host syncs in the cycle model"),
    "syntheticDataMode": BUILT,
    # Host-copy ops and explicit main loops only change the cycle timeline (overlapped IO).
    "useHostCopyOps": BUILT,
    "enableExplicitMainLoops": BUILT,
    "enableMergeExchange": pending(6, "merged exchanges in the cycle model"),
    "numIOTiles": BUILT,
    # VirtualGraphMode.ExecutionPhases is rejected by the virtual-graph pass (issue #6).
    "virtualGraphMode": BUILT,
    "enablePipelining": BUILT,
    # Replicas hold their own state; gradients are all-reduced (transforms/replication.py).
    "enableReplicatedGraphs": BUILT,
    "replicatedGraphCount": BUILT,
    # Inference rejects accumulation itself with the spec's message (session.py).
    "enableGradientAccumulation": BUILT,
    "accumulationFactor": BUILT,
    "accumulationAndReplicationReductionType": ByMode(no_effect(_INFERENCE_ONLY_GRADS), BUILT),
    "meanAccumulationAndReplicationReductionStrategy": ByMode(
        no_effect(_INFERENCE_ONLY_GRADS), BUILT
    ),
    # Instances meet over torch.distributed (gloo, env://): device/distributed.py.
    "enableDistributedReplicatedGraphs": BUILT,
    "globalReplicationFactor": BUILT,
    "globalReplicaOffset": BUILT,
    "executionPhaseSettings": pending(5, "execution phases"),
    "accumulateOuterFragmentSettings": ByMode(
        no_effect("inference has no accumulate outer fragment"),
        pending(5, "accumulate outer fragment scheduling"),
    ),
    "batchSerializationSettings": pending(6, "batch serialisation"),
    "autodiffSettings": ByMode(no_effect("inference runs no autodiff"), _TRAINING),
    # Off-chip storage and replicated tensor sharding (transforms/rts.py) are built.
    "activationTensorLocationSettings": BUILT,
    "weightTensorLocationSettings": BUILT,
    "optimizerStateTensorLocationSettings": BUILT,
    "accumulatorTensorLocationSettings": BUILT,
    "tensorLocationSettingsOverride": BUILT,
    "enableNonStableSoftmax": pending(7, "non-stable softmax"),
    "enableStableNorm": pending(7, "stable norm"),
    "enableStochasticRounding": pending(7, "stochastic rounding"),
    "enableFloatingPointChecks": pending(7, "floating-point exception checks"),
    "partialsTypeMatMuls": pending(7, "matmul partials type"),
    "enableFullyConnectedPass": no_effect("only changes Poplar's matmul plan, not modelled"),
    "enableSerializedMatmuls": pending(6, "serialised matmuls in the memory model"),
    "groupNormStridedChannelGrouping": pending(7, "strided GroupNorm channel grouping"),
    "enableSupportedDataTypeCasting": pending(7, "strict 64-bit integer handling"),
    "strictOpVersions": BUILT,
    "opxAliasChecking": pending(7, "kernel alias checking"),
    "opxModifyChecking": pending(7, "kernel modify checking"),
    "automaticLossScalingSettings": ByMode(
        no_effect("inference has no loss scaling"), pending(3, "automatic loss scaling")
    ),
    "enableLoadAndOffloadRNGState": pending(7, "RNG state load/offload"),
    "customCodelets": pending(8, "custom codelets"),
    "customCodeletCompileFlags": pending(8, "custom codelets"),
    "compileEngine": BUILT,
    "constantWeights": BUILT,
    "enableEngineCaching": pending(6, "engine caching"),
    "cachePath": no_effect("read only with enableEngineCaching, which is checked itself"),
    "instrumentWithHardwareCycleCounter": BUILT,
    "hardwareInstrumentations": pending(6, "cycle instrumentation"),
    "disableGradAccumulationTensorStreams": ByMode(
        no_effect(_INFERENCE_ONLY_GRADS), pending(3, "gradient accumulation streams")
    ),
    "compilationProgressLogger": BUILT,  # called during prepareDevice() (progress.py)
    "compilationProgressTotal": BUILT,
    "engineOptions": BUILT,  # only "autoReport.all" is read; other keys are Poplar tuning
    "convolutionOptions": pending(6, "convolution planning options in the cost model"),
    "lstmOptions": pending(6, "LSTM planning options in the cost model"),
    "matmulOptions": pending(6, "matmul planning options in the cost model"),
    "reportOptions": no_effect("the simulated profile report has a fixed content"),
    "gclOptions": pending(5, "collective (GCL) options"),
}

_missing = set(_hints(SessionOptions)) ^ set(OPTION_STATUS)
if _missing:  # a new field must say how the session treats it
    raise AssertionError(f"OPTION_STATUS and SessionOptions disagree on: {sorted(_missing)}")
del _missing


def option_status(name: str, training: bool) -> OptionStatus:
    """The status of option ``name`` for an inference (False) or training (True) session."""
    status = OPTION_STATUS[name]
    if isinstance(status, ByMode):
        return status.training if training else status.inference
    return status


_DEFAULTS: SessionOptions | None = None


def _default_options() -> SessionOptions:
    """One shared, never-mutated default instance (building one costs ~0.5 ms per session)."""
    global _DEFAULTS
    if _DEFAULTS is None:
        _DEFAULTS = SessionOptions()
    return _DEFAULTS


def non_default_options(options: SessionOptions) -> dict[str, tuple[Any, Any]]:
    """Field name -> (value, default) for every option that differs from its default."""
    defaults = _default_options()
    changed = {}
    for f in dataclasses.fields(SessionOptions):
        value, default = getattr(options, f.name), getattr(defaults, f.name)
        if value != default:
            changed[f.name] = (value, default)
    return changed


def _fmt(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(_fmt(v) for v in value)) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_fmt(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _differences(path: str, value: Any, default: Any) -> list[str]:
    """``path = value (default d)`` for each differing leaf, descending into option structs."""
    if dataclasses.is_dataclass(value) and type(value) is type(default):
        lines = []
        for f in dataclasses.fields(value):
            sub_value, sub_default = getattr(value, f.name), getattr(default, f.name)
            if sub_value != sub_default:
                lines += _differences(f"{path}.{f.name}", sub_value, sub_default)
        return lines
    return [f"{path} = {_fmt(value)} (default {_fmt(default)})"]


# Parts of a built option struct that are still pending (none: replicated tensor sharding and
# its sharding domains are built by transforms/rts.py).
_PENDING_PARTS: dict[str, OptionStatus] = {}


def check_sharding_domain(domain: CommGroup, where: str, local_replicas: int,
                          global_replicas: int) -> int:
    """The number of replicas a tensor sharded over ``domain`` is split across (spec §10.4).

    ``where`` names the tensor and the setting it came from. Raises popart_exception for a
    domain RTS cannot use: Orthogonal or Ungrouped, a Consecutive size that does not divide
    the replicas, All over more than one instance (each host needs the whole tensor), or a
    Consecutive size other than the local replicas with more than one instance.
    """
    instances = global_replicas // local_replicas if local_replicas else 1
    kind = domain.type
    if kind is CommGroupType.All:
        if instances > 1:
            raise popart_exception(
                f"{where}: replicated tensor sharding over CommGroup(All) is not supported with "
                f"{instances} instances ({global_replicas} replicas in total, {local_replicas} "
                f"per instance): each host needs the whole tensor. Use "
                f"CommGroup(CommGroupType.Consecutive, {local_replicas}) as the shardingDomain."
            )
        return global_replicas
    if kind is not CommGroupType.Consecutive:
        raise popart_exception(
            f"{where}: replicated tensor sharding supports the sharding domains "
            f"CommGroupType.All and CommGroupType.Consecutive, not {kind.name}."
        )
    size = domain.replicaGroupSize
    if size < 1 or global_replicas % size:
        raise popart_exception(
            f"{where}: shardingDomain CommGroup(Consecutive, replicaGroupSize={size}) must split "
            f"the {global_replicas} replicas into equal groups; use a group size >= 1 that "
            f"divides {global_replicas}."
        )
    if instances > 1 and size != local_replicas:
        raise popart_exception(
            f"{where}: with {instances} instances the shardingDomain CommGroup(Consecutive, "
            f"replicaGroupSize={size}) must have the size of the local replicas, "
            f"{local_replicas} (shards are gathered inside one instance)."
        )
    return size


def check_buildable(options: SessionOptions, training: bool) -> None:
    """Raise NotImplementedOptionError naming every non-default option not built yet.

    Non-default NO_EFFECT options are logged as a warning on ``popart:session`` with the reason.
    """
    if not isinstance(options, SessionOptions):
        raise popart_exception(
            f"userOptions must be a SessionOptions, got {type(options).__name__}."
        )
    mode = "training" if training else "inference"
    offending = []
    for name, (value, default) in non_default_options(options).items():
        status = option_status(name, training)
        diffs = _differences(name, value, default)
        if name == "tensorLocationSettingsOverride":
            diffs = [d for tid, loc in value.items()
                     for d in _differences(f"{name}[{tid!r}]", loc, TensorLocation())]
        for diff in diffs:
            part = next((p for p in _PENDING_PARTS if f".{p}" in diff.split(" = ")[0]), None)
            state = _PENDING_PARTS[part] if part is not None else status
            if state.state is BuildState.PENDING:
                offending.append(f"  - {diff}: {state.note}, to be built by issue #{state.issue}")
            elif state.state is BuildState.NO_EFFECT:
                _log.warning(
                    "SessionOptions.%s has no effect in the simulator: %s.", diff, state.note
                )
    if offending:
        raise NotImplementedOptionError(
            f"This {mode} session sets {len(offending)} SessionOptions value(s) whose behaviour "
            "is not built yet:\n"
            + "\n".join(offending)
            + "\nReset them to their defaults to run now."
        )


# ----------------------------------------------------------------------------------------------
# IO tiles and overlapped host IO (spec §9, F100-F104)
# ----------------------------------------------------------------------------------------------

# PopART 2.3's numIOTiles range on a full-size IPU.
IO_TILES_MIN, IO_TILES_MAX = 32, 192
_OVERLAP = (ExchangeStrategy.OverlapInnerLoop, ExchangeStrategy.OverlapLoops)
_LOCATION_SETTINGS = ("activationTensorLocationSettings", "weightTensorLocationSettings",
                      "optimizerStateTensorLocationSettings", "accumulatorTensorLocationSettings")


def check_io_options(options: SessionOptions, streams: dict[str, tuple[TileSet, ExchangeStrategy]],
                     tiles_per_ipu: int, full_chip_tiles: int) -> None:
    """Check ``numIOTiles``, ``enableExplicitMainLoops`` / ``useHostCopyOps`` and the tile set
    and exchange strategy of each host stream (``streams``: "input 'x'" / "anchor 'y'" ->
    (TileSet, ExchangeStrategy)) against the device's tile count. Raises popart_exception.

    PopART 2.3 wants an even ``numIOTiles`` in [32, 192]; a simulated device with fewer tiles
    than the real chip (IpuModel default: 4) accepts any even 0 < n < tilesPerIPU with a
    warning instead (spec §9 decision).
    """
    n = options.numIOTiles
    if n < 0 or n % 2:
        raise popart_exception(
            f"SessionOptions.numIOTiles = {n}: the number of IO tiles must be an even number "
            f"(0 for none)."
        )
    if n > 0:
        if n >= tiles_per_ipu:
            raise popart_exception(
                f"SessionOptions.numIOTiles = {n} leaves no compute tiles: the device has "
                f"{tiles_per_ipu} tiles per IPU. Use an even number below {tiles_per_ipu}, or a "
                f"device with more tiles (createIpuModelDevice({{'tilesPerIPU': ...}}))."
            )
        if not IO_TILES_MIN <= n <= IO_TILES_MAX:
            if tiles_per_ipu >= full_chip_tiles:
                raise popart_exception(
                    f"SessionOptions.numIOTiles = {n} is outside [{IO_TILES_MIN}, "
                    f"{IO_TILES_MAX}], the range for a full IPU of {tiles_per_ipu} tiles. Use an "
                    f"even number in that range."
                )
            _log.warning(
                "SessionOptions.numIOTiles = %d is outside PopART's range [%d, %d]; accepted "
                "because the simulated device has only %d tiles per IPU (%d compute tiles).",
                n, IO_TILES_MIN, IO_TILES_MAX, tiles_per_ipu, tiles_per_ipu - n)
        if options.virtualGraphMode is VirtualGraphMode.Off:
            raise popart_exception(
                f"SessionOptions.numIOTiles = {n} needs virtual graphs (each IPU's graph is split "
                f"into compute and IO tile sets): set virtualGraphMode to VirtualGraphMode.Manual "
                f"or VirtualGraphMode.Auto."
            )
    if options.enableExplicitMainLoops and not options.useHostCopyOps:
        raise popart_exception(
            "enableExplicitMainLoops requires useHostCopyOps: set SessionOptions.useHostCopyOps "
            "= True as well, or turn enableExplicitMainLoops off."
        )
    for what, (tile_set, strategy) in streams.items():
        if strategy is ExchangeStrategy.OverlapStep:
            raise popart_exception(
                f"ExchangeStrategy::OverlapStep is not yet supported. {what} asks for it; use "
                f"ExchangeStrategy.OverlapInnerLoop or OverlapLoops."
            )
        if tile_set is TileSet.IO and n == 0:
            raise popart_exception(
                f"{what} is streamed to TileSet.IO, but SessionOptions.numIOTiles = 0. Set "
                f"numIOTiles to an even number of IO tiles or use TileSet.Compute."
            )
        if strategy in _OVERLAP:
            missing = [text for text, ok in (
                ("useHostCopyOps = True", options.useHostCopyOps),
                ("enableExplicitMainLoops = True", options.enableExplicitMainLoops),
                ("virtualGraphMode Manual or Auto",
                 options.virtualGraphMode is not VirtualGraphMode.Off),
            ) if not ok]
            if missing:
                raise popart_exception(
                    f"{what} uses ExchangeStrategy.{strategy.name}, which needs "
                    f"{', '.join(missing)} in SessionOptions (overlapped IO runs in explicit "
                    f"main loops with host-copy ops on virtual graphs)."
                )
            if tile_set is not TileSet.IO:
                _log.warning(
                    "%s uses ExchangeStrategy.%s on TileSet.Compute: it compiles and runs, but "
                    "only streams on TileSet.IO overlap with compute, so there is no speed-up.",
                    what, strategy.name)
    if n == 0:
        locations = [(f"{name}.location", getattr(options, name).location)
                     for name in _LOCATION_SETTINGS]
        locations += [(f"tensorLocationSettingsOverride[{tid!r}]", loc)
                      for tid, loc in options.tensorLocationSettingsOverride.items()]
        for where, loc in locations:
            for field_name in ("loadTileSet", "storageTileSet"):
                if getattr(loc, field_name) is TileSet.IO:
                    raise popart_exception(
                        f"SessionOptions.{where}.{field_name} = TileSet.IO, but numIOTiles = 0. "
                        f"Set numIOTiles to an even number of IO tiles or use TileSet.Compute."
                    )
