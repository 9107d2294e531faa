"""The compile-once execution plan (DESIGN decision 9).

``prepareDevice()`` turns a scheduled graph into a flat list of steps over numbered slots:
each step is a pre-bound kernel with the slot numbers of its inputs and outputs, and the slots
it frees afterwards. ``execute()`` then does no graph walking and no name lookups.

Steps are grouped by the ``ExecutionContext`` of their op (docs/training.md): the ``Normal``
fragment runs every micro-batch, the ``AccumulateOuterFragment`` once per weight update. The
fragments share one slot table, so variables written in one are read in the other.

A pipelined plan (``num_stages`` > 0) also splits the Normal fragment by pipeline stage:
``stage_steps[s]`` is stage s's compute, ``copy_steps[s]`` its end-of-cycle inter-IPU copies.
Slot frees come from the stage-ordered schedule (lower.py), so they hold however the run loop
interleaves stages within a cycle.

Static memory plan (device/arena.py): outputs of ops with an into-kernel
(``Op.writes_into``) get a view of a preallocated per-dtype arena, placed by liveness; their
step runs ``op.kernel_into`` with that view's slot (``buffer_slots``) as its first input.

Replicas (DESIGN decision 6): the steps and slot numbers are shared, the values are
not. ``add_replicas(n)`` gives each local replica its own slot list (``replica_values``) with
its own copy of every variable (weights, optimizer state, accumulators, running statistics,
stashes); constants stay shared. A step list then runs as segments split at the collective
ops (``Op.collective``): every replica runs a segment's steps, then the collective reads the
input of every replica and writes each one's output (``execute_replicas``).
"""

from __future__ import annotations

from functools import partial
from typing import Iterable

import numpy as np
import torch

from ..dtypes import to_storage
from ..errors import popart_internal_exception, popart_runtime_error
from ..ir.graph import Graph
from ..ir.op import ExecutionContext, Op
from ..ir.tensor import TensorKind
from ..ops.base import wrap_unsigned_outputs
from ..ops.control_flow import use_body_compiler
from ..ops.state_journal import JournaledWrites, StateJournal
from ..ops.rounding import generic_rounding, stochastically_rounded
from ..ops.string_tensors import kernel_for
from .arena import plan_arena, plan_scratch
from . import recycle
from .recycle import RecycledOutput, recyclable
from .layout import plan_layouts, with_layouts
from .fp_position import current_position


def to_torch(array: np.ndarray) -> torch.Tensor | np.ndarray:
    """Zero-copy when the array is contiguous and writeable; copies otherwise.

    STRING (object) arrays stay numpy: torch has no string type (ops/string_tensors.py).
    """
    if not isinstance(array, np.ndarray):
        array = np.asarray(array)
    if not array.flags.c_contiguous or not array.flags.writeable:
        array = np.array(array, order="C", copy=True)  # keeps 0-d values 0-d
    if array.dtype == object:
        return array
    return to_storage(array)


class ExecutionPlan:
    """Slots and steps for one graph; ``keep`` names tensors that must survive the execution."""

    def __init__(self, graph: Graph, keep: Iterable[str], order: list[Op] | None = None,
                 num_stages: int = 0):
        self.graph = graph
        order = order if order is not None else graph.topo_order()
        # Fragments in the order one weight update runs them (stable within each fragment).
        # Scheduling constraints between fragments are met by that order: an outer-fragment
        # reader of a variable scheduled "before" a Normal writer reads it after the last
        # micro-batch, which is the value it must see.
        contexts = list(ExecutionContext)
        self.order = sorted(order, key=lambda op: contexts.index(op.settings.execution_context))
        keep = set(keep)
        self.slot: dict[str, int] = {}
        values: list[torch.Tensor | None] = []

        def slot_of(tid: str) -> int:
            if tid not in self.slot:
                self.slot[tid] = len(values)
                values.append(None)
            return self.slot[tid]

        self.stream_ids = [t for t in graph.inputs if graph.tensors[t].kind is TensorKind.STREAM]
        self.variable_ids = [t.id for t in graph.tensors.values() if t.kind is TensorKind.VARIABLE]
        for tid in self.stream_ids + self.variable_ids:
            slot_of(tid)
        for tensor in graph.tensors.values():
            if tensor.kind is TensorKind.CONST and (tensor.consumers or tensor.id in keep):
                values[slot_of(tensor.id)] = to_torch(tensor.data)
            if tensor.kind is TensorKind.VARIABLE:
                values[slot_of(tensor.id)] = to_torch(np.array(tensor.data, copy=True))
        for tid in keep:
            slot_of(tid)

        last_use: dict[int, int] = {}
        raw_steps = []
        for position, op in enumerate(self.order):
            ins = tuple(-1 if t is None else slot_of(t.id) for t in op.inputs)
            outs = tuple(-1 if t is None else slot_of(t.id) for t in op.outputs)
            for s in ins:
                if s >= 0:
                    last_use[s] = position
            for s in outs:
                if s >= 0:
                    last_use.setdefault(s, position)
            raw_steps.append((op, ins, outs))

        # Only op-produced values are freed; streams, variables, consts and kept ones persist.
        produced = {
            self.slot[t.id]
            for op in self.order
            for t in op.outputs
            if t is not None and t.id not in keep
        }
        frees: dict[int, list[int]] = {}
        for s, position in last_use.items():
            if s in produced:
                frees.setdefault(position, []).append(s)

        # The static memory plan (device/arena.py): outputs written into preallocated arena
        # views, one extra slot per buffer holding each replica's view.
        # Memory layouts (device/layout.py): channels-last activations between convolutions.
        kept_slots = {self.slot[t] for t in keep}
        self.layouts = layouts = plan_layouts(raw_steps, kept_slots)
        # Scratch (Op.scratch_infos): temporaries of a step in the arena too, keyed by
        # placeholder numbers past every slot.
        state = {self.slot[t] for t in self.variable_ids} | kept_slots
        scratch = plan_scratch(raw_steps, num_stages, len(values), state)
        self.arena = plan_arena(raw_steps, kept_slots, num_stages, layouts.channels_last,
                                scratch)
        self.buffer_slots: dict[int, int] = {}
        for s in self.arena.buffers:
            self.buffer_slots[s] = len(values)
            values.append(None)

        # The run journal (ops/state_journal.py): in-place writes of state (variables, kept
        # tensors) are recorded at their first write in a run, so a failed run can be undone.
        self.journal = StateJournal()
        state = {self.slot[t] for t in self.variable_ids} | {self.slot[t] for t in keep}
        self.inplace_slots: set[int] = set()  # state slots some step writes in place
        self.produced_slots = produced
        self.pinned_slots = _viewed_state(raw_steps, state)
        self.steps = []
        self.fragments: dict[ExecutionContext, list[tuple]] = {c: [] for c in ExecutionContext}
        for position, (op, ins, outs) in enumerate(raw_steps):
            single = len(outs) == 1
            written = tuple(i for i in op.modifies_inputs if i < len(ins) and ins[i] in state)
            self.inplace_slots.update(ins[i] for i in written)
            base = kernel_for(op)
            # An op writing its state itself, when all it writes is state and its kernel sees
            # the state tensors (not float32 copies of them, as with generic rounding).
            journaled = (isinstance(op, JournaledWrites) and not generic_rounding(op)
                         and written == tuple(i for i in op.modifies_inputs
                                              if i < len(ins) and ins[i] >= 0))
            if journaled:
                base = partial(op.journaled_kernel, self.journal)
            kernel = stochastically_rounded(op, wrap_unsigned_outputs(op, base))
            if written and not journaled:
                kernel = _journal_saved(self.journal, kernel, written)
            checks = op.settings.checks
            if checks.floating_point:
                kernel = floating_point_checked(op, kernel)
            if checks.alias:
                kernel = alias_checked(op, kernel)
            if checks.modify:
                kernel = modify_checked(op, kernel)
            if single and outs[0] in self.buffer_slots:
                # Checks, rounding and journaling never apply here (arena._eligible): the
                # into-kernel takes its output buffer first, then the op's inputs.
                kernel, ins = op.kernel_into, (self.buffer_slots[outs[0]],) + ins
            elif (recycle.enabled and not num_stages and position not in scratch
                  and not layouts.steps[position].active
                  and recyclable(op, ins, outs, kept_slots)):
                # A large host-read output (logits): written into the previous run's output
                # once the host has let go of it (device/recycle.py), no pages faulted in.
                kernel = RecycledOutput(op)
            if position in scratch:
                # The scratch kernel: output buffer (or none), scratch buffers, the inputs.
                into = single and outs[0] in self.buffer_slots
                ins = ((ins[0] if into else -1),
                       *(self.buffer_slots[s] for s in scratch[position][1])) + ins[into:]
                kernel = op.kernel_scratch
            if layouts.steps[position].active:
                kernel = with_layouts(kernel, layouts.steps[position],
                                      len(ins) - len(op.inputs), single)
            step = (kernel, ins,
                    outs[0] if single else outs, single,
                    tuple(frees.get(position, ())), op)
            self.steps.append(step)
            self.fragments[op.settings.execution_context].append(step)
        self.normal_steps = self.fragments[ExecutionContext.Normal]
        self.outer_steps = self.fragments[ExecutionContext.AccumulateOuterFragment]
        self.stage_steps: list[list[tuple]] = [[] for _ in range(num_stages)]
        self.copy_steps: list[list[tuple]] = [[] for _ in range(num_stages)]
        for step in self.normal_steps if num_stages else ():
            op = step[5]
            between = op.runs_between_cycles
            (self.copy_steps if between else self.stage_steps)[op.settings.pipeline_stage].append(
                step)
        self.values = values
        self._bind_arena(values)
        self.replica_values: list[list[torch.Tensor | None]] = [values]
        self._segments: dict[int, list[tuple[list[tuple], tuple | None]]] = {}

    def add_replicas(self, count: int) -> None:
        """Give ``count`` replicas their own slot lists; replica r > 0 starts as a copy of
        replica 0 with its own variable storage."""
        variable_slots = [self.slot[t] for t in self.variable_ids]
        self.replica_values = [self.values]
        for _ in range(1, count):
            values = list(self.values)
            for s in variable_slots:
                values[s] = values[s].clone()
            self._bind_arena(values)  # each replica writes into its own arenas
            self.replica_values.append(values)

    def _bind_arena(self, values: list) -> None:
        for s, view in self.arena.bind().items():
            values[self.buffer_slots[s]] = view

    def written_state_slots(self, extra: Iterable[str] = ()) -> list[int]:
        """The slots of device state a run can change: variables an op writes in place
        (``modifies_inputs``, a contract opxModifyChecking verifies) or outputs, and the
        tensors ``extra`` (op outputs that persist through a run, such as stashes, and the
        random seed, which the run loop writes itself). Everything else a run writes (anchors,
        activations) is rebound every micro-batch and is not state."""
        variables = {self.slot[t] for t in self.variable_ids}
        written = {self.slot[t] for t in extra if t in self.slot}
        for _fn, ins, outs, single, _frees, op in self.steps:
            for i in op.modifies_inputs:
                if i < len(ins) and ins[i] in variables:
                    written.add(ins[i])
            for s in (outs,) if single else outs:
                if s in variables:
                    written.add(s)
        return sorted(written)

    def segments(self, steps: list[tuple]) -> list[tuple[list[tuple], tuple | None]]:
        """``steps`` split after each collective step: [(plain steps, collective or None)]."""
        key = id(steps)
        cached = self._segments.get(key)
        if cached is None:
            cached, plain = [], []
            for step in steps:
                if step[5].collective:
                    cached.append((plain, step))
                    plain = []
                else:
                    plain.append(step)
            cached.append((plain, None))
            self._segments[key] = cached
        return cached

    def has_collective(self, steps: list[tuple]) -> bool:
        return len(self.segments(steps)) > 1

    def execute_replicas(self, steps: list[tuple], comm, group=None) -> None:
        """Run ``steps`` on the local replicas ``group`` (default: all), collectives across all
        replicas of ``comm`` (a ``device.distributed.ReplicaComm``). Caller is inside
        ``torch.no_grad()``."""
        if group is None:
            replicas = self.replica_values
        else:
            replicas = [self.replica_values[r] for r in group]
            if len(replicas) != len(self.replica_values) and self.has_collective(steps):
                raise popart_runtime_error(
                    f"Steps with a collective must run on all {len(self.replica_values)} local "
                    f"replicas together, not on replicas {list(group)}."
                )
        for plain, collective in self.segments(steps):
            if plain:
                for values in replicas:
                    self.execute_in_no_grad(plain, values)
            if collective is not None:
                self._run_collective(collective, comm)

    def _run_collective(self, step: tuple, comm) -> None:
        _fn, ins, out, _single, frees, op = step
        replicas = self.replica_values
        local = [values[ins[0]] for values in replicas]
        everyone = comm.gather(local, f"{op.debug_name} (collective over {comm.total} replicas)")
        try:
            results = op.reduce_replicas(everyone, comm.offset, comm.local)
        except popart_runtime_error:
            raise
        except Exception as exc:
            raise popart_runtime_error(
                f"{op.debug_name}: collective failed on inputs "
                f"{[tuple(v.shape) for v in local]}: {type(exc).__name__}: {exc}"
            ) from exc
        for values, result in zip(replicas, results):
            values[out] = result
            for s in frees:
                values[s] = None

    def set_value(self, tensor_id: str, value: torch.Tensor) -> None:
        self.values[self.slot[tensor_id]] = value

    def get_value(self, tensor_id: str) -> torch.Tensor | None:
        return self.values[self.slot[tensor_id]]

    def execute(self) -> None:
        """Run every step once over the current slot values (all fragments, in order)."""
        with torch.inference_mode(False), torch.no_grad():
            self.execute_in_no_grad(self.steps)

    def execute_in_no_grad(self, steps: list[tuple] | None = None,
                           values: list | None = None) -> None:
        """Run ``steps`` (default: the Normal fragment) over ``values`` (default: replica 0's
        slots) for callers already inside ``torch.no_grad()`` (and not in inference mode): a
        run loop enters the context once instead of once per micro-batch, which costs about as
        much as a small kernel."""
        if steps is None:
            steps = self.normal_steps
        v = self.values if values is None else values
        index = 0
        try:
            for index, (fn, ins, out, single, frees, _op) in enumerate(steps):
                result = fn(*[v[i] if i >= 0 else None for i in ins])
                if single:
                    v[out] = result
                else:
                    for s, r in zip(out, result):
                        if s >= 0:
                            v[s] = r
                for s in frees:
                    v[s] = None
        except (popart_runtime_error, KernelCheckError):
            raise
        except Exception as exc:
            op = steps[index][5]
            shapes = ", ".join(
                f"'{t.id}' {t.info}" if t is not None else "<absent>" for t in op.inputs
            )
            raise popart_runtime_error(
                f"{op.debug_name}: kernel failed on inputs {shapes}: {type(exc).__name__}: {exc}"
            ) from exc


class DeviceMode:
    """``torch.inference_mode(False)`` + ``torch.no_grad()`` for a run loop, at a fraction of
    their cost (a step of a small model pays for them once per call): grad mode is switched
    directly, inference mode only entered when the caller is in it."""

    __slots__ = ("_grad", "_inference")

    def __enter__(self):
        self._inference = None
        if torch.is_inference_mode_enabled():
            self._inference = torch.inference_mode(False)
            self._inference.__enter__()
        self._grad = torch.is_grad_enabled()
        # The C switch: torch.set_grad_enabled builds a context object on each call.
        torch._C._set_grad_enabled(False)
        return self

    def __exit__(self, *exc):
        torch._C._set_grad_enabled(self._grad)
        if self._inference is not None:
            self._inference.__exit__(*exc)


# Subgraph ops (If, Loop, Call, Scan ...) run each body as a plan of its own.
use_body_compiler(ExecutionPlan)


def floating_point_checked(op: Op, kernel):
    """``kernel`` followed by the IPU's floating-point exception check (SessionOptions.
    enableFloatingPointChecks): a NaN or inf output computed from finite float inputs stops
    the run with popart_runtime_error naming the op."""
    float_outputs = [i for i, t in enumerate(op.outputs)
                     if t is not None and t.info.dtype.is_float]
    if not float_outputs:
        return kernel
    float_inputs = [i for i, t in enumerate(op.inputs) if t is not None and t.info.dtype.is_float]
    single = len(op.outputs) == 1

    def run(*xs):
        position = current_position()  # which run() call / micro-batch (device/fp_position.py)
        index = position.count(op) if position is not None else -1
        result = kernel(*xs)
        outs = (result,) if single else result
        for i in float_outputs:
            value = outs[i]
            if value is None or bool(torch.isfinite(value).all()):
                continue
            if all(xs[j] is None or bool(torch.isfinite(xs[j]).all()) for j in float_inputs):
                nans = int(torch.isnan(value).sum())
                infs = int(torch.isinf(value).sum())
                when = f" {position.describe(op, index)}" if position is not None else ""
                raise popart_runtime_error(
                    f"{op.debug_name}: floating-point exception{when}: output "
                    f"'{op.outputs[i].id}' {op.outputs[i].info} holds {nans} NaN and {infs} inf "
                    f"value(s) computed from finite inputs (SessionOptions."
                    f"enableFloatingPointChecks). Check the op's inputs for overflow, division "
                    f"by zero or an invalid operation."
                )
        return result

    return run


class KernelCheckError(popart_internal_exception):
    """A kernel broke its op's declaration (SessionOptions.opxModifyChecking /
    opxAliasChecking): the op's code is wrong, not the model."""


def _unchanged(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Same shape, dtype and values, NaN equal to NaN (a kernel that leaves an input alone
    leaves its bits alone, so value equality with NaN == NaN is exact enough)."""
    if before.shape != after.shape or before.dtype != after.dtype:
        return False
    if torch.equal(before, after):
        return True
    if not (before.is_floating_point() or before.is_complex()):
        return False
    both_nan = torch.isnan(before) & torch.isnan(after)
    return bool(((before == after) | both_nan).all())


def modify_checked(op: Op, kernel):
    """``kernel`` checked not to change an input the op does not list in ``modifies_inputs``
    (SessionOptions.opxModifyChecking): each such input is cloned before the kernel runs and
    compared after; a change raises KernelCheckError naming the op and the input."""
    declared = set(op.modifies_inputs)

    def run(*xs):
        saved = [(i, x.clone()) for i, x in enumerate(xs)
                 if i not in declared and isinstance(x, torch.Tensor)]
        result = kernel(*xs)
        for i, before in saved:
            if not _unchanged(before, xs[i]):
                tensor = op.inputs[i]
                raise KernelCheckError(
                    f"{op.debug_name}: the kernel modified input {i} '{tensor.id}' {tensor.info}, "
                    f"which the op does not declare modified (modifies_inputs = "
                    f"{tuple(op.modifies_inputs)}) (SessionOptions.opxModifyChecking). Make the "
                    f"kernel write a new tensor, or list the input in modifies_inputs."
                )
        return result

    return run


def _storage(x) -> int:
    """The address of the storage behind ``x`` (0 for empty tensors and non-tensors)."""
    if not isinstance(x, torch.Tensor) or x.numel() == 0:
        return 0
    return x.untyped_storage().data_ptr()


def alias_checked(op: Op, kernel):
    """``kernel`` checked not to return an input's storage (or a view of it) unless the op
    declares it (SessionOptions.opxAliasChecking): ``Op.aliases_inputs`` for ops whose kernel
    may return a view of an input, and the inputs it lists in ``modifies_inputs``, which it
    writes and returns. Anything else raises KernelCheckError naming the output and input."""
    if op.aliases_inputs:
        return kernel
    declared = set(op.modifies_inputs)
    single = len(op.outputs) == 1

    def run(*xs):
        result = kernel(*xs)
        written = {_storage(xs[i]) for i in declared if i < len(xs)}
        storages = {}
        for i, x in enumerate(xs):
            address = _storage(x)
            if address and address not in written:
                storages.setdefault(address, i)
        for k, out in enumerate((result,) if single else result):
            i = storages.get(_storage(out))
            if i is not None:
                tensor, output = op.inputs[i], op.outputs[k]
                raise KernelCheckError(
                    f"{op.debug_name}: output {k} '{output.id}' {output.info} shares storage with "
                    f"input {i} '{tensor.id}' {tensor.info}, but the op does not declare that "
                    f"its outputs alias its inputs (SessionOptions.opxAliasChecking). Return a "
                    f"new tensor (e.g. .clone()), or set aliases_inputs = True on the op."
                )
        return result

    return run


class StateSnapshot:
    """Device state of some slots on every local replica, kept from the start of a run and put
    back when the run fails, so a failed ``run()`` changes nothing (docs/security.md).

    Nothing is copied up front for state the steps write in place: the plan's run journal
    (ops/state_journal.py) keeps each such tensor's start value at its first write (optimizer
    updates and accumulators write out of place into a ping-pong buffer and swap, with no
    copy). ``save()`` opens the journal and remembers which tensor each slot holds (steps that
    write a slot as an output rebind it, leaving the old tensor alone); the few slots written
    in place outside the steps (the random seed, by the run loop) are copied, with one
    ``torch._foreach_copy_`` into buffers kept across runs. ``restore()`` undoes the journal,
    rebinds the slots and copies those buffers back; ``commit()`` ends a successful run."""

    __slots__ = ("_plan", "_slots", "_copied", "_live", "_buffers", "_refs")

    def __init__(self, plan: ExecutionPlan, slots: list[int]):
        self._plan, self._slots = plan, slots
        skip = plan.inplace_slots | plan.produced_slots
        self._copied = [s for s in slots if s not in skip]
        self._live: list[torch.Tensor] = []
        self._buffers: list[torch.Tensor] = []
        self._refs: list[list] = []

    def save(self) -> None:
        plan = self._plan
        if not self._slots and not plan.pinned_slots:
            plan.journal.begin()  # nothing to remember or copy (an inference plan): open only
            return
        replicas = plan.replica_values
        self._refs = [[values[s] for s in self._slots] for values in replicas]
        plan.journal.begin([values[s] for values in replicas for s in plan.pinned_slots])
        live = [values[s] for values in replicas for s in self._copied]
        live = [v for v in live if isinstance(v, torch.Tensor) and v.numel()]
        buffers = self._buffers
        if len(buffers) != len(live) or any(
                b.shape != v.shape or b.dtype != v.dtype for b, v in zip(buffers, live)):
            with torch.inference_mode(False):
                buffers = self._buffers = [torch.empty_like(v) for v in live]
        if live:
            torch._foreach_copy_(buffers, live)
        self._live = live

    def commit(self) -> None:
        self._plan.journal.commit()

    def restore(self) -> None:
        with torch.no_grad():
            self._plan.journal.rollback()
            for values, refs in zip(self._plan.replica_values, self._refs):
                for s, value in zip(self._slots, refs):
                    values[s] = value
            if self._live:
                torch._foreach_copy_(self._live, self._buffers)


def _journal_saved(journal: StateJournal, kernel, indices: tuple[int, ...]):
    """``kernel`` preceded by saving, in an open run journal, the state inputs it writes."""

    def run(*xs):
        if journal.is_open:
            for i in indices:
                journal.save(xs[i])
        return kernel(*xs)

    return run


def _viewed_state(raw_steps, state: set[int]) -> set[int]:
    """State slots a view may be taken of (an ``aliases_inputs`` op reads the slot, or a slot
    holding the same tensor, such as an in-place op's output): the journal keeps their storage
    (copy, no swap), so the views stay views."""
    root: dict[int, set[int]] = {s: {s} for s in state}
    viewed: set[int] = set()
    for op, ins, outs in raw_steps:
        if op.aliases_inputs:
            for s in ins:
                viewed |= root.get(s, set())
        sources = ins if op.aliases_inputs else [ins[i] for i in op.modifies_inputs
                                                   if i < len(ins)]
        roots = set().union(*(root.get(s, set()) for s in sources)) if sources else set()
        if roots:
            for s in outs:
                if s >= 0:
                    root[s] = root.get(s, set()) | roots
    return viewed
