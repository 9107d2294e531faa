"""Moving weights and optimizer state between the host and a compiled wrapper's session
("Weight sync").

``StateSyncMixin`` gives ``PoplarExecutor`` ``copyWeightsToHost`` / ``copyWeightsToDevice``,
``setOptimizer``, and the optimizer-state glue: hooks on the optimizer's ``state_dict`` /
``load_state_dict`` and the reads / writes between the device's optimizer tensors and
``optimizer.state`` in torch's format. The host-side dirty / version bookkeeping these rely on
is ``weight_sync.py``'s.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

import popart_backend as popart

from .. import optim, optimizer_translation
from ..errors import Error
from . import replica_params
from .compilation import backend_error
from .running import check_int32


class StateSyncMixin:
    """``PoplarExecutor``'s weight and optimizer-state copies between host and device."""

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        state = dict(self._user_model.named_parameters())
        state.update(self._user_model.named_buffers())
        return state

    def _check_int64_state(self, fqns) -> None:
        """int64 parameters and buffers must fit int32 on the device, as inputs must."""
        state = self._state_tensors()
        for fqn in fqns:
            tensor = state.get(fqn)
            if tensor is not None and tensor.dtype is torch.int64:
                kind = "Parameter" if isinstance(tensor, torch.nn.Parameter) else "Buffer"
                check_int32(tensor.detach(), f"{kind} '{fqn}'")

    def copyWeightsToHost(self) -> None:  # noqa: N802
        """Device weights -> the user model's parameters and buffers, by name."""
        executable = self._require_compiled("copyWeightsToHost()")
        if self._training:
            self._link.host_dirty = False
        session = executable.session
        state = self._state_tensors()
        arrays = {onnx_name: np.empty(replica_params.read_shape(self, fqn, state[fqn].shape),
                                      dtype=_numpy_dtype(state[fqn].dtype))
                  for onnx_name, fqn in executable.device_weights.items()}
        session.weightsToHost()
        session.readWeights(popart.PyWeightsIO(arrays))
        with torch.no_grad():
            for onnx_name, fqn in executable.device_weights.items():
                value = replica_params.from_device(self, fqn, arrays[onnx_name])
                state[fqn].copy_(torch.from_numpy(value))
            pending = self._micro_batches_pending
            if pending:
                # torch counts BatchNorm forward calls; the device does not keep the count.
                for _, module in self._batch_norms():
                    module.num_batches_tracked.add_(pending)
                self.__dict__["_micro_batches_pending"] = 0

    def copyWeightsToDevice(self) -> None:  # noqa: N802
        """The user model's parameters and buffers -> device."""
        executable = self._require_compiled("copyWeightsToDevice()")
        self._pull_host()
        self._check_int64_state(executable.traced.param_map.values())
        state = self._state_tensors()
        arrays = {onnx_name: replica_params.to_device(
                      self, fqn, np.array(state[fqn].detach().cpu().numpy(), order="C"))
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
        optim.hold(optimizer, self)
        step = _state_step(optimizer)
        if step is not None:
            self.__dict__["_steps_done"] = step

    def _unhook_optimizer(self) -> None:
        for handle in self._optimizer_hooks:
            handle.remove()
        self._optimizer_hooks.clear()
        optim.hold(self._optimizer, None)

    def _read_optimizer_state(self) -> None:
        """Device optimizer state -> ``optimizer.state`` in torch's format (and ``_ipu_state``)."""
        executable = self._active
        if executable is None or executable.translation is None or not self._attached:
            return
        self.__dict__["_optimizer_state_dirty"] = False
        translation = executable.translation
        session = executable.session
        session.weightsToHost()
        # state id -> the parameter it belongs to (replica-grouped: one value per group)
        names = _param_names(self, translation)
        owner = {slot.backend_id: names[weight_id]
                 for weight_id, slots in translation.state.items() for slot in slots
                 if slot.backend_id is not None}
        owner.update({i: names[weight_id]
                      for weight_id, ids_ in translation.internal_state.items() for i in ids_})
        arrays = {tid: _host_array(session, tid) for tid in owner}
        arrays = {tid: np.zeros(replica_params.read_shape(self, owner[tid], a.shape), a.dtype)
                  for tid, a in arrays.items()}
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
                    entry["step"] = torch.tensor(float(replica_params.from_device(
                        self, owner[slot.backend_id], arrays[slot.backend_id], keep=False)))
                else:
                    value = torch.from_numpy(replica_params.from_device(
                        self, owner[slot.backend_id], arrays[slot.backend_id], keep=False).copy())
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
        optim.written(optimizer)
        arrays = {}
        names = _param_names(self, translation)
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
                arrays[slot.backend_id] = replica_params.state_to_device(
                    self, names[weight_id], array)
            started = bool(entry)
            for tid in translation.internal_state[weight_id]:
                array = _host_array(session, tid)
                # A state entry (e.g. torch SGD's momentum_buffer, which stores no step count)
                # means at least one step was taken: the next one is not the first.
                array[...] = float(max(self._steps_done, 1) if started else 0)
                arrays[tid] = replica_params.state_to_device(
                    self, names[weight_id], array)
        if not arrays:
            return
        session.weightsToHost()
        session.writeWeights(popart.PyWeightsIO(arrays))
        session.weightsFromHost()

    def setOptimizer(self, optimizer) -> None:  # noqa: N802
        """Use ``optimizer``'s current hyper-parameters (or a new optimizer object) from the
        next run, without recompiling. Call it after an LR scheduler's ``step()``."""
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
            self._running_stat_names() | set(executable.traced.updated_buffers),
            compiled=executable.translation)
        optimizer_translation.check_replacement(executable.translation, translation, optimizer)
        try:
            executable.session.updateOptimizerFromHost(translation.backend)
        except popart.popart_exception as exc:
            raise backend_error(exc, executable.traced) from exc
        executable.translation = translation
        if optimizer is not previous:
            self.__dict__["_optimizer_state_pending"] = True


def _param_names(wrapper, translation) -> dict:
    """Backend weight id -> the parameter's name in the user model (None if not found)."""
    by_id = {id(p): name for name, p in wrapper._user_model.named_parameters()}
    return {w: by_id.get(id(p)) for w, p in translation.weights.items()}


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

