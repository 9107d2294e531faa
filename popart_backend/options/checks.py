"""Which SessionOptions the session implements, and the checks of option values it runs.

``OPTION_STATUS`` records, per field, whether the session implements it (BUILT), whether by
design it cannot change a simulated result or estimate (NO_EFFECT, with the reason), or which
issue will build it (PENDING). ``check_buildable()`` turns every non-default PENDING field into
one ``NotImplementedOptionError``, so no option is ever silently ignored. The IO-tile
and sharding-domain rules are checked here too.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from dataclasses import dataclass
from typing import Any

from ..errors import NotImplementedOptionError, popart_exception
from ..tensorinfo import ExchangeStrategy, TileSet
from .enums import AutodiffStitchStrategy, CommGroupType, TensorStorage, VirtualGraphMode
from .planning import check_planning_options
from .session_options import SessionOptions
from .structs import CommGroup, ExecutionPhaseSettings, TensorLocation
from .typed import _hints
from .values import check_numeric_options

_log = logging.getLogger("popart:session")

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


def pending(issue: int | None, what: str) -> OptionStatus:
    """Not built; ``issue`` is the open issue that will build it (None: none planned yet)."""
    return OptionStatus(BuildState.PENDING, issue, what)


def no_effect(why: str) -> OptionStatus:
    return OptionStatus(BuildState.NO_EFFECT, None, why)


_NO_OUTLINING = no_effect("the simulator does not outline; code size is a fixed estimate")
_SCHEDULER_SEARCH = no_effect("tunes the scheduler's search budget, not the schedule's meaning")
_INFERENCE_ONLY_GRADS = "inference has no gradients"

# Issues: #3 training/optimizer/accumulation, #5 pipelining/virtual graphs/replication/
# recomputation/sync, #6 memory and cycle model/IO tiles/tensor locations/profiling/DOT and IR
# dumps, #8 custom codelets; None: no issue plans it yet.
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
    "serializedPoprithmsAnnealGraphsDir": no_effect("there is no poprithms shift graph"),
    # False: weight updates as early as they can go in the liveness order (device/option_model.py).
    "delayVarUpdates": ByMode(no_effect("inference has no variable updates"), BUILT),
    # The liveness order runs gradient consumers early (device/option_model.py).
    "scheduleNonWeightUpdateGradientConsumersEarly": ByMode(
        no_effect(_INFERENCE_ONLY_GRADS), BUILT),
    # Gradient sums as chains of Adds (transforms/decompose_grad_sum.py).
    "decomposeGradSum": ByMode(no_effect(_INFERENCE_ONLY_GRADS), BUILT),
    "aliasZeroCopy": no_effect(
        "subgraph and loop copies are not modelled separately, so there is no copy to alias"),
    # Recomputation clones forward ops into the backward pass; the IR is always explicit.
    "autoRecomputation": ByMode(no_effect("inference has no backward pass"), BUILT),
    "explicitRecomputation": ByMode(no_effect("inference has no backward pass"), BUILT),
    # Merged weight updates: syncs and a gradient buffer (device/var_update_merge.py).
    "mergeVarUpdate": ByMode(no_effect("inference has no variable updates"), BUILT),
    "mergeVarUpdateMemThreshold": ByMode(no_effect("inference has no variable updates"), BUILT),
    "looseThresholdAtPeak": ByMode(no_effect("inference has no variable updates"), BUILT),
    "useLoopCandidateCreator": _NO_OUTLINING,
    "rearrangeAnchorsOnHost": no_effect("simulated tensors have no tile layout to rearrange"),
    "rearrangeStreamsOnHost": no_effect("simulated tensors have no tile layout to rearrange"),
    # Buffers per input stream in the memory model (device/option_model.py).
    "enablePrefetchDatastreams": BUILT,
    "defaultPrefetchBufferingDepth": BUILT,
    "prefetchBufferingDepthMap": BUILT,
    "defaultBufferingDepth": BUILT,
    "bufferingDepthMap": BUILT,
    "groupHostSync": BUILT,  # one host sync per step for inputs and anchors (device/cost.py)
    "syntheticDataMode": BUILT,
    # Host-copy ops and explicit main loops only change the cycle timeline (overlapped IO).
    "useHostCopyOps": BUILT,
    "enableExplicitMainLoops": BUILT,
    "enableMergeExchange": no_effect(
        "the cycle model already gives every remote and host transfer its own sync, the "
        "unmerged form"),
    "numIOTiles": BUILT,
    "enableEfficientOverlapIOTopoCons": no_effect(
        "overlapped host IO is modelled as hiding behind a whole iteration; the schedule "
        "constraints that help Poplar achieve that are not modelled"),
    "experimentalSettings": no_effect(
        "host-transferable tensors have no tile-layout offset in the simulator"),
    "virtualGraphMode": BUILT,  # every mode, ExecutionPhases included (execution_phases.py)
    "virtualGraphSplitRatios": BUILT,  # VirtualGraphMode.Auto (transforms/virtual_graphs.py)
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
    "replicatedCollectivesSettings": BUILT,  # merged collectives (device/cost.py)
    "createImplicitPipeliningFwdOnlyProgram": ByMode(
        no_effect("inference runs only the forward program"),
        BUILT,  # session_fwd_only.py: run("implicitPipeliningFwdOnly", stepio)
    ),
    # Stash buffers for every value leaving its stage (transforms/pipelining.py).
    "stashAllTensorsInferencePipeline": ByMode(
        BUILT,
        no_effect("only inference pipelines read it; training stashes what the backward pass "
                  "needs"),
    ),
    # VirtualGraphMode.ExecutionPhases (transforms/execution_phases.py); check_execution_phases
    # logs the parts without effect.
    "executionPhaseSettings": BUILT,
    # Overlap schedules: the IPUs' weight updates run in parallel (device/cost.py).
    "accumulateOuterFragmentSettings": ByMode(
        no_effect("inference has no accumulate outer fragment"), BUILT),
    "batchSerializationSettings": BUILT,  # memory and cycles (device/option_model.py)
    # Training: checked against the model's subgraphs by check_stitch_strategy below.
    "autodiffSettings": ByMode(no_effect("inference runs no autodiff"), BUILT),
    # Off-chip storage and replicated tensor sharding (transforms/rts.py) are built.
    "activationTensorLocationSettings": BUILT,
    "weightTensorLocationSettings": BUILT,
    "optimizerStateTensorLocationSettings": BUILT,
    "accumulatorTensorLocationSettings": BUILT,
    "tensorLocationSettingsOverride": BUILT,
    # transforms/numerics_options.py
    "enableNonStableSoftmax": BUILT,
    "enableStableNorm": no_effect(
        "the simulated norms always take the variance about the mean (the stable form)"),
    # every float16 kernel result and weight update (transforms/stochastic_rounding.py).
    "enableStochasticRounding": BUILT,
    "enableFloatingPointChecks": BUILT,
    "partialsTypeMatMuls": BUILT,  # float16 products only (transforms/numerics_options.py)
    "enableFullyConnectedPass": no_effect("only changes Poplar's matmul plan, not modelled"),
    # False: the per-op matmul serialisations are not planned (device/planner.py).
    "enableSerializedMatmuls": BUILT,
    "groupNormStridedChannelGrouping": BUILT,  # transforms/numerics_options.py
    # True: INT64/UINT64 inputs range-checked as 32-bit at the stream; False: refused
    # (session_methods.py check_64bit_*).
    "enableSupportedDataTypeCasting": BUILT,
    # False: constant expressions of shared tensors stay unfolded (transforms/const_fold.py,
    # importer/fold_policy.py).
    "enableConstantFoldingOfMultipleConsumers": BUILT,
    "enableInplaceAmbiguityChecking": no_effect(
        "in-place variants are used only where the op is the sole reader, so no in-place "
        "ambiguity can arise"),
    # A float32 loss scale applied to the first float16 gradients (transforms/loss_scaling.py).
    "ensureFp32LossScaleTensor": ByMode(no_effect("inference has no loss scaling"), BUILT),
    "throwIfLog2ScaleTensorNotInRange": no_effect(
        "there are no float8 ops, the only readers of a log2 scale tensor"),
    "strictOpVersions": BUILT,
    "opxAliasChecking": BUILT,  # transforms/numerics_options.py KernelChecks
    "opxModifyChecking": BUILT,
    "automaticLossScalingSettings": ByMode(
        no_effect("inference has no loss scaling"), BUILT  # transforms/auto_loss_scaling.py
    ),
    # Session.getRNGState / setRNGState (device/simulator.py rng_state).
    "enableLoadAndOffloadRNGState": BUILT,
    "_enableRngStateManagement": no_effect(
        "the simulator always keeps one random generator state per replica"),
    "customCodelets": no_effect(
        "custom codelets are not compiled in the simulator; custom ops run their Python kernels"),
    "customCodeletCompileFlags": no_effect(
        "custom codelets are not compiled in the simulator; custom ops run their Python kernels"),
    "compileEngine": BUILT,
    "constantWeights": BUILT,
    "enableEngineCaching": BUILT,  # executable/session_mixin.py: the engine cache
    "cachePath": BUILT,
    "enableVariablesCaching": no_effect(
        "engine cache entries hold no variables here: the weights always come from the model"),
    "instrumentWithHardwareCycleCounter": BUILT,
    "hardwareInstrumentations": no_effect(
        "the simulator counts every op's cycles whatever is instrumented, and the counters add "
        "no modelled overhead"),
    "disableGradAccumulationTensorStreams": ByMode(
        no_effect(_INFERENCE_ONLY_GRADS),
        no_effect("the simulator models no host streams for accumulators (readWeights reads "
                  "the device copy directly)"),
    ),
    "disableOptimizerStateTensorStreams": ByMode(
        no_effect("inference has no optimizer state"),
        no_effect("the simulator models no host streams for optimizer state (readWeights "
                  "reads the device copy directly)"),
    ),
    "updatableNamedBuffers": no_effect(
        "there is no copyNamedBuffersToDevice call that would update the named buffers"),
    "compilationProgressLogger": BUILT,  # called during prepareDevice() (progress.py)
    "compilationProgressTotal": BUILT,
    # report/auto.py reads "autoReport.all" and "autoReport.directory" (merged with the
    # POPLAR_ENGINE_OPTIONS variable); other keys are logged once as having no effect.
    "engineOptions": BUILT,
    # Per key (options/planning.py): "partialsType" as the per-op setting, other keys logged.
    "convolutionOptions": BUILT,
    "lstmOptions": BUILT,
    "matmulOptions": BUILT,
    "reportOptions": no_effect("the simulated profile report has a fixed content"),
    "gclOptions": no_effect(
        "collectives are modelled as a plain ring over the IPU-Links; GCL's algorithm and "
        "buffer choices are not modelled"),
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
_PENDING_PARTS: dict[str, OptionStatus] = {
    # Batch serialisation is modelled by its factor (activation memory, per-slice syncs); the
    # slices are not materialised as ops, so how they are unrolled, scheduled or concatenated
    # changes no modelled number.
    **{part: no_effect("batch-serialised slices are not materialised as separate ops")
       for part in ("concatOnVirtualGraphChange", "concatOnExecutionPhaseChange",
                    "concatOnPipelineStageChange", "method", "batchSchedule")},
    "prepareScheduleForMergingCollectives": no_effect(
        "only orders the schedule for merging; the merge flags themselves are modelled"),
}


def check_sharding_domain(domain: CommGroup, where: str, local_replicas: int,
                          global_replicas: int) -> int:
    """The number of replicas a tensor sharded over ``domain`` is split across.

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
    check_numeric_options(options)
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
                offending.append(f"  - {diff}: {state.note}, not built yet")
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
    check_planning_options(options)
    check_execution_phases(options, training)


_PHASE_DEFAULTS = ExecutionPhaseSettings()
_PHASE_WARNED: set[str] = set()


def _warn_once(message: str, *args) -> None:
    """Log a no-effect warning once per process for each distinct text."""
    text = message % args if args else message
    if text not in _PHASE_WARNED:
        _PHASE_WARNED.add(text)
        _log.warning(text)


def check_execution_phases(options: SessionOptions, training: bool) -> None:
    """``executionPhaseSettings``: refuse what phased execution does not build with, and log
    the settings that change nothing in our model."""
    settings = options.executionPhaseSettings
    if options.virtualGraphMode is not VirtualGraphMode.ExecutionPhases:
        if settings != _PHASE_DEFAULTS:
            _warn_once("SessionOptions.executionPhaseSettings has no effect: only "
                         "virtualGraphMode = VirtualGraphMode.ExecutionPhases runs phases (this "
                         "session uses %s).", options.virtualGraphMode)
        return
    if settings.phases < 1:
        raise popart_exception(
            f"virtualGraphMode = VirtualGraphMode.ExecutionPhases needs "
            f"executionPhaseSettings.phases >= 1 (got {settings.phases}): set it to the number "
            f"of phases the builder's executionPhase annotations use."
        )
    accumulating = training and options.enableGradientAccumulation
    if settings.accumulatorIOSchedule is not _PHASE_DEFAULTS.accumulatorIOSchedule:
        if not accumulating:
            _warn_once("SessionOptions.executionPhaseSettings.accumulatorIOSchedule = %s has no "
                       "effect: this session has no gradient accumulators (it is not a training "
                       "session with enableGradientAccumulation = True).",
                       settings.accumulatorIOSchedule)
        elif not _may_be_off_chip(options, options.accumulatorTensorLocationSettings):
            _warn_once("SessionOptions.executionPhaseSettings.accumulatorIOSchedule = %s has no "
                       "effect: the gradient accumulators are on chip (accumulatorTensorLocation"
                       "Settings), where they stay on the IPU of their phase; set their storage "
                       "to TensorStorage.OffChip to stream them per phase.",
                       settings.accumulatorIOSchedule)
    if settings.optimizerStateIOSchedule is not _PHASE_DEFAULTS.optimizerStateIOSchedule and (
            not training or not _may_be_off_chip(
                options, options.optimizerStateTensorLocationSettings)):
        _warn_once("SessionOptions.executionPhaseSettings.optimizerStateIOSchedule = %s has "
                   "no effect: %s", settings.optimizerStateIOSchedule,
                   "an inference session has no optimizer state." if not training else
                   "the optimizer state is on chip (optimizerStateTensorLocationSettings), "
                   "where it stays on the IPU of its phase; set its storage to "
                   "TensorStorage.OffChip to stream it per phase.")
    if settings.schedule is not _PHASE_DEFAULTS.schedule:
        _warn_once("SessionOptions.executionPhaseSettings.schedule = %s has no effect: the "
                   "simulated IPU places each phase's loads by the IO schedules (Preload or "
                   "OnDemand) alone, whatever the interleaving of IO and compute.",
                   settings.schedule)


def _may_be_off_chip(options: SessionOptions, settings) -> bool:
    """Whether a variable kind of ``settings`` (its TensorLocationSettings) may be OffChip: its
    storage, or any ``tensorLocationSettingsOverride`` asking for OffChip."""
    off_chip = TensorStorage.OffChip
    return settings.location.storage is off_chip or any(
        location.storage is off_chip
        for location in options.tensorLocationSettingsOverride.values())


_STITCH_LOGGED: set[str] = set()


def check_stitch_strategy(options: SessionOptions, has_subgraphs: bool) -> None:
    """``autodiffSettings.stitchStrategy`` of a training session. It decides how the gradient
    of a subgraph (If, Loop, Scan, Call body) gets the forward values it needs. Our gradient
    bodies recompute the forward body, which is RecomputeAllNonInputs (the default);
    RecomputeMinimal is logged as computed that way (same numbers). AddFwdOutputs and
    SafeAddFwdOutputs make If and Call return those values as extra outputs that their
    gradient reads (transforms/autodiff_stitch.py, which also refuses or logs the subgraphs
    where that is not possible). Without subgraphs every strategy is logged as having no
    effect."""
    strategy = options.autodiffSettings.stitchStrategy
    if strategy is AutodiffStitchStrategy.RecomputeAllNonInputs:
        return
    name = f"AutodiffStitchStrategy.{strategy.name}"
    if not has_subgraphs:
        message = (f"SessionOptions.autodiffSettings.stitchStrategy = {name} has no effect: the "
                   f"model has no subgraph (If, Loop, Scan, Call) whose gradient is stitched.")
    elif strategy is AutodiffStitchStrategy.RecomputeMinimal:
        message = (f"SessionOptions.autodiffSettings.stitchStrategy = {name}: the gradient of "
                   f"a subgraph recomputes its whole forward body, as RecomputeAllNonInputs "
                   f"(the same numbers; the unused recomputed ops cost cycles PopART's minimal "
                   f"set would not).")
    else:
        return  # built: autodiff stitches (transforms/autodiff_stitch.py)
    if name not in _STITCH_LOGGED:
        _STITCH_LOGGED.add(name)
        _log.warning(message)


# ----------------------------------------------------------------------------------------------
# IO tiles and overlapped host IO
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
    warning instead (a design decision).
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
