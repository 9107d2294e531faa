"""Sessions: import a model, compile it for the simulated device, run it with step IO.

``InferenceSession`` runs the forward graph; ``TrainingSession`` adds the backward pass, gradient
accumulation and the optimizer (docs/training.md) and updates the weights on the device.
Construction imports the model, checks options and anchors and runs the session's passes;
``prepareDevice()`` compiles the lowered Program (execution plan, anchor write tables);
``run(stepio)`` executes one step of ``batchesPerStep`` batches (training: weight updates).
Variables keep a host copy (``writeWeights`` / ``readWeights``) and a device copy
(``weightsFromHost`` / ``weightsToHost``), as in PopART.
"""

from __future__ import annotations

import copy
import difflib
import functools
import logging
import threading

import numpy as np

from . import progress
from .dataflow import DataFlow, PyStepIO, anchor_shape
from .device.analysis import DeviceModel, analyse
from .device.distributed import check_global_replication, replica_comm
from .device.lower import Program, lower
from .device.manager import DeviceConnectionType
from .device.run_tables import execution_order
from .device.simulator import SimulatedDevice
from .device.transfers import BatchInfo
from .errors import popart_exception, popart_runtime_error
from .executable.session_mixin import ExecutableMixin
from .importer.onnx_model import LoadedModel, import_model, load_model
from .ir.dot import DotWriter
from .ir.dump import dump_on_error, maybe_dump_ir
from .ir.ir import Ir
from .limits import check_step
from .optim.base import Optimizer
from .options.checks import check_buildable, check_io_options, check_stitch_strategy
from .options.enums import DotCheck, SyntheticDataMode
from .options.patterns import Patterns, log_pattern_effects
from .options.session_options import SessionOptions
from .report import report_directory, summary_text, write_auto_report
from .session_fwd_only import ForwardOnlyMixin, build_forward_only
from .session_methods import (IrSource, SessionMethodsMixin, check_64bit_inputs,
                              mark_broadcast_inputs, remember_ir_source, run_checked)
from .session_weights import HostWeights, WeightsMixin
from .tensorinfo import InputShapeInfo, TensorInfo, input_settings_from_model
from .transforms.pipeline import inference_passes, run_passes, training_passes

__all__ = ["InferenceSession", "TrainingSession"]

_log = logging.getLogger("popart:session")
_TRACE = 5  # PopART's TRACE level (popart_backend.logging.TRACE)
_LOGGED: set[str] = set()

_SYNTHETIC = {
    SyntheticDataMode.Off: "off",
    SyntheticDataMode.Zeros: "zeros",
    SyntheticDataMode.RandomNormal: "random_normal",
    SyntheticDataMode.RandomUniform: "random_uniform",
}


class SessionBase(WeightsMixin, SessionMethodsMixin, ExecutableMixin, ForwardOnlyMixin):
    """What inference and training sessions share: import, anchors, device, weights, run.

    A subclass sets ``_training`` and overrides the hooks ``_constant_weights()``,
    ``_passes()`` and ``_check_mode_options()``. Anchors are checked on the imported graph, or,
    for training (whose anchors may name gradients and other tensors the passes create), after
    the passes.

    Thread safety: a session may be shared by threads. Each session has one (re-entrant) lock,
    held by every method that reads or changes the device or the host weights (``run``,
    ``prepareDevice``, ``weightsFromHost``/``weightsToHost``, ``readWeights``/``writeWeights``,
    ``modelToHost``, ``updateOptimizerFromHost``, ``setRandomSeed``, ``setRNGState`` ... see
    ``_LOCKED_METHODS``): a call made while another thread is inside one of them waits for it
    to finish, so concurrent runs execute one after the other, as sequential calls would.
    """

    _training = False

    def __init__(self, fnModel, dataFlow, deviceInfo, inputShapeInfo, patterns,  # noqa: N803
                 userOptions, name: str):
        self._lock = threading.RLock()
        if not isinstance(dataFlow, DataFlow):
            raise popart_exception(
                f"{type(self).__name__}: dataFlow must be a DataFlow, not "
                f"{type(dataFlow).__name__}."
            )
        dataFlow = copy.copy(dataFlow)  # noqa: N806 - PopART sessions copy it (setBatchesPerStep)
        self._check_device_info(deviceInfo)
        if not isinstance(inputShapeInfo, InputShapeInfo):
            raise popart_exception(
                f"{type(self).__name__}: inputShapeInfo must be an InputShapeInfo, not "
                f"{type(inputShapeInfo).__name__}."
            )
        # patterns=None means the set registered now, built at call time.
        patterns = Patterns() if patterns is None else patterns
        if not isinstance(patterns, Patterns):
            raise popart_exception(
                f"{type(self).__name__}: patterns must be a Patterns or None, not "
                f"{type(patterns).__name__}."
            )
        patterns.check_mandatory(type(self).__name__)
        log_pattern_effects(patterns, _LOGGED)
        check_buildable(userOptions, self._training)
        self._check_mode_options(userOptions)
        self.name = name
        self._options = userOptions
        self._patterns = patterns
        self._data_flow = dataFlow
        self._device_info = deviceInfo
        self._set_factors(userOptions)

        self._model: LoadedModel = load_model(fnModel)
        self._check_io_settings()
        self._dots = DotWriter(userOptions)  # also rejects a bad POPART_DOT_CHECKS
        graph_name = self._model.proto.graph.name
        self._ir = None
        with dump_on_error(lambda: self._ir, graph_name):
            self._ir = import_model(
                self._model,
                input_shape_info=inputShapeInfo.to_ir(),
                constant_weights=self._constant_weights(),
                strict_op_versions=userOptions.strictOpVersions,
                fold_multiple_consumers=userOptions.enableConstantFoldingOfMultipleConsumers,
                replicas=self._global_replication_factor,
            )
            self._ir.patterns = patterns  # read by the passes (transforms/apply_patterns.py)
            self._dots.write(self._ir, DotCheck.Fwd0)
            # Sequence / optional graph IO: anchors name elements (importer/value_io.ValueIO).
            self._value_io = self._ir.value_io
            self._user_anchors = dataFlow.anchors()
            if self._value_io:
                dataFlow = self._value_io.expand_data_flow(dataFlow)
                self._data_flow = dataFlow
            if not self._training:
                self._check_anchors_exist()
            self._ir.anchors = dataFlow.anchors()
            passes = self._passes()
            with progress.track(f"{name}: IR passes", len(passes), "pass") as steps:
                self._dots.run_passes(self._ir, passes, progress.counting(run_passes, steps))
            if self._training:
                self._check_anchors_exist()
        remember_ir_source(self._ir, IrSource(self._model, dataFlow, self._user_anchors,
                                              userOptions, patterns))
        self._fwd_only = build_forward_only(self, inputShapeInfo)
        self._finish_init()

    def _finish_init(self) -> None:
        """Lower the IR after its passes, check the device, take the host weights."""
        name = self.name
        if self._ir.restored_state:
            # Training state stored in the model that this session has no use for.
            _log.log(logging.WARNING if self._training else logging.INFO,
                     "%s '%s': the model stores training state %s that this session does not "
                     "create (another optimizer, or no training); it is not used.",
                     type(self).__name__, name, sorted(self._ir.restored_state))
        maybe_dump_ir(self._ir, self._model.proto.graph.name)
        _log.info("%s '%s': %d ops, %d tensors after its passes", type(self).__name__, name,
                  len(self._ir.main.ops), len(self._ir.main.tensors))
        self._program: Program = lower(self._ir, self._data_flow, self._replication_factor,
                                       self._accumulation_factor)
        mark_broadcast_inputs(self._program, self._model.proto)
        check_64bit_inputs(self._program, self._options)
        self._check_device()
        # Host copies of the weights (variables), as given by the model or writeWeights();
        # each is copied from the IR when first used.
        self._host_weights = HostWeights(self._ir.main.tensors, self._program.weights)
        self._random_seed = 0
        self._device: SimulatedDevice | None = None
        self._device_model: DeviceModel | None = None
        self._runs = 0
        self._profiled_runs = 0
        self._engine_loaded = False
        self._weights_written = False

    def _set_factors(self, userOptions: SessionOptions) -> None:  # noqa: N803
        """Local and global replication and accumulation factors of ``userOptions``."""
        check_global_replication(userOptions)
        self._replication_factor = (
            userOptions.replicatedGraphCount if userOptions.enableReplicatedGraphs else 1
        )
        if userOptions.replicatedGraphCount != 1 and not userOptions.enableReplicatedGraphs \
                and "replicatedGraphCount" not in _LOGGED:
            _LOGGED.add("replicatedGraphCount")
            _log.warning("SessionOptions.replicatedGraphCount = %d has no effect because "
                         "enableReplicatedGraphs is False; the session runs one replica. Set "
                         "enableReplicatedGraphs = True to replicate.",
                         userOptions.replicatedGraphCount)
        # All replicas of all instances (global replication): gradients reduce
        # over them; host data and anchors hold only the local ones.
        self._global_replication_factor = (
            userOptions.globalReplicationFactor
            if userOptions.enableDistributedReplicatedGraphs else self._replication_factor
        )
        self._accumulation_factor = userOptions.getAccumulationFactor()

    # --- construction checks ----------------------------------------------------------------

    def _constant_weights(self) -> bool:
        return False

    def _passes(self) -> list:
        raise NotImplementedError

    def _ipus_per_replica(self) -> int:
        """The device's IPUs per replica, which virtual graphs and pipelining split over."""
        return max(1, self._device_info.numIpus // self._replication_factor)

    def _check_mode_options(self, options: SessionOptions) -> None:
        pass

    def _check_io_settings(self) -> None:
        """numIOTiles and the tile set / exchange strategy of each input and anchor."""
        streams = {f"Input '{tensor_id}'": (s.tileSet(), s.exchangeStrategy())
                   for tensor_id, s in input_settings_from_model(self._model.proto).items()}
        for anchor_id in self._data_flow.anchors():
            art = self._data_flow.art(anchor_id)
            streams[f"Anchor '{anchor_id}'"] = (art.tileSet(), art.exchangeStrategy())
        spec = self._device_info.spec
        check_io_options(self._options, streams, spec.num_tiles, spec.full_chip_tiles)

    def _check_anchors_exist(self) -> None:
        tensors = self._ir.main.tensors
        missing = [a for a in self._data_flow.anchors() if a not in tensors]
        if not missing:
            return
        lines = []
        for anchor_id in missing:
            close = difflib.get_close_matches(anchor_id, list(tensors), n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            lines.append(f"Anchor '{anchor_id}' is not a tensor of the model.{hint}")
        outputs = ", ".join(repr(o) for o in self._ir.main.outputs)
        where = ("tensors of the training graph (ONNX tensors, 'Gradient___<tensor>' for any "
                 "floating-point tensor the loss depends on, ...)"
                 if self._training else "tensors of the ONNX graph")
        raise popart_exception(
            "\n".join(lines) + f"\nDataFlow anchors must name {where} (its outputs are "
            f"{outputs})."
        )

    def _check_device(self) -> None:
        needed = self._replication_factor * self._program.ipus_per_replica
        num_ipus = self._device_info.numIpus
        if num_ipus < needed or num_ipus % self._replication_factor:
            raise popart_exception(
                f"{type(self).__name__} '{self.name}': replicatedGraphCount = "
                f"{self._replication_factor} replicas × {self._program.ipus_per_replica} IPU(s) "
                f"per replica need {needed} IPUs (and a multiple of {self._replication_factor}), "
                f"but the device has {num_ipus}. Acquire a device with "
                f"acquireAvailableDevice({needed}) or "
                f"createIpuModelDevice({{'numIPUs': {needed}}})."
            )

    # --- properties ---------------------------------------------------------------------------

    @property
    def dataFlow(self) -> DataFlow:  # noqa: N802 - PopART's name
        return self._data_flow

    @property
    def replicationFactor(self) -> int:  # noqa: N802
        return self._replication_factor

    @property
    def accumulationFactor(self) -> int:  # noqa: N802
        return self._accumulation_factor

    @property
    def options(self) -> SessionOptions:
        return self._options

    # --- device -------------------------------------------------------------------------------

    def prepareDevice(self, loadEngine: bool = True, err=None) -> None:  # noqa: N802,N803
        """Compile the Program for the simulated device, then load it unless ``loadEngine`` is
        False or ``compileEngine`` is off. With ``err`` (an OutOfMemoryError) an
        overflow fills it instead of raising."""
        if err is not None:
            return self._prepare_with_status(loadEngine, err)
        _log.log(_TRACE, "Session::prepareDevice")
        if not self._options.compileEngine:
            _log.info("compileEngine is False: the IR is built, no engine is compiled.")
            return
        if self._device is None:
            program = self._program  # host buffers of one step, before the device builds them
            check_step(program.micro_batches_per_run, sum(
                s.info.num_bytes for s in (*program.inputs, *program.anchors)),
                f"{self.name}: one step's host input and anchor buffers")
            with progress.track(f"{self.name}: prepareDevice", 3, "stage",
                                self._options.compilationProgressLogger,
                                self._options.compilationProgressTotal) as steps:
                # No storage yet: the device allocates its variables and run buffers (per
                # replica) at weightsFromHost or the first run; an offline device never does.
                device = SimulatedDevice(
                    self._program, _SYNTHETIC[self._options.syntheticDataMode], self._random_seed,
                    replica_comm(self._options, self._replication_factor))
                progress.step(steps, "device model")
                # The memory and cycle model of the simulated IPU (DESIGN decision 8), from
                # shapes alone: raises OutOfMemoryException when a tile or an IPU overflows.
                # An engine cache hit loads it (our Poplar compile) from the entry instead.
                model = self._cached_device_model()
                if model is None:  # computed, and written to the engine cache (executable/)
                    model = self._computed_device_model(lambda: analyse(
                        self._ir, execution_order(self._program), self._device_info,
                        self._options, BatchInfo.from_program(self._program),
                        program=self._program, model=self._model.proto))
                self._device_model = model
                progress.step(steps, "memory check")
                self._device_model.check_fits(summary_text(self._device_model))
                progress.step(steps)
            self._device = device
            self._device_built()  # a loaded executable's RNG state (executable/)
            self._write_auto_report()
        if loadEngine:
            self.loadEngineAndConnectStreams()

    def loadEngineAndConnectStreams(self) -> None:  # noqa: N802
        """Attach to the device (OnDemand devices attach here) and load the compiled engine."""
        if self._device is None:
            raise popart_exception(
                f"{type(self).__name__} '{self.name}': loadEngineAndConnectStreams() needs a "
                f"compiled engine; call prepareDevice() first."
            )
        if self._offline():
            _log.info("Offline device: the engine is compiled but cannot be loaded.")
            return
        device_info = self._device_info
        if not device_info.isAttached:
            # OnDemand devices attach when first needed, retrying up to the manager's timeout.
            on_demand = device_info.connectionType is DeviceConnectionType.OnDemand
            attached = device_info.tryAttachUntilTimeout() if on_demand else device_info.attach()
            if not attached:
                raise popart_exception(
                    f"{type(self).__name__} '{self.name}': could not attach to device "
                    f"{device_info!r}; it is in use. Detach it elsewhere or acquire another."
                )
        self._engine_loaded = True

    def _offline(self) -> bool:
        return self._device_info.connectionType is DeviceConnectionType.Never

    def _ready_device(self, what: str) -> SimulatedDevice:
        if self._offline():
            raise popart_exception("Offline IPU device is not configured for execution")
        if not self._options.compileEngine:
            raise popart_exception(
                f"{what}: no engine was compiled because SessionOptions.compileEngine is False; "
                f"set it to True to run."
            )
        if self._device is None or not self._engine_loaded:
            raise popart_exception(
                f"{what} called before the device was prepared; call session.prepareDevice() "
                f"first."
            )
        return self._device

    def run(self, stepio, debugName: str = "", *more) -> None:  # noqa: N803
        """Run one step: batchesPerStep batches, reading inputs and writing anchors."""
        if isinstance(stepio, str) or more:  # run(programHandle, stepio, debugName="")
            return self._run_handle(stepio, debugName, *more)
        device = self._ready_device("run()")
        if self._training and self._host_weights and not self._weights_written:
            raise popart_runtime_error(
                "Must call weightsFromHost before run as the model has initializers and the "
                "session has been created in training mode"
            )
        if debugName:
            _log.debug("run '%s'", debugName)
        _log.log(_TRACE, "Session::run")
        if self._value_io:
            if isinstance(stepio, PyStepIO) and stepio.allocate_outputs:
                raise popart_exception("run(): PyStepIO(allocate_outputs=True) cannot give this "
                                       "model's sequence or optional anchors; pass "
                                       "session.initAnchorArrays() as its outputs instead.")
            streams = {s.id: s.info for s in (*self._program.inputs, *self._program.anchors)}
            stepio = self._value_io.flatten_step_io(stepio, streams)
        run_checked(self, device, self._program, stepio, self.name, self._runs + 1, self._ir.main)
        self._fwd_only_ran_last = False
        if self._training:
            self._host_weights_in_sync = False  # the device weights moved on
        self._runs += 1
        self._profiled_runs += 1
        if self._runs == 1:
            self._write_auto_report()

    def _write_auto_report(self) -> None:
        """The autoReport files (report/auto.py): after compiling, again after the first run."""
        directory = report_directory(self._options, self.name)
        if directory is not None and self._device_model is not None:
            write_auto_report(self._device_model, self._profiled_runs, directory)

    def initAnchorArrays(self) -> dict[str, np.ndarray]:  # noqa: N802
        """Zero-filled numpy arrays of the shapes, one per anchor; a list of them for
        a sequence anchor, None for an absent optional one."""
        arrays = {
            a.id: np.zeros(a.host_shape, dtype=a.info.dtype.numpy) for a in self._program.anchors
        }
        if self._value_io:
            return self._value_io.group_anchors(arrays, self._user_anchors)
        return arrays

    def getIr(self) -> Ir:  # noqa: N802 - PopART's name
        """The session's IR after its passes (for training: forward, backward, optimizer)."""
        return self._ir

    def getInfo(self, id: str) -> TensorInfo:  # noqa: N802,A002 - PopART's names
        tensors = self._ir.main.tensors
        if id not in tensors and id in self._ir.fused_gradients:
            return TensorInfo.from_ir(self._ir.fused_gradients[id])
        if id not in tensors:
            close = difflib.get_close_matches(id, list(tensors), n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise popart_exception(f"getInfo: no tensor '{id}' in the session's IR.{hint}")
        return TensorInfo.from_ir(tensors[id].info)

    def getAllTensorIds(self) -> set[str]:  # noqa: N802 - PopART's name
        """The ids of every tensor of the IR after its passes, gradients under the reserved
        prefix (``Gradient___<id>``); subgraph tensors as ``<graph id>/<tensor id>``."""
        ids = set(self._ir.main.tensors) | set(self._ir.fused_gradients)
        for graph_id, graph in self._ir.graphs.items():
            if graph is not self._ir.main:
                ids.update(t if t.startswith(f"{graph_id}/") else f"{graph_id}/{t}"
                           for t in graph.tensors)
        return ids

    def anchor_host_shape(self, anchor_id: str) -> tuple[int, ...]:
        """The host shape of an anchor (what initAnchorArrays allocates)."""
        info = self._ir.main.tensor(anchor_id).info
        return anchor_shape(self._data_flow.art(anchor_id), info.shape,
                            self._data_flow.batchesPerStep(), self._accumulation_factor,
                            self._replication_factor)


class InferenceSession(SessionBase):
    """Run a forward graph on the simulated device.

    ``InferenceSession(fnModel, dataFlow, deviceInfo, inputShapeInfo=InputShapeInfo(),
    patterns=None, userOptions=SessionOptions(), name="inference")``
    """

    _training = False

    def __init__(self, fnModel, dataFlow, deviceInfo,  # noqa: N803
                 inputShapeInfo: InputShapeInfo | None = None, patterns=None,  # noqa: N803
                 userOptions: SessionOptions | None = None, name: str = "inference"):  # noqa: N803
        super().__init__(
            fnModel, dataFlow, deviceInfo,
            InputShapeInfo() if inputShapeInfo is None else inputShapeInfo,
            patterns,
            SessionOptions() if userOptions is None else userOptions,
            name,
        )

    @classmethod
    def fromIr(cls, ir: Ir, deviceInfo,  # noqa: N802,N803 - PopART's names
               name: str = "fromIr") -> InferenceSession:
        """A session that runs ``ir`` as it stands, on ``deviceInfo``: no import and no passes,
        with the model, data flow, options and patterns of the session whose ``getIr()`` it is.
        The new session works on its own copy of ``ir`` (later edits of ``ir`` do not reach it);
        an Ir with backward and optimizer ops trains on every ``run()``, as in PopART."""
        if not isinstance(ir, Ir):
            raise popart_exception(f"fromIr: ir must be an Ir (session.getIr()), not "
                                   f"{type(ir).__name__}.")
        self = cls.__new__(cls)
        self._init_from_ir(ir, deviceInfo, name)
        return self

    def _constant_weights(self) -> bool:
        return self._options.constantWeights

    def _passes(self) -> list:
        return inference_passes(self._options, self._ipus_per_replica(),
                                self._data_flow.batchesPerStep())

    def _check_mode_options(self, options: SessionOptions) -> None:
        if options.enableGradientAccumulation:
            raise popart_exception("Gradient Accumulation only available when training.")

    def resetHostWeights(  # noqa: N802 - PopART's names
        self,
        modelProtoOrFilename,  # noqa: N803
        ignoreWeightsInModelWithoutCorrespondingHostWeight: bool = False,  # noqa: N803
    ) -> None:
        if self._options.constantWeights:
            raise popart_exception("Cannot call resetHostWeights when constantWeights is set")
        super().resetHostWeights(modelProtoOrFilename,
                                 ignoreWeightsInModelWithoutCorrespondingHostWeight)



class TrainingSession(SessionBase):
    """Train a model on the simulated device: forward, backward, optimizer.

    ``TrainingSession(fnModel, dataFlow, loss, optimizer, deviceInfo,
    inputShapeInfo=InputShapeInfo(), patterns=None, userOptions=SessionOptions(),
    name="training")``

    One ``run()`` makes ``batchesPerStep`` weight updates, each over ``accumulationFactor``
    micro-batches. Host copies cover every variable: weights, optimizer state, accumulators and
    non-const optimizer values; ``weightsFromHost()`` writes them all to the device.
    """

    _training = True

    def __init__(self, fnModel, dataFlow, loss, optimizer, deviceInfo,  # noqa: N803
                 inputShapeInfo: InputShapeInfo | None = None, patterns=None,  # noqa: N803
                 userOptions: SessionOptions | None = None, name: str = "training"):  # noqa: N803
        if not isinstance(loss, str):
            raise popart_exception(
                f"TrainingSession: loss must be the id (str) of the final loss tensor, not "
                f"{type(loss).__name__}."
            )
        if not isinstance(optimizer, Optimizer):
            raise popart_exception(
                f"TrainingSession: optimizer must be a popart optimizer (SGD, ConstSGD, Adam, "
                f"Adaptive), not {type(optimizer).__name__}."
            )
        self._loss_id = loss
        self._optimizer = optimizer
        super().__init__(
            fnModel, dataFlow, deviceInfo,
            InputShapeInfo() if inputShapeInfo is None else inputShapeInfo,
            patterns,
            SessionOptions() if userOptions is None else userOptions,
            name,
        )

    def _check_mode_options(self, options: SessionOptions) -> None:
        if options.enableGradientAccumulation and options.accumulationFactor < 1:
            raise popart_exception(
                f"enableGradientAccumulation is true, but accumulationFactor = "
                f"{options.accumulationFactor}; it must be at least 1."
            )

    def _passes(self) -> list:
        self._check_loss()
        check_stitch_strategy(self._options, len(self._ir.graphs) > 1)
        return training_passes(self._options, self._loss_id, self._optimizer,
                               self._accumulation_factor, self._global_replication_factor,
                               self._ipus_per_replica(), self._data_flow.batchesPerStep())

    def _check_loss(self) -> None:
        tensors = self._ir.main.tensors
        if self._loss_id in tensors:
            return
        close = difflib.get_close_matches(self._loss_id, list(tensors), n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        outputs = ", ".join(repr(o) for o in self._ir.main.outputs)
        raise popart_exception(
            f"TrainingSession: the loss '{self._loss_id}' is not a tensor of the model.{hint} "
            f"Pass the id of the final (reduced) loss, e.g. the output of "
            f"builder.aiGraphcore.l1loss(...); the graph outputs are {outputs}."
        )

    def getTensorIds(self) -> set[str]:  # noqa: N802 - PopART's name
        """All tensor ids of the training IR (forward, backward, optimizer), as
        ``getAllTensorIds()``."""
        return self.getAllTensorIds()

    def updateOptimizerFromHost(self, optimizer) -> None:  # noqa: N802
        """Replace the optimizer's non-const values; the next ``run()`` uses them.

        The class, structure and const values must not change.
        """
        if not isinstance(optimizer, Optimizer):
            raise popart_exception(
                f"updateOptimizerFromHost needs a popart optimizer, not "
                f"{type(optimizer).__name__}."
            )
        self._optimizer.check_update(optimizer)
        changed = {}
        for tensor_id, (key, weight_id) in self._ir.optimizer_tensors.hyper_params.items():
            value = optimizer.hyper_parameter_values(weight_id)[key]
            host = self._host_weights[tensor_id]
            host[...] = value
            changed[tensor_id] = host
        if changed and self._device is not None and self._engine_loaded and not self._offline():
            self._device.write_weights(changed)
        self._optimizer = optimizer


# The methods that hold the session's lock (SessionBase's docstring): those that read or change
# the device, the host weights or the RNG, including the ones the mixins define.
_LOCKED_METHODS = (
    "prepareDevice", "loadEngineAndConnectStreams", "run", "setRandomSeed", "getRNGState",
    "setRNGState", "getSummaryReport", "getReport", "getCycleCount", "weightsFromHost",
    "weightsToHost", "readWeights", "writeWeights", "resetHostWeights", "modelToHost",
    "updateOptimizerFromHost", "copyDeviceWeightsToHost", "saveVariables", "broadcastWeights",
    "setEngineIsLoaded", "compileAndExport", "saveExecutable", "loadExecutable",
    "updateEngineCache",
)


def _locked(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return call


for _cls in (SessionBase, InferenceSession, TrainingSession):
    for _name in _LOCKED_METHODS:
        # SessionBase: its own and its mixins' methods; a subclass: only those it overrides.
        _method = getattr(_cls, _name, None) if _cls is SessionBase else _cls.__dict__.get(_name)
        if _method is not None:
            setattr(_cls, _name, _locked(_method))
