"""What the session options that act on the device model ask of it (``OptionModel``), read
once from SessionOptions by ``option_model`` for device/memory.py and device/cost.py.

- ``batchSerializationSettings.factor`` = f (F9): the ops that work on the batch dimension run
  in f slices of batch / f samples each. The values are the same (each slice computes its
  share); the model sees it as (a) the activations of those ops taking 1 / f of their bytes,
  since one slice is live at a time (the outputs read back, anchors and graph outputs, are
  concatenated whole), and (b) each of those ops running f supersteps, so it pays f syncs
  instead of one (the FLOPs and bytes are unchanged). The batch is the first dim of the first
  streamed input; an op "works on the batch" when its output's first dim is that batch.
  ``transformContext`` Fwd serialises the forward ops only, Bwd every op of the main
  fragment. 0 (the default) and 1 mean no serialisation.
- ``defaultBufferingDepth`` / ``bufferingDepthMap`` (and their deprecated names): each host
  input stream keeps ``depth`` device buffers instead of one, in the "streams" memory category,
  when ``enablePrefetchDatastreams`` is on (with it off, every stream has one buffer). The
  cycle model does not overlap host transfers either way.
- ``groupHostSync``: the anchors of a step travel in the same host sync as the step's last
  input transfer, so the anchor transfer pays no sync of its own.
- ``delayVarUpdates`` = False (training): the weight updates run as early as they can, right
  after the last op they depend on, instead of as late as they can (the default schedule,
  which runs them after every other ready op). Like the recompute clones of device/memory.py
  this is the order the liveness walk uses, so a weight's gradient dies at its update and the
  peak can drop; the executed schedule, and so every value, is unchanged.
- ``mergeVarUpdate`` (with ``mergeVarUpdateMemThreshold``, ``looseThresholdAtPeak``): groups
  of weight updates run as one op (device/var_update_merge.py): one sync per group, and a
  concatenated gradient buffer in memory.
- ``accumulateOuterFragmentSettings.schedule`` OverlapCycleOptimized / OverlapMemoryOptimized:
  the outer-fragment ops of the IPUs not in ``excludedVirtualGraphs`` run in parallel, so the
  weight update takes the slowest IPU's cycles instead of their sum (device/cost.py).
- ``scheduleNonWeightUpdateGradientConsumersEarly``: the ops that read a gradient but are
  not weight updates (accumulators, reductions) run right after their inputs in the liveness
  walk's order, so the gradients they read die early; the executed schedule is unchanged.
- ``enableSerializedMatmuls`` = False: the per-op matmul serialisations
  (``OpSettings.serialize_matmul``) are not planned; device/planner.py sees plain matmuls.
- ``replicatedCollectivesSettings.merge*Collectives``: the collectives of that kind in one
  fragment on one IPU run as one merged collective: the bytes are the same, but only the first
  pays the IPU sync.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..errors import popart_exception
from ..ir.ir import Ir
from ..ir.op import ExecutionContext, Op
from ..ir.graph import Graph
from ..ir.tensor import TensorKind, TensorRole
from ..options.enums import AccumulateOuterFragmentSchedule, BatchSerializationTransformContext
from .var_update_merge import merge_groups

__all__ = ["OptionModel", "early_op_order", "early_var_update_order", "option_model"]

_log = logging.getLogger("popart:session")
_logged: set[str] = set()


def log_once(key: str, message: str) -> None:
    if key not in _logged:
        _logged.add(key)
        _log.warning(message)


_MERGED = {
    "mergeAllReduceCollectives": "ReplicatedAllReduce",
    "mergeReduceScatterCollectives": "ReplicatedReduceScatter",
    "mergeAllGatherCollectives": "ReplicatedAllGather",
}


@dataclass(frozen=True)
class OptionModel:
    """The device-model effects of the session options (the defaults: none)."""

    serial_factor: int = 1
    serialised: frozenset[str] = frozenset()  # tensors made in batch-serialised slices
    stream_depth: dict[str, int] = field(default_factory=dict)  # input id -> buffers
    group_host_sync: bool = False
    merged_collectives: frozenset[str] = frozenset()  # op types merged per fragment
    early_var_updates: bool = False  # delayVarUpdates = False
    # enableSerializedMatmuls: the matmuls' per-op serialisation is planned (device/planner.py).
    serialized_matmuls: bool = True
    # mergeVarUpdate: groups of weight updates run as one (device/var_update_merge.py).
    merged_updates: tuple[tuple[int, ...], ...] = ()
    # accumulateOuterFragmentSettings: IPUs whose outer-fragment ops overlap (device/cost.py).
    outer_overlap_ipus: frozenset[int] = frozenset()
    # scheduleNonWeightUpdateGradientConsumersEarly: ops the liveness walk runs right after
    # their inputs (``early_op_order``).
    early_ops: frozenset[int] = frozenset()
    # matmulOptions / convolutionOptions["availableMemoryProportion"]: the planner's budget of
    # the AMP ops without a proportion of their own (device/planner.py; None: Poplar's 0.6).
    matmul_proportion: float | None = None
    conv_proportion: float | None = None

    def merged_follower(self, op: Op) -> bool:
        """An update merged into an earlier one of its group: it pays no sync of its own."""
        return any(op.id in group[1:] for group in self.merged_updates)

    def stream_bytes(self, tensor_id: str, num_bytes: int) -> int:
        return num_bytes * self.stream_depth.get(tensor_id, 1)

    def activation_bytes(self, tensor_id: str, num_bytes: int) -> int:
        if tensor_id in self.serialised:
            return -(-num_bytes // self.serial_factor)
        return num_bytes

    def op_syncs(self, op: Op) -> int:
        """Supersteps (syncs) one execution of ``op`` takes: the factor for a serialised op."""
        if any(t is not None and t.id in self.serialised for t in op.outputs):
            return self.serial_factor
        return 1


def option_model(ir: Ir, order: Sequence[Op], options, keep: Iterable[str] = ()) -> OptionModel:
    """The ``OptionModel`` of ``options`` (SessionOptions, or None: no effects) for ``ir``'s
    main graph run in ``order``. Raises popart_exception for a batch-serialisation factor or a
    buffering depth that cannot be used."""
    if options is None:
        return OptionModel()
    graph = ir.main
    streams = [graph.tensors[t] for t in graph.inputs
               if t in graph.tensors and graph.tensors[t].kind is TensorKind.STREAM]
    factor, serialised = _batch_serialisation(ir, order, options, streams, set(keep))
    merged = frozenset(op_type for flag, op_type in _MERGED.items()
                       if getattr(options.replicatedCollectivesSettings, flag))
    return OptionModel(
        serial_factor=factor,
        serialised=serialised,
        stream_depth=_stream_depths(options, streams),
        group_host_sync=options.groupHostSync,
        merged_collectives=merged,
        early_var_updates=not options.delayVarUpdates,
        serialized_matmuls=bool(options.enableSerializedMatmuls),
        merged_updates=tuple(merge_groups(graph, order, options)),
        outer_overlap_ipus=_outer_overlap(order, options),
        early_ops=(_gradient_consumers(order)
                   if options.scheduleNonWeightUpdateGradientConsumersEarly else frozenset()),
        matmul_proportion=_proportion(options.matmulOptions),
        conv_proportion=_proportion(options.convolutionOptions),
    )


def _proportion(planning: dict[str, str]) -> float | None:
    """The ``availableMemoryProportion`` of a planning dict (checked by options/planning.py)."""
    value = planning.get("availableMemoryProportion")
    return None if value is None else float(value)


def _gradient_consumers(order: Sequence[Op]) -> frozenset[int]:
    """Ops of the Normal fragment that read a gradient (an output of an op autodiff made, or of
    another such consumer) and are neither gradient ops themselves nor weight updates: the
    named-gradient copies, accumulators, reductions, gradient statistics."""
    gradients: set[str] = set()
    early: set[int] = set()
    for op in order:
        outs = {t.id for t in op.outputs if t is not None}
        if op.grad_of is not None:
            gradients |= outs
        elif (not _updates_weight(op)
              and op.settings.execution_context is ExecutionContext.Normal
              and any(t is not None and t.id in gradients for t in op.inputs)):
            early.add(op.id)
            gradients |= outs
    return frozenset(early)


_OVERLAP = (AccumulateOuterFragmentSchedule.OverlapCycleOptimized,
            AccumulateOuterFragmentSchedule.OverlapMemoryOptimized)


def _outer_overlap(order: Sequence[Op], options) -> frozenset[int]:
    """The IPUs whose accumulate-outer-fragment ops overlap: with an Overlap schedule, every
    IPU with such ops except ``excludedVirtualGraphs``."""
    settings = options.accumulateOuterFragmentSettings
    if settings.schedule is AccumulateOuterFragmentSchedule.Scheduler:
        log_once("outer-scheduler", "SessionOptions.accumulateOuterFragmentSettings.schedule = "
                 "Scheduler has no effect in the simulator: its scheduler runs the weight "
                 "updates serially, as Serial does.")
    if settings.schedule not in _OVERLAP:
        return frozenset()
    if settings.schedule is AccumulateOuterFragmentSchedule.OverlapMemoryOptimized:
        log_once("outer-memory", "SessionOptions.accumulateOuterFragmentSettings.schedule = "
                 "OverlapMemoryOptimized: the IPUs' weight updates overlap as with "
                 "OverlapCycleOptimized; its memory-saving order of remote loads has no effect "
                 "in the simulator's memory model.")
    excluded = set(settings.excludedVirtualGraphs)
    return frozenset(op.settings.ipu or 0 for op in order
                     if op.settings.execution_context is ExecutionContext.AccumulateOuterFragment
                     and (op.settings.ipu or 0) not in excluded)


def _updates_weight(op: Op) -> bool:
    return op.settings.execution_context is ExecutionContext.Normal and any(
        i < len(op.inputs) and op.inputs[i] is not None
        and op.inputs[i].kind is TensorKind.VARIABLE and op.inputs[i].role is TensorRole.WEIGHT
        for i in op.modifies_inputs)


def early_var_update_order(graph: Graph, order: Sequence[Op]) -> list[Op]:
    """``order`` with each weight update (an op of the Normal fragment writing a weight in
    place), and the ops whose results only weight updates read (the copy making the weight's
    gradient), moved to just after the last op each depends on: the producers of its inputs, the other
    readers of the tensors it writes (they must see the old value) and its scheduling
    constraints. The ops that read their results stay after them, so the result is a valid
    schedule whenever ``order`` is."""
    ops = list(order)
    updates = {op.id for op in ops if _updates_weight(op)}
    if not updates:
        return ops
    moving_ids = set(updates)
    for op in ops:  # the ops whose every result goes straight into weight updates
        outs = [t for t in op.outputs if t is not None]
        if (op.id not in updates and outs and not op.modifies_inputs
                and op.settings.execution_context is ExecutionContext.Normal
                and all(t.consumers and all(c.id in updates for c in t.consumers)
                        for t in outs)):
            moving_ids.add(op.id)
    out = [op for op in ops if op.id not in moving_ids]
    for op in (op for op in ops if op.id in moving_ids):
        deps = {t.producer.id for t in op.inputs if t is not None and t.producer is not None}
        for i in op.modifies_inputs:
            if i < len(op.inputs) and op.inputs[i] is not None:
                deps |= {r.id for r in op.inputs[i].consumers if r is not op}
        deps |= set(graph.constraints.get(op.id, ()))
        last = max((k for k, other in enumerate(out) if other.id in deps), default=-1)
        out.insert(last + 1, op)
    return out


def early_op_order(graph: Graph, order: Sequence[Op],
                   extra: frozenset[int] = frozenset()) -> list[Op]:
    """``order`` with each op marked ``early_in_liveness`` (or in ``extra``) moved to just after
    the last op it depends on (its inputs' producers and its scheduling constraints), in order,
    so a valid schedule stays valid. The liveness walk's order, as ``early_var_update_order``."""
    ops = list(order)

    def early(op: Op) -> bool:
        return op.settings.early_in_liveness or op.id in extra

    if not any(early(op) for op in ops):
        return ops
    out = [op for op in ops if not early(op)]
    for op in (op for op in ops if early(op)):
        deps = {t.producer.id for t in op.inputs if t is not None and t.producer is not None}
        # Constraints from another fragment order separate programs, not this one.
        deps |= {i for i in graph.constraints.get(op.id, ()) if i in graph.ops
                 and graph.ops[i].settings.execution_context
                 is op.settings.execution_context}
        last = max((k for k, other in enumerate(out) if other.id in deps), default=-1)
        out.insert(last + 1, op)
    return out


def _batch_serialisation(ir: Ir, order: Sequence[Op], options, streams,
                         keep: set[str]) -> tuple[int, frozenset[str]]:
    settings = options.batchSerializationSettings
    factor = settings.factor
    if factor < 0:
        raise popart_exception(
            f"SessionOptions.batchSerializationSettings.factor = {factor}: the factor must be "
            f"0 (off) or a number of slices >= 1 that divides the batch."
        )
    if factor <= 1:
        return 1, frozenset()
    batched = [t for t in streams if t.info.shape]
    if not batched:
        raise popart_exception(
            f"SessionOptions.batchSerializationSettings.factor = {factor}: the model has no "
            f"streamed input with a batch dimension to serialise. Set the factor to 0."
        )
    batch = batched[0].info.shape[0]
    if batch % factor:
        raise popart_exception(
            f"SessionOptions.batchSerializationSettings.factor = {factor} does not divide the "
            f"batch size {batch} (the first dim of input '{batched[0].id}'). Use a factor that "
            f"divides {batch}."
        )
    forward_only = settings.transformContext is BatchSerializationTransformContext.Fwd
    forward = ir.forward_op_ids
    serialised = set()
    for op in order:
        if op.settings.execution_context is not ExecutionContext.Normal:
            continue
        if forward_only and forward and op.id not in forward:
            continue
        for t in op.outputs:
            if (t is not None and t.kind is TensorKind.ACT_GRAD and t.id not in keep
                    and t.info.shape and t.info.shape[0] == batch):
                serialised.add(t.id)
    return factor, frozenset(serialised)


def _stream_depths(options, streams) -> dict[str, int]:
    ids = {t.id for t in streams}
    depth_map = dict(options.bufferingDepthMap)
    for where, depth in [("defaultBufferingDepth", options.defaultBufferingDepth),
                         *((f"bufferingDepthMap[{k!r}]", v) for k, v in depth_map.items())]:
        if depth < 1:
            raise popart_exception(
                f"SessionOptions.{where} = {depth}: a buffering depth is a number of buffers, "
                f"at least 1."
            )
    unknown = sorted(set(depth_map) - ids)
    if unknown:
        raise popart_exception(
            f"SessionOptions.bufferingDepthMap names {unknown}, which are not streamed inputs "
            f"of the model. Its keys must be input tensor ids: {sorted(ids)}."
        )
    if not options.enablePrefetchDatastreams:
        return {}
    depths = {tid: depth_map.get(tid, options.defaultBufferingDepth) for tid in ids}
    return {tid: d for tid, d in depths.items() if d > 1}
