"""Running a compiled wrapper: a call's inputs to the backend and its outputs back to torch.

``RunMixin`` gives ``PoplarExecutor`` its ``__call__``: input checks (detach, contiguous), the
host IO of one run (one ``PyStepIO`` per call; 0-d inputs broadcast, input replica groups
expanded), the training bookkeeping after a run, and the outputs per ``OutputMode`` reshaped by
PopTorch's stacking rule. ``_FastCall`` lets a call repeating the last one's signature skip
binding and the executable lookup.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import torch
from torch.utils import _pytree as pytree

import popart_backend as popart

from ..errors import Error, user_location
from ..options.enums import CommGroupType
from . import weight_sync
from .compilation import _Executable, backend_error, check_buffers

_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}


class RunMixin:
    """``PoplarExecutor``'s run side: ``__call__`` and the host IO of one run."""

    def __call__(self, *args, **kwargs):
        fast = self.__dict__["_fast"]
        if fast is not None and not kwargs:
            leaves = fast.leaves(self, args)
            if leaves is not None:
                return self._run(fast.executable, leaves)
        leaves, signature = self._signature(args, kwargs)
        originals = leaves
        leaves = self._prepare_leaves(leaves, signature)
        executable = self._select(leaves, signature)
        if self._offline():
            raise Error("The model is compiled for an offline target "
                        "(connectionType(Never) / useOfflineIpuTarget); use compile() only.")
        if not self._attached:
            self.attachToDevice()
        self.__dict__["_fast"] = _FastCall.of(self, args, kwargs, leaves, executable)
        return self._run(executable, leaves, originals)

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
                if leaf.dtype is torch.float64:
                    # As PopTorch: the model is traced and run with float32 values.
                    self._warn_once("float64", f"Input {spec.path} is float64; the IPU has no "
                                    f"64-bit floats, so it is cast to float32.")
                    leaf = leaf.to(torch.float32)
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
        # P11: pull the weights a training wrapper of the same model (or of a model sharing
        # modules with it) moved since our last run.
        d = self.__dict__
        cached = d["_links"]
        if cached[0] != weight_sync.generation():
            cached = d["_links"] = (weight_sync.generation(),
                                    weight_sync.links_over(self._user_model))
        seen, moved = d["_seen_versions"], False
        for link in cached[1]:
            trainer = link.training
            if (trainer is not None and trainer.isCompiled()
                    and link.version != seen.get(link, -1)):
                link.pull()
                moved = True
            seen[link] = link.version
        if moved:
            self.copyWeightsToDevice()

    def _run(self, executable: _Executable, leaves, originals=None):
        check_buffers(executable)
        self._sync_before_run()
        traced = executable.traced
        inputs = {}
        grouped = self._input_group_size() > 1
        for leaf, spec, name in zip(leaves, traced.signature.leaves, traced.input_names):
            if name is None:
                continue
            if leaf.dtype is torch.int64:
                check_int32(leaf, f"Input {spec.path}")
            if spec.shape and not grouped:
                inputs[name] = leaf.cpu()  # read in place by the device (no numpy round trip)
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
        # The run allocates the outputs (or hands its result tensors over): each call returns
        # new tensors, as PopTorch does, written once. One step IO serves every call.
        stepio = executable.stepio
        if stepio is None:
            stepio = executable.stepio = popart.PyStepIO({}, {}, allocate_outputs=True)
        stepio.inputs = inputs
        stepio.input_offsets.clear()  # each call reads its inputs from the start
        try:
            session.run(stepio)
        except popart.popart_exception as exc:
            raise backend_error(exc, traced) from exc
        anchors = stepio.outputs
        if self._training:
            n = self._options.device_iterations
            self._link.device_moved()
            d = self.__dict__
            d["_optimizer_state_dirty"] = True
            d["_steps_done"] += n
            d["_micro_batches_pending"] += n * self._options.Training.gradient_accumulation
            # The device ran the optimizer's steps: tell torch's LR schedulers, which check
            # this flag to warn about scheduler.step() before optimizer.step().
            self._optimizer._opt_called = True
        outputs = self._outputs(executable, anchors)
        if executable.anchored:
            executable.anchored_values = _anchored_values(executable, anchors)
        if traced.input_updates:
            self._update_inputs(executable, anchors, leaves if originals is None else originals)
        return outputs

    def _update_inputs(self, executable: _Executable, anchors: dict, originals) -> None:
        """Write each input ``forward`` updated in place back into the caller's tensor, as
        eager torch would have: every micro-batch's rows, from the input's replica group."""
        for index, name in executable.traced.input_updates:
            target = originals[index]
            sample = tuple(executable.session.getInfo(name).shape())
            rows = _as_tensor(anchors[name]).reshape(-1, *sample)  # [N·G·R·B, ...]; [1]: 0-d
            size, kind = self._options.input_replica_grouping
            if size > 1 and sample:
                rin = self._options.input_replicas
                replicas = self._options.replication_factor
                view = rows.reshape(-1, replicas, sample[0], *sample[1:])  # [N·G, R, B, ...]
                # the first replica of each input group
                first = (list(range(rin)) if kind is CommGroupType.Orthogonal
                         else [g * size for g in range(rin)])
                rows = view[:, first]
            value = _as_tensor(rows).reshape(target.shape)
            with torch.no_grad():
                target.copy_(value)

    def _input_group_size(self) -> int:
        return self._options.input_replica_grouping[0]

    def _expand_input_groups(self, array: np.ndarray, divisor: int) -> np.ndarray:
        """[N·G·Rin·B, ...] -> [N·G·R·B, ...]: each replica gets its input group's rows."""
        size, kind = self._options.input_replica_grouping
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

    def _outputs(self, executable: _Executable, anchors: dict):
        traced = executable.traced
        table = executable.output_table
        if table is None:
            table = executable.output_table = _output_table(
                executable, anchors, dict.fromkeys(traced.output_names))
        results = {}
        for name, shape, narrow in table:
            tensor = _as_tensor(anchors[name])
            if shape is not None:
                tensor = tensor.view(shape)  # the run's outputs are contiguous
            if narrow is torch.int32:
                check_int32(tensor, f"Output '{name}' of forward")
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


_INT32 = torch.iinfo(torch.int32)


_RANGE = threading.local()


def _int64_range(tensor: torch.Tensor) -> tuple[int, int]:
    """(min, max) of an int64 tensor by one pass, into two 0-d tensors kept per thread (a
    steady call allocates nothing)."""
    buffers = getattr(_RANGE, "buffers", None)
    if buffers is None:
        buffers = _RANGE.buffers = (torch.empty((), dtype=torch.int64),
                                    torch.empty((), dtype=torch.int64))
    torch.aminmax(tensor, out=buffers)
    return int(buffers[0]), int(buffers[1])


def check_int32(tensor: torch.Tensor, what: str) -> None:
    """An int64 input or output must fit int32, the IPU's integer type: refused rather
    than wrapped. One min/max pass over the tensor."""
    if not tensor.numel():
        return
    low, high = _int64_range(tensor)
    if low >= _INT32.min and high <= _INT32.max:
        return
    bad = high if high > _INT32.max else low
    raise Error(f"{what} (int64) holds {bad}, outside the int32 range [{_INT32.min}, "
                f"{_INT32.max}]: the IPU computes integers in int32, so it would wrap to "
                f"{int(torch.tensor(bad).to(torch.int32))}. Keep integer values within int32 "
                f"(e.g. reduce ids modulo the table size on the host).",
                location=user_location())


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


def _anchored_values(executable: _Executable, anchors: dict) -> dict[str, torch.Tensor]:
    """The tensors of ``Options.anchorTensor`` from this run's anchors, by short name, stacked
    as outputs are."""
    table = executable.anchored_table
    if table is None:
        table = executable.anchored_table = _output_table(
            executable, anchors, dict.fromkeys(executable.anchored.values()))
    values = {}
    for name, shape, narrow in table:
        tensor = _as_tensor(anchors[name])
        tensor = tensor if shape is None else tensor.view(shape)
        values[name] = tensor if narrow is None else tensor.to(narrow)
    return {short: values[name] for short, name in executable.anchored.items()}


def _output_table(executable: _Executable, anchors: dict, names) -> list:
    """Per distinct output (of ``names``): its host shape (stacking: the anchor's batches
    stacked along dim 0; None when the anchor array already has it) and the dtype it narrows
    to (int64 -> int32, float64 -> float32)."""
    table = []
    for name in names:
        tensor = _as_tensor(anchors[name])
        size = tensor.numel()
        sample = tuple(executable.session.getInfo(name).shape())
        count = size // max(int(np.prod(sample, dtype=np.int64)), 1) if sample else size
        if count > 1:
            shape = (count * sample[0], *sample[1:]) if sample else (count,)
        else:
            shape = sample
        table.append((name, None if tuple(tensor.shape) == shape else shape,
                      _NARROW.get(tensor.dtype)))
    return table


def _as_tensor(value) -> torch.Tensor:
    """A run's output as a torch tensor (numpy arrays, for types torch has no view of, are
    wrapped)."""
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(value)
