"""Gradient all-reduce across replicas: ``ReplicatedAllReduce`` ops
between the gradients (or their accumulators) and the optimizer.

Every replica computes the gradient of its own micro-batch; before the weight update each
weight's gradient is summed over all replicas (all global replicas with global replication),
in replica order, so all replicas apply the same update and their weights stay equal. The
pass runs after autodiff and gradient accumulation and before the optimizer:

- without accumulation the all-reduce runs every micro-batch (``Normal`` context), on
  ``Gradient___w``;
- with accumulation it runs once per weight update in the accumulate outer fragment, on the
  accumulator (or its scaled alias), after the last micro-batch of the window.

Mean reduction needs nothing here: the divisions by the replica count are in
``grad_accumulation.reduction_factors`` (Running / Post at the optimizer, PostAndLoss at the
loss gradient), given the global replication factor.

Before (rf = 2, no accumulation):
  Gradient___w = MatMul(...)
  UpdatedVar___w = SGDUpdate(w, Gradient___w)
After:
  Gradient___w = MatMul(...)
  Gradient___w/allreduced = ReplicatedAllReduce(Gradient___w)
  UpdatedVar___w = SGDUpdate(w, Gradient___w/allreduced)

A replica-grouped weight (``Ir.grouped_variables``: each group of replicas trains its own copy)
has its gradient all-reduced within its group only (the op's ``comm_group``), so replicas of
different groups never mix. With Mean reduction the divisions by the global replica count are
then turned into a division by the group size: a ``Scale`` of (replicas / group size) follows
the group's all-reduce, so each group's update is the mean over its own replicas.

With several IPUs per replica each all-reduce runs on its weight's IPU (``weight_ipu``): its
busy time and its buffers belong there, next to the weight's update.
"""

from __future__ import annotations

import logging

from ..ir.graph import Graph
from ..ir.ir import Ir
from ..ir.op import ExecutionContext, OpSettings
from ..ops import collectives as _collectives  # noqa: F401 - registers ReplicatedAllReduce
from ..ops import graphcore_elementwise as _elementwise  # noqa: F401 - registers Scale
from ..ops.registry import AI_GRAPHCORE, create_op

_log = logging.getLogger("popart:transform")
ALLREDUCED_SUFFIX = "/allreduced"


class AllReduceGradients:
    """Pass: a ``ReplicatedAllReduce`` on every weight gradient the optimizer reads
    (``Ir.weight_grads``), which then names the all-reduced tensors.

    ``context`` is where the optimizer runs (Normal, or the accumulate outer fragment). With
    one replica in total the pass adds nothing and leaves ``Ir.weight_grads`` as it is.
    """

    name = "all_reduce_gradients"

    def __init__(self, context: ExecutionContext, global_replicas: int, mean: bool = False):
        """``mean``: the Mean reduction divides the gradients by ``global_replicas`` elsewhere
        (grad_accumulation.reduction_factors); grouped weights rescale to their group size."""
        self.context = context
        self.global_replicas = global_replicas
        self.mean = mean

    def run(self, ir: Ir) -> bool:
        gradients = dict(ir.weight_grads)
        if self.global_replicas <= 1:
            return False
        graph = ir.main
        for weight_id, grad_id in gradients.items():
            out = graph.unique_id(grad_id + ALLREDUCED_SUFFIX)
            ipu = weight_ipu(graph, weight_id, grad_id)
            grouping = ir.grouped_variables.get(weight_id)
            comm_group = grouping.comm_group if grouping is not None else None
            op = create_op("ReplicatedAllReduce", {},
                           OpSettings(name=out, execution_context=self.context, ipu=ipu,
                                      comm_group=comm_group),
                           domain=AI_GRAPHCORE, where=out)
            graph.add_op(op, [grad_id], [out])
            group_size = len(grouping.groups[0]) if grouping is not None else 0
            if self.mean and group_size and group_size != self.global_replicas:
                scaled = graph.unique_id(out + "/group_mean")
                scale = create_op("Scale", {"scale": self.global_replicas / group_size},
                                  OpSettings(name=scaled, execution_context=self.context,
                                             ipu=ipu),
                                  domain=AI_GRAPHCORE, where=scaled)
                graph.add_op(scale, [out], [scaled])
                out = scaled
            ir.weight_grads[weight_id] = out
        _log.debug("all_reduce_gradients: %d gradients over %d replicas (%s)", len(gradients),
                   self.global_replicas, self.context.name)
        return bool(gradients)


def weight_ipu(graph: Graph, weight_id: str, grad_id: str) -> int | None:
    """The IPU of weight ``weight_id``: that of the placed ops reading it (the lowest when they
    differ), else where its gradient ``grad_id`` is computed or accumulated; None when none of
    them is placed (one IPU per replica)."""
    readers = [op.settings.ipu for op in graph.tensors[weight_id].consumers
               if op.settings.ipu is not None]
    if readers:
        return min(readers)
    grad = graph.tensors[grad_id]
    writers = [grad.producer] if grad.producer is not None else []
    writers += [op for op in grad.consumers
                if any(op.inputs[i] is grad for i in op.modifies_inputs)]
    return next((op.settings.ipu for op in writers if op.settings.ipu is not None), None)


class GroupOptimizerState:
    """Pass: the training state of a replica-grouped weight (its optimizer state and gradient
    accumulator, ``Ir.optimizer_tensors.state`` and ``Ir.accumulators``) is grouped like the
    weight: one value per group on the host, so writing the weights back never copies one
    group's momentum into another's. Runs after the optimizer.

    Before: w grouped in 2 groups, Accl___w f32[3] (data f32[3]).
    After:  Accl___w in ``Ir.grouped_variables`` with w's grouping, data f32[2, 3].

    A model written by modelToHost stores that state per group ([2, 3] above): the optimizer's
    ``Ir.initial_state`` parks it and this pass takes it as the data (``grouped_initial_state``),
    so a session built from the model resumes each group's state. A parked value no grouped
    state takes, or with another number of groups, raises popart_exception.
    """

    name = "group_optimizer_state"

    def run(self, ir: Ir) -> bool:
        grouped = ir.grouped_variables
        if not grouped:
            ir.refuse_unused_grouped_state()
            return False
        owners: dict[str, set[str]] = {}
        state = ir.optimizer_tensors.state if ir.optimizer_tensors is not None else {}
        for weight_id, ids in state.items():
            for tensor_id in ids:
                owners.setdefault(tensor_id, set()).add(weight_id)
        for weight_id, accumulator in ir.accumulators.items():
            owners.setdefault(accumulator.tensor_id, set()).add(weight_id)
        changed = False
        for tensor_id, weights in owners.items():
            groupings = {grouped.get(w) for w in weights}
            if len(groupings) != 1 or None in groupings or tensor_id in grouped:
                continue  # shared with other weights, or not a grouped weight's
            grouping = groupings.pop()
            tensor = ir.main.tensors[tensor_id]
            if grouping.num_groups > 1:
                # A checkpoint's per-group value (modelToHost), else the start value per group.
                tensor.data = ir.grouped_initial_state(tensor_id, tensor.data,
                                                       grouping.num_groups)
            grouped[tensor_id] = grouping
            changed = True
        ir.refuse_unused_grouped_state()
        return changed
