"""``poptorch_lite.Options`` and its translation to backend options.

Setters return ``self`` so calls chain, check their argument types (``TypeError`` naming the
option) and store typed values. An object handed to a wrapper or a DataLoader is frozen: later
setters raise ``AttributeError`` ("frozen; use clone()"). ``to_backend()`` turns the values into a
``popart_backend.SessionOptions`` plus the DataFlow settings the wrapper needs.

The enums live in ``enums.py``, the sub-option groups (Training, Precision, ...) and the
shared argument checks in ``groups.py``, and the file / JSON conversions in ``files.py``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import warnings

import torch

import popart_backend as popart

from ..blocks import ExecutionStrategy
from ..errors import ConfigFileError, Error
from .enums import (
    CommGroupType,
    ConnectionType,
    MeanReductionStrategy,
    OutputMode,
    ReductionType,
    SyncPattern,
)
from .files import _apply_call, _from_plain, _to_plain
from .logs import setLogLevel, setRepeatLimit
from .status import apply_statuses
from .optionsdict import OptionsDictMixin, _Key
from .groups import (
    _check_type,
    _Distributed,
    _Jit,
    _Popart,
    _positive,
    _Precision,
    _TensorLocations,
    _Training,
)

__all__ = ["Options"]

_log = logging.getLogger("poptorch_lite")


_DEFAULTS = {
    "deviceIterations": 1,
    "replicationFactor": 1,
    "inputReplicaGrouping": (1, CommGroupType.Consecutive),
    "outputMode": OutputMode.Default,
    "outputReturnPeriod": 1,
    "anchoredTensors": {},
    "randomSeed": None,
    "executableCachePath": os.environ.get("POPTORCH_CACHE_DIR") or None,
    "useIpuModel": True if os.environ.get("POPTORCH_IPU_MODEL") == "1" else None,  # None: unset
    "ipuId": None,
    "offlineIpuVersion": None,
    "connectionType": ConnectionType.Always,
    "syncPattern": SyncPattern.Full,
    "autoRoundNumIPUs": False,
    "executionStrategy": None,
    "availableMemoryProportion": {},
    "broadcastBuffers": True,
    "logDir": ".",
    "maxRepeatLogs": 4,
    "modelName": None,
    "profilingDir": None,
    "logCycleCount": False,
    "showCompilationProgressBar": True,
    "enableStableNorm": False,
    "enableSyntheticData": False,
    "moduleNamescope": True,
    "updatableNamedBuffers": [],
    "relaxOptimizerAttributesChecks": False,
    "sourceLocationExcludes": ["/torch/", "/poptorch_lite/"],
    "Training.gradientAccumulation": 1,
    "Training.accumulationAndReplicationReductionType": ReductionType.Mean,
    "Training.meanAccumulationAndReplicationReductionStrategy": MeanReductionStrategy.Post,
    "Training.automaticLossScaling": False,
    "Training.convolutionDithering": False,
    "Precision.partialsType": "float",
    "Precision.floatingPointExceptions": False,
    "Precision.stochasticRounding": False,
    "TensorLocations.numIOTiles": 0,
    "Distributed.processId": None,  # None: from the environment (see _Distributed)
    "Distributed.numProcesses": None,
    "Distributed.envNumProcesses": None,
    "Distributed.envProcessId": None,
    "Jit.exporter": "dynamo",
    "_Popart.options": {},
    "_Popart.engineOptions": {},
    "_Popart.patterns": None,  # None: the backend's default Patterns
    "_Popart.patternsLevel": 2,
    "TensorLocations.activationLocation": None,  # None: the backend's default location
    "TensorLocations.weightLocation": None,
    "TensorLocations.optimizerLocation": None,
    "TensorLocations.accumulatorLocation": None,
    "Distributed.ipuofConfigs": {},
    "createdOptions": {},  # createOrSet keys no code reads: "key" or "Group.key" -> value
}


class Options(OptionsDictMixin):
    """Options of a wrapper or DataLoader: ``Options().deviceIterations(4).randomSeed(0)``.

    Users write through PopTorch's camelCase setters. The rest of the frontend reads through
    read-only snake_case properties, never the value dict:

    - batching: ``device_iterations``, ``replication_factor``, ``input_replica_grouping``
      (group size, ``CommGroupType``), ``input_replicas``, ``output_mode``,
      ``output_return_period`` and ``resolved_output_mode(training)``;
    - device: ``connection_type``, ``offline_ipu_version``, ``use_ipu_model``, ``ipu_id``,
      ``sync_pattern``, ``auto_round_num_ipus``, ``execution_strategy``;
    - session: ``random_seed``, ``model_name``, ``profiling_dir``,
      ``show_compilation_progress_bar``, ``source_location_excludes``;
    - in the groups: ``Training.gradient_accumulation``, ``Training.reduction_type``,
      ``Distributed.process_id_and_count`` and ``Jit.exporter_name``.

    Users may also read and write values by PopTorch's keys (``opts.log_dir``,
    ``opts.set(replication_factor=2)``, ``opts("random_seed")``): ``Options._KEYS``, at the end
    of this module, maps each key to its setter (``optionsdict.py``).
    """

    def __init__(self):
        object.__setattr__(self, "_values", copy.deepcopy(_DEFAULTS))
        object.__setattr__(self, "_frozen", False)
        object.__setattr__(self, "Training", _Training(self))
        object.__setattr__(self, "Precision", _Precision(self))
        object.__setattr__(self, "TensorLocations", _TensorLocations(self))
        object.__setattr__(self, "Distributed", _Distributed(self))
        object.__setattr__(self, "Jit", _Jit(self))
        object.__setattr__(self, "_Popart", _Popart(self))
        defaults = os.environ.get("POPTORCH_DEFAULT_OPTIONS")
        if defaults:
            self.from_json(defaults)

    # --- freezing, copying, printing --------------------------------------------------------

    def _check_not_frozen(self, key: str) -> None:
        if self._frozen:
            raise AttributeError(
                f"Options are frozen: '{key}' cannot be changed after the options were given to "
                f"a wrapper or DataLoader. Use options.clone() to get an editable copy.")

    def _set(self, key: str, value):
        self._check_not_frozen(key)
        self._values[key] = value
        return self

    def _freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name, value):
        raise AttributeError(f"Options: use the setter methods (e.g. {name}(...)) instead of "
                             f"assigning '{name}'.")

    def clone(self) -> "Options":
        """An unfrozen deep copy."""
        other = Options.__new__(Options)
        object.__setattr__(other, "_values", copy.deepcopy(self._values))
        object.__setattr__(other, "_frozen", False)
        for name, group in (("Training", _Training), ("Precision", _Precision),
                            ("TensorLocations", _TensorLocations), ("Distributed", _Distributed),
                            ("Jit", _Jit), ("_Popart", _Popart)):
            object.__setattr__(other, name, group(other))
        return other

    def toDict(self) -> dict:  # noqa: N802
        """Every option by name; enums as ``"OutputMode.All"`` strings (JSON-friendly)."""
        return {k: _to_plain(v) for k, v in sorted(self._values.items())}

    def __repr__(self) -> str:
        changed = {k: v for k, v in self._values.items() if v != _DEFAULTS.get(k)}
        body = ", ".join(f"{k}={_to_plain(v)!r}" for k, v in sorted(changed.items()))
        return f"Options({body})"

    # --- batching ------------------------------------------------------------------------------

    def deviceIterations(self, device_iterations: int):  # noqa: N802
        """N device-loop iterations per call; inputs carry N times more micro-batches."""
        return self._set("deviceIterations", _positive("deviceIterations", device_iterations))

    @property
    def device_iterations(self) -> int:
        return self._values["deviceIterations"]

    def replicationFactor(self, replication_factor: int):  # noqa: N802
        """R local data-parallel replicas: each runs the whole model on its own
        micro-batches; gradients are reduced over all replicas (of all processes) before each
        optimizer step. The device then has R × (IPUs per replica) IPUs."""
        _positive("replicationFactor", replication_factor)
        group = self._values["inputReplicaGrouping"][0]
        if replication_factor % group:
            raise ValueError(f"Options.replicationFactor({replication_factor}): not a multiple "
                             f"of the input group size {group} (inputReplicaGrouping).")
        return self._set("replicationFactor", replication_factor)

    @property
    def replication_factor(self) -> int:
        return self._values["replicationFactor"]

    def inputReplicaGrouping(self, input_group_size: int, input_group_type):  # noqa: N802
        """Replicas in groups of ``input_group_size`` share their input: the call
        then carries R / size micro-batches per step, group r feeding replicas r·size ..
        r·size+size-1 (Consecutive) or r, r + R/size, ... (Orthogonal)."""
        _positive("inputReplicaGrouping", input_group_size)
        if not isinstance(input_group_type, CommGroupType):
            raise TypeError(f"Options.inputReplicaGrouping: expected a CommGroupType, got "
                            f"{input_group_type!r}.")
        if input_group_type is CommGroupType.All:
            raise ValueError("Options.inputReplicaGrouping: CommGroupType.All is not valid for "
                             "inputs; use Consecutive, Orthogonal or NoGrouping.")
        if input_group_type is CommGroupType.NoGrouping:
            input_group_size = 1  # every replica its own group
        if self.replication_factor % input_group_size:
            raise ValueError(f"Options.inputReplicaGrouping: group size {input_group_size} does "
                             f"not divide replicationFactor {self.replication_factor}.")
        return self._set("inputReplicaGrouping", (input_group_size, input_group_type))

    @property
    def input_replica_grouping(self) -> tuple[int, CommGroupType]:
        """(input group size, how replicas are grouped); size 1 when every replica has its own
        input."""
        return self._values["inputReplicaGrouping"]

    @property
    def input_replicas(self) -> int:
        """Rin = R / input_group_size: the replica factor of the input's batch dimension."""
        return self.replication_factor // self.input_replica_grouping[0]

    def outputMode(self, output_mode, output_return_period=None):  # noqa: N802
        """Which micro-batches' outputs come back."""
        if not isinstance(output_mode, OutputMode):
            raise TypeError(f"Options.outputMode: expected an OutputMode, got {output_mode!r}.")
        period = 1
        if output_mode is OutputMode.EveryN:
            if not isinstance(output_return_period, int) or output_return_period < 1:
                raise ValueError(f"Options.outputMode(EveryN): output_return_period must be an "
                                 f"int > 0, got {output_return_period!r}.")
            period = output_return_period
        elif output_return_period is not None:
            _log.info("outputMode(%s): output_return_period %s ignored (EveryN only).",
                      output_mode.name, output_return_period)
        self._set("outputMode", output_mode)
        return self._set("outputReturnPeriod", period)

    def anchorMode(self, anchor_mode, anchor_return_period=None):  # noqa: N802
        warnings.warn("Options.anchorMode is deprecated; use Options.outputMode.",
                      DeprecationWarning, stacklevel=2)
        return self.outputMode(anchor_mode, anchor_return_period)

    @property
    def output_mode(self) -> OutputMode:
        return self._values["outputMode"]

    @property
    def output_return_period(self) -> int:
        return self._values["outputReturnPeriod"]

    def defaultOutputMode(self) -> bool:  # noqa: N802
        """True while ``outputMode`` was left at ``OutputMode.Default`` (the wrapper then picks
        Final for training, All for inference)."""
        return self.output_mode is OutputMode.Default

    def anchorTensor(self, short_name: str, long_name: str, output_mode=None,  # noqa: N802
                     output_return_period: int = 1):
        """Also return the backend tensor ``long_name`` (an id of ``getTensorNames()``) after
        each run, read with ``wrapper.getAnchoredTensor(short_name)``. ``output_mode``
        None: the model's output mode and period."""
        _check_type("anchorTensor", short_name, str)
        _check_type("anchorTensor", long_name, str)
        if output_mode is not None and not isinstance(output_mode, OutputMode):
            raise TypeError(f"Options.anchorTensor: expected an OutputMode or None, got "
                            f"{output_mode!r}.")
        if output_mode is OutputMode.EveryN and (not isinstance(output_return_period, int)
                                                 or output_return_period < 1):
            raise ValueError(f"Options.anchorTensor(EveryN): output_return_period must be an "
                             f"int > 0, got {output_return_period!r}.")
        anchored = dict(self._values["anchoredTensors"])
        anchored[short_name] = (long_name, output_mode, output_return_period)
        return self._set("anchoredTensors", anchored)

    # --- device, seed, caching -----------------------------------------------------------------

    def randomSeed(self, random_seed: int):  # noqa: N802
        """Seed the device RNG; also seeds host torch."""
        _check_type("randomSeed", random_seed, int)
        torch.manual_seed(random_seed)
        return self._set("randomSeed", random_seed)

    @property
    def random_seed(self) -> int | None:
        return self._values["randomSeed"]

    def enableExecutableCaching(self, path):  # noqa: N802
        if path is not None:
            _check_type("enableExecutableCaching", path, str)
        return self._set("executableCachePath", path)

    def useIpuModel(self, use_model: bool):  # noqa: N802
        return self._set("useIpuModel", _check_type("useIpuModel", use_model, bool))

    def useIpuId(self, ipu_id: int):  # noqa: N802
        _check_type("useIpuId", ipu_id, int)
        return self._set("ipuId", ipu_id)

    def useOfflineIpuTarget(self, ipu_version: int = 2):  # noqa: N802
        _check_type("useOfflineIpuTarget", ipu_version, int)
        self._set("offlineIpuVersion", ipu_version)
        return self._set("connectionType", ConnectionType.Never)

    def connectionType(self, connection_type):  # noqa: N802
        return self._set("connectionType",
                         _check_type("connectionType", connection_type, ConnectionType))

    def syncPattern(self, sync_pattern):  # noqa: N802
        return self._set("syncPattern", _check_type("syncPattern", sync_pattern, SyncPattern))

    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True):  # noqa: N802
        return self._set("autoRoundNumIPUs",
                         _check_type("autoRoundNumIPUs", auto_round_num_ipus, bool))

    @property
    def connection_type(self) -> ConnectionType:
        return self._values["connectionType"]

    @property
    def offline_ipu_version(self) -> int | None:
        """The IPU version of ``useOfflineIpuTarget``; None when it was not called."""
        return self._values["offlineIpuVersion"]

    @property
    def use_ipu_model(self) -> bool:
        return bool(self._values["useIpuModel"])

    @property
    def ipu_id(self) -> int | None:
        return self._values["ipuId"]

    @property
    def sync_pattern(self) -> SyncPattern:
        return self._values["syncPattern"]

    @property
    def auto_round_num_ipus(self) -> bool:
        return self._values["autoRoundNumIPUs"]

    def setExecutionStrategy(self, strategy):  # noqa: N802
        if not isinstance(strategy, ExecutionStrategy):
            raise TypeError(f"Options.setExecutionStrategy: expected an execution strategy "
                            f"(PipelinedExecution, ShardedExecution, ...), got "
                            f"{type(strategy).__name__}.")
        return self._set("executionStrategy", strategy)

    @property
    def execution_strategy(self) -> ExecutionStrategy | None:
        """The strategy ``setExecutionStrategy`` set; None: derived from the blocks."""
        return self._values["executionStrategy"]

    @property
    def available_memory_proportion(self) -> dict:
        """``setAvailableMemoryProportion``'s {"IPUk": proportion}; empty: the default."""
        return dict(self._values["availableMemoryProportion"])

    # --- misc ----------------------------------------------------------------------------------

    def setAvailableMemoryProportion(self, available_memory_proportion: dict):  # noqa: N802
        _check_type("setAvailableMemoryProportion", available_memory_proportion, dict)
        for key, value in available_memory_proportion.items():
            if not str(key).startswith("IPU"):
                raise ValueError(f"Options.setAvailableMemoryProportion: keys look like 'IPU0', "
                                 f"got {key!r}.")
            if not 0.0 < float(value) <= 1.0:
                raise ValueError(f"Options.setAvailableMemoryProportion: {key} = {value} is "
                                 f"outside (0, 1] (0 would leave the matmuls and convolutions "
                                 f"no temporary memory, which PopART refuses). Pass a small "
                                 f"positive value such as 0.01 for the least memory.")
        return self._set("availableMemoryProportion", dict(available_memory_proportion))

    def broadcastBuffers(self, broadcast_buffers: bool = True):  # noqa: N802
        return self._set("broadcastBuffers",
                         _check_type("broadcastBuffers", broadcast_buffers, bool))

    @property
    def broadcast_buffers(self) -> bool:
        return self._values["broadcastBuffers"]

    def logDir(self, log_dir: str):  # noqa: N802
        """Where files go: the backend's ``logDir`` (DOT graphs) and the profile of
        ``enableProfiling()`` without a directory."""
        return self._set("logDir", _check_type("logDir", log_dir, str))

    def maxRepeatLogs(self, number_repeated: int | None):  # noqa: N802
        """Log a message repeated back to back at most this many times, then suppress the
        repeats (None: never suppress); applied to the frontend logger at compile."""
        if number_repeated is not None:
            _check_type("maxRepeatLogs", number_repeated, int)
            if number_repeated < 1:
                raise ValueError(f"Options.maxRepeatLogs: must be >= 1 or None, got "
                                 f"{number_repeated}.")
        return self._set("maxRepeatLogs", number_repeated)

    def modelName(self, name: str):  # noqa: N802
        return self._set("modelName", _check_type("modelName", name, str))

    @property
    def model_name(self) -> str | None:
        return self._values["modelName"]

    def enableProfiling(self, profile_dir: str | None = None):  # noqa: N802
        """Write the simulated IPU's report (profile.json, profile.html, trace.json) into
        ``profile_dir/<model name>`` (default directory: ``logDir``) after compiling and after
        the first run."""
        if profile_dir is not None:
            _check_type("enableProfiling", profile_dir, str)
        return self._set("profilingDir", profile_dir or "")

    @property
    def profiling_dir(self) -> str | None:
        """Where profiling reports go; None when profiling is off."""
        directory = self._values["profilingDir"]
        if directory is None:
            return None
        return directory or self._values["logDir"]

    def logCycleCount(self, log_cycle_count: bool):  # noqa: N802
        return self._set("logCycleCount", _check_type("logCycleCount", log_cycle_count, bool))

    def showCompilationProgressBar(self, show: bool = True):  # noqa: N802
        return self._set("showCompilationProgressBar",
                         _check_type("showCompilationProgressBar", show, bool))

    @property
    def show_compilation_progress_bar(self) -> bool:
        return self._values["showCompilationProgressBar"]

    def enableStableNorm(self, enabled: bool):  # noqa: N802
        return self._set("enableStableNorm", _check_type("enableStableNorm", enabled, bool))

    def enableSyntheticData(self, enabled: bool):  # noqa: N802
        return self._set("enableSyntheticData", _check_type("enableSyntheticData", enabled, bool))

    def disableModuleNamescope(self):  # noqa: N802
        return self._set("moduleNamescope", False)

    def updatableNamedBuffers(self, buffers: list):  # noqa: N802
        _check_type("updatableNamedBuffers", buffers, (list, tuple))
        return self._set("updatableNamedBuffers", list(buffers))

    def relaxOptimizerAttributesChecks(self, relax: bool = True):  # noqa: N802
        return self._set("relaxOptimizerAttributesChecks",
                         _check_type("relaxOptimizerAttributesChecks", relax, bool))

    def sourceLocationExcludes(self, excludes: list):  # noqa: N802
        _check_type("sourceLocationExcludes", excludes, (list, tuple))
        return self._set("sourceLocationExcludes", list(excludes))

    def appendToLocationExcludes(self, *excludes: str):  # noqa: N802
        return self._set("sourceLocationExcludes",
                         self._values["sourceLocationExcludes"] + list(excludes))

    @property
    def source_location_excludes(self) -> tuple[str, ...]:
        """Path fragments of source files that error locations skip."""
        return tuple(self._values["sourceLocationExcludes"])

    def setLogLevel(self, level):  # noqa: N802
        """(lite) ``poptorch_lite.setLogLevel(level)`` as a chainable setter: it sets the
        frontend's console level, which is process-wide, not part of these options."""
        setLogLevel(level)
        return self

    # --- files and JSON ------------------------------------------------------------------------

    def loadFromFile(self, filepath: str):  # noqa: N802
        """Apply one setter per line (``deviceIterations(4)``); ``#`` starts a comment."""
        with open(filepath) as f:
            lines = f.read().splitlines()
        for number, raw in enumerate(lines, start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                _apply_call(self, line)
            except Exception as exc:  # any failure of that line is reported with its position
                raise ConfigFileError(
                    f"{type(exc).__name__} in {filepath}:{number}: {exc}\n    {raw.strip()}"
                ) from exc
        return self

    def from_json(self, string: str):
        """Apply ``{"deviceIterations": 4, "outputMode": "OutputMode.All", ...}``."""
        values = json.loads(string)
        if not isinstance(values, dict):
            raise ValueError("Options.from_json: expected a JSON object of option values.")
        for key, value in values.items():
            if key not in _DEFAULTS:
                raise AttributeError(f"Options.from_json: unknown option {key!r}.")
            self._set(key, _from_plain(value))
        return self

    # --- translation to the backend --------------------------------------------------------------

    def resolved_output_mode(self, training: bool) -> OutputMode:
        mode = self.output_mode
        if mode is OutputMode.Default:
            return OutputMode.Final if training else OutputMode.All
        return mode

    def to_backend(self, training: bool) -> popart.SessionOptions:
        """The SessionOptions this configuration compiles with (unknown _Popart keys raise).

        Also where each setter's status (status.py) applies: NO_EFFECT setters in use are logged
        once, REFUSED ones raise, and ``maxRepeatLogs`` is set on the frontend logger."""
        apply_statuses(self._values)
        setRepeatLimit(self._values["maxRepeatLogs"])
        opts = popart.SessionOptions()
        opts.logDir = self._values["logDir"]
        # The wrapper reads and writes weights by name, so they must stay variables.
        opts.constantWeights = False
        accumulation = self.Training.gradient_accumulation
        if accumulation > 1:
            opts.enableGradientAccumulation = True
            opts.accumulationFactor = accumulation
        if training:
            opts.accumulationAndReplicationReductionType = popart.ReductionType[
                self.Training.reduction_type.name]
            opts.meanAccumulationAndReplicationReductionStrategy = popart.MeanReductionStrategy[
                self._values["Training.meanAccumulationAndReplicationReductionStrategy"].name]
        # logCycleCount: the session counts the cycles of each run, read by cycleCount().
        if self._values["logCycleCount"] and self.use_ipu_model:
            raise Error("Options.logCycleCount(True): the IPU Model (useIpuModel) has no cycle "
                        "counter; use the simulated IPU (useIpuModel(False)).")
        opts.instrumentWithHardwareCycleCounter = self._values["logCycleCount"]
        if self._values["enableSyntheticData"]:
            opts.syntheticDataMode = popart.SyntheticDataMode.RandomNormal
        self._replication_to_backend(opts)
        for group in (self.Training, self.Precision, self.TensorLocations, self._Popart):
            group._to_backend(opts)
        for key, value in self._values["_Popart.options"].items():
            if not hasattr(opts, key):
                raise Error(f"Options._Popart.set({key!r}, ...): popart_backend.SessionOptions "
                            f"has no option {key!r}; check the spelling.")
            setattr(opts, key, value)
        # The execution report is always on: getPerfCounters() and the latencies read the
        # simulated timeline from it, as PopTorch's perf counters are always recorded.
        opts.engineOptions = {**opts.engineOptions, "autoReport.all": "true"}
        return opts

    def backend_patterns(self) -> popart.Patterns | None:
        """The ``popart_backend.Patterns`` the sessions are built with (``_Popart.setPatterns``);
        None: the backend's default set."""
        return self._Popart.backend_patterns

    def _replication_to_backend(self, opts: popart.SessionOptions) -> None:
        """Local replicas, and global replication when several processes run."""
        replicas = self.replication_factor
        if replicas > 1:
            opts.enableReplicatedGraphs = True
            opts.replicatedGraphCount = replicas
        process_id, processes = self.Distributed.process_id_and_count
        if processes > 1:
            opts.enableDistributedReplicatedGraphs = True
            opts.globalReplicationFactor = replicas * processes
            opts.globalReplicaOffset = process_id * replicas



def _setter(method: str, *keep):
    """A ``_Key.put`` calling ``method`` with the value (and the current values of ``keep``)."""
    return lambda o, v: getattr(o, method)(v, *(k(o) for k in keep))


def _unset(key: str):
    return lambda o: o._set(key, None)


def _is_set(key: str):
    return lambda o: o._values[key] is not None


Options._KEYS = {
    "replication_factor": _Key(lambda o: o.replication_factor, _setter("replicationFactor")),
    "input_group_size": _Key(lambda o: o.input_replica_grouping[0],
                             lambda o, v: o.inputReplicaGrouping(v, o.input_replica_grouping[1])),
    "input_cgt": _Key(lambda o: o.input_replica_grouping[1],
                      lambda o, v: o.inputReplicaGrouping(o.input_replica_grouping[0], v)),
    "broadcast_buffers": _Key(lambda o: o._values["broadcastBuffers"],
                              _setter("broadcastBuffers")),
    "device_iterations": _Key(lambda o: o.device_iterations, _setter("deviceIterations")),
    "log_dir": _Key(lambda o: o._values["logDir"], _setter("logDir")),
    "max_repeat_logs": _Key(lambda o: o._values["maxRepeatLogs"], _setter("maxRepeatLogs")),
    "auto_round_num_ipus": _Key(lambda o: o.auto_round_num_ipus, _setter("autoRoundNumIPUs")),
    "anchored_tensors": _Key(lambda o: dict(o._values["anchoredTensors"])),  # anchorTensor()
    "output_mode": _Key(lambda o: o.output_mode,
                        lambda o, v: o.outputMode(v, o.output_return_period
                                                  if v is OutputMode.EveryN else None)),
    "output_return_period": _Key(lambda o: o.output_return_period,
                                 lambda o, v: o.outputMode(o.output_mode, v)),
    "connection_type": _Key(lambda o: o.connection_type, _setter("connectionType")),
    "sync_pattern": _Key(lambda o: o.sync_pattern, _setter("syncPattern")),
    "available_memory_proportion": _Key(lambda o: dict(o._values["availableMemoryProportion"]),
                                        _setter("setAvailableMemoryProportion")),
    "model_name": _Key(lambda o: o.model_name, _setter("modelName"), _is_set("modelName"),
                       _unset("modelName")),
    "use_model": _Key(lambda o: o.use_ipu_model, _setter("useIpuModel"), _is_set("useIpuModel"),
                      _unset("useIpuModel")),
    "ipu_id": _Key(lambda o: o.ipu_id, _setter("useIpuId"), _is_set("ipuId"), _unset("ipuId")),
    "ipu_version": _Key(lambda o: o.offline_ipu_version, _setter("useOfflineIpuTarget"),
                        _is_set("offlineIpuVersion"), _unset("offlineIpuVersion")),
    "random_seed": _Key(lambda o: o.random_seed, _setter("randomSeed"), _is_set("randomSeed"),
                        _unset("randomSeed")),
}
