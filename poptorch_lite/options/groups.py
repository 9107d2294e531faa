"""The option groups of ``poptorch_lite.Options`` (``Training``, ``Precision``,
``TensorLocations``, ``Distributed``, ``Jit`` and ``_Popart``) and the argument checks every
setter shares.

A group keeps no state of its own: its setters write ``root._values`` under the group's
prefix (``"Training.gradientAccumulation"``), so freezing, cloning and ``toDict`` of the root
cover the groups too. The root is any ``_OptionStore`` (``Options`` is the only one), so this
module does not import ``options.py``, which imports it.

Read side (snake_case, for the rest of the frontend): ``Training.gradient_accumulation``,
``Training.reduction_type``, ``Distributed.process_id_and_count`` and ``Jit.exporter_name``.
The groups whose values become backend options write them in ``_to_backend(opts)`` (called by
``Options.to_backend``); status.py says, per setter, which field.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Protocol

import torch

import popart_backend as popart

from .enums import MeanReductionStrategy, ReductionType
from .optionsdict import OptionsDictMixin, _Key

__all__ = ["TensorLocationSettings"]

# Process id / count variables read when Distributed is not configured explicitly: the ones
# setEnvVarNames names, else Open MPI's (PopTorch's default), else torchrun's (lite).
_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")
_TORCHRUN_ENV = ("WORLD_SIZE", "RANK")


def _check_type(option: str, value, types, what: str = ""):
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        names = what or (" or ".join(t.__name__ for t in types) if isinstance(types, tuple)
                         else types.__name__)
        raise TypeError(f"Options.{option}: expected {names}, got {type(value).__name__} "
                        f"({value!r}).")
    return value


def _positive(option: str, value) -> int:
    _check_type(option, value, int)
    if value < 1:
        raise ValueError(f"Options.{option}: must be >= 1, got {value}.")
    return value


class _OptionStore(Protocol):
    """What a group needs of its root ``Options``: the value dict and the frozen check."""

    _values: dict

    def _check_not_frozen(self, key: str) -> None: ...


class _Group:
    """A set of options stored in ``root._values`` under ``prefix``; frozen with the root."""

    _prefix = ""

    def __init__(self, root: _OptionStore):
        object.__setattr__(self, "_root", root)

    def _set(self, key: str, value):
        self._root._check_not_frozen(self._prefix + key)
        self._root._values[self._prefix + key] = value
        return self

    def _get(self, key: str):
        return self._root._values[self._prefix + key]

    def __setattr__(self, name, value):
        raise AttributeError(
            f"Options{'.' + self._prefix.rstrip('.') if self._prefix else ''}: use the setter "
            f"methods (e.g. {name}(...)) instead of assigning '{name}'.")


class _DictGroup(OptionsDictMixin, _Group):
    """A group with PopTorch's OptionsDict methods (``set``, ``exists``, ``opts.Training(...)``
    ...) over its ``_KEYS``; its values stay in the root's dict."""

    def _dict_root(self):
        return self._root

    def _dict_prefix(self) -> str:
        return self._prefix


class _Training(_DictGroup):
    _prefix = "Training."

    def gradientAccumulation(self, gradient_accumulation: int):  # noqa: N802 - PopTorch's name
        return self._set("gradientAccumulation",
                         _positive("Training.gradientAccumulation", gradient_accumulation))

    @property
    def gradient_accumulation(self) -> int:
        return self._get("gradientAccumulation")

    def accumulationAndReplicationReductionType(self, reduction_type):  # noqa: N802
        if not isinstance(reduction_type, ReductionType) or (
                reduction_type is ReductionType.NoReduction):
            raise ValueError(
                "Options.Training.accumulationAndReplicationReductionType: expected "
                f"ReductionType.Mean or ReductionType.Sum, got {reduction_type!r}.")
        return self._set("accumulationAndReplicationReductionType", reduction_type)

    @property
    def reduction_type(self) -> ReductionType:
        """How micro-batch (and replica) gradients combine: ``Mean`` or ``Sum``."""
        return self._get("accumulationAndReplicationReductionType")

    def setMeanAccumulationAndReplicationReductionStrategy(self, strategy):  # noqa: N802
        if not isinstance(strategy, MeanReductionStrategy):
            raise ValueError(
                "Options.Training.setMeanAccumulationAndReplicationReductionStrategy: expected a "
                f"MeanReductionStrategy, got {strategy!r}.")
        if strategy is MeanReductionStrategy.PostAndLoss:
            warnings.warn("MeanReductionStrategy.PostAndLoss is deprecated; use Post.",
                          DeprecationWarning, stacklevel=2)
        return self._set("meanAccumulationAndReplicationReductionStrategy", strategy)

    def setAutomaticLossScaling(self, enabled: bool):  # noqa: N802
        return self._set("automaticLossScaling",
                         _check_type("Training.setAutomaticLossScaling", enabled, bool))

    def setConvolutionDithering(self, enabled: bool):  # noqa: N802
        return self._set("convolutionDithering",
                         _check_type("Training.setConvolutionDithering", enabled, bool))

    def _to_backend(self, opts: popart.SessionOptions) -> None:
        """Loss scaling and dithering; the backend builds, logs or refuses them (checks.py)."""
        if self._get("automaticLossScaling"):
            opts.automaticLossScalingSettings = popart.AutomaticLossScalingSettings(enabled=True)
        if self._get("convolutionDithering"):
            opts.convolutionOptions = {**opts.convolutionOptions, "enableConvDithering": "true"}


class _Precision(_DictGroup):
    _prefix = "Precision."

    def setPartialsType(self, dtype):  # noqa: N802
        if dtype not in (torch.float, torch.half):
            raise ValueError(f"Options.Precision.setPartialsType: expected torch.float or "
                             f"torch.half, got {dtype!r}.")
        return self._set("partialsType", "float" if dtype is torch.float else "half")

    def enableFloatingPointExceptions(self, enabled: bool):  # noqa: N802
        return self._set("floatingPointExceptions",
                         _check_type("Precision.enableFloatingPointExceptions", enabled, bool))

    def enableStochasticRounding(self, enabled: bool):  # noqa: N802
        return self._set("stochasticRounding",
                         _check_type("Precision.enableStochasticRounding", enabled, bool))

    def halfFloatCasting(self, *_args):  # noqa: N802
        warnings.warn("Options.Precision.halfFloatCasting is deprecated and has no effect.",
                      DeprecationWarning, stacklevel=2)
        return self

    def runningStatisticsAlwaysFloat(self, *_args):  # noqa: N802
        warnings.warn("Options.Precision.runningStatisticsAlwaysFloat is deprecated and has no "
                      "effect.", DeprecationWarning, stacklevel=2)
        return self

    def _to_backend(self, opts: popart.SessionOptions) -> None:
        if self._get("partialsType") == "half":
            # PopTorch's partials type covers the matmuls and the convolutions.
            opts.partialsTypeMatMuls = "half"
            opts.convolutionOptions = {**opts.convolutionOptions, "partialsType": "half"}
        if self._get("floatingPointExceptions"):
            opts.enableFloatingPointChecks = True
        if self._get("stochasticRounding"):
            opts.enableStochasticRounding = True


class TensorLocationSettings:
    """Where a class of tensors lives (memory model only)."""

    def __init__(self):
        self.values: dict = {}

    def _flag(self, key, value, types=bool):
        self.values[key] = _check_type(f"TensorLocationSettings.{key}", value, types)
        return self

    def useOnChipStorage(self, use: bool = True):  # noqa: N802
        return self._flag("onChip", use)

    def useReplicatedTensorSharding(self, use: bool = True):  # noqa: N802
        return self._flag("useReplicatedTensorSharding", use)

    def minElementsForOffChip(self, min_elements: int):  # noqa: N802
        return self._flag("minElementsForOffChip", min_elements, int)

    def minElementsForReplicatedTensorSharding(self, min_elements: int):  # noqa: N802
        return self._flag("minElementsForReplicatedTensorSharding", min_elements, int)

    def useIOTilesToLoad(self, use: bool = True):  # noqa: N802
        return self._flag("useIOTilesToLoad", use)

    def useIOTilesToStore(self, use: bool = True):  # noqa: N802
        return self._flag("useIOTilesToStore", use)


class _TensorLocations(_DictGroup):
    _prefix = "TensorLocations."

    def numIOTiles(self, num_tiles: int):  # noqa: N802
        _check_type("TensorLocations.numIOTiles", num_tiles, int)
        if num_tiles % 2 or not 32 <= num_tiles <= 192:
            raise ValueError(f"Options.TensorLocations.numIOTiles: must be even and in "
                             f"[32, 192], got {num_tiles}.")
        return self._set("numIOTiles", num_tiles)

    def _location(self, key, settings):
        _check_type(f"TensorLocations.{key}", settings, TensorLocationSettings)
        return self._set(key, dict(settings.values))

    def setActivationLocation(self, settings):  # noqa: N802
        return self._location("activationLocation", settings)

    def setWeightLocation(self, settings):  # noqa: N802
        return self._location("weightLocation", settings)

    def setOptimizerLocation(self, settings):  # noqa: N802
        return self._location("optimizerLocation", settings)

    def setAccumulatorLocation(self, settings):  # noqa: N802
        return self._location("accumulatorLocation", settings)

    def _to_backend(self, opts: popart.SessionOptions) -> None:
        if self._get("numIOTiles"):
            opts.numIOTiles = self._get("numIOTiles")
        for key, field in _LOCATION_FIELDS.items():
            values = self._get(key)
            if values is not None:
                setattr(opts, field, _backend_location(values, getattr(opts, field)))


# TensorLocations key -> the SessionOptions field it sets.
_LOCATION_FIELDS = {"activationLocation": "activationTensorLocationSettings",
                    "weightLocation": "weightTensorLocationSettings",
                    "optimizerLocation": "optimizerStateTensorLocationSettings",
                    "accumulatorLocation": "accumulatorTensorLocationSettings"}


def _backend_location(values: dict, default: popart.TensorLocationSettings
                      ) -> popart.TensorLocationSettings:
    """A ``TensorLocationSettings``' values over the backend's defaults for that tensor type."""
    loc = default.location
    on_chip = values.get("onChip", loc.storage is popart.TensorStorage.OnChip)
    rts = values.get("useReplicatedTensorSharding",
                     loc.replicatedTensorSharding is popart.ReplicatedTensorSharding.On)
    io, compute = popart.TileSet.IO, popart.TileSet.Compute
    location = popart.TensorLocation(
        popart.TensorStorage.OnChip if on_chip else popart.TensorStorage.OffChip,
        io if values.get("useIOTilesToLoad", loc.loadTileSet is io) else compute,
        io if values.get("useIOTilesToStore", loc.storageTileSet is io) else compute,
        popart.ReplicatedTensorSharding.On if rts else popart.ReplicatedTensorSharding.Off)
    return popart.TensorLocationSettings(
        location,
        values.get("minElementsForOffChip", default.minElementsForOffChip),
        values.get("minElementsForReplicatedTensorSharding",
                   default.minElementsForReplicatedTensorSharding))


class _Distributed(_DictGroup):
    """Processes of a globally replicated job (P34): each holds ``replicationFactor`` local
    replicas; the job has ``replicationFactor × numProcesses``. Unless configured, the process
    id and count come from the environment: the variables ``setEnvVarNames`` names, else Open
    MPI's ``OMPI_COMM_WORLD_RANK/SIZE``, else torchrun's ``RANK/WORLD_SIZE``; else 1 process."""

    _prefix = "Distributed."

    def configureProcessId(self, process_id: int, num_processes: int):  # noqa: N802
        _check_type("Distributed.configureProcessId", process_id, int)
        _positive("Distributed.configureProcessId", num_processes)
        if not 0 <= process_id < num_processes:
            raise ValueError(f"Options.Distributed.configureProcessId: process id {process_id} "
                             f"is outside [0, {num_processes}).")
        self._set("processId", process_id)
        return self._set("numProcesses", num_processes)

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str):  # noqa: N802
        _check_type("Distributed.setEnvVarNames", var_num_processes, str)
        _check_type("Distributed.setEnvVarNames", var_process_id, str)
        self._set("envNumProcesses", var_num_processes)
        return self._set("envProcessId", var_process_id)

    def disable(self):
        """One process, whatever the environment says."""
        self._set("processId", 0)
        return self._set("numProcesses", 1)

    def _from_env(self) -> tuple[int, int] | None:
        values = self._root._values
        names = [(values.get("Distributed.envNumProcesses"),
                  values.get("Distributed.envProcessId"))]
        if names[0][0] is None:
            names = [_MPI_ENV, _TORCHRUN_ENV]
        for size_var, rank_var in names:
            size, rank = os.environ.get(size_var), os.environ.get(rank_var)
            if size is None and rank is None:
                continue
            try:
                size_i, rank_i = int(size if size is not None else 1), int(rank or 0)
            except ValueError:
                raise ValueError(f"Options.Distributed: {size_var}={size!r} / {rank_var}="
                                 f"{rank!r} are not integers.") from None
            if size_i < 1 or not 0 <= rank_i < size_i:
                raise ValueError(f"Options.Distributed: {rank_var}={rank_i} is outside [0, "
                                 f"{size_var}={size_i}).")
            return rank_i, size_i
        return None

    @property
    def process_id_and_count(self) -> tuple[int, int]:
        """(this process's id, number of processes): as configured, else from the environment,
        else (0, 1)."""
        pid, count = self._get("processId"), self._get("numProcesses")
        if pid is not None:
            return pid, count
        return self._from_env() or (0, 1)

    @property
    def processId(self) -> int:  # noqa: N802
        return self.process_id_and_count[0]

    @property
    def numProcesses(self) -> int:  # noqa: N802
        return self.process_id_and_count[1]

    @property
    def localProcessId(self) -> int:  # noqa: N802
        """(lite) This process's index on its host: torchrun's LOCAL_RANK (or Open MPI's)."""
        for name in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"):
            if os.environ.get(name, "").isdigit():
                return int(os.environ[name])
        return self.processId


class _Jit(_DictGroup):
    _prefix = "Jit."

    def traceModel(self, trace_model: bool):  # noqa: N802
        if trace_model:
            raise ValueError("Options.Jit.traceModel(True): the TorchScript tracing frontend is "
                             "gone; poptorch_lite captures models with torch.export. Use "
                             "Options.Jit.exporter('torchscript') for the legacy ONNX exporter.")
        warnings.warn("Options.Jit.traceModel is deprecated and has no effect.",
                      DeprecationWarning, stacklevel=2)
        return self

    def exporter(self, name: str):
        """(lite) ``"dynamo"`` (default: torch.export) or ``"torchscript"`` (legacy, opt-in)."""
        if name not in ("dynamo", "torchscript"):
            raise ValueError(f"Options.Jit.exporter: expected 'dynamo' or 'torchscript', got "
                             f"{name!r}.")
        return self._set("exporter", name)

    @property
    def exporter_name(self) -> str:
        """The exporter ``exporter()`` chose: ``"dynamo"`` or ``"torchscript"``."""
        return self._get("exporter")


class _Popart(_Group):
    """PopTorch's ``_PopartOptions``: not an OptionsDict; ``set`` writes ``options``."""

    _prefix = "_Popart."

    def checkIsFrozen(self, option: str | None = None) -> None:  # noqa: N802
        self._root._check_not_frozen(self._prefix + (option or "options"))

    @property
    def options(self) -> dict:
        """The SessionOptions values given with ``set`` (a copy)."""
        return dict(self._get("options"))

    def set(self, key: str, value):
        _check_type("_Popart.set", key, str)
        options = dict(self._get("options"))
        options[key] = value
        return self._set("options", options)

    def setPatterns(self, patterns: dict, level: int = 2):  # noqa: N802
        """Patterns of the sessions: ``PatternsLevel(level)`` (0 none, 1 minimal, 2 default,
        3 all), then each ``name: bool`` of ``patterns`` (unknown names raise)."""
        _check_type("_Popart.setPatterns", patterns, dict)
        _check_type("_Popart.setPatterns", level, int)
        self._patterns_for(dict(patterns), level)  # checks names and level now
        self._set("patternsLevel", level)
        return self._set("patterns", dict(patterns))

    @staticmethod
    def _patterns_for(patterns: dict, level: int) -> popart.Patterns:
        if level not in range(4):
            raise ValueError(f"Options._Popart.setPatterns: level must be 0 (none), 1 (minimal), "
                             f"2 (default) or 3 (all), got {level}.")
        result = popart.Patterns(popart.PatternsLevel(level))
        for name, enabled in patterns.items():
            result.enablePattern(name, _check_type(f"_Popart.setPatterns[{name!r}]", enabled,
                                                   bool))
        return result

    @property
    def backend_patterns(self) -> popart.Patterns | None:
        """The ``popart_backend.Patterns`` of ``setPatterns``; None: the backend's default."""
        patterns = self._get("patterns")
        if patterns is None:
            return None
        return self._patterns_for(patterns, self._get("patternsLevel"))

    def setEngineOptions(self, engine_options: dict):  # noqa: N802
        """Engine options merged into ``SessionOptions.engineOptions`` (``autoReport.*`` write
        the profile; others are logged once as having no effect)."""
        _check_type("_Popart.setEngineOptions", engine_options, dict)
        return self._set("engineOptions", {str(k): str(v).lower() if isinstance(v, bool)
                                           else str(v) for k, v in engine_options.items()})

    def _to_backend(self, opts: popart.SessionOptions) -> None:
        engine = self._get("engineOptions")
        if engine:
            opts.engineOptions = {**opts.engineOptions, **engine}



_NO_EFFECT_LOGGED: set[str] = set()


def _put_ipuof(group, value):
    """``Distributed.set(ipuof_configs=...)``: stored and read back; IPU-over-fabric configs
    only address real IPU servers, which is logged once."""
    _check_type("Distributed.ipuof_configs", value, dict)
    if value and "ipuof_configs" not in _NO_EFFECT_LOGGED:
        _NO_EFFECT_LOGGED.add("ipuof_configs")
        logging.getLogger("poptorch_lite").warning(
            "Options.Distributed.ipuof_configs: IPU-over-fabric configurations select real IPU "
            "servers; they have no effect on the simulated IPUs.")
    return group._set("ipuofConfigs", dict(value))


_Training._KEYS = {
    "gradient_accumulation": _Key(lambda t: t.gradient_accumulation,
                                  lambda t, v: t.gradientAccumulation(v)),
    "accumulation_and_replication_reduction_type": _Key(
        lambda t: t.reduction_type, lambda t, v: t.accumulationAndReplicationReductionType(v)),
    "meanAccumulationAndReplicationReductionStrategy": _Key(
        lambda t: t._get("meanAccumulationAndReplicationReductionStrategy"),
        lambda t, v: t.setMeanAccumulationAndReplicationReductionStrategy(v)),
}

_Distributed._KEYS = {
    "num_distributed_processes": _Key(lambda d: d.numProcesses,
                                      lambda d, v: d.configureProcessId(d.processId, v)),
    "distributed_process_id": _Key(lambda d: d.processId,
                                   lambda d, v: d.configureProcessId(v, d.numProcesses)),
    "ipuof_configs": _Key(lambda d: dict(d._get("ipuofConfigs")), _put_ipuof),
}
