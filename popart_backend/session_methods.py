"""The sessions' smaller PopART methods: the random seed and RNG state, the profile (summary
report, ``Report``, cycle count), the IR and graph dumps, the host /
device weight synchronisation flags of popxl, engine state, saving variables, external-data
locations and the distributed weight broadcast. ``SessionBase`` mixes them in; they use the
session's ``_ir``, ``_model``, ``_device``, ``_program``, ``_host_weights`` and ``_options``."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import shutil
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from .builder.public_types import IrSerializationFormat
from .device.manager import DeviceInfo
from .dtypes import DataType
from .errors import OutOfMemoryError, OutOfMemoryException, StepIOError, popart_exception
from .dataflow import PyStepIO
from .device.fp_position import RunPosition, track_run
from .ir.dot import DotWriter
from .ir.dump import ir_to_json
from .report import PROFILING_DISABLED, Report, profiling_enabled, summary_text
from .tensorinfo import ReplicatedStreamMode, input_settings_from_model

__all__ = ["IrSource", "SessionMethodsMixin", "check_64bit_inputs", "check_64bit_ranges",
           "ir_source", "mark_broadcast_inputs", "remember_ir_source"]

_log = logging.getLogger("popart:session")
_LOGGED: set[str] = set()


def _log_once(key: str, message: str) -> None:
    if key not in _LOGGED:
        _LOGGED.add(key)
        _log.warning(message)


@dataclass(frozen=True)
class IrSource:
    """What a session built its Ir from: ``InferenceSession.fromIr`` runs such an Ir again
    with the same model, data flow (sequence anchors expanded), options and patterns."""

    model: Any  # importer.onnx_model.LoadedModel
    data_flow: Any  # DataFlow
    user_anchors: list
    options: Any  # SessionOptions
    patterns: Any  # Patterns


# Ir -> its IrSource; weak, so an Ir nobody holds any more is not kept alive.
_IR_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def remember_ir_source(ir, source: IrSource) -> None:
    _IR_SOURCES[ir] = source


def mark_broadcast_inputs(program, model) -> None:
    """Flag the Program's inputs the Builder gave ``InputSettings(ReplicatedStreamMode.
    Broadcast)``: the host feeds one value per micro-batch that every replica reads."""
    broadcast = {tensor_id for tensor_id, s in input_settings_from_model(model).items()
                 if s.replicatedStreamMode() is ReplicatedStreamMode.Broadcast}
    if broadcast:
        program.inputs = [dataclasses.replace(s, broadcast=s.id in broadcast)
                          for s in program.inputs]


# enableSupportedDataTypeCasting: the 64-bit integer types the IPU holds as 32-bit ones.
_CAST_64 = {DataType.INT64: (DataType.INT32, np.iinfo(np.int32)),
            DataType.UINT64: (DataType.UINT32, np.iinfo(np.uint32))}


def check_64bit_inputs(program, options) -> None:
    """``enableSupportedDataTypeCasting = False``: the IPU has no 64-bit integers, so an
    INT64 / UINT64 host input cannot be streamed; raises popart_exception naming them."""
    if options.enableSupportedDataTypeCasting:
        return
    wide = [f"'{s.id}' ({s.info.dtype.name})" for s in program.inputs if s.info.dtype in _CAST_64]
    if wide:
        raise popart_exception(
            f"Inputs {', '.join(wide)} are 64-bit integers, which the IPU does not support, and "
            f"SessionOptions.enableSupportedDataTypeCasting is False. Set it to True (the "
            f"default) to cast them to 32 bits at the stream, or give the inputs as INT32 / "
            f"UINT32.")


def run_checked(session, device, program, stepio, label: str, run_number: int,
                main_graph) -> None:
    """``device.run(stepio)`` after the per-run checks every program of ``session`` shares:
    64-bit input ranges (``enableSupportedDataTypeCasting``), and with
    ``enableFloatingPointChecks`` the run's position, which floating-point errors name."""
    options = session._options
    if options.enableSupportedDataTypeCasting and isinstance(stepio, PyStepIO):
        check_64bit_ranges(program, stepio)
    if not options.enableFloatingPointChecks:
        device.run(stepio)
        return
    with track_run(RunPosition(label, run_number, session._replication_factor,
                               session._accumulation_factor, main_graph)):
        device.run(stepio)


_RANGE = threading.local()


def _int64_range(tensor: torch.Tensor) -> tuple[int, int]:
    """(min, max) of an int64 tensor, into two 0-d tensors kept per thread (a steady run
    allocates nothing for its checks)."""
    buffers = getattr(_RANGE, "buffers", None)
    if buffers is None:
        buffers = _RANGE.buffers = (torch.empty((), dtype=torch.int64),
                                    torch.empty((), dtype=torch.int64))
    torch.aminmax(tensor, out=buffers)
    return int(buffers[0]), int(buffers[1])


def check_64bit_ranges(program, stepio) -> None:
    """``enableSupportedDataTypeCasting``: INT64 / UINT64 host inputs travel as INT32 / UINT32,
    so every value must fit; raises StepIOError naming the input and the first bad value."""
    for stream in program.inputs:
        cast = _CAST_64.get(stream.info.dtype)
        array = stepio.inputs.get(stream.id)
        if isinstance(array, torch.Tensor) and cast is not None:
            if array.dtype is torch.int64 and array.numel() and not array.requires_grad:
                # One min/max pass; the numpy path below finds the first bad value.
                low, high = _int64_range(array)
                if low >= cast[1].min and high <= cast[1].max:
                    continue
            array = array.detach().cpu().numpy()  # a lite PyStepIO input (dataflow.py)
        if cast is None or not isinstance(array, np.ndarray) or array.size == 0 \
                or array.dtype != stream.info.dtype.numpy:
            continue
        narrow, limits = cast
        bad = (array < limits.min) | (array > limits.max)
        if bad.any():
            value = array.reshape(-1)[int(np.argmax(bad.reshape(-1)))]
            raise StepIOError(
                f"Input '{stream.id}' ({stream.info.dtype.name}) holds {value}, outside the "
                f"{narrow.name} range [{limits.min}, {limits.max}] the IPU streams it as "
                f"(SessionOptions.enableSupportedDataTypeCasting). Give values in that range.")


def ir_source(ir) -> IrSource:
    """The IrSource of ``ir``; raises popart_exception if no session built it."""
    source = _IR_SOURCES.get(ir)
    if source is None:
        raise popart_exception(
            f"fromIr: this {type(ir).__name__} was not built by a session, so its data flow, "
            f"options and model are unknown. Pass the Ir of an existing session "
            f"(session.getIr()), or build an InferenceSession from the ONNX model instead."
        )
    return source


class SessionMethodsMixin:
    """See the module docstring."""

    _host_weights_in_sync = True

    def _check_device_info(self, deviceInfo) -> None:  # noqa: N803
        """Raise popart_exception unless ``deviceInfo`` is a DeviceInfo."""
        if deviceInfo is None:
            raise popart_exception(
                f"{type(self).__name__}: deviceInfo is None (no device was acquired). Use "
                f"DeviceManager().createCpuDevice() or acquireAvailableDevice(...)."
            )
        if not isinstance(deviceInfo, DeviceInfo):
            raise popart_exception(
                f"{type(self).__name__}: deviceInfo must be a DeviceInfo from the DeviceManager "
                f"(createCpuDevice(), createIpuModelDevice(...), acquireAvailableDevice(...)), "
                f"not {type(deviceInfo).__name__}."
            )

    def _init_from_ir(self, ir, device_info, name: str) -> None:
        """``fromIr``: the session's state from its source, on a copy of ``ir``."""
        source = ir_source(ir)
        self._lock = threading.RLock()
        self._check_device_info(device_info)
        self.name, self._options, self._patterns = name, source.options, source.patterns
        self._data_flow, self._device_info = copy.copy(source.data_flow), device_info
        self._set_factors(source.options)
        self._model, self._user_anchors = source.model, list(source.user_anchors)
        self._check_io_settings()
        self._dots = DotWriter(source.options)
        self._ir = copy.deepcopy(ir)
        self._value_io = self._ir.value_io
        remember_ir_source(self._ir, source)
        self._finish_init()

    def getRandomSeed(self) -> int:  # noqa: N802 - PopART's names
        """The seed of the last ``setRandomSeed`` (0 when never set)."""
        return self._random_seed

    def setRandomSeed(self, seedValue: int) -> None:  # noqa: N802,N803
        if isinstance(seedValue, bool) or not isinstance(seedValue, (int, np.integer)):
            raise popart_exception(
                f"setRandomSeed: the seed must be an int, got {type(seedValue).__name__} "
                f"{seedValue!r}."
            )
        self._random_seed = int(seedValue)
        self._reseed_devices()  # the session's device and the forward-only program's

    def getRNGState(self) -> list[int]:  # noqa: N802
        """The device's RNG state: [seed, micro-batch counter] per local replica, concatenated
        (device/simulator.py ``rng_state``). Needs ``enableLoadAndOffloadRNGState``."""
        self._check_rng_option("getRNGState()")
        return self._ready_device("getRNGState()").rng_state()

    def setRNGState(self, rngValue) -> None:  # noqa: N802,N803 - PopART's names
        """Restore a state of ``getRNGState()``: the following runs draw exactly what they
        drew after it was taken. Needs ``enableLoadAndOffloadRNGState``."""
        self._check_rng_option("setRNGState()")
        try:
            state = [int(v) for v in rngValue]
        except (TypeError, ValueError) as exc:
            raise popart_exception(
                f"setRNGState: the state must be a list of ints as getRNGState() returns, got "
                f"{rngValue!r} ({exc})."
            ) from exc
        self._ready_device("setRNGState()").set_rng_state(state)

    def _check_rng_option(self, what: str) -> None:
        if not self._options.enableLoadAndOffloadRNGState:
            raise popart_exception(
                f"{what}: the RNG state can only be read or written when "
                f"SessionOptions.enableLoadAndOffloadRNGState is True; set it before creating "
                f"the session."
            )

    def getSummaryReport(self, resetProfile: bool = True) -> str:  # noqa: N802,N803
        """Text summary: memory and cycles of the simulated IPU when profiling is on
        (``engineOptions["autoReport.all"] = "true"``) and the device is prepared."""
        graph = self._ir.main
        header = [
            f"{type(self).__name__} '{self.name}'",
            f"  ops: {len(graph.ops)}, tensors: {len(graph.tensors)}, weights: "
            f"{len(self._program.weights)}",
            f"  batches per step: {self._data_flow.batchesPerStep()}, replication factor: "
            f"{self._replication_factor}, accumulation factor: {self._accumulation_factor}",
        ]
        if not profiling_enabled(self._options) or self._device_model is None:
            return "\n".join(header + [PROFILING_DISABLED])
        text = "\n".join(header + [summary_text(self._device_model, self._profiled_runs)])
        if resetProfile:
            self._profiled_runs = 0
        return text

    def getReport(self) -> Report:  # noqa: N802
        """The profile of the simulated IPU as a Report object."""
        if not profiling_enabled(self._options):
            raise popart_exception(
                "getReport: execution profiling is not enabled; set "
                "SessionOptions.engineOptions = {'autoReport.all': 'true'}."
            )
        if self._device_model is None:
            raise popart_exception("getReport: call prepareDevice() first.")
        return Report(self._device_model, self._profiled_runs)

    def getCycleCount(self, id: str = "") -> int:  # noqa: N802,A002
        """Simulated cycles of the last run; needs instrumentWithHardwareCycleCounter."""
        if not self._options.instrumentWithHardwareCycleCounter:
            raise popart_exception(
                "getCycleCount: the session was not built with cycle instrumentation; set "
                "SessionOptions.instrumentWithHardwareCycleCounter = True."
            )
        self._ready_device("getCycleCount()")
        if not (self._runs or self._fwd_only_ran_last):
            raise popart_exception(
                "getCycleCount: no run() yet; the counter holds the cycles of the last run."
            )
        return self._cycle_model().cycle_count(id)

    def _prepare_with_status(self, load_engine: bool, err) -> None:
        """``prepareDevice(loadEngine, err)``: an overflow fills ``err`` instead of raising."""
        if not isinstance(err, OutOfMemoryError):
            raise popart_exception(
                f"prepareDevice(err=...): err must be a popart.OutOfMemoryError, got "
                f"{type(err).__name__}."
            )
        err._set_status("", "", "")
        try:
            self.prepareDevice(load_engine)
        except OutOfMemoryException as exc:
            err._set_status(str(exc), exc.getSummaryReport(), exc.getProfilePath())

    # --- dumps --------------------------------------------------------------------------------
    def _serializeIr(self, format=IrSerializationFormat.JSON) -> str:  # noqa: N802,A002
        """The IR as PopART's JSON dump (``ir/dump.py``)."""
        if format is not IrSerializationFormat.JSON:
            raise popart_exception(
                f"_serializeIr: format {format!r} is not an IrSerializationFormat; use "
                f"IrSerializationFormat.JSON."
            )
        return json.dumps(ir_to_json(self._ir, self._model.proto.graph.name))

    def getSerializedGraph(self) -> bytes:  # noqa: N802
        """The compiled graph, serialised: the simulator runs the IR, so it is the IR's JSON
        dump as bytes. Needs ``prepareDevice()``."""
        if self._device is None:
            raise popart_exception(
                "getSerializedGraph() needs a compiled graph; call session.prepareDevice() first."
            )
        return self._serializeIr(IrSerializationFormat.JSON).encode()

    def checkInplacingAmbiguity(self) -> None:  # noqa: N802
        """PopART checks that in-place ops' results do not depend on the schedule. The
        simulator runs one fixed total order of ops, so no ambiguity exists to find."""
        _log_once("checkInplacingAmbiguity",
                  "checkInplacingAmbiguity() has nothing to check: the simulator runs the ops "
                  "in one fixed order, so in-place results never depend on the schedule.")

    # --- host / device weights (popxl's helpers) ----------------------------------------------
    def copyDeviceWeightsToHost(self) -> None:  # noqa: N802
        """Device weights -> host copies (``weightsToHost``), then mark them in sync."""
        self.weightsToHost()
        self._host_weights_in_sync = True

    def markHostWeightsOutOfSync(self) -> None:  # noqa: N802
        self._host_weights_in_sync = False

    def markHostWeightsInSync(self) -> None:  # noqa: N802
        self._host_weights_in_sync = True

    def areHostWeightsInSync(self) -> bool:  # noqa: N802
        """False after a training run until ``weightsToHost`` / ``copyDeviceWeightsToHost``;
        the ``mark*`` methods set it directly."""
        return self._host_weights_in_sync

    def setEngineIsLoaded(self, isLoaded: bool) -> None:  # noqa: N802,N803
        """Tell the session whether its engine is on the device (several sessions sharing
        one device): with False, ``run()`` and the weight copies ask to load it again."""
        if isLoaded and self._device is None:
            raise popart_exception(
                "setEngineIsLoaded(True): no engine was compiled; call prepareDevice() first."
            )
        self._engine_loaded = bool(isLoaded)

    def saveVariables(self, path) -> None:  # noqa: N802
        """Write the device's variables (weights) to ``path`` as a numpy ``.npz`` archive."""
        device = self._ready_device("saveVariables()")
        values = device.read_weights(self._program.weights)
        with open(path, "wb") as f:
            np.savez(f, **values)

    def updateExternallySavedTensorLocations(self, fromLocation: str,  # noqa: N802,N803
                                             toLocation: str) -> None:  # noqa: N803
        """Copy the external-data file ``fromLocation`` to ``toLocation`` and point the
        model's initializers stored there at the new file (``modelToHost`` writes there)."""
        base = self._model.base_dir
        source, target = base / fromLocation, Path(toLocation)
        target = target if target.is_absolute() else base / target
        moved = [init for init in self._model.proto.graph.initializer
                 if init.data_location == onnx.TensorProto.EXTERNAL
                 and any(e.key == "location" and (base / e.value).resolve() == source.resolve()
                         for e in init.external_data)]
        if not moved:
            raise popart_exception(
                f"updateExternallySavedTensorLocations: no initializer of the model is saved in "
                f"'{fromLocation}' (looked in '{base}')."
            )
        shutil.copyfile(source, target)
        for init in moved:
            for entry in init.external_data:
                if entry.key == "location":
                    entry.value = str(Path(toLocation)) if Path(toLocation).is_absolute() else (
                        toLocation)

    def broadcastWeights(self, rootRank: int = 0) -> None:  # noqa: N802,N803
        """Give every instance the weights of instance ``rootRank`` (distributed replication):
        each weight is gathered over all replicas and the root's first replica's value is
        written to this instance's device."""
        device = self._ready_device("broadcastWeights()")
        comm = device.comm
        instances = comm.total // comm.local
        if not 0 <= rootRank < instances:
            raise popart_exception(
                f"broadcastWeights(rootRank={rootRank}): there are {instances} instances "
                f"(ranks 0..{instances - 1})."
            )
        if instances == 1:
            _log_once("broadcastWeights", "broadcastWeights(): one instance only; its weights "
                      "are already everyone's.")
            return
        values = {}
        for tensor_id, value in device.read_weights(self._program.weights).items():
            local = [torch.from_numpy(np.ascontiguousarray(value))] * comm.local
            values[tensor_id] = comm.gather(local, "broadcastWeights")[
                rootRank * comm.local].numpy()
        device.write_weights(values)

    def connectStreamToCallback(self, streamHandle: str, callback, index: int = 0) -> None:  # noqa: N802,N803
        """PopART binds a host callback to a raw Poplar stream. The simulated device has no
        Poplar streams to bind: feed inputs and take anchors with ``PyStepIOCallback``."""
        raise popart_exception(
            f"connectStreamToCallback('{streamHandle}'): the simulated device has no Poplar "
            f"streams to bind callbacks to. Use PyStepIOCallback(input_fn, input_complete_fn, "
            f"output_fn, output_complete_fn) to serve inputs and anchors from callbacks."
        )
