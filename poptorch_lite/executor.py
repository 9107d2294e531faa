"""``PoplarExecutor``: the wrapper that compiles a module for the simulated IPU and runs it
(spec §2.1-§2.4, P1-P20, P24, P25).

A call binds the arguments to ``forward``'s signature, flattens them, and looks up the
executable compiled for that input signature (a new signature traces and compiles again, with a
warning). The executable is a ``popart_backend`` session built from the traced ONNX model; inputs
go in as one ``PyStepIO`` per call (``deviceIterations`` × accumulation micro-batches), outputs
come back per ``OutputMode`` reshaped PopTorch-style (§2.4 stacking rule).

Training wrappers build the backend optimizer from the torch/lite optimizer
(``optimizer_translation.py``), leave the host weights stale after each run and pull them on
first host access (``weight_sync.py``, P10), and move optimizer state between the device and
``optimizer.state`` (torch's format) when ``optimizer.state_dict()`` is called, at
``detachFromDevice()`` / ``destroy()``, and after ``load_state_dict`` (P56).
"""

from __future__ import annotations

import atexit
import logging
import time
import warnings
import weakref

import numpy as np
import onnx
import popart_backend as popart
import torch
import tqdm
from torch.utils import _pytree as pytree

from . import blocks, optimizer_translation, tracing, weight_sync
from .blocks import block_annotations
from .errors import Error
from .options import CommGroupType, ConnectionType, Options, OutputMode

__all__ = ["PoplarExecutor"]

_log = logging.getLogger("poptorch_lite")

_ART = {OutputMode.All: "All", OutputMode.Final: "Final", OutputMode.EveryN: "EveryN",
        OutputMode.Sum: "Sum"}
_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}

_pre_compile_hooks: list = []
_post_compile_hooks: list = []

# The simulated machine's size (lite; spec §2.3): more IPUs than this cannot be acquired.
MAX_IPUS = 64


class _Executable:
    """One compiled input signature: traced model, backend session and IO tables."""

    def __init__(self, traced: tracing.TracedModel, session, divisor: int, device_weights,
                 translation=None):
        self.traced = traced
        self.session = session
        self.divisor = divisor
        self.device_weights = device_weights  # ONNX initializer -> FQN, device-held only
        self.translation = translation  # training: the optimizer as compiled
        self.placement: blocks.Placement | None = None  # stages and IPUs (spec §2.3)
        # Per distinct output name: (name, host shape or None when the anchor array has it
        # already, narrowed dtype or None), built on the first run from the anchor arrays
        # (their sizes are fixed by the compiled session).
        self.output_table: list[tuple] | None = None


class PoplarExecutor:
    """A module compiled for the simulated IPU; use like the module (``wrapper(x)``)."""

    def __init__(self, model: torch.nn.Module, options: Options | None, training: bool,
                 optimizer=None):
        if isinstance(model, PoplarExecutor):
            model = model.model
        if not isinstance(model, torch.nn.Module):
            raise Error(f"Expected a torch.nn.Module to wrap, got {type(model).__name__}.")
        options = Options() if options is None else options
        if not isinstance(options, Options):
            raise Error(f"options must be a poptorch_lite.Options, not {type(options).__name__}.")
        accumulation = options._values["Training.gradientAccumulation"]
        if not training and accumulation != 1:
            raise Error(
                f"Options.Training.gradientAccumulation({accumulation}) is only for training "
                f"wrappers; an inference wrapper needs 1. Use Options.deviceIterations to run "
                f"more batches per call.")
        link = weight_sync.link_of(model)
        if training:
            if link.training is not None:
                raise RuntimeError(
                    "This model is already held by a training wrapper; call destroy() on it "
                    "before wrapping the model for training again.")
            for name, buffer in model.named_buffers():
                if type(buffer) is not torch.Tensor:
                    raise Error(f"Buffer '{name}' is a {type(buffer).__name__}, not a plain "
                                f"torch.Tensor; training wrappers need plain buffers.")
        options._freeze()
        private = options.clone()
        if private.output_mode is OutputMode.Default:
            private.outputMode(private.resolved_output_mode(training))
        private._freeze()
        d = self.__dict__
        d["_user_model"] = model
        d["_options"] = private
        d["_training"] = training
        d["_optimizer"] = optimizer
        # P15: the flags the model had when wrapped are the ones traced.
        d["_flags"] = {name: m.training for name, m in model.named_modules()}
        d["_executables"] = {}
        d["_active"] = None
        d["_device"] = None
        d["_attached"] = False
        d["_warned"] = set()
        d["_compile_seconds"] = None
        d["_link"] = link
        d["_seen_version"] = -1  # inference: training weights version last pulled (P11)
        d["_optimizer_hooks"] = []
        d["_optimizer_state_dirty"] = False  # device optimizer state newer than the host's
        d["_optimizer_state_pending"] = False  # host optimizer state to write before a run
        d["_steps_done"] = 0  # optimizer steps made on the device since compile
        d["_micro_batches_pending"] = 0  # BatchNorm num_batches_tracked not yet on the host
        d["_fast"] = None  # _FastCall: the last call's signature, to skip re-binding it
        if training:
            link.set_training(self)
            weight_sync.install_hooks(model, link)
            self._hook_optimizer(optimizer)

    # --- pass-through ------------------------------------------------------------------------

    @property
    def model(self) -> torch.nn.Module:
        return self._user_model

    @property
    def options(self) -> Options:
        return self._options

    @property
    def training(self) -> bool:
        return self._training

    def __getattr__(self, name):
        model = self.__dict__.get("_user_model")
        if model is None:
            raise AttributeError(name)
        return getattr(model, name)

    def __setattr__(self, name, value):
        if name in self.__dict__ or name in type(self).__dict__:
            object.__setattr__(self, name, value)
        else:
            setattr(self._user_model, name, value)

    def __repr__(self) -> str:
        kind = "training" if self._training else "inference"
        lines = [f"PoplarExecutor({kind}, compiled={self.isCompiled()}, "
                 f"attached={self.isAttachedToDevice()})"]
        for path, (user_id, ipu_id) in block_annotations(self._user_model).items():
            lines.append(f"  block {user_id!r} starts at '{path}' on ipu {ipu_id}")
        lines.append(repr(self._user_model))
        return "\n".join(lines)

    def state_dict(self, *args, **kwargs):
        """The user model's state dict; a training wrapper pulls device weights first."""
        self._link.pull()
        return self._user_model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True):
        """Load into the user model, then push to the device when attached (P9)."""
        result = self._user_model.load_state_dict(state_dict, strict=strict)
        if self.isCompiled() and self._attached:
            self.copyWeightsToDevice()
        return result

    def train(self, mode: bool = True) -> "PoplarExecutor":
        """Set the traced train/eval flag before compiling (P15)."""
        if self.isCompiled():
            if bool(mode) != all(self._flags.values()):
                raise Error(
                    f"wrapper.{'train' if mode else 'eval'}(): the model was compiled with a "
                    f"different train/eval flag. Build a second wrapper instead (e.g. "
                    f"model.eval(); poptorch_lite.inferenceModel(model)); it shares the "
                    f"weights.")
            return self
        for name in self._flags:
            self._flags[name] = bool(mode)
        return self

    def eval(self) -> "PoplarExecutor":
        return self.train(False)

    # --- state -----------------------------------------------------------------------------

    def isCompiled(self) -> bool:  # noqa: N802 - PopTorch's name
        return self._active is not None

    def isAttachedToDevice(self) -> bool:  # noqa: N802
        return self._attached

    isAttached = isAttachedToDevice

    def _require_compiled(self, what: str) -> _Executable:
        if self._active is None:
            raise Error(f"{what}: the model has not been compiled or has been destroyed; call "
                        f"the wrapper or wrapper.compile(...) first.")
        return self._active

    def _offline(self) -> bool:
        return self._options._values["connectionType"] is ConnectionType.Never

    # --- compile -----------------------------------------------------------------------------

    def compile(self, *args, **kwargs) -> None:
        """Trace and compile for these inputs without running (P6)."""
        if self.isCompiled():
            warnings.warn("compile(): the wrapper is already compiled; nothing to do.",
                          UserWarning, stacklevel=2)
            return
        leaves, signature = self._signature(args, kwargs)
        self._select(leaves, signature)

    def _signature(self, args, kwargs):
        named = tracing.bind_inputs(self._user_model.forward, args, kwargs)
        leaves, signature = tracing.flatten_inputs(named)
        return leaves, signature

    def _select(self, leaves, signature) -> _Executable:
        key = signature.key()
        executable = self._executables.get(key)
        if executable is None:
            if self._executables:
                old = self._active.traced.signature
                warnings.warn(
                    f"The inputs differ from those used to compile ({_diff(old, signature)}); "
                    f"recompiling for the new input signature. Keep input shapes fixed (e.g. "
                    f"drop_last=True) to avoid recompilation.", UserWarning, stacklevel=4)
            executable = self._compile(leaves, signature)
            self._executables[key] = executable
            self._switch_to(executable, fresh=True)
        elif executable is not self._active:
            self._switch_to(executable, fresh=False)
        return executable

    def _switch_to(self, executable: _Executable, fresh: bool) -> None:
        # The host is current here: _compile() pulled before tracing, or we pull now.
        self._link.pull()
        previous = self._active
        if previous is not None and self._training and self._attached:
            self._read_optimizer_state()
        self.__dict__["_active"] = executable
        if not fresh and self._attached:
            self.copyWeightsToDevice()
        if self._training and previous is not None and self._attached:
            # The new executable continues from the old one's optimizer state.
            self._write_optimizer_state()

    def _compile(self, leaves, signature) -> _Executable:
        for hook in _pre_compile_hooks:
            hook()
        start = time.monotonic()
        self._link.pull()  # the trace bakes the host weights into the initializers
        divisor = tracing.check_combined_batch(signature, self._options)
        kind = "training" if self._training else "inference"
        with tqdm.tqdm(total=3, desc=f"Compiling {kind} model", unit="phase", leave=False,
                       disable=not self._options._values["showCompilationProgressBar"]) as bar:
            bar.set_postfix_str("trace + ONNX export")
            traced = self._trace(leaves, signature, divisor)
            bar.update()
            bar.set_postfix_str("check ops")
            tracing.check_supported(traced)
            if self._training:
                self._check_batch_norms()
            bar.update()
            bar.set_postfix_str("build session + prepareDevice")
            placement = self._place(traced)
            session, translation = self._build_session(traced, placement)
            device_weights = self._device_weight_map(session, traced)
            bar.update()
        executable = _Executable(traced, session, divisor, device_weights, translation)
        executable.placement = placement
        self.__dict__["_compile_seconds"] = time.monotonic() - start
        _log.info("compiled the %s model in %.2f s", kind, self._compile_seconds)
        if not self._offline():
            self.__dict__["_attached"] = True
        for hook in _post_compile_hooks:
            hook()
        return executable

    def _trace(self, leaves, signature, divisor) -> tracing.TracedModel:
        modules = dict(self._user_model.named_modules())
        saved = {name: m.training for name, m in modules.items()}
        try:
            for name, module in modules.items():
                module.training = self._flags.get(name, module.training)
            return tracing.trace(
                self._user_model, leaves, signature, divisor,
                exporter=self._options._values["Jit.exporter"],
                excludes=tuple(self._options._values["sourceLocationExcludes"]))
        finally:
            for name, module in modules.items():
                module.training = saved[name]

    def _place(self, traced: tracing.TracedModel) -> blocks.Placement:
        """Stages and IPUs from the traced blocks and the execution strategy (spec §2.3)."""
        values = self._options._values
        placement = blocks.place_model(traced.proto, values["executionStrategy"])
        blocks.check_pipeline_depth(placement, self._training,
                                    values["Training.gradientAccumulation"],
                                    self._options.device_iterations)
        return placement

    def _num_ipus(self, placement: blocks.Placement) -> int:
        """Device IPUs = replicas × IPUs per replica (P44), power of two unless rounded."""
        replicas = self._options.replication_factor
        needed = placement.ipus_per_replica * replicas
        if needed > MAX_IPUS:
            raise Error(f"too many IPUs requested ({needed}): {placement.ipus_per_replica} IPU(s) "
                        f"per replica × replicationFactor({replicas}) exceeds the simulated "
                        f"machine's {MAX_IPUS} IPUs. Lower replicationFactor or place the model "
                        f"on fewer IPUs.")
        if needed & (needed - 1):
            if not self._options._values["autoRoundNumIPUs"]:
                raise Error(f"The model needs {needed} IPUs ({placement.ipus_per_replica} per "
                            f"replica × replicationFactor({replicas})), which is not a power of "
                            f"two. Use Options.autoRoundNumIPUs(True) to round up (extra IPUs "
                            f"idle), or change the ipu_ids / replicationFactor.")
            needed = 1 << (needed - 1).bit_length()
            if needed % replicas:
                raise Error(f"autoRoundNumIPUs: {needed} IPUs do not split into "
                            f"replicationFactor({replicas}) equal replicas; use a power-of-two "
                            f"replicationFactor.")
        return needed

    def _acquire_device(self, num_ipus: int):
        if self._device is not None:
            return self._device
        values = self._options._values
        manager = popart.DeviceManager()
        connection = popart.DeviceConnectionType[values["connectionType"].name]
        if connection is popart.DeviceConnectionType.Never:
            version = values["offlineIpuVersion"] or 2
            device = manager.createOfflineIPUDevice(
                {"numIPUs": num_ipus, "ipuVersion": f"ipu{version}"})
        elif values["useIpuModel"]:
            device = manager.createIpuModelDevice({"numIPUs": num_ipus})
        elif values["ipuId"] is not None:
            device = manager.acquireDeviceById(values["ipuId"], connectionType=connection)
        else:
            device = manager.acquireAvailableDevice(
                num_ipus, pattern=popart.SyncPattern[values["syncPattern"].name],
                connectionType=connection)
        if device is None:
            raise Error(f"failed to acquire {num_ipus} IPU(s): every simulated IPU of that size "
                        f"is in use. Call detachFromDevice() or destroy() on another wrapper.")
        self.__dict__["_device"] = device
        return device

    def _build_session(self, traced: tracing.TracedModel, placement: blocks.Placement):
        values = self._options._values
        mode = self._options.resolved_output_mode(self._training)
        period = self._options.output_return_period
        n = self._options.device_iterations
        if mode is OutputMode.EveryN and n % period:
            raise Error(f"outputMode(EveryN, {period}): the period must divide "
                        f"deviceIterations ({n}).")
        art = (popart.AnchorReturnType("EveryN", period) if mode is OutputMode.EveryN
               else popart.AnchorReturnType(_ART[mode]))
        anchors = {name: art for name in dict.fromkeys(traced.output_names)}
        data_flow = popart.DataFlow(n, anchors)
        session_options = self._options.to_backend(self._training)
        if placement.multi_ipu:
            session_options.virtualGraphMode = popart.VirtualGraphMode.Manual
            session_options.enablePipelining = placement.pipelined
        if values["profilingDir"] is not None:
            session_options.engineOptions = {**session_options.engineOptions,
                                             "autoReport.all": "true",
                                             "autoReport.directory": values["profilingDir"]}
        device = self._acquire_device(self._num_ipus(placement))
        _init_distributed(self._options)
        translation = None
        try:
            if self._training:
                session, translation = self._build_training_session(
                    traced, data_flow, device, session_options)
            else:
                session = popart.InferenceSession(traced.proto, data_flow, device,
                                                  userOptions=session_options,
                                                  name=values["modelName"] or "inference")
            if values["randomSeed"] is not None:
                session.setRandomSeed(values["randomSeed"])
            session.prepareDevice()
            if not self._offline():
                session.weightsFromHost()
        except popart.popart_exception as exc:
            raise backend_error(exc, traced) from exc
        if translation is not None and not self._offline() and self._optimizer.state:
            # e.g. Adagrad's initial accumulator, or a state loaded from a checkpoint
            self._write_optimizer_state(session, translation)
        return session, translation

    def _build_training_session(self, traced, data_flow, device, session_options):
        loss_id = find_loss(traced)
        translation = optimizer_translation.translate(
            self._optimizer, self._user_model, traced.param_map, self._running_stat_names())
        session = popart.TrainingSession(traced.proto, data_flow, loss_id, translation.backend,
                                         device, userOptions=session_options,
                                         name=self._options._values["modelName"] or "training")
        return session, translation

    def _batch_norms(self) -> list[tuple[str, torch.nn.modules.batchnorm._BatchNorm]]:
        """BatchNorm modules that update running statistics in this (training) wrapper."""
        return [(name, m) for name, m in self._user_model.named_modules()
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                and m.track_running_stats and self._flags.get(name, m.training)]

    def _check_batch_norms(self) -> None:
        for name, module in self._batch_norms():
            if module.momentum is None:
                raise Error(f"BatchNorm '{name}' has momentum=None (cumulative moving average), "
                            f"which the device does not implement; give it a momentum "
                            f"(torch's default is 0.1).")

    def _running_stat_names(self) -> set[str]:
        names = set()
        for name, _ in self._batch_norms():
            prefix = f"{name}." if name else ""
            names.update((prefix + "running_mean", prefix + "running_var"))
        return names

    @staticmethod
    def _device_weight_map(session, traced: tracing.TracedModel) -> dict[str, str]:
        """The mapped initializers the session keeps as device weights (others are constants)."""
        held = {}
        inits = {i.name: i for i in traced.proto.graph.initializer}
        for onnx_name, fqn in traced.param_map.items():
            init = inits[onnx_name]
            array = np.empty(tuple(init.dims),
                             dtype=onnx.helper.tensor_dtype_to_np_dtype(init.data_type))
            try:
                session.readWeights(popart.PyWeightsIO({onnx_name: array}))
            except popart.popart_exception:
                _log.debug("'%s' (%s) is a constant of the compiled model", fqn, onnx_name)
                continue
            held[onnx_name] = fqn
        return held

    # --- weights -----------------------------------------------------------------------------

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        state = dict(self._user_model.named_parameters())
        state.update(self._user_model.named_buffers())
        return state

    def copyWeightsToHost(self) -> None:  # noqa: N802
        """Device weights -> the user model's parameters and buffers, by name (P8)."""
        executable = self._require_compiled("copyWeightsToHost()")
        if self._training:
            self._link.host_dirty = False
        session = executable.session
        state = self._state_tensors()
        arrays = {onnx_name: np.empty(tuple(state[fqn].shape),
                                      dtype=_numpy_dtype(state[fqn].dtype))
                  for onnx_name, fqn in executable.device_weights.items()}
        session.weightsToHost()
        session.readWeights(popart.PyWeightsIO(arrays))
        with torch.no_grad():
            for onnx_name, fqn in executable.device_weights.items():
                state[fqn].copy_(torch.from_numpy(arrays[onnx_name]))
            pending = self._micro_batches_pending
            if pending:
                # torch counts BatchNorm forward calls; the device does not keep the count.
                for _, module in self._batch_norms():
                    module.num_batches_tracked.add_(pending)
                self.__dict__["_micro_batches_pending"] = 0

    def copyWeightsToDevice(self) -> None:  # noqa: N802
        """The user model's parameters and buffers -> device (P9)."""
        executable = self._require_compiled("copyWeightsToDevice()")
        self._link.pull()
        state = self._state_tensors()
        arrays = {onnx_name: np.ascontiguousarray(state[fqn].detach().cpu().numpy())
                  for onnx_name, fqn in executable.device_weights.items()}
        session = executable.session
        if self._training and self._attached:
            # weightsFromHost() writes every variable: refresh the host copies of the
            # optimizer state first so they are not rolled back.
            session.weightsToHost()
        session.writeWeights(popart.PyWeightsIO(arrays))
        session.weightsFromHost()
        if self._training:
            self._link.device_moved()
            self._link.host_dirty = False

    # --- optimizer -------------------------------------------------------------------------

    def _hook_optimizer(self, optimizer) -> None:
        """state_dict() of the optimizer reads device state; load_state_dict() queues a write."""
        ref = weakref.ref(self)

        def before_state_dict(_optimizer):
            wrapper = ref()
            if wrapper is not None and wrapper._optimizer_state_dirty:
                wrapper._read_optimizer_state()

        def after_load_state_dict(_optimizer):
            wrapper = ref()
            if wrapper is not None:
                wrapper.__dict__["_optimizer_state_dirty"] = False
                wrapper.__dict__["_optimizer_state_pending"] = True
                step = _state_step(_optimizer)
                if step is not None:
                    wrapper.__dict__["_steps_done"] = step

        self._optimizer_hooks.extend([
            optimizer.register_state_dict_pre_hook(before_state_dict),
            optimizer.register_load_state_dict_post_hook(after_load_state_dict)])
        step = _state_step(optimizer)
        if step is not None:
            self.__dict__["_steps_done"] = step

    def _unhook_optimizer(self) -> None:
        for handle in self._optimizer_hooks:
            handle.remove()
        self._optimizer_hooks.clear()

    def _read_optimizer_state(self) -> None:
        """Device optimizer state -> ``optimizer.state`` in torch's format (and ``_ipu_state``)."""
        executable = self._active
        if executable is None or executable.translation is None or not self._attached:
            return
        self.__dict__["_optimizer_state_dirty"] = False
        translation = executable.translation
        session = executable.session
        session.weightsToHost()
        ids = [slot.backend_id for slots in translation.state.values() for slot in slots
               if slot.backend_id is not None]
        ids += [i for ids_ in translation.internal_state.values() for i in ids_]
        arrays = {tid: _host_array(session, tid) for tid in ids}
        if arrays:
            session.readWeights(popart.PyWeightsIO(arrays))
        optimizer = self._optimizer
        for weight_id, slots in translation.state.items():
            param = translation.weights[weight_id]
            entry = {}
            for slot in slots:
                if slot.backend_id is None:
                    entry[slot.torch_key] = torch.tensor(float(self._steps_done))
                elif slot.torch_key == "step":
                    entry["step"] = torch.tensor(float(arrays[slot.backend_id]))
                else:
                    value = torch.from_numpy(arrays[slot.backend_id].copy())
                    entry[slot.torch_key] = (value / slot.scale if slot.scale != 1.0
                                             else value).to(param.dtype)
            if entry:
                optimizer.state[param] = entry
        if hasattr(optimizer, "_ipu_state"):
            optimizer._ipu_state = {tid: torch.from_numpy(a.copy()) for tid, a in arrays.items()}
            optimizer._ipu_param = dict(translation.backend.hyper_parameter_values(None))

    def _write_optimizer_state(self, session=None, translation=None) -> None:
        """``optimizer.state`` (torch's format) -> the device; missing entries start at zero."""
        if session is None:
            executable = self._active
            session, translation = executable.session, executable.translation
        self.__dict__["_optimizer_state_pending"] = False
        optimizer = self._optimizer
        arrays = {}
        for weight_id, slots in translation.state.items():
            entry = optimizer.state.get(translation.weights[weight_id], {})
            for slot in slots:
                if slot.backend_id is None:
                    continue
                value = entry.get(slot.torch_key)
                array = _host_array(session, slot.backend_id)
                if value is not None:
                    array[...] = (torch.as_tensor(value).detach().float()
                                  * slot.scale).numpy().astype(array.dtype)
                arrays[slot.backend_id] = array
            started = bool(entry)
            for tid in translation.internal_state[weight_id]:
                array = _host_array(session, tid)
                array[...] = float(self._steps_done if started else 0)
                arrays[tid] = array
        if not arrays:
            return
        session.weightsToHost()
        session.writeWeights(popart.PyWeightsIO(arrays))
        session.weightsFromHost()

    def setOptimizer(self, optimizer) -> None:  # noqa: N802
        """Use ``optimizer``'s current hyper-parameters (or a new optimizer object) from the
        next run, without recompiling (P12). Call it after an LR scheduler's ``step()``."""
        if not self._training:
            raise Error("setOptimizer(): this is an inference wrapper; it has no optimizer.")
        previous = self._optimizer
        if optimizer is not previous:
            if self.isCompiled() and self._attached:
                self._read_optimizer_state()  # the old object keeps its trained state
            self._unhook_optimizer()
            self.__dict__["_optimizer"] = optimizer
            self._hook_optimizer(optimizer)
        executable = self._active
        if executable is None:
            return
        translation = optimizer_translation.translate(
            optimizer, self._user_model, executable.traced.param_map,
            self._running_stat_names(), compiled=executable.translation)
        optimizer_translation.check_replacement(executable.translation, translation, optimizer)
        try:
            executable.session.updateOptimizerFromHost(translation.backend)
        except popart.popart_exception as exc:
            raise backend_error(exc, executable.traced) from exc
        executable.translation = translation
        if optimizer is not previous:
            self.__dict__["_optimizer_state_pending"] = True

    # --- device ------------------------------------------------------------------------------

    def detachFromDevice(self) -> None:  # noqa: N802
        self._require_compiled("detachFromDevice()")
        if not self._attached:
            raise Error("detachFromDevice(): the device is not attached.")
        if self._training:
            self.copyWeightsToHost()
            if self._optimizer_state_dirty:
                self._read_optimizer_state()
        self._device.detach()
        self.__dict__["_attached"] = False

    def attachToDevice(self) -> None:  # noqa: N802
        executable = self._require_compiled("attachToDevice()")
        if self._offline():
            raise Error("attachToDevice(): the model is compiled for an offline target and "
                        "cannot attach.")
        if self._attached:
            raise Error("attachToDevice(): the device is already attached.")
        if not self._device.attach():
            raise Error(f"failed to acquire {self._device.numIpus} IPU(s) to attach: they are "
                        f"in use. Call detachFromDevice() or destroy() on the other wrapper.")
        self.__dict__["_attached"] = True
        executable.session.loadEngineAndConnectStreams()
        self.copyWeightsToDevice()
        if self._training:
            self._write_optimizer_state()

    def destroy(self) -> None:
        """Sync weights and optimizer state (training), release the device, drop every
        executable and restore the user model's classes (P14)."""
        if self._training and self._link.training is self:
            if self.isCompiled() and self._attached:
                self.copyWeightsToHost()
                if self._optimizer_state_dirty:
                    self._read_optimizer_state()
            self._unhook_optimizer()
            weight_sync.remove_hooks(self._user_model)
            self._link.set_training(None)
        if not self.isCompiled():
            return
        if self._device is not None and self._attached:
            self._device.detach()
        d = self.__dict__
        d["_executables"] = {}
        d["_fast"] = None
        d["_active"] = None
        d["_device"] = None
        d["_attached"] = False

    def compilationTime(self):  # noqa: N802
        import datetime

        self._require_compiled("compilationTime()")
        return datetime.timedelta(seconds=self._compile_seconds)

    # --- run ---------------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        fast = self.__dict__["_fast"]
        if fast is not None and not kwargs:
            leaves = fast.leaves(self, args)
            if leaves is not None:
                return self._run(fast.executable, leaves)
        leaves, signature = self._signature(args, kwargs)
        leaves = self._prepare_leaves(leaves, signature)
        executable = self._select(leaves, signature)
        if self._offline():
            raise Error("The model is compiled for an offline target "
                        "(connectionType(Never) / useOfflineIpuTarget); use compile() only.")
        if not self._attached:
            self.attachToDevice()
        self.__dict__["_fast"] = _FastCall.of(self, args, kwargs, leaves, executable)
        return self._run(executable, leaves)

    def _prepare_leaves(self, leaves, signature):
        out = []
        for leaf, spec in zip(leaves, signature.leaves):
            if isinstance(leaf, torch.Tensor):
                if leaf.requires_grad:
                    self._warn_once("requires_grad", f"Input {spec.path} requires grad; it is "
                                    f"detached (the device computes gradients itself).")
                    leaf = leaf.detach()
                if not leaf.is_contiguous():
                    self._warn_once("contiguous", f"Input {spec.path} is not contiguous; it "
                                    f"is copied before each call.")
                    leaf = leaf.contiguous()
            out.append(leaf)
        return out

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, UserWarning, stacklevel=4)

    def _sync_before_run(self) -> None:
        if self._training:
            if self._optimizer_state_pending:
                self._write_optimizer_state()
            return
        # P11: pull the weights a training wrapper of the same model moved since our last run.
        link = self._link
        trainer = link.training
        if trainer is not None and trainer.isCompiled() and link.version != self._seen_version:
            link.pull()
            self.copyWeightsToDevice()
        self.__dict__["_seen_version"] = link.version

    def _run(self, executable: _Executable, leaves):
        self._sync_before_run()
        traced = executable.traced
        inputs = {}
        for leaf, spec, name in zip(leaves, traced.signature.leaves, traced.input_names):
            if name is None:
                continue
            array = leaf.cpu().numpy()
            if not spec.shape:
                # 0-d tensors are not sliced: every micro-batch of every replica sees the same
                # value.
                array = np.ascontiguousarray(np.broadcast_to(
                    array, (executable.divisor * self._input_group_size(),)))
            else:
                array = self._expand_input_groups(array, executable.divisor)
            inputs[name] = np.ascontiguousarray(array)
        session = executable.session
        anchors = session.initAnchorArrays()
        try:
            session.run(popart.PyStepIO(inputs, anchors))
        except popart.popart_exception as exc:
            raise backend_error(exc, traced) from exc
        if self._training:
            n = self._options.device_iterations
            self._link.device_moved()
            d = self.__dict__
            d["_optimizer_state_dirty"] = True
            d["_steps_done"] += n
            d["_micro_batches_pending"] += n * self._options._values[
                "Training.gradientAccumulation"]
            # The device ran the optimizer's steps: tell torch's LR schedulers, which check
            # this flag to warn about scheduler.step() before optimizer.step().
            self._optimizer._opt_called = True
        return self._outputs(executable, anchors)

    def _input_group_size(self) -> int:
        return self._options._values["inputReplicaGrouping"][0]

    def _expand_input_groups(self, array: np.ndarray, divisor: int) -> np.ndarray:
        """[N·G·Rin·B, ...] -> [N·G·R·B, ...]: each replica gets its input group's rows (§2.4)."""
        size, kind = self._options._values["inputReplicaGrouping"]
        if size == 1:
            return array
        rin = self._options.input_replicas
        replicas = self._options.replication_factor
        micro = array.shape[0] // divisor  # B
        view = array.reshape(-1, rin, micro, *array.shape[1:])  # [N·G, Rin, B, ...]
        if kind is CommGroupType.Orthogonal:
            groups = [r % rin for r in range(replicas)]
        else:  # Consecutive: group r feeds replicas r·size .. r·size + size - 1
            groups = [r // size for r in range(replicas)]
        return view[:, groups].reshape(-1, *array.shape[1:])

    def getPipelineSummary(self) -> str:  # noqa: N802 - (lite)
        """Stages per IPU and the pipeline's fill / main / flush cycles; with
        ``Options.enableProfiling`` also the backend's ``getSummaryReport()``."""
        executable = self._require_compiled("getPipelineSummary()")
        values = self._options._values
        text = blocks.schedule_summary(executable.placement, self._training,
                                       values["Training.gradientAccumulation"],
                                       self._options.device_iterations,
                                       self._options.replication_factor)
        processes = self._options.Distributed.numProcesses
        if processes > 1:
            text += (f"\n  processes: {processes} (this one: "
                     f"{self._options.Distributed.processId}), global replicas: "
                     f"{processes * self._options.replication_factor}")
        if values["profilingDir"] is not None:
            text += "\n" + executable.session.getSummaryReport(resetProfile=False)
        return text

    def _outputs(self, executable: _Executable, anchors: dict):
        traced = executable.traced
        table = executable.output_table
        if table is None:
            table = executable.output_table = _output_table(executable, anchors)
        results = {}
        for name, shape, narrow in table:
            tensor = torch.from_numpy(anchors[name])
            if shape is not None:
                tensor = tensor.view(shape)  # initAnchorArrays' arrays are C-contiguous
            results[name] = tensor if narrow is None else tensor.to(narrow)
        leaves = []
        for index, source in enumerate(traced.output_leaf_sources):
            if source is None:
                leaves.append(traced.output_constants.get(index))
            else:
                leaves.append(results[traced.output_names[source]])
        if traced.output_spec is None:
            return leaves[0] if len(leaves) == 1 else tuple(leaves)
        return pytree.tree_unflatten(leaves, traced.output_spec)



class _FastCall:
    """The input signature of the last call made of plain tensors passed positionally.

    A training step or an inference batch repeats the same call; matching the new arguments
    against this record (type, dtype, shape, no grad, contiguous) gives the same leaves and
    executable as binding to ``forward``'s signature, flattening and looking up the signature
    key would, at a fraction of the cost (those cost about as much as a small model's step).
    Anything else (kwargs, non-tensor or changed arguments, another executable, a detached
    device, a replaced ``forward``) falls back to the full path, which records the new call.
    """

    __slots__ = ("executable", "forward", "positions", "specs", "template")

    def __init__(self, forward, executable, specs, positions, template):
        self.forward = forward
        self.executable = executable
        self.specs = specs  # per positional argument: (dtype, shape)
        self.positions = positions  # leaf index of each argument; None: the leaves are args
        self.template = template  # the leaves, with constants (defaults) at other indices

    @staticmethod
    def _function(model):
        forward = model.forward
        return getattr(forward, "__func__", forward)

    @classmethod
    def of(cls, wrapper, args, kwargs, leaves, executable) -> _FastCall | None:
        if kwargs or not all(type(a) is torch.Tensor for a in args):
            return None
        positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        # Every tensor leaf must be an argument as given (not detached or made contiguous).
        if len(positions) != len(args) or any(leaves[p] is not a
                                              for p, a in zip(positions, args)):
            return None
        specs = tuple((a.dtype, a.shape) for a in args)
        same = positions == list(range(len(leaves)))
        return cls(cls._function(wrapper._user_model), executable, specs,
                   None if same else positions, None if same else list(leaves))

    def leaves(self, wrapper, args) -> list | None:
        """The leaves for ``args``, or None when the full path must handle the call."""
        specs = self.specs
        if (len(args) != len(specs) or self.executable is not wrapper._active
                or not wrapper._attached
                or self._function(wrapper._user_model) is not self.forward):
            return None
        for arg, (dtype, shape) in zip(args, specs):
            if (type(arg) is not torch.Tensor or arg.dtype is not dtype or arg.shape != shape
                    or arg.requires_grad or not arg.is_contiguous()):
                return None
        if self.positions is None:
            return list(args)
        leaves = list(self.template)
        for position, arg in zip(self.positions, args):
            leaves[position] = arg
        return leaves


def _output_table(executable: _Executable, anchors: dict) -> list:
    """Per distinct output: its host shape (PopTorch's §2.4 stacking: the anchor's batches
    stacked along dim 0; None when the anchor array already has it) and the dtype it narrows
    to (int64 -> int32, float64 -> float32)."""
    table = []
    for name in dict.fromkeys(executable.traced.output_names):
        array = anchors[name]
        sample = tuple(executable.session.getInfo(name).shape())
        count = array.size // max(int(np.prod(sample, dtype=np.int64)), 1) if sample else (
            array.size)
        if count > 1:
            shape = (count * sample[0], *sample[1:]) if sample else (count,)
        else:
            shape = sample
        table.append((name, None if array.shape == shape else shape,
                      _NARROW.get(torch.from_numpy(array).dtype)))
    return table


def _init_distributed(options: Options) -> None:
    """Several processes: make sure torch.distributed can meet its peers (spec §5.3).

    The backend joins the env:// rendezvous (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, as
    torchrun sets them). When the process id came from elsewhere (configureProcessId, Open
    MPI's variables) RANK / WORLD_SIZE may be missing: then the process group is created here
    with this process's id and count, and the backend uses it."""
    process_id, processes = options.Distributed._resolved()
    if processes <= 1:
        return
    import datetime
    import os

    import torch.distributed as dist

    if dist.is_initialized():
        return
    if os.environ.get("RANK") and os.environ.get("WORLD_SIZE"):
        if (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) != (process_id, processes):
            raise Error(f"Options.Distributed: process {process_id} of {processes}, but the "
                        f"environment says RANK={os.environ['RANK']} of WORLD_SIZE="
                        f"{os.environ['WORLD_SIZE']}; make them agree.")
        return  # the backend's env:// rendezvous reads them
    missing = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(n)]
    if missing:
        raise Error(f"Options.Distributed: {processes} processes need a rendezvous address; set "
                    f"{' and '.join(missing)} (the same on every process), or launch with "
                    f"torchrun.")
    try:
        timeout = float(os.environ.get("POPART_DISTRIBUTED_TIMEOUT") or 120.0)
    except ValueError:
        timeout = 120.0
    try:
        dist.init_process_group("gloo", init_method="env://", rank=process_id,
                                world_size=processes,
                                timeout=datetime.timedelta(seconds=timeout))
    except Exception as exc:  # torch raises RuntimeError subclasses on timeouts
        raise Error(f"Options.Distributed: process {process_id} of {processes} could not meet "
                    f"its peers at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
                    f"within {timeout:g} s (POPART_DISTRIBUTED_TIMEOUT): {exc}") from exc
    # A gloo group alive at interpreter exit can abort the process; close the one made here.
    atexit.register(lambda: dist.destroy_process_group() if dist.is_initialized() else None)


def _host_array(session, tensor_id: str) -> np.ndarray:
    """A zeroed array shaped like the session's variable ``tensor_id``."""
    try:
        info = session.getInfo(tensor_id)
    except popart.popart_exception as exc:
        raise Error(f"The compiled session has no optimizer tensor '{tensor_id}' (the backend "
                    f"names optimizer state as docs/training.md fixes: Accl___<w>, "
                    f"Accl1___<w>, Step___<w>, ...): {exc}") from exc
    return np.zeros(tuple(info.shape()), dtype=np.dtype(info.data_type_lcase()))


def _state_step(optimizer) -> int | None:
    """The step count stored in a torch optimizer's state, if any."""
    for entry in optimizer.state.values():
        step = entry.get("step") if isinstance(entry, dict) else None
        if step is not None:
            return int(float(step))
    return None


def _numpy_dtype(dtype: torch.dtype):
    return torch.empty((), dtype=dtype).numpy().dtype


def _diff(old: tracing.InputSignature, new: tracing.InputSignature) -> str:
    if str(old.treedef) != str(new.treedef):
        return f"structure {old.treedef} became {new.treedef}"
    parts = []
    for a, b in zip(old.leaves, new.leaves):
        if a.describe() != b.describe():
            parts.append(f"input {a.path}: compiled with {a.describe()}, got {b.describe()}")
    return "; ".join(parts) or "input signature changed"


def find_loss(traced: tracing.TracedModel) -> str:
    """The one final loss among forward's outputs (P57): an IdentityLoss output, else the only
    0-d float output."""
    producers = {out: node for node in traced.proto.graph.node for out in node.output}
    outputs = list(dict.fromkeys(traced.output_names))
    marked = [o for o in outputs if o in producers and producers[o].op_type == "IdentityLoss"]
    if len(marked) == 1:
        return marked[0]
    shapes = {o.name: o.type.tensor_type for o in traced.proto.graph.output}
    scalars = [o for o in outputs if shapes[o].HasField("shape") and not shapes[o].shape.dim
               and shapes[o].elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)]
    candidates = marked or scalars
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise Error("no loss found in the traced graph; return a torch loss or wrap your "
                    "expression in poptorch_lite.identity_loss (the loss must be among "
                    "forward's returned values).")
    raise Error(f"{len(candidates)} independent losses ({', '.join(candidates)}); combine them "
                f"and wrap the sum in poptorch_lite.identity_loss.")


def backend_error(exc: Exception, traced: tracing.TracedModel) -> Error:
    """A backend exception as an Error carrying the user's source line when it names a node."""
    text = str(exc)
    location = ""
    for node_name, where in traced.node_locations.items():
        if f"'{node_name}'" in text or where in text:
            location = where
            break
    kind = "out_of_memory" if isinstance(exc, popart.OutOfMemoryException) else (
        "unsupported_op" if isinstance(exc, popart.UnsupportedOpError) else "popart_backend_error")
    return Error(f"{type(exc).__name__}: {text}", type=kind, location=location)
