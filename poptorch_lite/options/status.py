"""What each ``poptorch_lite.Options`` setter does in the simulated IPU (the frontend's
counterpart of ``popart_backend``'s option status table).

``SETTER_STATUS`` names every setter of ``Options``, of its groups (``Training.gradientAccumulation``
...) and of ``TensorLocationSettings`` with its status:

- ``BUILT``: frontend code reads the value (the note says where);
- ``BACKEND``: ``Options.to_backend()`` writes it into the ``popart_backend.SessionOptions``
  field the note names, whose own status table (``popart_backend/options/checks.py``) then
  applies: built, logged as no effect, or refused with ``NotImplementedOptionError``;
- ``NO_EFFECT``: by design nothing in the simulated IPU can change; ``to_backend()`` logs the
  note once per process (WARNING) when the setter's value keys differ from their inert values;
- ``REFUSED``: not built; ``to_backend()`` raises ``Error`` when it is set;
- ``DEPRECATED``: PopTorch's deprecated no-ops; every call warns (``DeprecationWarning``).

``NOT_SETTERS`` lists the public methods that set no option (copies, files, queries, PopTorch's
OptionsDict methods). tests/poptorch/test_option_status.py fails when a public method is in
neither, so a new setter must say what it does.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from typing import Any

from ..errors import Error

__all__ = ["NOT_SETTERS", "SETTER_STATUS", "SetterState", "SetterStatus", "apply_statuses"]

_log = logging.getLogger("poptorch_lite")


class SetterState(enum.Enum):
    BUILT = "built"
    BACKEND = "backend"
    NO_EFFECT = "no effect"
    REFUSED = "refused"
    DEPRECATED = "deprecated"


@dataclass(frozen=True)
class SetterStatus:
    """``note``: BUILT where it is read; BACKEND the SessionOptions field; NO_EFFECT and
    REFUSED why. ``inert``: value key -> the value that means "not set" (NO_EFFECT, REFUSED)."""

    state: SetterState
    note: str
    inert: dict[str, Any] = field(default_factory=dict)


def built(where: str) -> SetterStatus:
    return SetterStatus(SetterState.BUILT, where)


def backend(field_name: str) -> SetterStatus:
    return SetterStatus(SetterState.BACKEND, field_name)


def no_effect(why: str, **inert) -> SetterStatus:
    return SetterStatus(SetterState.NO_EFFECT, why, inert)


def refused(why: str, **inert) -> SetterStatus:
    return SetterStatus(SetterState.REFUSED, why, inert)


_DEPRECATED = SetterStatus(SetterState.DEPRECATED, "deprecated in PopTorch; warns, no effect")
_LOCATION = "through TensorLocations.set*Location"

SETTER_STATUS: dict[str, SetterStatus] = {
    # batching and outputs
    "deviceIterations": built("tracing.py (combined batch), DataFlow batchesPerStep, running.py"),
    "replicationFactor": built("tracing.py, running.py; to_backend replicatedGraphCount"),
    "inputReplicaGrouping": built("tracing.py, running.py (input replica groups)"),
    "outputMode": built("compilation.py: the anchors' AnchorReturnType"),
    "anchorMode": built("deprecated alias of outputMode"),
    "anchorTensor": built("compilation.py: extra DataFlow anchors; introspection.py: "
                          "getAnchoredTensor"),
    # device, seed, caching
    "randomSeed": built("compilation.py: session.setRandomSeed; data.py shuffling"),
    "enableExecutableCaching": built("executor/executable.py: the executable cache"),
    "useIpuModel": built("compilation.py: createIpuModelDevice"),
    "useIpuId": built("compilation.py: acquireDeviceById"),
    "useOfflineIpuTarget": built("compilation.py: createOfflineIPUDevice"),
    "connectionType": built("compilation.py: the device's connection type"),
    "syncPattern": built("compilation.py: acquireAvailableDevice(pattern=...)"),
    "autoRoundNumIPUs": built("compilation.py: IPU count rounding"),
    "setExecutionStrategy": built("blocks.place_model"),
    # misc
    "setAvailableMemoryProportion": built(
        "blocks.apply_memory_proportions: each MatMul/Gemm/Conv of IPU k gets the proportion the "
        "backend's planner bounds its temporaries by"),
    "broadcastBuffers": built("compilation.py: buffer broadcast of replicas"),
    "logDir": built("to_backend logDir (DOT files) and enableProfiling()'s default directory"),
    "maxRepeatLogs": built("logs.py: repeated-message suppression of the frontend logger"),
    "modelName": built("the session name, so the profile's subdirectory"),
    "enableProfiling": built("compilation.py: autoReport.directory; report files (report/auto.py)"),
    "logCycleCount": built("to_backend instrumentWithHardwareCycleCounter; cycleCount()"),
    "showCompilationProgressBar": built("compilation.py: the progress bar"),
    "enableStableNorm": no_effect(
        "the simulated norms always take the variance about the mean (the stable form)",
        enableStableNorm=False),
    "enableSyntheticData": backend("syntheticDataMode"),
    "disableModuleNamescope": no_effect(
        "op names always carry the module path; names change no number, memory or cycle",
        moduleNamescope=True),
    "updatableNamedBuffers": built("introspection.py: copyNamedBuffersToDevice"),
    "relaxOptimizerAttributesChecks": no_effect(
        "the optimizer translation raises on no attribute check this could relax",
        relaxOptimizerAttributesChecks=False),
    "sourceLocationExcludes": built("tracing.py: source locations of errors"),
    "appendToLocationExcludes": built("tracing.py: source locations of errors"),
    "setLogLevel": built("logs.py: the frontend logger's level"),
    # groups
    "Training.gradientAccumulation": built("tracing.py, running.py; to_backend accumulationFactor"),
    "Training.accumulationAndReplicationReductionType": backend(
        "accumulationAndReplicationReductionType"),
    "Training.setMeanAccumulationAndReplicationReductionStrategy": backend(
        "meanAccumulationAndReplicationReductionStrategy"),
    "Training.setAutomaticLossScaling": backend("automaticLossScalingSettings"),
    "Training.setConvolutionDithering": backend("convolutionOptions"),
    "Precision.setPartialsType": backend("partialsTypeMatMuls"),
    "Precision.enableFloatingPointExceptions": backend("enableFloatingPointChecks"),
    "Precision.enableStochasticRounding": backend("enableStochasticRounding"),
    "Precision.halfFloatCasting": _DEPRECATED,
    "Precision.runningStatisticsAlwaysFloat": _DEPRECATED,
    "TensorLocations.numIOTiles": backend("numIOTiles"),
    "TensorLocations.setActivationLocation": backend("activationTensorLocationSettings"),
    "TensorLocations.setWeightLocation": backend("weightTensorLocationSettings"),
    "TensorLocations.setOptimizerLocation": backend("optimizerStateTensorLocationSettings"),
    "TensorLocations.setAccumulatorLocation": backend("accumulatorTensorLocationSettings"),
    "TensorLocationSettings.useOnChipStorage": built(_LOCATION),
    "TensorLocationSettings.useReplicatedTensorSharding": built(_LOCATION),
    "TensorLocationSettings.minElementsForOffChip": built(_LOCATION),
    "TensorLocationSettings.minElementsForReplicatedTensorSharding": built(_LOCATION),
    "TensorLocationSettings.useIOTilesToLoad": built(_LOCATION),
    "TensorLocationSettings.useIOTilesToStore": built(_LOCATION),
    "Distributed.configureProcessId": built("process_id_and_count: data.py, executor/distributed.py"),
    "Distributed.setEnvVarNames": built("process_id_and_count"),
    "Distributed.disable": built("process_id_and_count"),
    "Jit.traceModel": _DEPRECATED,
    "Jit.exporter": built("tracing.py: the ONNX exporter"),
    "_Popart.set": built("to_backend: the named SessionOptions field (unknown names raise)"),
    "_Popart.setPatterns": built("backend_patterns(): the sessions' popart_backend.Patterns"),
    "_Popart.setEngineOptions": built("to_backend: merged into SessionOptions.engineOptions"),
}

NOT_SETTERS = frozenset({
    "clone", "toDict", "defaultOutputMode", "loadFromFile", "from_json", "resolved_output_mode",
    "to_backend", "backend_patterns",
    # PopTorch's OptionsDict methods (optionsdict.py): they call the setters above
    "set", "createOrSet", "exists", "deleteIfExists", "checkIsFrozen", "update",
})

_LOGGED: set[str] = set()


def apply_statuses(values: dict) -> None:
    """Log each NO_EFFECT setter in use once (WARNING); raise Error for a REFUSED one."""
    for name, status in SETTER_STATUS.items():
        used = [k for k, inert in status.inert.items() if values[k] != inert]
        if not used:
            continue
        if status.state is SetterState.REFUSED:
            raise Error(f"Options.{name}: {status.note}. Remove the call to compile.")
        if status.state is SetterState.NO_EFFECT and name not in _LOGGED:
            _LOGGED.add(name)
            _log.warning("Options.%s has no effect on the simulated IPU: %s.", name, status.note)
