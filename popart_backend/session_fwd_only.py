"""The forward-only program of an implicitly pipelined training session
(``SessionOptions.createImplicitPipeliningFwdOnlyProgram``).

With the option, a ``TrainingSession`` with implicit pipelining also builds a second program:
the model's forward pass alone, pipelined over the same stages and IPUs, with no backward pass
and no weight update (e.g. validation between training steps on the same weights). It runs
through the program-handle form of run, ``session.run("implicitPipeliningFwdOnly", stepio)``.

How it is built here: the session's model is imported again and given the inference passes
(so it computes what an ``InferenceSession`` of the current weights computes), then lowered
with the session's batches per step, accumulation and replication factors, so it reads the
same step IO as a training run. Each run first copies the training device's current weights
(variables: weights, running statistics) into the forward-only device; nothing flows back,
so the weights, optimizer state and accumulators of the training program stay as they were.
Anchors the forward pass cannot produce (gradients, updated weights) are not written; a
warning names them. Its cycles come from the device model of this forward-only pipeline
(``getCycleCount()`` after such a run); its memory is that of the training program, of which it
is a part on hardware.
"""

from __future__ import annotations

import copy
import logging

from .dataflow import DataFlow, PyStepIO
from .device.analysis import DeviceModel, analyse
from .device.distributed import replica_comm
from .device.lower import Program, lower
from .device.run_tables import execution_order
from .device.simulator import SimulatedDevice
from .device.transfers import BatchInfo
from .errors import popart_exception, popart_runtime_error
from .importer.onnx_model import import_model
from .session_methods import run_checked
from .transforms.pipeline import inference_passes, run_passes

__all__ = ["FWD_ONLY_HANDLE", "ForwardOnlyMixin", "ForwardOnlyProgram", "build_forward_only"]

_log = logging.getLogger("popart:session")

# PopART's name of the forward-only program handle.
FWD_ONLY_HANDLE = "implicitPipeliningFwdOnly"
_OPTION = "SessionOptions.createImplicitPipeliningFwdOnlyProgram"


class ForwardOnlyProgram:
    """The forward-only IR, its Program and (once run) its device and device model."""

    def __init__(self, session, input_shape_info):
        options = copy.deepcopy(session._options)
        # The training session logged this as without effect; its forward program agrees.
        options.stashAllTensorsInferencePipeline = False
        self.options = options
        flow = session._data_flow
        ir = import_model(
            session._model, input_shape_info=input_shape_info.to_ir(), constant_weights=False,
            strict_op_versions=options.strictOpVersions,
            fold_multiple_consumers=options.enableConstantFoldingOfMultipleConsumers,
            replicas=session._global_replication_factor,
        )
        ir.patterns = session._patterns
        anchors = [a for a in flow.anchors() if a in ir.main.tensors]
        self.skipped_anchors = [a for a in flow.anchors() if a not in ir.main.tensors]
        ir.anchors = anchors
        af = session._accumulation_factor
        # The pipeline depth: an accumulation window with accumulation, else batchesPerStep.
        depth = af if af > 1 else flow.batchesPerStep()
        run_passes(ir, inference_passes(options, session._ipus_per_replica(), depth))
        self.ir = ir
        self.data_flow = DataFlow(flow.batchesPerStep(), {a: flow.art(a) for a in anchors})
        self.program: Program = lower(ir, self.data_flow, session._replication_factor, af)
        self.device: SimulatedDevice | None = None
        self.device_model: DeviceModel | None = None
        self.runs = 0  # completed runs, for the floating-point check's run position

    def shared_weights(self, training_program: Program) -> list[str]:
        trained = set(training_program.weights)
        return [w for w in self.program.weights if w in trained]


def build_forward_only(session, input_shape_info) -> ForwardOnlyProgram | None:
    """The forward-only program when the session's options ask for it, else None; refuses the
    option where there is no implicit pipeline to take it from."""
    options = session._options
    if not options.createImplicitPipeliningFwdOnlyProgram or not session._training:
        return None  # inference: logged as without effect by the option checks
    if not options.implicitPipeliningEnabled():
        how = ("enablePipelining is False" if not options.enablePipelining else
               "pipelining is explicit (useHostCopyOps and enableExplicitMainLoops are on)")
        raise popart_exception(
            f"{_OPTION} = True needs implicit pipelining, but {how}. Set "
            f"enablePipelining = True without explicit pipelining, or leave the option False.")
    if session._value_io:
        raise popart_exception(
            f"{_OPTION} = True: a model with sequence or optional inputs or outputs has no "
            f"forward-only program in the simulator; leave the option False.")
    return ForwardOnlyProgram(session, input_shape_info)


class ForwardOnlyMixin:
    """``run(programHandle, stepio)`` and the cycle model of the last run program, for
    ``SessionBase``; uses the session's ``_fwd_only``, ``_device``, ``_program``."""

    _fwd_only: ForwardOnlyProgram | None = None
    _fwd_only_ran_last = False

    def _run_handle(self, handle, stepio, debugName: str = "") -> None:  # noqa: N803
        """``run(programHandle, stepio, debugName="")``."""
        known = [FWD_ONLY_HANDLE] if self._fwd_only is not None else []
        if handle != FWD_ONLY_HANDLE or not known:
            if handle == FWD_ONLY_HANDLE:
                what = ("a TrainingSession" if self._training else "this InferenceSession, "
                        "which runs only its forward program anyway (use run(stepio))")
                raise popart_exception(
                    f"run('{handle}'): {type(self).__name__} '{self.name}' has no forward-only "
                    f"program. Set {_OPTION} = True (with implicit pipelining) in "
                    f"{what} to build it.")
            listed = ", ".join(repr(k) for k in known) or "none (only run(stepio))"
            raise popart_exception(
                f"run({handle!r}, stepio): unknown program handle. The program handles of "
                f"{type(self).__name__} '{self.name}' are: {listed}.")
        training_device = self._ready_device(f"run('{handle}')")
        if self._host_weights and not self._weights_written:
            raise popart_runtime_error(
                f"run('{handle}'): call weightsFromHost() first; the forward-only program reads "
                f"the weights on the device.")
        if debugName:
            _log.debug("run '%s' (%s)", debugName, handle)
        fwd = self._fwd_only
        if fwd.device is None:
            if fwd.skipped_anchors:
                _log.warning("run('%s'): the forward-only program does not compute the anchors "
                             "%s (not forward tensors); their arrays are left unwritten.",
                             handle, ", ".join(fwd.skipped_anchors))
            # Both or neither: a failed analysis must not leave a device without its model.
            device = SimulatedDevice(
                fwd.program, training_device.synthetic, self._random_seed,
                replica_comm(self._options, self._replication_factor))
            fwd.device_model = analyse(
                fwd.ir, execution_order(fwd.program), self._device_info, fwd.options,
                BatchInfo.from_program(fwd.program), program=fwd.program,
                model=self._model.proto)
            fwd.device = device
        shared = fwd.shared_weights(self._program)
        fwd.device.write_weights(training_device.read_weights(shared))
        run_checked(self, fwd.device, fwd.program,
                    _only_anchors(stepio, {a.id for a in fwd.program.anchors}),
                    f"{self.name}' program '{handle}", fwd.runs + 1, fwd.ir.main)
        fwd.runs += 1
        self._fwd_only_ran_last = True

    def _reseed_devices(self) -> None:
        """``setRandomSeed``: reseed the session's device and, once built, the forward-only
        program's own device (both restart their micro-batch counters)."""
        for device in (self._device, self._fwd_only.device if self._fwd_only else None):
            if device is not None:
                device.set_seed(self._random_seed)

    def _cycle_model(self) -> DeviceModel:
        """The device model of the program the last run executed."""
        if self._fwd_only_ran_last:
            return self._fwd_only.device_model
        return self._device_model


def _only_anchors(stepio, anchors: set[str]):
    """``stepio`` without the outputs the forward-only program does not write; read positions
    are shared with ``stepio``, so they advance as for any run."""
    if not isinstance(stepio, PyStepIO) or set(stepio.outputs) <= anchors:
        return stepio
    view = PyStepIO(stepio.inputs, {k: v for k, v in stepio.outputs.items() if k in anchors})
    view.runtime_asserts = stepio.runtime_asserts
    view.input_offsets = stepio.input_offsets
    view.output_offsets = stepio.output_offsets
    return view
