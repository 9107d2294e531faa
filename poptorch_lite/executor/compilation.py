"""Compiling a wrapped module: trace, place, build and prepare a backend session per input
signature.

``CompileMixin`` gives ``PoplarExecutor`` its compile side: binding a call to ``forward``'s
signature, the executable keyed by input signature (one per wrapper: a call with other inputs
is an ``Error``, as in PopTorch), tracing with the train/eval flags the model had when wrapped,
stage / IPU placement, device acquisition and the ``InferenceSession`` / ``TrainingSession`` built from the traced ONNX
model. ``_Executable`` is one compiled signature. Also here: the compile hooks
(``registerPreCompileHook`` / ``registerPostCompileHook``), ``find_loss``
(the traced loss) and ``backend_error`` (a backend exception with the user's source line).
"""

from __future__ import annotations

import logging
import time
import warnings

import numpy as np
import onnx
import torch
import tqdm

import popart_backend as popart

from .. import blocks, optimizer_translation, phased, tracing
from ..errors import Error
from ..ops.core import apply_available_memory
from ..ops.ipu import apply_io_overlap
from ..options.enums import OutputMode
from . import replica_params
from .distributed import _init_distributed

__all__ = ["registerPostCompileHook", "registerPreCompileHook"]

_log = logging.getLogger("poptorch_lite")

_ART = {OutputMode.All: "All", OutputMode.Final: "Final", OutputMode.EveryN: "EveryN",
        OutputMode.Sum: "Sum"}

_pre_compile_hooks: list = []
_post_compile_hooks: list = []


def registerPreCompileHook(hook) -> None:  # noqa: N802 - PopTorch's name
    """Call ``hook()`` (no arguments) before every compilation."""
    _pre_compile_hooks.append(hook)


def registerPostCompileHook(hook) -> None:  # noqa: N802 - PopTorch's name
    """Call ``hook()`` (no arguments) after every compilation."""
    _post_compile_hooks.append(hook)


# The simulated machine's size (lite): more IPUs than this cannot be acquired.
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
        self.placement: blocks.Placement | None = None  # stages and IPUs
        # Per module of the model: the buffer names it had when compiled (see check_buffers).
        self.buffer_layout: list[tuple[str, torch.nn.Module, tuple[str, ...]]] = []
        # The buffer tensors themselves: a buffer reassigned on the host is caught too.
        self.buffer_tensors: dict[str, torch.Tensor] = {}
        # Training: (name, parameter, requires_grad when compiled); see check_buffers.
        self.grad_flags: list[tuple[str, torch.nn.Parameter, bool]] = []
        # Per distinct output name: (name, host shape or None when the anchor array has it
        # already, narrowed dtype or None), built on the first run from the anchor arrays
        # (their sizes are fixed by the compiled session).
        self.output_table: list[tuple] | None = None
        # Options.anchorTensor: short name -> backend id; their table (as output_table)
        # and their values from the last run, short name -> tensor.
        self.anchored: dict[str, str] = {}
        self.anchored_table: list[tuple] | None = None
        self.anchored_values: dict[str, torch.Tensor] | None = None
        # The step IO of every run (running.py): its inputs are set per call, its outputs
        # allocated by each run.
        self.stepio = None


class CompileMixin:
    """``PoplarExecutor``'s compile side: the executable cache and how an executable is built."""

    def compile(self, *args, **kwargs) -> None:
        """Trace and compile for these inputs without running."""
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
        """The executable of ``signature``: the compiled one, or a new one when the wrapper is
        not compiled yet. A wrapper holds at most one executable (``_active``; compiling,
        ``loadExecutable`` and ``destroy`` keep ``_executables`` to it), so there is never
        another one to switch to."""
        key = signature.key()
        executable = self._executables.get(key)
        if executable is not None:
            return executable
        if self._active is not None:
            # As PopTorch: a compiled wrapper takes only the inputs it was compiled for.
            change = _diff(self._active.traced.signature, signature)
            raise Error(f"The inputs differ from those used to compile: {change}. "
                        f"A compiled wrapper only takes inputs of the compiled structure, "
                        f"shapes, dtypes and constant values; build a new wrapper or call "
                        f"destroy() to recompile.", type="input_changed")
        executable = self._compile(leaves, signature)
        self._executables[key] = executable
        self._pull_host()  # the host is current before the first run
        self.__dict__["_active"] = executable
        return executable

    def _compile(self, leaves, signature) -> _Executable:
        for hook in _pre_compile_hooks:
            hook()
        start = time.monotonic()
        self._pull_host()  # the trace bakes the host weights into the initializers
        divisor = tracing.check_combined_batch(signature, self._options)
        kind = "training" if self._training else "inference"
        with tqdm.tqdm(total=3, desc=f"Compiling {kind} model", unit="phase", leave=False,
                       disable=not self._options.show_compilation_progress_bar) as bar:
            bar.set_postfix_str("trace + ONNX export")
            traced = self._trace(leaves, signature, divisor)
            self._check_int64_state(traced.param_map.values())
            bar.update()
            bar.set_postfix_str("check ops")
            tracing.check_supported(traced)
            if self._training:
                self._check_batch_norms()
            self._check_replicated_buffers(traced)
            self._check_mutations(traced, divisor)
            bar.update()
            bar.set_postfix_str("build session + prepareDevice")
            placement = self._place(traced)
            session, translation, anchored = self._build_session(traced, placement)
            device_weights = self._device_weight_map(session, traced)
            bar.update()
        executable = _Executable(traced, session, divisor, device_weights, translation)
        executable.placement = placement
        executable.anchored = anchored
        executable.buffer_layout = [(path, m, tuple(m._buffers))
                                    for path, m in self._user_model.named_modules()]
        executable.buffer_tensors = dict(self._user_model.named_buffers())
        if translation is not None:  # training: which parameters the compiled model trains
            executable.grad_flags = [(name, p, p.requires_grad) for name, p
                                     in torch.nn.Module.named_parameters(self._user_model)]
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
                exporter=self._options.Jit.exporter_name,
                excludes=self._options.source_location_excludes)
        finally:
            for name, module in modules.items():
                module.training = saved[name]

    def _device_seed(self) -> int:
        """``Options.randomSeed`` or, unset, torch's ``initial_seed()`` as PopTorch does, so a
        ``torch.manual_seed(s)`` before compiling makes the device's random ops reproducible."""
        if self._options.random_seed is not None:
            return self._options.random_seed
        return torch.initial_seed() % 2**63

    def _place(self, traced: tracing.TracedModel) -> blocks.Placement:
        """Stages and IPUs from the traced blocks and the execution strategy."""
        strategy = self._options.execution_strategy
        if phased.is_phased(strategy):  # SerialPhasedExecution / ParallelPhasedExecution
            return phased.place_phased(traced.proto, strategy)
        placement = blocks.place_model(traced.proto, strategy)
        blocks.check_pipeline_depth(placement, self._training,
                                    self._options.Training.gradient_accumulation,
                                    self._options.device_iterations)
        return placement

    def _num_ipus(self, placement: blocks.Placement) -> int:
        """Device IPUs = replicas × IPUs per replica, power of two unless rounded."""
        replicas = self._options.replication_factor
        needed = placement.ipus_per_replica * replicas
        if needed > MAX_IPUS:
            raise Error(f"too many IPUs requested ({needed}): {placement.ipus_per_replica} IPU(s) "
                        f"per replica × replicationFactor({replicas}) exceeds the simulated "
                        f"machine's {MAX_IPUS} IPUs. Lower replicationFactor or place the model "
                        f"on fewer IPUs.")
        if needed & (needed - 1):
            if not self._options.auto_round_num_ipus:
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
        options = self._options
        manager = popart.DeviceManager()
        connection = popart.DeviceConnectionType[options.connection_type.name]
        if connection is popart.DeviceConnectionType.Never:
            version = options.offline_ipu_version or 2
            device = manager.createOfflineIPUDevice(
                {"numIPUs": num_ipus, "ipuVersion": f"ipu{version}"})
        elif options.use_ipu_model:
            device = manager.createIpuModelDevice({"numIPUs": num_ipus})
        elif options.ipu_id is not None:
            device = manager.acquireDeviceById(options.ipu_id, connectionType=connection)
        else:
            device = manager.acquireAvailableDevice(
                num_ipus, pattern=popart.SyncPattern[options.sync_pattern.name],
                connectionType=connection)
        if device is None:
            raise Error(f"failed to acquire {num_ipus} IPU(s): every simulated IPU of that size "
                        f"is in use. Call detachFromDevice() or destroy() on another wrapper.")
        self.__dict__["_device"] = device
        return device

    def _build_session(self, traced: tracing.TracedModel, placement: blocks.Placement):
        traced = replica_params.annotated(self, traced)  # replicaGrouping: values per group
        mode = self._options.resolved_output_mode(self._training)
        period = self._options.output_return_period
        n = self._options.device_iterations
        art = _anchor_art(mode, period, n, f"outputMode(EveryN, {period})")
        session_options = self._options.to_backend(self._training)
        apply_available_memory(traced.proto)  # set_available_memory: its op's own proportion
        blocks.apply_memory_proportions(traced.proto,
                                        self._options.available_memory_proportion)
        # set_overlap_for_input/output: IO-tile streams (inputs in the model's metadata).
        overlapped, overlap = apply_io_overlap(traced.proto, session_options.numIOTiles)
        if overlap:  # overlapped IO runs in explicit loops with host-copy ops (PopART's rule)
            session_options.useHostCopyOps = True
            session_options.enableExplicitMainLoops = True
        anchors = {name: _anchor_art(mode, period, n, f"outputMode(EveryN, {period})",
                                     overlapped[name]) if name in overlapped else art
                   for name in dict.fromkeys(traced.output_names)}
        # An input's new value is read back for every micro-batch, whatever the output mode.
        anchors.update({name: popart.AnchorReturnType("All") for _, name in traced.input_updates})
        anchored = self._anchored_tensors(anchors)
        data_flow = popart.DataFlow(n, anchors)
        # wrapper.rng_state reads and writes the device RNG (getRNGState / setRNGState).
        session_options.enableLoadAndOffloadRNGState = True
        if placement.strategy == "phased":
            phased.apply_phase_options(session_options, placement,
                                       self._options.execution_strategy)
        elif placement.multi_ipu:
            session_options.virtualGraphMode = popart.VirtualGraphMode.Manual
            session_options.enablePipelining = placement.pipelined
        elif session_options.numIOTiles:
            # IO tiles split each IPU's graph: the backend needs virtual graphs for that.
            session_options.virtualGraphMode = popart.VirtualGraphMode.Auto
        profiling_dir = self._options.profiling_dir
        if profiling_dir is not None:
            session_options.engineOptions = {**session_options.engineOptions,
                                             "autoReport.all": "true",
                                             "autoReport.directory": profiling_dir}
        device = self._acquire_device(self._num_ipus(placement))
        _init_distributed(self._options)
        translation = None
        try:
            if self._training:
                session, translation = self._build_training_session(
                    traced, data_flow, device, session_options)
            else:
                session = popart.InferenceSession(traced.proto, data_flow, device,
                                                  patterns=self._options.backend_patterns(),
                                                  userOptions=session_options,
                                                  name=self._options.model_name or "inference")
            session.setRandomSeed(self._device_seed())
            session.prepareDevice()
            if not self._offline():
                session.weightsFromHost()
        except popart.popart_exception as exc:
            for short, long_name in anchored.items():
                if f"Anchor '{long_name}' is not a tensor" in str(exc):
                    raise Error(f"Options.anchorTensor({short!r}, {long_name!r}): no such tensor "
                                f"in the compiled model; use an id of wrapper.getTensorNames(). "
                                f"{exc}") from exc
            raise backend_error(exc, traced) from exc
        if translation is not None and not self._offline() and self._optimizer.state:
            # e.g. Adagrad's initial accumulator, or a state loaded from a checkpoint
            self._write_optimizer_state(session, translation)
        return session, translation, anchored

    def _anchored_tensors(self, anchors: dict) -> dict[str, str]:
        """Add the tensors of ``Options.anchorTensor`` to ``anchors``; returns short name
        -> backend id. The backend checks that the ids exist (in training after its passes, so
        ``Gradient___<id>`` of weights and of activations too)."""
        named = {}
        for short, (long_name, mode, period) in self._options.anchored_tensors.items():
            what = f"Options.anchorTensor({short!r}, {long_name!r})"
            if isinstance(mode, str):  # after toDict() / from_json: "OutputMode.All"
                mode = OutputMode[mode.rpartition(".")[2]]
            if mode is None:
                mode, period = self._options.output_mode, self._options.output_return_period
            if mode is OutputMode.Default:
                mode = OutputMode.Final if self._training else OutputMode.All
            period = period or 1
            art = _anchor_art(mode, period, self._options.device_iterations,
                              f"{what} with EveryN, {period}")
            if anchors.get(long_name, art) != art:
                raise Error(f"{what}: '{long_name}' is already returned with "
                            f"{anchors[long_name]}; anchor it with that output mode.")
            anchors[long_name] = art
            named[short] = long_name
        return named

    def _build_training_session(self, traced, data_flow, device, session_options):
        loss_id = find_loss(traced)
        translation = optimizer_translation.translate(
            self._optimizer, self._user_model, traced.param_map,
            self._running_stat_names() | set(traced.updated_buffers),
            variable_loss_scaling=session_options.automaticLossScalingSettings.enabled)
        optimizer_translation.mark_frozen(traced.proto, translation.frozen)
        session = popart.TrainingSession(traced.proto, data_flow, loss_id, translation.backend,
                                         device, patterns=self._options.backend_patterns(),
                                         userOptions=session_options,
                                         name=self._options.model_name or "training")
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

    def _check_replicated_buffers(self, traced: tracing.TracedModel) -> None:
        """Replicated training with buffers updated in place needs broadcastBuffers(False):
        each replica then keeps its own copy and the host reads replica 0's."""
        replicas = self._options.replication_factor
        if not self._training or replicas == 1 or not self._options.broadcast_buffers:
            return
        mutated = sorted(self._running_stat_names()) + list(traced.updated_buffers)
        if mutated:
            raise Error(
                f"replicationFactor({replicas}) in training with buffers updated in place "
                f"({', '.join(repr(m) for m in mutated[:4])}"
                f"{', ...' if len(mutated) > 4 else ''}): broadcasting buffers from replica 0 "
                f"is not supported. Set Options.broadcastBuffers(False) to let each replica keep "
                f"its own copy (the host then reads replica 0's).")

    def _check_mutations(self, traced: tracing.TracedModel, divisor: int) -> None:
        """In-place updates in ``forward`` that have no exact device form are refused here:
        parameters in a training wrapper (an inference wrapper keeps them as device state, like
        buffers), and a 0-d input every micro-batch shares (eager's calls would each
        change it, one after the other)."""
        if self._training and traced.updated_parameters:
            fqn = traced.updated_parameters[0]
            raise Error(
                f"forward updates the parameter '{fqn}' in place (e.g. `with torch.no_grad(): "
                f"self.{fqn} += ...` or `.copy_()`). A training wrapper changes parameters only "
                f"through the optimizer: the device would differentiate through the update and "
                f"order it against the optimizer step, which differs from eager torch. Change "
                f"the parameter outside forward (then call copyWeightsToDevice()), or register "
                f"the tensor as a buffer if it is not trained.", type="parameter_mutation",
                location=traced.mutation_locations.get(fqn, ""))
        copies = divisor * self._options.input_replica_grouping[0]
        for index, _ in traced.input_updates:
            spec = traced.signature.leaves[index]
            if not spec.shape and copies > 1:
                raise Error(
                    f"forward updates its 0-d input '{spec.path}' in place, but "
                    f"{copies} micro-batches (deviceIterations × replicas × "
                    f"gradientAccumulation) each see the same value, so there is no single new "
                    f"value to copy back. Give it a batch dimension, or return the new value "
                    f"instead of updating the input.", type="input_mutation",
                    location=traced.mutation_locations.get(spec.path, ""))

    def _running_stat_names(self) -> set[str]:
        names = set()
        for name, _ in self._batch_norms():
            prefix = f"{name}." if name else ""
            names.update((prefix + "running_mean", prefix + "running_var"))
        return names

    def _device_weight_map(self, session, traced: tracing.TracedModel) -> dict[str, str]:
        """The mapped initializers the session keeps as device weights (others are constants)."""
        held = {}
        inits = {i.name: i for i in traced.proto.graph.initializer}
        for onnx_name, fqn in traced.param_map.items():
            init = inits[onnx_name]
            array = np.empty(replica_params.read_shape(self, fqn, tuple(init.dims)),
                             dtype=onnx.helper.tensor_dtype_to_np_dtype(init.data_type))
            try:
                session.readWeights(popart.PyWeightsIO({onnx_name: array}))
            except popart.popart_exception:
                _log.debug("'%s' (%s) is a constant of the compiled model", fqn, onnx_name)
                continue
            held[onnx_name] = fqn
        return held


def _anchor_art(mode: OutputMode, period: int, n: int, what: str, io_strategy=None):
    """The anchor of an output mode; with ``io_strategy`` streamed through the IO tiles."""
    if mode is OutputMode.EveryN and n % period:
        raise Error(f"{what}: the period must divide deviceIterations ({n}).")
    where = () if io_strategy is None else (
        popart.TileSet.IO, popart.ExchangeStrategy[io_strategy])
    return (popart.AnchorReturnType("EveryN", period, *where) if mode is OutputMode.EveryN
            else popart.AnchorReturnType(_ART[mode], *where))


def check_buffers(executable: _Executable) -> None:
    """Raise Error when the model's buffers were registered or removed after compiling, or a
    parameter's ``requires_grad`` changed since a training model was compiled: the compiled
    executable would silently ignore the change."""
    changed = [name for name, param, flag in executable.grad_flags
               if param.requires_grad != flag]
    if changed:
        now = executable.grad_flags[[n for n, _, _ in executable.grad_flags].index(changed[0])]
        raise Error(
            f"requires_grad of {', '.join(repr(n) for n in changed)} changed after the "
            f"training model was compiled (e.g. '{changed[0]}' was {now[2]}, is "
            f"{not now[2]}); the compiled model still trains the parameters it was compiled "
            f"with. Set requires_grad before the first call, or wrap the model in a new "
            f"wrapper (destroy() this one first).", type="requires_grad_changed")
    for path, module, names in executable.buffer_layout:
        current = tuple(module._buffers)
        if current != names:
            added = [n for n in current if n not in names]
            removed = [n for n in names if n not in current]
            prefix = f"{path}." if path else ""
            change = "; ".join(
                [f"registered {', '.join(repr(prefix + n) for n in added)}"] * bool(added)
                + [f"removed {', '.join(repr(prefix + n) for n in removed)}"] * bool(removed))
            raise Error(
                f"The model's buffers changed after it was compiled ({change}); the compiled "
                f"model cannot see the change. Register buffers in __init__, before the first "
                f"call, or wrap the changed model in a new wrapper (destroy() this one first).",
                type="buffer_changed")
    if executable.buffer_tensors:
        # The plain nn.Module method: the weight-sync hook of named_buffers would copy every
        # device weight to the host on each run, and only tensor identity matters here.
        current = dict(torch.nn.Module.named_buffers(executable.buffer_layout[0][1]))
        replaced = [name for name, tensor in executable.buffer_tensors.items()
                    if name in current and current[name] is not tensor]
        if replaced:
            raise Error(
                f"The model's buffer(s) {', '.join(repr(n) for n in replaced)} were reassigned "
                f"(a new tensor object) after the model was compiled; the compiled model keeps "
                f"the old tensor and would not see the new values. Update buffers in place "
                f"(e.g. model.{replaced[0]}.copy_(new_value)) and call "
                f"wrapper.copyWeightsToDevice(), or wrap the model in a new wrapper.",
                type="buffer_changed")


def _diff(old: tracing.InputSignature, new: tracing.InputSignature) -> str:
    """What changed between the compiled inputs and a call's, argument by argument."""
    before = {leaf.path: leaf for leaf in old.leaves}
    after = {leaf.path: leaf for leaf in new.leaves}
    parts = []
    for path, leaf in before.items():
        if path not in after:
            parts.append(f"input {path}: expected {leaf.describe()}, got nothing (missing)")
        elif leaf.describe() != after[path].describe():
            parts.append(f"input {path}: expected {leaf.describe()}, "
                         f"got {after[path].describe()}")
    extra = [path for path in after if path not in before]
    if extra:
        shown = ", ".join(f"{path}={after[path].describe()}" for path in extra[:4])
        more = f" and {len(extra) - 4} more" if len(extra) > 4 else ""
        parts.append(f"inputs not in the compiled signature: {shown}{more}")
    if not parts:
        parts.append(_structure_diff(old.treedef, new.treedef, "input")
                     or f"the container structure differs: expected {old.treedef}, "
                        f"got {new.treedef}")
    if len(parts) > 6:
        parts = parts[:6] + [f"{len(parts) - 6} more"]
    return "; ".join(parts)


def _structure_diff(old, new, path: str) -> str | None:
    """The first place two input tree specs differ, said plainly: a container of another
    type or length, or a changed non-tensor field of a custom argument type."""
    if old.type is not new.type or old.num_children != new.num_children:
        return (f"{path}: expected {getattr(old.type, '__name__', old.type)} of "
                f"{old.num_children} item(s), got {getattr(new.type, '__name__', new.type)} of "
                f"{new.num_children}")
    if old.context != new.context:
        before, after = getattr(old.context, "fields", None), getattr(new.context, "fields", None)
        if before is None or after is None:
            return f"{path}: expected {old.context!r}, got {new.context!r}"
        return "; ".join(f"{path}.{k}: expected {before.get(k)!r}, got {after.get(k)!r}"
                         for k in sorted(set(before) | set(after), key=str)
                         if before.get(k) != after.get(k))
    keys = old.context if isinstance(old.context, list) else range(old.num_children)
    for i, key in enumerate(keys):
        found = _structure_diff(old.child(i), new.child(i), f"{path}[{key!r}]")
        if found:
            return found
    return None


def find_loss(traced: tracing.TracedModel) -> str:
    """The one final loss among forward's outputs: of the outputs that are losses (an
    IdentityLoss, or a 0-d float result of a torch loss function), the one no other consumes;
    without any, the only 0-d float output."""
    producers = {out: node for node in traced.proto.graph.node for out in node.output}
    outputs = list(dict.fromkeys(traced.output_names))
    shapes = {o.name: o.type.tensor_type for o in traced.proto.graph.output}
    scalars = [o for o in outputs if shapes[o].HasField("shape") and not shapes[o].shape.dim
               and shapes[o].elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)]
    marked = [o for o in outputs if o in producers and producers[o].op_type == "IdentityLoss"]
    losses = marked + [o for o in scalars if o in traced.loss_outputs and o not in marked]
    final = [o for o in losses
             if not any(o in _ancestors(other, producers) for other in losses if other != o)]
    if len(final) == 1:
        if final[0] in marked:
            return _seeded_loss(traced.proto, producers[final[0]])
        return final[0]
    candidates = final or scalars
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise Error("no loss found in the traced graph: a training model's forward must return "
                    "its loss, a 0-d float32 or float16 tensor (or one wrapped in "
                    "poptorch_lite.identity_loss), among its returned values; forward returned "
                    f"{_describe_outputs(outputs, shapes)}.")
    raise Error(f"{len(candidates)} independent losses ({', '.join(candidates)}); combine them "
                f"and wrap the sum in poptorch_lite.identity_loss.")


def _ancestors(name: str, producers: dict) -> set[str]:
    """Every value ``name`` is computed from."""
    seen, stack = set(), [name]
    while stack:
        node = producers.get(stack.pop())
        if node is None:
            continue
        for value in node.input:
            if value and value not in seen:
                seen.add(value)
                stack.append(value)
    return seen


def _describe_outputs(outputs: list[str], types: dict) -> str:
    """``forward``'s outputs as "'name' dtype[shape]", for the no-loss error."""
    parts = []
    for name in outputs:
        kind = types[name]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type).name if kind.elem_type \
            else "?"
        dims = [d.dim_value if d.HasField("dim_value") else "?" for d in kind.shape.dim] \
            if kind.HasField("shape") else "?"
        parts.append(f"'{name}' {dtype}{dims}")
    return ", ".join(parts) if parts else "no tensors"


_NO_REDUCTION = 2  # IdentityLoss's reduction attribute: 0 sum, 1 mean, 2 none


def _seeded_loss(proto: onnx.ModelProto, node: onnx.NodeProto) -> str:
    """The session loss for the final IdentityLoss ``node``: its output, or for reduction
    "none" (backward seeds ones of x's shape; the backend starts from a scalar) an added
    ``IdentityLoss(x, sum)`` beside it, whose gradient with respect to x is those ones."""
    reduction = next((onnx.helper.get_attribute_value(a) for a in node.attribute
                      if a.name == "reduction"), 1)
    if reduction != _NO_REDUCTION:
        return node.output[0]
    seed = f"{node.output[0]}/backward_seed"
    if not any(seed in n.output for n in proto.graph.node):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        attrs["reduction"] = 0
        proto.graph.node.append(onnx.helper.make_node(
            "IdentityLoss", [node.input[0]], [seed], name=f"{node.name}/backward_seed",
            domain=node.domain, **attrs))
    return seed


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
