"""SessionOptions.

Every option is a typed dataclass field carrying its PopART 2.3 default. Assignments are checked:
an unknown name or a value of the wrong type raises ``popart_exception`` instead of being
silently kept. The backend string dicts (``engineOptions`` ...) are ``OptionDict`` objects, so
``opts.engineOptions["k"] = "v"`` persists.

Which options the session implements, and the checks of their values, are in ``checks.py``;
the enums in ``enums.py``, the option structs (CommGroup, TensorLocation, the settings groups) in
``structs.py``, the type-checked assignment (``_Typed``, ``OptionDict``) in ``typed.py`` and
Patterns in ``patterns.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from ..errors import popart_exception
from .enums import (
    DotCheck,
    Instrumentation,
    MeanReductionStrategy,
    MergeVarUpdateType,
    RecomputationType,
    ReductionType,
    SubgraphCopyingStrategy,
    SyntheticDataMode,
    VirtualGraphMode,
)
from .structs import (
    AccumulateOuterFragmentSettings,
    AutodiffSettings,
    AutomaticLossScalingSettings,
    BatchSerializationSettings,
    ExecutionPhaseSettings,
    ExperimentalSettings,
    ReplicatedCollectivesSettings,
    TensorLocation,
    TensorLocationSettings,
)
from .typed import _Typed

__all__ = ["SessionOptions"]

_log = logging.getLogger("popart:session")

# ----------------------------------------------------------------------------------------------
# SessionOptions
# ----------------------------------------------------------------------------------------------


# Deprecated option -> the option that replaces it. Writing the old name warns once and writes
# the new one; writing the new name keeps the old one reading the same value.
_DEPRECATED = {
    "defaultPrefetchBufferingDepth": "defaultBufferingDepth",
    "prefetchBufferingDepthMap": "bufferingDepthMap",
    "serializedPoprithmsAnnealGraphsDir": "serializedPoprithmsShiftGraphsDir",
}
_RENAMED = {new: old for old, new in _DEPRECATED.items()}
_warned: set[str] = set()


def _str_dict():
    return field(default_factory=dict)


@dataclass
class SessionOptions(_Typed):
    """All 2.3 session options with their defaults."""

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
    serializedPoprithmsAnnealGraphsDir: str = ""  # deprecated alias of the one above
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
    useLoopCandidateCreator: bool = False
    # Host streams
    rearrangeAnchorsOnHost: bool = True
    rearrangeStreamsOnHost: bool = False
    enablePrefetchDatastreams: bool = True
    defaultPrefetchBufferingDepth: int = 1
    prefetchBufferingDepthMap: dict[str, int] = _str_dict()
    defaultBufferingDepth: int = 1  # the new name of defaultPrefetchBufferingDepth
    bufferingDepthMap: dict[str, int] = _str_dict()  # the new name of prefetchBufferingDepthMap
    groupHostSync: bool = False
    syntheticDataMode: SyntheticDataMode = SyntheticDataMode.Off
    useHostCopyOps: bool = False
    enableExplicitMainLoops: bool = False
    enableMergeExchange: bool = True
    numIOTiles: int = 0
    enableEfficientOverlapIOTopoCons: bool = False
    experimentalSettings: ExperimentalSettings = field(default_factory=ExperimentalSettings)
    # Parallelism
    virtualGraphMode: VirtualGraphMode = VirtualGraphMode.Off
    virtualGraphSplitRatios: list[float] = field(default_factory=list)
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
    replicatedCollectivesSettings: ReplicatedCollectivesSettings = field(
        default_factory=ReplicatedCollectivesSettings
    )
    createImplicitPipeliningFwdOnlyProgram: bool = False
    stashAllTensorsInferencePipeline: bool = False
    executionPhaseSettings: ExecutionPhaseSettings = field(default_factory=ExecutionPhaseSettings)
    accumulateOuterFragmentSettings: AccumulateOuterFragmentSettings = field(
        default_factory=AccumulateOuterFragmentSettings
    )
    batchSerializationSettings: BatchSerializationSettings = field(
        default_factory=BatchSerializationSettings
    )
    autodiffSettings: AutodiffSettings = field(default_factory=AutodiffSettings)
    # Tensor locations
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
    enableConstantFoldingOfMultipleConsumers: bool = True
    enableInplaceAmbiguityChecking: bool = False
    ensureFp32LossScaleTensor: bool = False
    throwIfLog2ScaleTensorNotInRange: bool = True
    strictOpVersions: bool = True
    opxAliasChecking: bool = False
    opxModifyChecking: bool = False
    automaticLossScalingSettings: AutomaticLossScalingSettings = field(
        default_factory=AutomaticLossScalingSettings
    )
    enableLoadAndOffloadRNGState: bool = False
    _enableRngStateManagement: bool = False
    customCodelets: list[str] = field(default_factory=list)
    customCodeletCompileFlags: str = ""
    # Engine / caching / instrumentation
    compileEngine: bool = True
    constantWeights: bool = True
    enableEngineCaching: bool = False
    enableVariablesCaching: bool = True
    cachePath: str = "session_cache"
    instrumentWithHardwareCycleCounter: bool = False
    hardwareInstrumentations: set[Instrumentation] = field(
        default_factory=lambda: {Instrumentation.Outer}
    )
    disableGradAccumulationTensorStreams: bool = False
    disableOptimizerStateTensorStreams: bool = False
    updatableNamedBuffers: list[str] = field(default_factory=list)
    compilationProgressLogger: Callable[[int, int], None] | None = None
    compilationProgressTotal: int = 100
    # Backend option dicts
    engineOptions: dict[str, str] = _str_dict()
    convolutionOptions: dict[str, str] = _str_dict()
    lstmOptions: dict[str, str] = _str_dict()
    matmulOptions: dict[str, str] = _str_dict()
    reportOptions: dict[str, str] = _str_dict()
    gclOptions: dict[str, str] = _str_dict()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ready", True)

    def __setattr__(self, name: str, value) -> None:
        if name == "updatableBuffers":  # PopART's Python spelling of updatableNamedBuffers
            name = "updatableNamedBuffers"
        super().__setattr__(name, value)
        if not self.__dict__.get("_ready"):
            return  # the constructor setting the defaults
        if name in _DEPRECATED:
            new = _DEPRECATED[name]
            if name not in _warned:
                _warned.add(name)
                _log.warning("SessionOptions.%s is deprecated: use SessionOptions.%s instead.",
                             name, new)
            super().__setattr__(new, getattr(self, name))
        elif name in _RENAMED:  # keep the old name reading the same value
            super().__setattr__(_RENAMED[name], getattr(self, name))

    @property
    def updatableBuffers(self) -> list[str]:  # noqa: N802
        """Alias of ``updatableNamedBuffers``."""
        return self.updatableNamedBuffers

    def enableExplicitIR(self, enable: bool = True) -> None:  # noqa: N802
        """Turn the explicit IR forms on (or off) together: host-copy ops, explicit main loops
        and explicit recomputation."""
        for name in ("useHostCopyOps", "enableExplicitMainLoops", "explicitRecomputation"):
            setattr(self, name, enable)

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
