"""``PoplarExecutor``: the wrapper that compiles a module for the simulated IPU and runs it
(spec §2.1-§2.4, P1-P20, P24, P25).

A call binds the arguments to ``forward``'s signature, flattens them, and looks up the
executable compiled for that input signature (a new signature traces and compiles again, with a
warning). The executable is a ``popart_backend`` session built from the traced ONNX model; inputs
go in as one ``PyStepIO`` per call (``deviceIterations`` × accumulation micro-batches), outputs
come back per ``OutputMode`` reshaped PopTorch-style (§2.4 stacking rule).
"""

from __future__ import annotations

import logging
import time
import warnings

import numpy as np
import onnx
import popart_backend as popart
import torch
from torch.utils import _pytree as pytree

from . import tracing
from .blocks import block_annotations
from .errors import Error
from .options import ConnectionType, Options, OutputMode

__all__ = ["PoplarExecutor"]

_log = logging.getLogger("poptorch_lite")

_ART = {OutputMode.All: "All", OutputMode.Final: "Final", OutputMode.EveryN: "EveryN",
        OutputMode.Sum: "Sum"}
_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}

_pre_compile_hooks: list = []
_post_compile_hooks: list = []


class _Executable:
    """One compiled input signature: traced model, backend session and IO tables."""

    def __init__(self, traced: tracing.TracedModel, session, divisor: int, device_weights):
        self.traced = traced
        self.session = session
        self.divisor = divisor
        self.device_weights = device_weights  # ONNX initializer -> FQN, device-held only


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
        if self._training and self.isCompiled() and self._attached:
            self.copyWeightsToHost()
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
        if self._active is not None and self._training and self._attached:
            self.copyWeightsToHost()
        self.__dict__["_active"] = executable
        if not fresh and self._attached:
            self.copyWeightsToDevice()

    def _compile(self, leaves, signature) -> _Executable:
        for hook in _pre_compile_hooks:
            hook()
        start = time.monotonic()
        divisor = tracing.check_combined_batch(signature, self._options)
        traced = self._trace(leaves, signature, divisor)
        tracing.check_supported(traced)
        session = self._build_session(traced)
        device_weights = self._device_weight_map(session, traced)
        executable = _Executable(traced, session, divisor, device_weights)
        self.__dict__["_compile_seconds"] = time.monotonic() - start
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

    def _num_ipus(self, traced: tracing.TracedModel) -> int:
        ipus = [a.i for node in traced.proto.graph.node for a in node.attribute
                if a.name == tracing.IPU_ATTR]
        needed = (max(ipus) + 1 if ipus else 1) * self._options.replication_factor
        if needed & (needed - 1):
            if not self._options._values["autoRoundNumIPUs"]:
                raise Error(f"The model needs {needed} IPUs, which is not a power of two. Use "
                            f"Options.autoRoundNumIPUs(True) to round up (extra IPUs idle).")
            needed = 1 << (needed - 1).bit_length()
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
            device = manager.acquireAvailableDevice(num_ipus, connectionType=connection)
        if device is None:
            raise Error(f"failed to acquire {num_ipus} IPU(s): every simulated IPU of that size "
                        f"is in use. Call detachFromDevice() or destroy() on another wrapper.")
        self.__dict__["_device"] = device
        return device

    def _build_session(self, traced: tracing.TracedModel):
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
        device = self._acquire_device(self._num_ipus(traced))
        try:
            if self._training:
                session = self._build_training_session(traced, data_flow, device,
                                                       session_options)
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
        return session

    def _build_training_session(self, traced, data_flow, device, session_options):
        from .optim import to_backend_optimizer

        loss_id = find_loss(traced)
        fqn_to_onnx = {fqn: name for name, fqn in traced.param_map.items()}
        optimizer = to_backend_optimizer(self._optimizer, self._user_model, fqn_to_onnx)
        return popart.TrainingSession(traced.proto, data_flow, loss_id, optimizer, device,
                                      userOptions=session_options,
                                      name=self._options._values["modelName"] or "training")

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

    def copyWeightsToDevice(self) -> None:  # noqa: N802
        """The user model's parameters and buffers -> device (P9)."""
        executable = self._require_compiled("copyWeightsToDevice()")
        state = self._state_tensors()
        arrays = {onnx_name: np.ascontiguousarray(state[fqn].detach().cpu().numpy())
                  for onnx_name, fqn in executable.device_weights.items()}
        executable.session.writeWeights(popart.PyWeightsIO(arrays))
        executable.session.weightsFromHost()

    # --- device ------------------------------------------------------------------------------

    def detachFromDevice(self) -> None:  # noqa: N802
        self._require_compiled("detachFromDevice()")
        if not self._attached:
            raise Error("detachFromDevice(): the device is not attached.")
        if self._training:
            self.copyWeightsToHost()
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

    def destroy(self) -> None:
        """Sync weights (training), release the device and drop every executable (P14)."""
        if not self.isCompiled():
            return
        if self._training and self._attached:
            self.copyWeightsToHost()
        if self._device is not None:
            self._device.detach()
        d = self.__dict__
        d["_executables"] = {}
        d["_active"] = None
        d["_device"] = None
        d["_attached"] = False

    def compilationTime(self):  # noqa: N802
        import datetime

        self._require_compiled("compilationTime()")
        return datetime.timedelta(seconds=self._compile_seconds)

    # --- run ---------------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        leaves, signature = self._signature(args, kwargs)
        leaves = self._prepare_leaves(leaves, signature)
        executable = self._select(leaves, signature)
        if self._offline():
            raise Error("The model is compiled for an offline target "
                        "(connectionType(Never) / useOfflineIpuTarget); use compile() only.")
        if not self._attached:
            self.attachToDevice()
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

    def _run(self, executable: _Executable, leaves):
        traced = executable.traced
        inputs = {}
        for leaf, spec, name in zip(leaves, traced.signature.leaves, traced.input_names):
            if name is None:
                continue
            array = leaf.cpu().numpy()
            if not spec.shape:
                # 0-d tensors are not sliced: every micro-batch sees the same value.
                array = np.ascontiguousarray(np.broadcast_to(array, (executable.divisor,)))
            inputs[name] = np.ascontiguousarray(array)
        session = executable.session
        anchors = session.initAnchorArrays()
        try:
            session.run(popart.PyStepIO(inputs, anchors))
        except popart.popart_exception as exc:
            raise backend_error(exc, traced) from exc
        return self._outputs(executable, anchors)

    def _outputs(self, executable: _Executable, anchors: dict):
        traced = executable.traced
        session = executable.session
        results = {}
        for name in dict.fromkeys(traced.output_names):
            array = anchors[name]
            sample = tuple(session.getInfo(name).shape())
            tensor = torch.from_numpy(array)
            count = array.size // max(int(np.prod(sample, dtype=np.int64)), 1) if sample else (
                array.size)
            if count > 1:
                tensor = tensor.reshape((count * sample[0], *sample[1:]) if sample else (count,))
            else:
                tensor = tensor.reshape(sample)
            results[name] = tensor.to(_NARROW.get(tensor.dtype, tensor.dtype))
        leaves = []
        for index, source in enumerate(traced.output_leaf_sources):
            if source is None:
                leaves.append(traced.output_constants.get(index))
            else:
                leaves.append(results[traced.output_names[source]])
        if traced.output_spec is None:
            return leaves[0] if len(leaves) == 1 else tuple(leaves)
        return pytree.tree_unflatten(leaves, traced.output_spec)



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
