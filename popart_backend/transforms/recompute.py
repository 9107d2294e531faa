"""Recomputation: forward ops recomputed in the backward pass, explicitly in
the IR (as ``explicitRecomputation`` shows them), so the memory model sees which activations stay
live and the cost model sees the extra compute. Numerics are unchanged: a clone computes
exactly what its forward op computed.

Which forward ops recompute (``autoRecomputation``), besides the builder's manual
``recomputeOutputInBackwardPass(ids, RecomputeType.Recompute)`` annotations:

- ``NoRecompute``: only the manual ones;
- ``Standard``: all but about sqrt(n) evenly spaced checkpoints per pipeline stage (or of the
  whole forward graph), which bounds the live activations by O(sqrt(n));
- ``NormOnly``: normalisations and the non-linearity that directly follows them (the op
  classes say which they are: ``Op.is_normalization``, ``Op.is_nonlinearity``);
- ``Pipeline``: every forward op of the stages before the loss's: only stage inputs are stashed;
- ``RecomputeAll``: every forward op.

Ops annotated ``RecomputeType.Checkpoint`` (``checkpointOutput``), ops writing a tensor in place
(BatchNorm's running statistics) and seeded random ops are never recomputed.

Before:  h = Relu(x)                  After:  h = Relu(x)
         dx = ReluGrad(dh, h)                 h/recomputed = Relu(x)       # Recomputed
                                              dx = ReluGrad(dh, h/recomputed)
"""

from __future__ import annotations

import dataclasses
import logging
import math

from ..ir.graph import Graph
from ..ir.op import ExecutionContext, Op, RecomputeType
from ..options.enums import RecomputationType

_log = logging.getLogger("popart:transform")

class Recompute:
    """Pass: clone the recomputed forward ops into the backward pass, per backward stage."""

    name = "recompute"

    def __init__(self, recomputation: RecomputationType):
        self.recomputation = recomputation
        self.recomputed: dict[int, Op] = {}
        self.clones: list[Op] = []

    def run(self, ir) -> bool:
        graph = ir.main
        order = graph.topo_order()
        forward = [op for op in order if op.id in ir.forward_op_ids and _eligible(op)]
        chosen = self._choose(forward, ir.loss_stage)
        self.recomputed = {op.id: op for op in chosen}
        if not chosen:
            return False
        memo: dict[tuple[int, int | None], Op] = {}
        for op in order:
            if op.id in ir.forward_op_ids or (
                op.settings.execution_context is not ExecutionContext.Normal
            ):
                continue
            for index, t in enumerate(op.inputs):
                if not self._recomputes(t, op):
                    continue
                clone = self._clone(graph, t.producer, op, memo)
                graph.replace_input(op, index, clone.outputs[t.producer.outputs.index(t)].id)
        _log.debug("recompute: %d forward ops recomputed by %d clones", len(chosen),
                   len(self.clones))
        return bool(self.clones)

    def _choose(self, forward: list[Op], loss_stage: int | None) -> list[Op]:
        kind = self.recomputation
        manual = [op for op in forward if op.settings.recompute is RecomputeType.Recompute]
        if kind is RecomputationType.NoRecompute:
            return manual
        if kind is RecomputationType.RecomputeAll:
            return forward
        if kind is RecomputationType.Pipeline:
            if loss_stage is None:
                return manual  # no pipeline: nothing to recompute per stage
            return [op for op in forward if op.settings.pipeline_stage < loss_stage] + [
                op for op in manual if op.settings.pipeline_stage >= loss_stage]
        if kind is RecomputationType.NormOnly:
            chosen = {op.id: op for op in manual}
            for op in forward:
                if op.is_normalization:
                    chosen[op.id] = op
                    for t in op.outputs[:1]:
                        for consumer in (t.consumers if t is not None else ()):
                            if consumer.is_nonlinearity and _eligible(consumer):
                                chosen[consumer.id] = consumer
            return [op for op in forward if op.id in chosen]
        # Standard: evenly spaced checkpoints per stage.
        chosen = {op.id for op in manual}
        by_stage: dict[int | None, list[Op]] = {}
        for op in forward:
            by_stage.setdefault(op.settings.pipeline_stage, []).append(op)
        for ops in by_stage.values():
            every = max(1, round(math.sqrt(len(ops))))
            chosen.update(op.id for i, op in enumerate(ops) if (i + 1) % every)
        return [op for op in forward if op.id in chosen]

    def _recomputes(self, tensor, reader: Op) -> bool:
        """Whether ``reader`` reads a recomputed ``tensor``: values from other IPUs arrive by
        copy (the copy's source is what gets stashed), so only same-IPU reads recompute."""
        return (tensor is not None and tensor.producer is not None
                and tensor.producer.id in self.recomputed
                and tensor.producer.settings.ipu == reader.settings.ipu)

    def _clone(self, graph: Graph, op: Op, reader: Op, memo) -> Op:
        """The clone of ``op`` computing its outputs where ``reader`` runs."""
        key = (op.id, reader.settings.pipeline_stage)
        if key in memo:
            return memo[key]
        inputs = []
        for t in op.inputs:
            if self._recomputes(t, reader):
                source = self._clone(graph, t.producer, reader, memo)
                inputs.append(source.outputs[t.producer.outputs.index(t)].id)
            else:
                inputs.append(t.id if t is not None else "")
        settings = dataclasses.replace(
            op.settings, name=f"{op.settings.name}/recomputed", recompute=RecomputeType.Recomputed,
            ipu=reader.settings.ipu, pipeline_stage=reader.settings.pipeline_stage)
        clone = op.clone_with(settings)
        clone.grad_of = None
        outputs = [graph.unique_id(f"{t.id}/recomputed") if t is not None else ""
                   for t in op.outputs]
        graph.add_op(clone, inputs, outputs)
        memo[key] = clone
        self.clones.append(clone)
        return clone


def _eligible(op: Op) -> bool:
    """Recomputing ``op`` gives the same values and changes no state."""
    return (op.settings.recompute is not RecomputeType.Checkpoint
            and not op.modifies_inputs
            and not op.requires_random_seed
            and op.foldable
            and op.settings.execution_context is ExecutionContext.Normal)
