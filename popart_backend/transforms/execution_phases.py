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
   without a phase (gradient sums, optimizer updates) take the latest phase of what they read;
2. checks that no op reads a value of a later phase;
3. streams the weights whose tensor location is OffChip (``weightTensorLocationSettings``,
   ``tensorLocationSettingsOverride``; PopART's defaults keep them on chip, on the IPU of their
   phases): every such weight is loaded (``RemoteLoad``) once per (phase, IPU) that
   reads it, the readers then read the loaded copy, and a weight updated in place is written
   back (``RemoteStore``) after the update, in the same phase;
4. streams the OffChip activations (``activationTensorLocationSettings``) read two or more
   phases after the one that made them (the backward pass reading forward activations):
   ``RemoteStore`` into a streaming-memory buffer
   (made by ``Init``) of each IPU that reads it, right after the producer (or in the next
   phase, after the inter-IPU copy, for the other IPU), ``RemoteLoad`` per later (phase, IPU)
   of readers. Values read in the same or the next phase stay on chip (the next phase's IPU gets
   them through an ``IpuCopy``);
5. makes the phases run in sequence: every op of phase p + 1 runs after every op of phase p
   (scheduling constraints from the last ops of p to the first ops of p + 1).

The IO schedules decide when a load runs: ``Preload`` (weights, activations and accumulators
by default) loads during the previous phase, so the next phase's tensors are on chip
(prefetched) while the previous phase computes on the other IPU; ``OnDemand`` loads at the
start of the phase that reads them. The memory model (device/memory.py) sees the loaded copies
as ordinary tensors and the streamed tensors in the streaming-memory pool; the cycle model
(device/cost.py) charges every RemoteLoad and RemoteStore.

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
        fill_placement(graph, order, lambda op: op.settings.execution_phase,
                       lambda op, p: set_placement(op, execution_phase=p), 0,
                       contexts=tuple(ExecutionContext))
        self._check_order(order)
        keep = set(ir.anchors) | set(graph.outputs)
        position = {op.id: i for i, op in enumerate(order)}

        def off_chip(tensor) -> bool:
            return resolve_one(tensor, self.options, position, ir.sharded_variables).off_chip

        weights = self._stream_weights(graph, order, set(ir.sharded_variables), off_chip)
        activations = self._stream_activations(graph, order, keep, off_chip)
        self._phases_in_sequence(graph)
        _log.debug("execution_phases: %d phase(s), %d weight load(s), %d activation(s) "
                   "streamed", len({_phase(op) for op in graph.ops.values()}), weights,
                   activations)
        return True

    @staticmethod
    def _check_order(order: list[Op]) -> None:
        for op in order:
            for t in op.inputs:
                if t is None or t.producer is None:
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

    def _stream_weights(self, graph: Graph, order: list[Op], sharded: set[str],
                        off_chip: Callable[[Tensor], bool]) -> int:
        loads = 0
        position = {op.id: i for i, op in enumerate(order)}
        for tensor in list(graph.tensors.values()):
            if tensor.kind is not TensorKind.VARIABLE or tensor.role is not TensorRole.WEIGHT:
                continue
            if not off_chip(tensor):
                continue  # on chip: it stays on the IPU of its phases
            readers = sorted({op.id: op for op in tensor.consumers}.values(),
                             key=lambda op: position[op.id])
            if not readers:
                continue
            if tensor.id in sharded or any(
                    op.settings.execution_context is not _NORMAL for op in readers):
                _log.debug("execution_phases: weight '%s' stays where its tensor location puts "
                           "it (sharded, or read outside the per-micro-batch program)",
                           tensor.id)
                continue
            groups: dict[tuple[int, int], list[Op]] = defaultdict(list)
            for op in readers:
                groups[(_phase(op), op.settings.ipu or 0)].append(op)
            for (phase, ipu), ops in sorted(groups.items()):
                loaded = graph.unique_id(f"{tensor.id}/phase{phase}")
                settings = OpSettings(
                    name=f"RemoteLoad___{loaded}", ipu=ipu,
                    execution_phase=self._load_phase(phase, self.settings.weightIOSchedule))
                graph.add_op(create_op("RemoteLoad", {}, settings, domain=AI_GRAPHCORE,
                                       where=loaded), [tensor.id], [loaded])
                loads += 1
                writers = []
                for op in ops:
                    for index, t in enumerate(op.inputs):
                        if t is tensor:
                            graph.replace_input(op, index, loaded)
                            if index in op.modifies_inputs:
                                writers.append((op, index))
                for op, index in writers:
                    self._store_back(graph, tensor.id, loaded, op, index, phase, ipu)
        return loads

    @staticmethod
    def _store_back(graph: Graph, var_id: str, loaded: str, writer: Op, index: int,
                    phase: int, ipu: int) -> None:
        """RemoteStore of the updated copy into the weight, after ``writer`` updated it."""
        source = writer.inputs[index]
        value = next((t.id for t in writer.outputs if t is not None and t.info == source.info),
                     None)
        stored = graph.unique_id(f"{var_id}/stored_phase{phase}")
        settings = OpSettings(name=f"RemoteStore___{stored}", ipu=ipu, execution_phase=phase,
                              schedule_priority=_STORE_PRIORITY)
        store = graph.add_op(create_op("RemoteStore", {}, settings, domain=AI_GRAPHCORE,
                                       where=stored), [var_id, value or loaded], [stored])
        if value is None:  # an update without an output: store once it has written the copy
            graph.add_constraint(writer, store)

    def _stream_activations(self, graph: Graph, order: list[Op], keep: set[str],
                            off_chip: Callable[[Tensor], bool]) -> int:
        streamed = 0
        schedule = self.settings.activationIOSchedule
        for op in order:
            if op.settings.execution_context is not _NORMAL or op.modifies_inputs or (
                    op.remote_transfer):
                continue
            for out in op.outputs:
                if out is None or out.kind is not TensorKind.ACT_GRAD or out.id in keep:
                    continue
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
    def _phases_in_sequence(graph: Graph) -> None:
        """Constraints from the last ops of each phase to the first ops of the next one."""
        by_phase: dict[int, list[Op]] = defaultdict(list)
        for op in graph.ops.values():
            if op.settings.execution_context is _NORMAL:
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
