"""``PoplarExecutor``: the wrapper that compiles a module for the simulated IPU and runs it, and
the functions that make one (``ipu_model``,
``inferenceModel``, ``trainingModel``).

This module holds the wrapper itself: its construction (options frozen and privately copied,
the train/eval flags to trace, the training link to the user model), the pass-through to the
user model, the compiled / attached state, attach / detach / destroy and the pipeline summary.
The rest of its behaviour comes from mixins, one module each:

- ``compilation.py`` (``CompileMixin``): a call binds the arguments to ``forward``'s signature,
  flattens them, and looks up the executable compiled for that input signature (a new signature
  traces and compiles again, with a warning). The executable is a ``popart_backend`` session
  built from the traced ONNX model.
- ``running.py`` (``RunMixin``): inputs go in as one ``PyStepIO`` per call
  (``deviceIterations`` × accumulation micro-batches), outputs come back per ``OutputMode``
  reshaped PopTorch-style (stacked by output mode).
- ``state_sync.py`` (``StateSyncMixin``): training wrappers build the backend optimizer from the
  torch/lite optimizer (``optimizer_translation.py``), leave the host weights stale after each
  run and pull them on first host access (``weight_sync.py``), and move optimizer state
  between the device and ``optimizer.state`` (torch's format) when ``optimizer.state_dict()`` is
  called, at ``detachFromDevice()`` / ``destroy()``, and after ``load_state_dict``.
- ``distributed.py``: the multi-process rendezvous.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import warnings
import weakref

import torch

import popart_backend as popart

from .. import blocks, optim
from ..blocks import block_annotations
from ..errors import Error
from ..options.enums import ConnectionType, OutputMode
from ..options.options import Options
from . import replica_params, weight_sync
from .compilation import (
    CompileMixin,
    _Executable,
)
from .executable import ExecutableMixin, prepare_load
from .introspection import IntrospectionMixin
from .running import RunMixin
from .state_sync import StateSyncMixin

__all__ = ["PoplarExecutor", "inferenceModel", "ipu_model", "load", "poptorchAtExit",
           "trainingModel"]

_log = logging.getLogger("poptorch_lite")

# Every wrapper alive, for poptorchAtExit.
_LIVE: "weakref.WeakSet[PoplarExecutor]" = weakref.WeakSet()


class PoplarExecutor(ExecutableMixin, CompileMixin, RunMixin, StateSyncMixin,
                     IntrospectionMixin):
    """A module compiled for the simulated IPU; use like the module (``wrapper(x)``).

    Thread safety: a wrapper may be shared by threads. It has one (re-entrant) lock, held by
    calls and by every method that compiles, moves weights, optimizer or RNG state, or
    attaches and detaches (``_LOCKED_MEMBERS``): a call made while another thread is inside
    one of them waits for it, so concurrent calls run one after the other, as sequential
    calls would.
    """

    def __init__(self, model: torch.nn.Module, options: Options | None, training: bool,
                 optimizer=None):
        if isinstance(model, PoplarExecutor):
            model = model.model
        if not isinstance(model, torch.nn.Module):
            raise Error(f"Expected a torch.nn.Module to wrap, got {type(model).__name__}.")
        options = Options() if options is None else options
        if not isinstance(options, Options):
            raise Error(f"options must be a poptorch_lite.Options, not {type(options).__name__}.")
        accumulation = options.Training.gradient_accumulation
        if not training and accumulation != 1:
            raise Error(
                f"Options.Training.gradientAccumulation({accumulation}) is only for training "
                f"wrappers; an inference wrapper needs 1. Use Options.deviceIterations to run "
                f"more batches per call.")
        if training and not isinstance(optimizer, torch.optim.Optimizer):
            raise Error(f"trainingModel: optimizer must be a torch.optim.Optimizer (e.g. "
                        f"poptorch_lite.optim.SGD(model.parameters(), lr=0.01)), not "
                        f"{type(optimizer).__name__} {optimizer!r}.")
        link = weight_sync.link_of(model)
        if training:
            if link.training is not None:
                raise RuntimeError(
                    "This model is already held by a training wrapper; call destroy() on it "
                    "before wrapping the model for training again.")
            if any(other.training is not None for other in weight_sync.links_over(model)):
                raise RuntimeError(
                    "A module of this model is already held by the training wrapper of another "
                    "model (e.g. a model containing it): two training wrappers would each move "
                    "the shared weights on their own device. Call destroy() on that wrapper "
                    "first.")
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
        d["_lock"] = threading.RLock()
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
        # Inference: the training links sharing modules with the model (cached per hook
        # generation) and the device version last pulled from each (link -> version).
        d["_links"] = (-1, ())
        d["_seen_versions"] = {}
        d["_optimizer_hooks"] = []
        d["_optimizer_state_dirty"] = False  # device optimizer state newer than the host's
        d["_optimizer_state_pending"] = False  # host optimizer state to write before a run
        d["_steps_done"] = 0  # optimizer steps made on the device since compile
        d["_micro_batches_pending"] = 0  # BatchNorm num_batches_tracked not yet on the host
        d["_fast"] = None  # _FastCall: the last call's signature, to skip re-binding it
        # RNG state read at detach, or set while detached: written to the device at attach.
        d["_rng_state_host"] = None
        # replicaGrouping settings: parameter name -> (CommGroupType, shards, retrieval mode)
        d["per_replica_params"] = {}
        # Their last read-back (replica_params.py): name -> [groups or replicas, *shape]
        d["per_replica_weights"] = {}
        replica_params.install_setters(self, model)
        _LIVE.add(self)
        if training:
            link.set_training(self)
            weight_sync.install_hooks(model, link)
            self._hook_optimizer(optimizer)

    def _pull_host(self) -> None:
        """Bring the host weights up to date with every training wrapper holding the model or
        a module it shares (its own link first)."""
        self._link.pull()
        for link in weight_sync.links_over(self._user_model):
            link.pull()

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
        value = getattr(model, name)
        if isinstance(value, torch.nn.Parameter):
            # wrapper.<param>.replicaGrouping(...) configures this wrapper
            replica_params.bind(self, name, value)
        return value

    def __setattr__(self, name, value):
        if (name in self.__dict__ or name in type(self).__dict__
                or name in _MIXIN_MEMBERS):
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
        self._pull_host()
        return self._user_model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True):
        """Load into the user model, then push to the device when attached."""
        result = self._user_model.load_state_dict(state_dict, strict=strict)
        if self.isCompiled() and self._attached:
            self.copyWeightsToDevice()
        return result

    def train(self, mode: bool = True) -> "PoplarExecutor":
        """Set the traced train/eval flag before compiling."""
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
        return self._options.connection_type is ConnectionType.Never

    def copyWeightsToHostIfNeeded(self) -> bool:  # noqa: N802
        """Copy the device weights to the host if a training run changed them since the last
        copy; True if it copied. Inference wrappers never change their weights implicitly."""
        if (self._training and self._link.host_dirty and self.isCompiled()
                and self._attached):
            self.copyWeightsToHost()
            return True
        return False

    # --- RNG ---------------------------------------------------------------------------------

    @property
    def rng_state(self) -> list[int]:
        """The device RNG's state, ``[seed, counter]`` per replica (the first value is the
        seed); assigning a state read earlier makes the next runs' random ops draw again
        what they drew after it was read."""
        executable = self._require_compiled("rng_state")
        if not self._attached:
            if self._rng_state_host is None:
                raise Error("rng_state: the device is not attached and holds no state read "
                            "at detach; call attachToDevice() first.")
            return list(self._rng_state_host)
        try:
            return executable.session.getRNGState()
        except popart.popart_exception as exc:
            raise Error(f"rng_state: the device cannot give its RNG state: {exc}") from exc

    @rng_state.setter
    def rng_state(self, state) -> None:
        executable = self._require_compiled("rng_state = ...")
        try:
            state = [int(v) for v in state]
        except (TypeError, ValueError):
            raise Error(f"rng_state = {state!r}: give a list of ints as wrapper.rng_state "
                        f"returns.") from None
        if not self._attached:
            self.__dict__["_rng_state_host"] = state
            return
        try:
            executable.session.setRNGState(state)
        except popart.popart_exception as exc:
            raise Error(f"rng_state = {state}: {exc}") from exc

    # --- device ------------------------------------------------------------------------------

    def detachFromDevice(self) -> None:  # noqa: N802
        self._require_compiled("detachFromDevice()")
        if not self._attached:
            raise Error("detachFromDevice(): the device is not attached.")
        if self._training:
            self.copyWeightsToHost()
            if self._optimizer_state_dirty:
                self._read_optimizer_state()
        self.__dict__["_rng_state_host"] = self.rng_state
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
        if self._rng_state_host is not None:
            self.rng_state = self._rng_state_host
            self.__dict__["_rng_state_host"] = None
        if self._training:
            self._write_optimizer_state()

    def destroy(self) -> None:
        """Sync weights and optimizer state (training), release the device, drop every
        executable and restore the user model's classes."""
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

    def getPipelineSummary(self) -> str:  # noqa: N802 - (lite)
        """Stages per IPU and the pipeline's fill / main / flush cycles; with
        ``Options.enableProfiling`` also the backend's ``getSummaryReport()``."""
        executable = self._require_compiled("getPipelineSummary()")
        text = blocks.schedule_summary(executable.placement, self._training,
                                       self._options.Training.gradient_accumulation,
                                       self._options.device_iterations,
                                       self._options.replication_factor)
        processes = self._options.Distributed.numProcesses
        if processes > 1:
            text += (f"\n  processes: {processes} (this one: "
                     f"{self._options.Distributed.processId}), global replicas: "
                     f"{processes * self._options.replication_factor}")
        if self._options.profiling_dir is not None:
            text += "\n" + executable.session.getSummaryReport(resetProfile=False)
        return text


# The members the mixins give the wrapper: like its class's own, they are set on the wrapper,
# not forwarded to the user model.
_MIXIN_MEMBERS = frozenset().union(*(vars(mixin) for mixin in (ExecutableMixin, CompileMixin,
                                                                 RunMixin, StateSyncMixin,
                                                                 IntrospectionMixin)))

# The members that hold the wrapper's lock (the class docstring).
_LOCKED_MEMBERS = (
    "__call__", "compile", "compileAndExport", "save", "loadExecutable", "copyWeightsToHost",
    "copyWeightsToDevice", "copyWeightsToHostIfNeeded", "copyNamedBuffersToDevice",
    "setOptimizer", "detachFromDevice", "attachToDevice", "destroy", "load_state_dict",
    "state_dict", "rng_state",
)


def _locked(function):
    @functools.wraps(function)
    def call(self, *args, **kwargs):
        with self.__dict__["_lock"]:
            return function(self, *args, **kwargs)

    return call


for _name in _LOCKED_MEMBERS:
    _member = getattr(PoplarExecutor, _name)
    if isinstance(_member, property):
        _member = property(_locked(_member.fget), _locked(_member.fset), doc=_member.__doc__)
    else:
        _member = _locked(_member)
    setattr(PoplarExecutor, _name, _member)


def backend_tensor_id(x) -> str:
    """The backend tensor id of ``x``: a parameter or buffer (the tensor itself, or its name
    in the model) of a model held by a live compiled wrapper. See ``getIpuTensorId``."""
    found = set()
    for wrapper in list(_LIVE):
        executable = wrapper.__dict__.get("_active")
        if executable is None:
            continue
        state = dict(wrapper._user_model.named_parameters(remove_duplicate=False))
        state.update(wrapper._user_model.named_buffers(remove_duplicate=False))
        names = [n for n, t in state.items() if (t is x if isinstance(x, torch.Tensor)
                                                   else n == x)]
        for onnx_name, fqn in executable.traced.param_map.items():
            if fqn in names:
                found.add(onnx_name)
    what = repr(x) if isinstance(x, str) else f"a {type(x).__name__} of shape " \
        f"{list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
    if len(found) == 1:
        return found.pop()
    if found:
        raise Error(f"getIpuTensorId({what}): the tensor is held by several compiled wrappers "
                    f"under different ids {sorted(found)}; destroy() the ones you no longer "
                    f"use, or read wrapper.getTensorNames().")
    raise Error(f"getIpuTensorId({what}): no compiled wrapper holds this tensor. Give a "
                f"parameter or buffer of a wrapped model (the tensor or its name, e.g. "
                f"'fc.weight') after the wrapper has compiled; other tensors of forward have "
                f"backend ids listed by wrapper.getTensorNames().")


def poptorchAtExit() -> None:  # noqa: N802 - PopTorch's name
    """Detach every live wrapper from its simulated IPUs (run at interpreter exit): training
    wrappers read their weights and optimizer state back first, as detachFromDevice() does."""
    released = 0
    for wrapper in list(_LIVE):
        if wrapper.isCompiled() and wrapper.isAttachedToDevice():
            wrapper.detachFromDevice()
            released += 1
    _log.debug("poptorchAtExit: detached %d wrapper(s)", released)


atexit.register(poptorchAtExit)


def inferenceModel(model: torch.nn.Module,  # noqa: N802 - PopTorch's name
                   options: Options | None = None) -> PoplarExecutor:
    """Wrap ``model`` for inference on the simulated IPU; compiled on the first call."""
    return PoplarExecutor(model, options, training=False)


def trainingModel(model: torch.nn.Module, options: Options | None = None,  # noqa: N802
                  optimizer=None) -> PoplarExecutor:
    """Wrap ``model`` for training; no optimizer means ``optim.SGD(lr=0.01)``."""
    if optimizer is None:
        optimizer = optim.SGD(model.parameters(), lr=0.01)
    return PoplarExecutor(model, options, training=True, optimizer=optimizer)


def ipu_model(model: torch.nn.Module, options: Options | None = None,
              optimizer=None) -> PoplarExecutor:
    """Training wrapper iff ``optimizer`` is given, else inference wrapper."""
    if optimizer is not None:
        return trainingModel(model, options, optimizer)
    if model.training:
        warnings.warn("ipu_model(): no optimizer given, so an inference wrapper was built for a "
                      "model in training mode; pass an optimizer (or use trainingModel(), which "
                      "defaults to SGD) to train.", UserWarning, stacklevel=2)
    return inferenceModel(model, options)


def load(filename, edit_opts_fn=None) -> PoplarExecutor:
    """A wrapper rebuilt from a ``compileAndExport`` / ``save`` file written with
    ``export_model=True``: options, weights, optimizer and RNG state restored, nothing
    traced or compiled again; ``edit_opts_fn(options)`` may change run-time options only."""
    contents, model, options, optimizer = prepare_load(filename, edit_opts_fn)
    wrapper = PoplarExecutor(model, options, training=optimizer is not None,
                             optimizer=optimizer)
    wrapper._load_contents(contents, filename)
    return wrapper
