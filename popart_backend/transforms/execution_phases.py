"""Execution phases (``VirtualGraphMode.ExecutionPhases``, F21): the graph runs as a sequence of
phases, each on one IPU, with weights and activations kept in streaming memory between the
phases that use them.

``AssignVirtualGraphs`` (transforms/virtual_graphs.py) checks the forward ops' phases (the
builder's ``executionPhase``, 0 .. ``executionPhaseSettings.phases`` - 1) and places phase p on
IPU ``p % executionPhaseSettings.stages``: with 2 stages consecutive phases alternate IPUs.
Autodiff gives each gradient op its forward op's settings. This pass, after the training
passes and recomputation, then:

1. moves the backward ops to their phase: the gradient of an op of forward phase p runs in
   phase 2·P - 2 - p (P = ``phases``), on the IPU of its forward op; the loss phase P - 1 holds
   both the forward and the start of the backward pass. The ops the training passes added
   without a phase (gradient sums, optimizer updates) take the latest phase of what they read
   (with gradient accumulation, the weight update's phases are described below);
2. checks that no op reads a value of a later phase;
3. streams the OffChip variables: weights (``weightTensorLocationSettings``), gradient
   accumulators (``accumulatorTensorLocationSettings``) and optimizer state
   (``optimizerStateTensorLocationSettings``), each also per ``tensorLocationSettingsOverride``
   (PopART's defaults keep them all on chip, on the IPU of their phases): every such variable
   is loaded (``RemoteLoad``) once per (fragment, phase, IPU) that reads it, the readers then
   read the loaded copy, and a variable updated in place is written back (``RemoteStore``)
   after its last update in that phase;
4. streams the OffChip activations (``activationTensorLocationSettings``) read two or more
   phases after the one that made them (the backward pass reading forward activations):
   ``RemoteStore`` into a streaming-memory buffer
   (made by ``Init``) of each IPU that reads it, right after the producer (or in the next
   phase, after the inter-IPU copy, for the other IPU), ``RemoteLoad`` per later (phase, IPU)
   of readers. Values read in the same or the next phase stay on chip (the next phase's IPU gets
   them through an ``IpuCopy``). A value an op wrote in place into an activation's storage is
   streamed like any other (from its writer's phase); one written into a variable is not;
5. makes the phases run in sequence within each fragment: every op of phase p + 1 runs after
   every op of phase p (scheduling constraints from the last ops of p to the first ops of
   p + 1).

Gradient accumulation (``enableGradientAccumulation``): each micro-batch runs every forward
and backward phase (the Normal fragment, ``accumulationFactor`` times per weight update), and
adds each weight's gradient into its accumulator in the weight's backward phase. The weight
update (optimizer and accumulator reset) is the accumulate outer fragment, run once per
``accumulationFactor`` micro-batches; its ops run in phases of their own: the update of a weight
takes the backward phase of that weight (so it is on the weight's IPU), and the outer fragment
walks these phases in order. An on-chip accumulator stays on its phase's IPU throughout; an
OffChip one is loaded and stored in its backward phase every micro-batch, and loaded and stored
again by the update.

The IO schedules decide when a load runs, per kind of tensor (``weightIOSchedule``,
``activationIOSchedule``, ``accumulatorIOSchedule``, ``optimizerStateIOSchedule``):
``Preload`` (the default for all but optimizer state) loads during the previous phase of the
same fragment, so the tensors are on chip (prefetched) while the previous phase computes on the
other IPU, at the price of holding them one phase longer; ``OnDemand`` (optimizer state's
default) loads at the start of the phase that reads them, in series with its compute. A load
never runs before the store of an earlier phase of the same fragment wrote the variable. The
memory model (device/memory.py) sees the loaded copies as ordinary tensors and the streamed
tensors in the streaming-memory pool; the cycle model (device/cost.py) charges every RemoteLoad
and RemoteStore.

Values are those of the unphased run: the loads and stores are copies.

Before (P = 2, training):            After:
    y = MatMul(x, w)      # phase 0      w_p0 = RemoteLoad(w)               # phase 0, ipu0
    l = Loss(y, w2)       # phase 1      y = MatMul(x, w_p0)                # phase 0, ipu0
    dw = MatMulRhsGrad(x, dy)            ...
    w' = SGDUpdate(w, dw)                w_p2 = RemoteLoad(w)               # phase 2, ipu0
                                         w' = SGDUpdate(w_p2, dw)           # phase 2, ipu0
                                         RemoteStore(w, w')                 # phase 2, ipu0
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from itertools import pairwise

from ..errors import popart_exception
from ..ir.graph import Graph
from ..ir.op import ExecutionContext, Op, OpSettings
from ..ir.tensor import Tensor, TensorKind, TensorRole
from ..ops.registry import AI_GRAPHCORE, create_op
from ..options.enums import ExecutionPhaseIOSchedule
from ..options.session_options import SessionOptions
from ..options.structs import ExecutionPhaseSettings
from .tensor_locations import resolve_one
from .virtual_graphs import fill_placement, set_placement

__all__ = ["ExecutionPhases", "backward_phase"]

_log = logging.getLogger("popart:transform")

# Stores run right after the value they store is made (highest schedule priority).
_STORE_PRIORITY = 1e9
_NORMAL = ExecutionContext.Normal
_OUTER = ExecutionContext.AccumulateOuterFragment
# The fragments whose variables are streamed per phase: a micro-batch and a weight update.
_PHASED = (_NORMAL, _OUTER)


def backward_phase(forward_phase: int, phases: int) -> int:
    """The phase running the gradient of an op of ``forward_phase`` (of ``phases`` forward
    phases): the backward pass walks the phases back from the loss phase ``phases - 1``."""
    return 2 * phases - 2 - forward_phase


def _phase(op: Op) -> int:
    return op.settings.execution_phase or 0


class ExecutionPhases:
    """Pass: backward phases, RemoteLoad / RemoteStore of weights and activations, and the
    phases in sequence (module docstring)."""

    name = "execution_phases"

    def __init__(self, options: SessionOptions, training: bool):
        self.options = options
        self.settings: ExecutionPhaseSettings = options.executionPhaseSettings
        self.training = training

    def run(self, ir) -> bool:
        graph = ir.main
        phases = self.settings.phases
        if self.training:
            for op in graph.ops.values():
                p = op.settings.execution_phase
                if op.id not in ir.forward_op_ids and p is not None:
                    set_placement(op, execution_phase=backward_phase(p, phases))
        order = graph.topo_order()

        def fill(contexts: tuple[ExecutionContext, ...]) -> None:
            fill_placement(graph, order, lambda op: op.settings.execution_phase,
                           lambda op, p: set_placement(op, execution_phase=p), 0,
                           contexts=contexts)

        fill((_NORMAL,))  # the micro-batch first: the weight update follows its phases
        self._update_phases(order)
        fill(tuple(ExecutionContext))
        self._check_order(order)
        keep = set(ir.anchors) | set(graph.outputs)
        position = {op.id: i for i, op in enumerate(order)}

        def off_chip(tensor) -> bool:
            return resolve_one(tensor, self.options, position, ir.sharded_variables).off_chip

        loads = self._stream_variables(graph, order, set(ir.sharded_variables), off_chip)
        activations = self._stream_activations(graph, order, keep, off_chip)
        for context in _PHASED:
            self._phases_in_sequence(graph, context)
        _log.debug("execution_phases: %d phase(s), variable loads per role %s, %d "
                   "activation(s) streamed", len({_phase(op) for op in graph.ops.values()}),
                   loads, activations)
        return True

    @staticmethod
    def _update_phases(order: list[Op]) -> None:
        """Phases of the accumulate outer fragment (the weight update with gradient
        accumulation): an op takes the latest phase of the ops making what it reads and, for a
        variable it reads, of the micro-batch ops reading that variable (a weight's update runs
        in its backward phase, where its gradient was accumulated). The rest are placed from
        their neighbours afterwards."""
        for op in order:
            if op.settings.execution_context is not _OUTER or (
                    op.settings.execution_phase is not None):
                continue
            found = []
            for t in op.inputs:
                if t is None:
                    continue
                if t.producer is not None:
                    found.append(t.producer.settings.execution_phase)
                elif t.kind is TensorKind.VARIABLE:
                    found.extend(c.settings.execution_phase for c in t.consumers
                                 if c.settings.execution_context is _NORMAL)
            found = [p for p in found if p is not None]
            if found:
                set_placement(op, execution_phase=max(found))

    @staticmethod
    def _check_order(order: list[Op]) -> None:
        for op in order:
            for t in op.inputs:
                if t is None or t.producer is None or (
                        t.producer.settings.execution_context
                        is not op.settings.execution_context):
                    continue
                if _phase(t.producer) > _phase(op):
                    raise popart_exception(
                        f"{op.debug_name} runs in execution phase {_phase(op)} but reads "
                        f"'{t.id}', made by {t.producer.debug_name} in the later phase "
                        f"{_phase(t.producer)}. Phases run in order: annotate the reader with "
                        f"builder.executionPhase({_phase(t.producer)}) or later."
                    )

    def _load_phase(self, phase: int, schedule: ExecutionPhaseIOSchedule) -> int:
        """The phase a load for ``phase`` runs in: the one before with Preload."""
        if schedule is ExecutionPhaseIOSchedule.Preload and phase > 0:
            return phase - 1
        return phase

    def _io_schedule(self, role: TensorRole | None) -> ExecutionPhaseIOSchedule | None:
        """The IO schedule of a variable of ``role``; None for the roles never streamed."""
        return {TensorRole.WEIGHT: self.settings.weightIOSchedule,
                TensorRole.ACCUMULATOR: self.settings.accumulatorIOSchedule,
                TensorRole.OPTIMIZER_STATE: self.settings.optimizerStateIOSchedule}.get(role)

    def _stream_variables(self, graph: Graph, order: list[Op], sharded: set[str],
                          off_chip: Callable[[Tensor], bool]) -> dict[str, int]:
        """Loads (and stores) of the OffChip weights, accumulators and optimizer state; returns
        the loads per role."""
        loads: dict[str, int] = defaultdict(int)
        position = {op.id: i for i, op in enumerate(order)}
        for tensor in list(graph.tensors.values()):
            if tensor.kind is not TensorKind.VARIABLE:
                continue
            schedule = self._io_schedule(tensor.role)
            if schedule is None or not off_chip(tensor):
                continue  # on chip: it stays on the IPU of its phases
            readers = sorted({op.id: op for op in tensor.consumers}.values(),
                             key=lambda op: position[op.id])
            if not readers:
                continue
            if tensor.id in sharded or any(
                    op.settings.execution_context not in _PHASED for op in readers):
                _log.debug("execution_phases: variable '%s' stays where its tensor location "
                           "puts it (sharded, or read outside the micro-batch and weight-update "
                           "fragments)", tensor.id)
                continue
            groups: dict[tuple[ExecutionContext, int, int], list[Op]] = defaultdict(list)
            for op in readers:
                groups[(op.settings.execution_context, _phase(op),
                        op.settings.ipu or 0)].append(op)
            stores: dict[ExecutionContext, list[Op]] = defaultdict(list)  # per fragment
            for (context, phase, ipu), ops in sorted(
                    groups.items(), key=lambda item: (item[0][0].value, *item[0][1:])):
                loaded = graph.unique_id(f"{tensor.id}/phase{phase}")
                load_phase = self._load_phase(phase, schedule)
                earlier = stores[context]
                if earlier:  # not before an earlier phase stored its update
                    load_phase = max(load_phase, _phase(earlier[-1]))
                settings = OpSettings(
                    name=f"RemoteLoad___{loaded}", ipu=ipu, execution_context=context,
                    execution_phase=load_phase)
                load = graph.add_op(create_op("RemoteLoad", {}, settings, domain=AI_GRAPHCORE,
                                              where=loaded), [tensor.id], [loaded])
                for store in earlier:
                    # Graph.add_op ordered this new reader of the variable before its writers.
                    graph.constraints.get(store.id, set()).discard(load.id)
                    graph.add_constraint(store, load)
                loads[tensor.role.value] += 1
                for op in ops:
                    for index, t in enumerate(op.inputs):
                        if t is tensor:
                            graph.replace_input(op, index, loaded)
                store = self._store_back(graph, tensor.id, graph.tensors[loaded], position,
                                         context, phase, ipu)
                if store is not None:
                    stores[context].append(store)
        return dict(loads)

    @staticmethod
    def _store_back(graph: Graph, var_id: str, loaded: Tensor, position: dict[int, int],
                    context: ExecutionContext, phase: int, ipu: int) -> Op | None:
        """RemoteStore of the loaded copy into the variable after the last op that updates it
        in place (following the chain of in-place outputs); None when no op writes it."""
        value, writer = loaded, None
        while True:
            writers = [op for op in value.consumers if _modifies(op, value)]
            if not writers:
                break
            writer = max(writers, key=lambda op: position.get(op.id, -1))
            alias = _alias_output(writer, value)
            if alias is None:
                break  # the writer updates the copy without an output: store the copy itself
            value, writer = alias, None
        if value is loaded and writer is None:
            return None  # read only
        stored = graph.unique_id(f"{var_id}/stored_phase{phase}")
        settings = OpSettings(name=f"RemoteStore___{stored}", ipu=ipu, execution_phase=phase,
                              execution_context=context, schedule_priority=_STORE_PRIORITY)
        store = graph.add_op(create_op("RemoteStore", {}, settings, domain=AI_GRAPHCORE,
                                       where=stored), [var_id, value.id], [stored])
        if writer is not None:
            # Graph.add_op ordered this new reader of the copy before its writer: the store
            # must see the written value, so it runs after the writer instead.
            graph.constraints.get(writer.id, set()).discard(store.id)
            graph.add_constraint(writer, store)
        return store

    def _stream_activations(self, graph: Graph, order: list[Op], keep: set[str],
                            off_chip: Callable[[Tensor], bool]) -> int:
        streamed = 0
        schedule = self.settings.activationIOSchedule
        for op in order:
            if op.settings.execution_context is not _NORMAL or op.remote_transfer:
                continue
            for out in op.outputs:
                if out is None or out.kind is not TensorKind.ACT_GRAD or out.id in keep:
                    continue
                if op.modifies_inputs and not _activation_storage(out):
                    continue  # written in place into a variable (or its loaded copy)
                made = _phase(op)
                far: dict[tuple[int, int], list[Op]] = defaultdict(list)
                for reader in {r.id: r for r in out.consumers}.values():
                    if _phase(reader) >= made + 2:
                        far[(_phase(reader), reader.settings.ipu or 0)].append(reader)
                if not far or not off_chip(out):
                    continue
                self._stream_activation(graph, op, out.id, far, schedule)
                streamed += 1
        return streamed

    def _stream_activation(self, graph: Graph, producer: Op, tid: str,
                           far: dict[tuple[int, int], list[Op]],
                           schedule: ExecutionPhaseIOSchedule) -> None:
        """One streaming-memory buffer per IPU that loads ``tid`` (each IPU has its own
        streaming memory): on the producer's IPU it is stored in the producer's phase, on
        another IPU in the next phase (after the inter-IPU copy)."""
        info = graph.tensors[tid].info
        made = _phase(producer)
        buffers: dict[int, str] = {}
        for (phase, dest), readers in sorted(far.items()):
            if dest not in buffers:
                store_phase = made if dest == (producer.settings.ipu or 0) else made + 1
                buffer = graph.unique_id(f"RemoteBuffer___{tid}")
                graph.add_op(create_op(
                    "Init", {"shape": tuple(info.shape), "data_type": info.dtype.onnx,
                             "init_type": 0},
                    OpSettings(name=f"Init___{buffer}", ipu=dest, execution_phase=store_phase),
                    domain=AI_GRAPHCORE, where=buffer), [], [buffer])
                stored = graph.unique_id(f"{tid}/remote")
                graph.add_op(create_op("RemoteStore", {}, OpSettings(
                    name=f"RemoteStore___{stored}", ipu=dest, execution_phase=store_phase,
                    schedule_priority=_STORE_PRIORITY), domain=AI_GRAPHCORE, where=stored),
                    [buffer, tid], [stored])
                buffers[dest] = stored
            stored = buffers[dest]
            store_phase = _phase(graph.tensors[stored].producer)
            loaded = graph.unique_id(f"{tid}/phase{phase}")
            load_phase = max(store_phase + 1, self._load_phase(phase, schedule))
            graph.add_op(create_op("RemoteLoad", {}, OpSettings(
                name=f"RemoteLoad___{loaded}", ipu=dest, execution_phase=load_phase),
                domain=AI_GRAPHCORE, where=loaded), [stored], [loaded])
            for reader in readers:
                for index, t in enumerate(reader.inputs):
                    if t is not None and t.id == tid:
                        graph.replace_input(reader, index, loaded)

    @staticmethod
    def _phases_in_sequence(graph: Graph, context: ExecutionContext) -> None:
        """Constraints from the last ops of each phase of the fragment ``context`` to the first
        ops of its next phase."""
        by_phase: dict[int, list[Op]] = defaultdict(list)
        for op in graph.ops.values():
            if op.settings.execution_context is context:
                by_phase[_phase(op)].append(op)
        phases = sorted(by_phase)
        for before, after in pairwise(phases):
            members = {op.id for op in by_phase[before]}
            sinks = [op for op in by_phase[before]
                     if not any(c.id in members for t in op.outputs if t is not None
                                for c in t.consumers)
                     and not any(op.id in graph.constraints.get(m, ()) for m in members)]
            members = {op.id for op in by_phase[after]}
            sources = [op for op in by_phase[after]
                       if not any(t is not None and t.producer is not None
                                  and t.producer.id in members for t in op.inputs)
                       and not members & graph.constraints.get(op.id, set())]
            for sink in sinks:
                for source in sources:
                    graph.add_constraint(sink, source)


def _modifies(op: Op, tensor: Tensor) -> bool:
    return any(i < len(op.inputs) and op.inputs[i] is tensor for i in op.modifies_inputs)


def _aliased_input(op: Op, out: Tensor) -> Tensor | None:
    """The input of in-place ``op`` whose storage its output ``out`` shares; None for a fresh
    output (matched as ``_alias_output`` matches them)."""
    for index in op.modifies_inputs:
        source = op.inputs[index] if index < len(op.inputs) else None
        if source is not None and _alias_output(op, source) is out:
            return source
    return None


def _activation_storage(tensor: Tensor) -> bool:
    """Whether ``tensor`` is stored in an activation's storage: follows in-place outputs to the
    input they write and loaded copies to what was loaded; False when that ends at a variable
    (an accumulator or running statistic updated in place), a constant or a host stream."""
    while tensor.producer is not None:
        op = tensor.producer
        source = (op.inputs[0] if op.remote_transfer and not op.modifies_inputs
                  else _aliased_input(op, tensor) if op.modifies_inputs else None)
        if source is None:
            break
        tensor = source
    return tensor.kind is TensorKind.ACT_GRAD


def _alias_output(op: Op, tensor: Tensor) -> Tensor | None:
    """The output of in-place ``op`` sharing ``tensor``'s storage, matched as the memory model
    matches them: per modified input in order, the first free output of the same info."""
    taken: set[int] = set()
    for index in op.modifies_inputs:
        source = op.inputs[index] if index < len(op.inputs) else None
        if source is None:
            continue
        match = next((k for k, out in enumerate(op.outputs)
                      if out is not None and k not in taken and out.info == source.info), None)
        if match is not None:
            taken.add(match)
        if source is tensor:
            return op.outputs[match] if match is not None else None
    return None
