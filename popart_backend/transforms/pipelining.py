"""Pipelining: pipeline stages, their checks, and stash/restore/copies.

``AssignPipelineStages`` (after the training passes) gives every op a stage:

- forward ops: the builder's ``pipelineStage`` annotations, or, when no op has one, the op's
  virtual graph id;
- gradient ops: ``2L - s`` where L is the loss's stage and s the stage of the forward op they
  differentiate (``Op.grad_of``); so forward {A:0, B:1, C:2} gives 2:{C, C'}, 3:{B'}, 4:{A'};
- ops the training passes added (weight-gradient sums, optimizer updates without
  accumulation, accumulators): the stage of what they read. With accumulation, the optimizer
  runs in the accumulate outer fragment, once after the pipeline's flush. The running mean's
  micro-batch counter becomes one counter per stage (``grad_accumulation.count_per_stage``):
  the stages of a cycle work on different micro-batches. A weight gradient summed from
  partials of several stages is accumulated partial by partial, each on its own stage
  (``grad_accumulation.accumulate_partials_per_stage``), so no partial is stashed.

Every stage runs on one IPU; a stage's IPU then overrides the op's annotation. The checks and
their messages are the spec's. ``P`` counts forward and backward stages.

``InsertPipelineStashes`` then makes every value read on a later stage than it is produced
travel there the way the hardware moves it:

- on the same IPU: ``Stashed___x = Stash(StashBuffer___x, ..., x)`` on x's stage and
  ``Restored___x = Restore(Stashed___x, ...)`` on the reader's stage, with a ring buffer of
  ``maxRestoreStage - stashStage + 1`` entries;
- to another IPU: ``x_c1 = IpuCopy(x)`` on the producer's stage, read on the next stage; a value
  skipping stages on other IPUs is copied along the stages in between.

Before (stages 0 on ipu0, 1 on ipu1, 2 on ipu0):
    h = MatMul(x, w)          # stage 0
    y = Relu(h)               # stage 1
    dh = ReluGrad(dy, y)      # stage 1
    dw = MatMul(T(x), dh)     # stage 2
After:
    h = MatMul(x, w)                                    # stage 0
    Stashed___x = Stash(StashBuffer___x, StashIndex___x, x)   # stage 0, 3 entries
    h_c1 = IpuCopy(h)                                   # stage 0, end of cycle
    y = Relu(h_c1)                                      # stage 1
    dh = ReluGrad(dy, y);  dh_c0 = IpuCopy(dh)          # stage 1
    Restored___x = Restore(Stashed___x, RestoreIndex___x)     # stage 2
    dw = MatMul(T(Restored___x), dh_c0)                 # stage 2
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from ..dtypes import DataType
from ..errors import popart_exception
from ..ir.graph import Graph
from ..ir.op import ExecutionContext, Op, OpSettings
from ..ir.tensor import Tensor, TensorInfo, TensorKind, TensorRole
from ..ops import stash as _stash_ops  # noqa: F401 - registers Stash / Restore
from ..ops.registry import AI_GRAPHCORE, create_op
from .grad_accumulation import accumulate_partials_per_stage, count_per_stage
from .ipu_copy import add_ipu_copy
from .virtual_graphs import fill_placement, set_placement

_log = logging.getLogger("popart:transform")
_STASH_ALL_WARNED: list[bool] = []  # the no-effect warning is logged once per process
NORMAL = ExecutionContext.Normal


class AssignPipelineStages:
    """Pass: a pipeline stage for every op, and the checks (``enablePipelining`` only).
    Reads ``Ir.forward_op_ids``; writes ``Ir.stage_ipus`` and ``Ir.loss_stage``.

    Before:  h = MatMul(x, w)  # ipu0     After:  h = MatMul(x, w)  # stage 0 ipu0
             loss = L1(h)      # ipu1             loss = L1(h)      # stage 1 ipu1
             dh = L1Grad(loss)                    dh = L1Grad(loss) # stage 1 ipu1
             dw = MatMul(x, dh)                   dw = MatMul(x, dh)  # stage 2 ipu0
    """

    name = "assign_pipeline_stages"

    def __init__(self, options, loss_id: str | None, depth: int, depth_name: str):
        """``depth`` is the pipeline's micro-batches per run of it (G): the accumulation factor
        with gradient accumulation, else batches per step; ``depth_name`` names it."""
        self.options = options
        self.loss_id = loss_id
        self.depth = depth
        self.depth_name = depth_name

    def run(self, ir) -> bool:
        graph = ir.main
        order = graph.topo_order()
        if not self.options.enablePipelining:
            # Stage annotations mean nothing without pipelining.
            staged = [op for op in order if op.settings.pipeline_stage is not None]
            for op in staged:
                set_placement(op, pipeline_stage=None)
            return bool(staged)
        # AssignVirtualGraphs checked the IPUs and mode, and recorded the forward ops.
        forward = [op for op in order if op.id in ir.forward_op_ids]
        self._forward_stages(forward)
        stage_ipu = self._stage_ipus(forward)
        loss_stage = self._loss_stage(graph, forward)
        self._backward_stages(graph, order, ir.forward_op_ids, loss_stage, stage_ipu)
        for op in order:
            if op.settings.pipeline_stage is not None:
                set_placement(op, ipu=stage_ipu[op.settings.pipeline_stage])
        ir.stage_ipus = dict(sorted(stage_ipu.items()))
        # Before the counters: they follow the stages of the Accumulates.
        accumulate_partials_per_stage(graph, frozenset(ir.anchors))
        if ir.accumulation_counters:
            ir.accumulation_counters = tuple(count_per_stage(graph))
        ir.loss_stage = loss_stage
        self._check_order(order)
        self._check_streams(graph)
        self._check_depth(len(ir.stage_ipus))
        _log.debug("assign_pipeline_stages: %d stages on IPUs %s", len(ir.stage_ipus),
                   ir.stage_ipus)
        return True

    def _forward_stages(self, forward: list[Op]) -> None:
        staged = [op for op in forward if op.settings.pipeline_stage is not None]
        if staged and len(staged) != len(forward):
            missing = [op.debug_name for op in forward if op.settings.pipeline_stage is None]
            raise popart_exception(
                "Only some ops have had their pipeline stage set. Either set the pipeline stage "
                f"on all ops or on none. Ops without a stage: {', '.join(missing[:5])}"
                f"{' ...' if len(missing) > 5 else ''}."
            )
        if not staged:
            for op in forward:
                set_placement(op, pipeline_stage=op.settings.ipu or 0)
        stages = sorted({op.settings.pipeline_stage for op in forward})
        if stages != list(range(len(stages))):
            raise popart_exception(
                f"Pipeline stages must be numbered 0, 1, ..., P-1 without gaps; the ops use "
                f"stages {stages}. Renumber the builder.pipelineStage annotations."
            )

    @staticmethod
    def _stage_ipus(forward: list[Op]) -> dict[int, int]:
        stage_ipu: dict[int, int] = {}
        first: dict[int, Op] = {}
        for op in forward:
            stage, ipu = op.settings.pipeline_stage, op.settings.ipu or 0
            if stage not in stage_ipu:
                stage_ipu[stage], first[stage] = ipu, op
            elif stage_ipu[stage] != ipu:
                raise popart_exception(
                    f"Ops {first[stage].debug_name} and {op.debug_name} have the same pipeline "
                    f"stage {stage}, but different virtual graph ids {stage_ipu[stage]} and "
                    f"{ipu}. All ops with the same pipeline stage must also have the same "
                    f"virtual graph id."
                )
        return stage_ipu

    def _loss_stage(self, graph: Graph, forward: list[Op]) -> int | None:
        if self.loss_id is None:
            return None
        loss = graph.tensor(self.loss_id)
        if loss.producer is None:
            raise popart_exception(
                f"Pipelining: the loss '{self.loss_id}' is not computed by an op, so it has no "
                f"pipeline stage."
            )
        loss_stage = loss.producer.settings.pipeline_stage
        later = [op for op in forward if op.settings.pipeline_stage > loss_stage]
        if later:
            raise popart_exception(
                f"Pipelining: {later[0].debug_name} is on a stage after the loss's stage "
                f"{loss_stage}. Put every forward op on the loss's stage or an earlier one; "
                f"stages after it hold the backward pass."
            )
        return loss_stage

    def _backward_stages(self, graph: Graph, order: list[Op], forward_ids: frozenset[int],
                         loss_stage: int | None, stage_ipu: dict[int, int]) -> None:
        for op in order:
            if op.id in forward_ids:
                continue
            set_placement(op, pipeline_stage=None)
            if op.grad_of is not None and op.grad_of.id in forward_ids and loss_stage is not None:
                s = op.grad_of.settings.pipeline_stage
                stage = 2 * loss_stage - s
                stage_ipu.setdefault(stage, stage_ipu[s])
                set_placement(op, pipeline_stage=stage)
        fill_placement(graph, order, lambda op: op.settings.pipeline_stage,
                       lambda op, stage: set_placement(op, pipeline_stage=stage),
                       max(stage_ipu))
        for op in order:
            if op.settings.execution_context is not NORMAL:
                # Runs once after the flush (accumulate outer fragment); keeps its IPU only.
                stage = op.settings.pipeline_stage
                set_placement(op, pipeline_stage=None,
                              ipu=stage_ipu.get(stage, op.settings.ipu or 0))

    @staticmethod
    def _check_order(order: list[Op]) -> None:
        for op in order:
            if op.settings.execution_context is not NORMAL:
                continue
            for t in op.inputs:
                producer = t.producer if t is not None else None
                if producer is None or producer.settings.execution_context is not NORMAL:
                    continue
                if producer.settings.pipeline_stage > op.settings.pipeline_stage:
                    raise popart_exception(
                        f"Tensor {t.id} is consumed in an earlier pipeline stage than it is "
                        f"produced: {producer.debug_name} makes it, {op.debug_name} reads it. "
                        f"Move the consumer to stage {producer.settings.pipeline_stage} or later."
                    )

    @staticmethod
    def _check_streams(graph: Graph) -> None:
        for tensor_id in graph.inputs:
            tensor = graph.tensors[tensor_id]
            if tensor.kind is not TensorKind.STREAM:
                continue
            ipus = sorted({op.settings.ipu for op in tensor.consumers
                           if op.settings.execution_context is NORMAL})
            if len(ipus) > 1:
                raise popart_exception(
                    f"For pipelining, the host stream tensor '{tensor_id}' must be consumed on a "
                    f"single IPU, but ops on IPUs {ipus} read it. Place all its consumers on one "
                    f"virtual graph (or pass it through an op there)."
                )

    def _check_depth(self, stages: int) -> None:
        if self.depth < stages:
            raise popart_exception(
                f"For pipelining, depth ({self.depth_name}) must equal at least the number of "
                f"pipeline stages ({stages}). It is {self.depth}; P = {stages} counts forward "
                f"and backward stages. Increase the {self.depth_name}."
            )


@dataclass
class _Location:
    """Where a value is available: the tensor holding it, on which stage (of its IPU)."""

    tensor_id: str
    stage: int
    restore_stages: set[int] = field(default_factory=set)
    last_read: int = 0  # stash-all: the last stage reading the value on another IPU


class InsertPipelineStashes:
    """Pass: stash/restore and inter-IPU copies so every read happens on its producer's stage
    (the stages of ``Ir.stage_ipus``; module docstring)."""

    name = "insert_pipeline_stashes"

    def __init__(self, stash_all: bool = False):
        """``stash_all``: ``stashAllTensorsInferencePipeline`` of an inference session; a
        value that leaves its producer's stage for another IPU is then stashed too, on its
        producer's IPU (ring of ``lastReaderStage - stage + 1`` entries), and copied from the
        restored entry. Only memory changes: the restore returns what was just stashed."""
        self.stash_all = stash_all

    def run(self, ir) -> bool:
        if not ir.stage_ipus:
            if self.stash_all and not _STASH_ALL_WARNED:
                _STASH_ALL_WARNED.append(True)
                _log.warning("SessionOptions.stashAllTensorsInferencePipeline has no effect: "
                             "the session is not pipelined (enablePipelining is False), so "
                             "no tensor crosses a pipeline stage.")
            return False
        graph = ir.main
        uses = self._uses(graph)
        # Twice: the dry run only learns each stash's ring size; the second adds the ops.
        plan = _Mover(graph, ir.stage_ipus, None, self.stash_all)
        for tensor, op, index in uses:
            plan.value_at(tensor, op.settings.pipeline_stage)
        mover = _Mover(graph, ir.stage_ipus, plan.locations, self.stash_all)
        for tensor, op, index in uses:
            tensor_id = mover.value_at(tensor, op.settings.pipeline_stage)
            if tensor_id != tensor.id:
                graph.replace_input(op, index, tensor_id)
        _log.debug("insert_pipeline_stashes: %d stashes, %d copies", mover.stashes, mover.copies)
        return bool(mover.stashes or mover.copies)

    @staticmethod
    def _uses(graph: Graph) -> list[tuple[Tensor, Op, int]]:
        """(value, reader, input index) for every read of an activation or host stream by a
        per-micro-batch op, readers in stage order."""
        uses = []
        for op in graph.topo_order():
            if op.settings.execution_context is not NORMAL:
                continue
            for index, t in enumerate(op.inputs):
                if t is None:
                    continue
                if t.kind is TensorKind.STREAM or (
                    t.producer is not None and t.producer.settings.execution_context is NORMAL
                ):
                    uses.append((t, op, index))
        uses.sort(key=lambda use: use[1].settings.pipeline_stage)
        return uses


def home_stage(tensor: Tensor) -> int:
    """The stage a value appears on: its producer's, or a stream's first reader's."""
    if tensor.producer is not None:
        return tensor.producer.settings.pipeline_stage
    return min(op.settings.pipeline_stage for op in tensor.consumers
               if op.settings.execution_context is NORMAL)


class _Mover:
    """Finds (and, unless dry, builds) the tensor holding a value on a given stage.

    ``sizes`` is None for the dry run; otherwise the dry run's locations, whose restore stages
    size the ring buffers.
    """

    def __init__(self, graph: Graph, stage_ipus: dict[int, int], sizes, stash_all=False):
        self.graph = graph
        self.stash_all = stash_all
        self.stage_ipu = stage_ipus
        self.dry = sizes is None
        self.sizes = sizes
        # (value id, ipu) -> where the value first is on that IPU.
        self.locations: dict[tuple[str, int], _Location] = {}
        self.memo: dict[tuple[str, int], str] = {}
        self.stashed: dict[tuple[str, int], str] = {}
        self.stashes = 0
        self.copies = 0

    def value_at(self, tensor: Tensor, stage: int) -> str:
        key = (tensor.id, stage)
        if key in self.memo:
            return self.memo[key]
        home = home_stage(tensor)
        home_key = (tensor.id, self.stage_ipu[home])
        if home_key not in self.locations:
            self.locations[home_key] = _Location(tensor.id, home)
        ipu = self.stage_ipu[stage]
        location = self.locations.get((tensor.id, ipu))
        if location is not None and location.stage <= stage:
            result = location.tensor_id if location.stage == stage else (
                self._restore(tensor.id, ipu, location, stage))
        else:
            # Not on this IPU yet: bring it to the previous stage's IPU, then copy it over.
            source = self.value_at(tensor, stage - 1)
            if self.stash_all and stage - 1 == home:
                # stashAllTensorsInferencePipeline: the copy leaves from the stash.
                home_location = self.locations[home_key]
                home_location.last_read = max(home_location.last_read, stage)
                source = self._restore(tensor.id, self.stage_ipu[home], home_location, home)
            result = self._copy(source, self.stage_ipu[stage - 1], ipu, stage - 1)
            self.locations[(tensor.id, ipu)] = _Location(result, stage)
        self.memo[key] = result
        return result

    def _restore(self, value_id: str, ipu: int, location: _Location, stage: int) -> str:
        location.restore_stages.add(stage)
        if self.dry:
            return f"<restore {location.tensor_id}@{stage}>"
        stashed = self.stashed.get((value_id, ipu))
        if stashed is None:
            planned = self.sizes[(value_id, ipu)]
            size = max(*planned.restore_stages, planned.last_read) - location.stage + 1
            stashed = self._stash(location.tensor_id, ipu, location.stage, size)
            self.stashed[(value_id, ipu)] = stashed
        graph = self.graph
        base = location.tensor_id
        index = self._index(f"RestoreIndex___{base}")
        out = graph.unique_id(f"Restored___{base}")
        op = create_op("Restore", {}, OpSettings(name=f"Restore___{out}", ipu=ipu,
                                                 pipeline_stage=stage),
                       domain=AI_GRAPHCORE, where=out)
        graph.add_op(op, [stashed, index], [out])
        return out

    def _stash(self, tensor_id: str, ipu: int, stage: int, size: int) -> str:
        graph = self.graph
        info = graph.tensor(tensor_id).info
        buffer_id = graph.unique_id(f"StashBuffer___{tensor_id}")
        data = np.zeros((size, *info.shape), info.dtype.numpy)
        buffer = graph.add_tensor(buffer_id, TensorInfo(info.dtype, (size, *info.shape)),
                                  TensorKind.VARIABLE, data)
        buffer.role = TensorRole.STASH
        index = self._index(f"StashIndex___{tensor_id}")
        out = graph.unique_id(f"Stashed___{tensor_id}")
        op = create_op("Stash", {}, OpSettings(name=f"Stash___{tensor_id}", ipu=ipu,
                                               pipeline_stage=stage),
                       domain=AI_GRAPHCORE, where=out)
        graph.add_op(op, [buffer_id, index, tensor_id], [out])
        self.stashes += 1
        return out

    def _index(self, base: str) -> str:
        graph = self.graph
        index = graph.add_tensor(graph.unique_id(base), TensorInfo(DataType.INT64, ()),
                                 TensorKind.VARIABLE, np.zeros((), np.int64))
        index.role = TensorRole.STASH
        return index.id

    def _copy(self, source: str, source_ipu: int, dest_ipu: int, stage: int) -> str:
        self.copies += 1
        if self.dry:
            return f"<copy {source}@{stage}>"
        return add_ipu_copy(self.graph, source, source_ipu, dest_ipu, stage)
