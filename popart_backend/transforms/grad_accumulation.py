"""Gradient accumulation: sum or average the gradients of ``af``
micro-batches into ``Accum___<w>`` variables and update the weights once per ``af``.

Two passes, around the optimizer pass:

- ``AccumulateGradients`` (before the optimizer) adds, per weight w of ``Ir.weight_grads``
  (gradient ``Gradient___w``), a zero-initialised variable ``Accum___w`` (role ACCUMULATOR) and
  an in-place ``Accumulate`` op run every micro-batch. It records the accumulators
  (``Ir.accumulators``) and points ``Ir.weight_grads`` at the tensor the optimizer reads as w's
  gradient; the optimizer runs in the ``AccumulateOuterFragment`` (once per weight update);
  ``reduction_factors`` gives the optimizer's extra gradient factor.
- ``ResetAccumulators`` (after the optimizer) zeroes every accumulator of ``Ir.accumulators``
  in the outer fragment, after the optimizer has read it.

``accumulationAndReplicationReductionType`` Sum uses the summed gradient. Mean divides by af
(and by the replica count), each ``MeanReductionStrategy`` literally:

- Running: ``Accumulate`` keeps the running mean, ``accum += (g - accum)/(n + 1)``, reading a
  micro-batch counter ``Counter___accumulation`` (role STEP) incremented after the accumulators.
  Pipelined, each stage works on another micro-batch in a cycle, so ``count_per_stage`` (run
  once stages are known) gives every stage that keeps running means its own counter.
- Post: the accumulator holds the sum; the optimizer's ``grad_scale`` divides it by af·rf.
- PostAndLoss: the loss gradient is divided by rf (the session seeds autodiff with it, see
  ``reduction_factors``) and an in-place ``AccumulatorScale`` divides the sum by af before the
  optimizer reads it.

Before (af = 4, Sum):
  Gradient___w = ...
  UpdatedVar___w = SGDUpdate(w, Gradient___w)
After:
  Gradient___w = ...
  Accum___w/accumulated = Accumulate(Accum___w, Gradient___w)
  # outer fragment, once per 4 micro-batches:
  UpdatedVar___w = SGDUpdate(w, Accum___w)
  Accum___w/reset = AccumulatorScale(Accum___w, factor=0)
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import popart_exception, popart_internal_exception
from ..ir.ir import Accumulator, Ir
from ..ir.op import ExecutionContext, OpSettings
from ..ir.tensor import TensorInfo, TensorKind, TensorRole
from ..ops.registry import AI_GRAPHCORE, create_op
from ..options.enums import MeanReductionStrategy, ReductionType

ACCUM_PREFIX = "Accum___"
COUNTER_ID = "Counter___accumulation"
OUTER = ExecutionContext.AccumulateOuterFragment
_log = logging.getLogger("popart:transform")


def reduction_factors(options, accumulation_factor: int,
                      replication_factor: int) -> tuple[float, float]:
    """(loss-gradient factor, optimizer gradient factor) of the reduction options.

    The loss gradient is seeded with lossScaling × the first; the optimizer's ``grad_scale`` is
    the second ÷ lossScaling. Running and PostAndLoss divide by af inside the accumulation pass
    (so not here); Post divides by af·rf at the optimizer.
    """
    if options.accumulationAndReplicationReductionType is ReductionType.Sum:
        return 1.0, 1.0
    if options.accumulationAndReplicationReductionType is not ReductionType.Mean:
        raise popart_exception(
            f"accumulationAndReplicationReductionType = "
            f"{options.accumulationAndReplicationReductionType} is not supported for gradients; "
            f"use ReductionType.Sum or ReductionType.Mean."
        )
    strategy = options.meanAccumulationAndReplicationReductionStrategy
    if strategy is MeanReductionStrategy.Running:
        return 1.0, 1.0 / replication_factor
    if strategy is MeanReductionStrategy.Post:
        accumulated = accumulation_factor if options.enableGradientAccumulation else 1
        return 1.0, 1.0 / (accumulated * replication_factor)
    if strategy is MeanReductionStrategy.PostAndLoss:
        return 1.0 / replication_factor, 1.0
    raise popart_exception(f"meanAccumulationAndReplicationReductionStrategy {strategy} unknown.")


class AccumulateGradients:
    """Pass: accumulators and per-micro-batch ``Accumulate`` ops for every weight gradient of
    ``Ir.weight_grads`` (module docstring); afterwards ``Ir.weight_grads`` maps each weight to
    the tensor its optimizer update reads, and ``Ir.accumulators`` holds the accumulators."""

    name = "accumulate_gradients"

    def __init__(self, accumulation_factor: int, reduction: ReductionType,
                 strategy: MeanReductionStrategy, accumulator_dtype=None):
        """``accumulator_dtype(weight DataType) -> DataType`` picks each accumulator's type (the
        optimizer's ``accumType``); default: the gradient's type."""
        if accumulation_factor < 1:
            raise popart_exception(
                f"accumulationFactor = {accumulation_factor}: gradient accumulation needs a "
                f"factor >= 1 micro-batches per weight update."
            )
        self._accumulator_dtype = accumulator_dtype
        self.accumulation_factor = accumulation_factor
        self.mean = reduction is ReductionType.Mean
        self.strategy = strategy

    def run(self, ir: Ir) -> bool:
        graph = ir.main
        gradients = dict(ir.weight_grads)
        if not gradients:
            return False
        running = self.mean and self.strategy is MeanReductionStrategy.Running
        post_scale = self.mean and self.strategy is MeanReductionStrategy.PostAndLoss
        if running:
            self._variable(graph, COUNTER_ID, np.zeros((), np.float32), TensorRole.STEP)
        for weight_id, grad_id in gradients.items():
            grad = graph.tensor(grad_id)
            accum_id = graph.unique_id(ACCUM_PREFIX + weight_id)
            if accum_id != ACCUM_PREFIX + weight_id:
                raise popart_exception(
                    f"Cannot create accumulator '{ACCUM_PREFIX + weight_id}' for weight "
                    f"'{weight_id}': the model already has a tensor of that name; rename it."
                )
            dtype = grad.info.dtype
            if self._accumulator_dtype is not None:
                dtype = self._accumulator_dtype(graph.tensor(weight_id).info.dtype)
            self._variable(graph, accum_id, np.zeros(grad.info.shape, dtype.numpy),
                           TensorRole.ACCUMULATOR)
            inputs = [accum_id, grad_id] + ([COUNTER_ID] if running else [])
            self._add(graph, "Accumulate", inputs, f"{accum_id}/accumulated",
                      ExecutionContext.Normal, accumulation_type="Mean" if running else "Add")
            read_id = accum_id
            if post_scale:
                read_id = self._add(graph, "AccumulatorScale", [accum_id], f"{accum_id}/mean",
                                    OUTER, factor=1.0 / self.accumulation_factor).outputs[0].id
            ir.accumulators[weight_id] = Accumulator(accum_id, read_id)
            ir.weight_grads[weight_id] = read_id
        if running:
            # Graph.add_op schedules the Accumulates, which read the count, before this write.
            one = graph.add_const(graph.unique_id(f"{COUNTER_ID}/one"), np.ones((), np.float32))
            self._add(graph, "Accumulate", [COUNTER_ID, one.id], f"{COUNTER_ID}/incremented",
                      ExecutionContext.Normal)
            ir.accumulation_counters = (COUNTER_ID,)
        _log.debug("accumulate_gradients: %d accumulators, af = %d", len(gradients),
                   self.accumulation_factor)
        return True

    @staticmethod
    def _variable(graph, tensor_id: str, value: np.ndarray, role: TensorRole):
        value = graph.ir.initial_state(tensor_id, value)  # a checkpoint's value, if any
        tensor = graph.add_tensor(tensor_id, TensorInfo.of(value), TensorKind.VARIABLE, value)
        tensor.role = role
        return tensor

    @staticmethod
    def _add(graph, op_type: str, inputs: list[str], output: str, context: ExecutionContext,
             **attrs):
        settings = OpSettings(name=output, execution_context=context)
        op = create_op(op_type, attrs, settings, domain=AI_GRAPHCORE, where=output)
        return graph.add_op(op, inputs, [graph.unique_id(output)])


def count_per_stage(graph) -> list[str]:
    """Split the running-mean counter into one per pipeline stage; returns the new counters.

    In a pipeline cycle stage s works on micro-batch c - s, so a counter shared by the stages
    would count another stage's micro-batches. Each stage's counter counts the micro-batches
    that stage has accumulated: read by the stage's ``Accumulate`` (Mean) ops, incremented on
    the stage after them, and zeroed in the outer fragment with the accumulators. Run after
    the stages (and their IPUs) are assigned; does nothing without a running mean.

    Before (stage 1 keeps Accum___w1, stage 2 Accum___w0):
      Accumulate(Accum___w1, g1, Counter___accumulation)         # stage 1
      Accumulate(Accum___w0, g0, Counter___accumulation)         # stage 2
      Accumulate(Counter___accumulation, one)                    # stage 2
    After:
      Accumulate(Accum___w1, g1, Counter___accumulation/stage1)  # stage 1
      Accumulate(Counter___accumulation/stage1, one)             # stage 1
      Accumulate(Accum___w0, g0, Counter___accumulation/stage2)  # stage 2
      Accumulate(Counter___accumulation/stage2, one)             # stage 2
    """
    if COUNTER_ID not in graph.tensors:
        return []
    counter = graph.tensor(COUNTER_ID)
    means = [op for op in counter.consumers if op.op_type == "Accumulate"
             and op.inputs[0] is not counter and op.attrs.accumulation_type == "Mean"]
    own = [op for op in counter.consumers if op not in means]
    if sorted(op.op_type for op in own) != ["Accumulate", "AccumulatorScale"]:
        raise popart_internal_exception(
            f"count_per_stage: '{COUNTER_ID}' should be read by the running means, its "
            f"increment and its reset only; other readers: {[op.debug_name for op in own]}."
        )
    increment = next(op for op in own if op.op_type == "Accumulate")
    one_id = increment.inputs[1].id
    by_stage: dict[int, list] = {}
    for op in means:
        by_stage.setdefault(op.settings.pipeline_stage, []).append(op)
    counters = []
    for stage, readers in sorted(by_stage.items()):
        stage_counter = AccumulateGradients._variable(
            graph, graph.unique_id(f"{COUNTER_ID}/stage{stage}"), np.zeros((), np.float32),
            TensorRole.STEP).id
        for op in readers:
            graph.replace_input(op, 2, stage_counter)
        ipu = readers[0].settings.ipu
        # Graph.add_op schedules the stage's readers of the count before each write of it.
        for op_type, context, placed, attrs in (
                ("Accumulate", ExecutionContext.Normal, stage, {}),
                ("AccumulatorScale", OUTER, None, {"factor": 0.0})):
            name = f"{stage_counter}/{'incremented' if placed is not None else 'reset'}"
            settings = OpSettings(name=name, execution_context=context, ipu=ipu,
                                  pipeline_stage=placed)
            op = create_op(op_type, attrs, settings, domain=AI_GRAPHCORE, where=name)
            inputs = [stage_counter, one_id] if op_type == "Accumulate" else [stage_counter]
            graph.add_op(op, inputs, [graph.unique_id(name)])
        counters.append(stage_counter)
    for op in own:
        outputs = [t for t in op.outputs if t is not None]
        graph.remove_op(op)
        for t in outputs:
            graph.remove_tensor(t)
    graph.remove_tensor(counter)
    return counters


def accumulate_partials_per_stage(graph, anchors=()) -> int:
    """Add each partial of a weight gradient into its accumulator on the partial's own stage.

    A weight read on several pipeline stages (a tied embedding: the lookup on stage 0, the
    decoder on a later one) gets a gradient ``Sum`` of partials made on different backward
    stages; the Sum and its ``Accumulate`` run on the last of them, so every earlier partial
    would be stashed for each micro-batch in flight. The accumulator sums over micro-batches
    anyway, so each partial is added on the stage that makes it: nothing crosses a stage.
    The reduction over replicas (and the optimizer) still reads the accumulator once, in the
    outer fragment, after every partial. Run after the stages are assigned, before the
    stashes; returns the number of sums split.

    Only ``Add`` accumulation is split (Sum, Post and PostAndLoss reductions): a running mean
    rescales the whole accumulator every time, so the partials are left summed (and stashed).
    Sums whose partials run on another IPU than the accumulator are left too, and so are
    anchored sums (``anchors``: their value is wanted every micro-batch).

    Before (g0 on stage 4, g1 on stage 2, same IPU):
      Gradient___w = Sum(g0, g1)                            # stage 4
      Accum___w/accumulated = Accumulate(Accum___w, Gradient___w)   # stage 4
    After:
      Accum___w/accumulated = Accumulate(Accum___w, g0)     # stage 4
      Accum___w/accumulated__1 = Accumulate(Accum___w, g1)  # stage 2
    """
    split = 0
    for op in list(graph.ops_of_type("Accumulate")):
        grad = op.inputs[1]
        if not (op.inputs[0].id.startswith(ACCUM_PREFIX) and _splittable(op, grad)):
            continue
        parts = _partials(grad)
        if any(t.id in anchors for t in _sum_tensors(grad, parts)):
            continue
        stages = {_stage(t, op) for t in parts}
        if len(stages) < 2 or any(t.info.shape != grad.info.shape for t in parts):
            continue
        if op.attrs.accumulation_type != "Add":
            _log.info("Gradient '%s' has partials on pipeline stages %s; with the Running mean "
                      "reduction they are summed (and stashed) on stage %d before being "
                      "accumulated.", grad.id, sorted(stages), op.settings.pipeline_stage)
            continue
        ipus = {t.producer.settings.ipu for t in parts if t.producer is not None}
        if ipus - {op.settings.ipu}:
            continue
        _split(graph, op, grad, parts)
        split += 1
    if split:
        _log.debug("accumulate_partials_per_stage: %d gradient sums split", split)
    return split


def _splittable(op, grad) -> bool:
    producer = grad.producer
    return (op.settings.execution_context is ExecutionContext.Normal
            and op.settings.pipeline_stage is not None and producer is not None
            and grad.consumers == [op] and grad.id not in op.graph.outputs
            and _is_grad_sum(producer))


def _is_grad_sum(producer) -> bool:
    """The gradient sum autodiff made (or the Add chain decomposeGradSum made of it)."""
    if producer.op_type == "Sum":
        return len(producer.inputs) >= 2 and all(t is not None for t in producer.inputs)
    return producer.op_type == "Add" and producer.settings.early_in_liveness


def _partials(grad) -> list:
    """The tensors summed into ``grad``: the Sum's inputs, or the leaves of its Add chain."""
    producer = grad.producer
    if producer.op_type == "Sum":
        return list(producer.inputs)
    parts = []
    for t in producer.inputs:
        inner = t.producer
        if (inner is not None and inner.op_type == "Add" and inner.settings.early_in_liveness
                and t.consumers == [producer]):
            parts.extend(_partials(t))
        else:
            parts.append(t)
    return parts


def _sum_tensors(grad, parts) -> list:
    """The sum's own tensors: ``grad`` and the chain's intermediate totals."""
    found, stack = [], [grad]
    while stack:
        tensor = stack.pop()
        found.append(tensor)
        stack.extend(t for t in tensor.producer.inputs if t not in parts)
    return found


def _stage(tensor, accumulate) -> int:
    producer = tensor.producer
    if producer is None or producer.settings.pipeline_stage is None:
        return accumulate.settings.pipeline_stage
    return producer.settings.pipeline_stage


def _split(graph, accumulate, grad, parts) -> None:
    accum_id = accumulate.inputs[0].id
    # The Accumulate keeps a partial of its own stage (the last partial if none is).
    own_index = next((k for k, t in enumerate(parts)
                      if _stage(t, accumulate) == accumulate.settings.pipeline_stage),
                     len(parts) - 1)
    own = parts[own_index]
    # Remove the sum (and its Adds), then read the partials directly.
    sum_ops = [t.producer for t in _sum_tensors(grad, parts)]
    graph.replace_input(accumulate, 1, own.id)
    for producer in sum_ops:
        outputs = [t for t in producer.outputs if t is not None]
        graph.remove_op(producer)
        for t in outputs:
            graph.remove_tensor(t)
    befores = set(graph.constraints.get(accumulate.id, ()))
    afters = [later for later, ids in graph.constraints.items() if accumulate.id in ids]
    for k, part in enumerate(parts):
        if k == own_index:
            continue
        producer = part.producer
        stage = _stage(part, accumulate)
        ipu = producer.settings.ipu if producer is not None else accumulate.settings.ipu
        name = f"{accum_id}/accumulated"
        settings = OpSettings(name=name, execution_context=ExecutionContext.Normal, ipu=ipu,
                              pipeline_stage=stage)
        op = create_op("Accumulate", {"accumulation_type": "Add"}, settings,
                       domain=AI_GRAPHCORE, where=name)
        graph.add_op(op, [accum_id, part.id], [graph.unique_id(name)])
        # Scheduled like the Accumulate it splits: after the same ops, before the same ops.
        graph.constraints[op.id] = set(befores)
        for later in afters:
            graph.constraints[later].add(op.id)


class ResetAccumulators:
    """Pass: zero every accumulator of ``Ir.accumulators`` (and the running-mean counters) in
    the outer fragment, after the optimizer read it.

    Before:  UpdatedVar___w = SGDUpdate(w, Accum___w)                 # outer fragment
    After:   UpdatedVar___w = SGDUpdate(w, Accum___w)
             Accum___w/reset = AccumulatorScale(Accum___w, factor=0)  # outer fragment
    """

    name = "reset_accumulators"

    def run(self, ir: Ir) -> bool:
        graph = ir.main
        for accumulator in ir.accumulators.values():
            # Reset through the tensor the optimizer read (an alias of the accumulator), so
            # the scheduler puts every reader of it first.
            accum_id, read_id = accumulator.tensor_id, accumulator.read_id
            tensor = graph.tensor(read_id)
            if read_id != accum_id and tensor.producer is None:
                raise popart_internal_exception(
                    f"reset_accumulators: '{read_id}' should alias accumulator '{accum_id}'."
                )
            AccumulateGradients._add(graph, "AccumulatorScale", [read_id], f"{accum_id}/reset",
                                     OUTER, factor=0.0)
        for counter_id in ir.accumulation_counters:
            AccumulateGradients._add(graph, "AccumulatorScale", [counter_id],
                                     f"{counter_id}/reset", OUTER, factor=0.0)
        return bool(ir.accumulators)

