"""Replicated tensor sharding as PopART does it: the optimizer state and the weight update are
split over the replicas; the weights stay whole on every replica.

A variable whose resolved location has ``replicatedTensorSharding`` On (``tensor_locations``:
never activations, never below ``minElementsForReplicatedTensorSharding``, never without
replication) is split over the k replicas of its sharding domain (CommGroup All: every replica;
Consecutive(k): replicas {0..k-1}, {k..2k-1}, ...). Each replica stores one shard f[ceil(n/k)]
(``ops.collectives.ShardLayout``: the last shards carry one zero pad). In the IR the variable
keeps its id, its info becomes the shard, its ``data`` stays the full host value and
``Ir.sharded_variables`` records the ``Sharding``; the device splits host values into shards
(weightsFromHost) and joins them back (weightsToHost, readWeights). The variables stored as
shards are optimizer state and accumulators; weights never are.

Per trained weight w, the tensors of one optimizer instance share a domain: when w (through
``weightTensorLocationSettings``) or any of its optimizer state asks for RTS, all its state is
stored sharded and its update runs on shards. Then, where the optimizer runs (every micro-batch,
or once per weight update in the accumulate outer fragment):

- the gradient all-reduce becomes ``ReplicatedReduceScatter`` over the domain (followed by a
  ``ReplicatedAllReduce`` over the other groups when the domain is smaller than the replicas),
  so each replica gets the summed gradient of its own shard;
- ``w/shard = ReplicatedReduceScatter(w, local)`` takes this replica's shard of the whole weight
  (PopART's Local collective operator: no sum, nothing crosses the IPU-Links);
- the update op (SGD, Adam, Adaptive: element-wise) runs on ``w/shard`` and the state shards;
- ``w/gathered = ReplicatedAllGather(updated shard)`` and ``CopyVarUpdate(w, w/gathered)`` put
  the updated whole weight back on every replica, once per weight update;
- Lamb scales by ‖w‖ and ‖u‖ of the whole weight: ``LambSquareNorms`` gives each replica's
  (Σw², Σu²) of its shard (zero pads add nothing), a ``ReplicatedAllReduce`` over the domain
  sums them, and the update (``sharded_norms``) takes the ratio from the sums;
- a ``GlobalNormClipFactor`` reading sharded gradients reads instead, per domain,
  ``ReplicatedAllReduce(GradientSquareSum(shards...))``: the sum of squares of those whole
  gradients (the other gradients are whole on every replica and enter as before).

The forward and backward passes read the whole weight, so nothing is gathered per micro-batch
and pipeline stashes never hold gathered copies.

An accumulator ``Accum___w`` is sharded on its own: the gradient is reduce-scattered every
micro-batch and accumulated into the shard; the outer fragment reads the shard (sharded update)
or all-gathers it (unsharded update). Weights without an update (inference, frozen weights)
stay whole; RTS asked for them is logged as having no effect. Running statistics differ between
replicas and are never sharded.

Not supported (popart_exception): anchors on a sharded tensor (read it with weightsToHost /
readWeights).

Before (rf = 2, no accumulation, w f32[5,6], its momentum sharded over All):
  Gradient___w/allreduced = ReplicatedAllReduce(Gradient___w)
  y = MatMul(x, w)
  UpdatedVar___w = SGDUpdate(w, Gradient___w/allreduced, Accl___w)      # f32[5,6]
After:
  y = MatMul(x, w)                                                     # w f32[5,6], whole
  Gradient___w/scattered = ReplicatedReduceScatter(Gradient___w)       # f32[15]
  w/shard = ReplicatedReduceScatter(w, local)                          # f32[15]
  UpdatedVar___w = SGDUpdate(w/shard, Gradient___w/scattered, Accl___w)  # Accl___w f32[15]
  w/gathered = ReplicatedAllGather(UpdatedVar___w)                     # f32[5,6]
  UpdatedVar___w/whole = CopyVarUpdate(w, w/gathered)
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from ..errors import popart_exception
from ..ir.graph import Graph
from ..ir.ir import Ir
from ..ir.op import ExecutionContext, Op, OpSettings
from ..ir.tensor import TensorInfo, TensorKind, TensorRole
from ..ops.collectives import ShardLayout, shard_layout
from ..ops.registry import AI_GRAPHCORE, create_op
from ..options.checks import check_sharding_domain
from ..options.enums import CommGroupType, ReplicatedTensorSharding
from ..options.structs import CommGroup
from .tensor_locations import resolve_tensor_locations

__all__ = ["ShardVariables", "Sharding"]

_log = logging.getLogger("popart:transform")
GATHERED_SUFFIX = "/gathered"
SCATTERED_SUFFIX = "/scattered"
SHARD_SUFFIX = "/shard"
_LAMB_MODES = ("Lamb", "LambNoBias")
_SETTINGS_FIELDS = ("weightTensorLocationSettings", "optimizerStateTensorLocationSettings",
                    "accumulatorTensorLocationSettings", "activationTensorLocationSettings")


@dataclass(frozen=True)
class Sharding:
    """How one variable is split: ``num_shards`` replicas of each group of ``domain`` over
    ``num_replicas`` (global) replicas each hold one shard of ``full_info``."""

    full_info: TensorInfo
    domain: CommGroup
    num_shards: int
    num_replicas: int

    @property
    def layout(self) -> ShardLayout:
        return shard_layout(self.full_info.nelms, self.num_shards)

    @property
    def shard_info(self) -> TensorInfo:
        return TensorInfo(self.full_info.dtype, (self.layout.shard_size,))

    @property
    def comm_group(self) -> tuple[int, int]:
        """The ``OpSettings.comm_group`` of the collectives within a shard group."""
        return (CommGroupType.Consecutive.value, self.num_shards)

    def shard_index(self, replica: int) -> int:
        """The shard global ``replica`` holds (its position in its consecutive group)."""
        return replica % self.num_shards

    def group_of(self, replica: int) -> range:
        start = replica - self.shard_index(replica)
        return range(start, start + self.num_shards)

    def describe(self) -> str:
        layout = self.layout
        return (f"{self.num_shards} shards of {layout.shard_size} element(s) "
                f"(real {list(layout.counts)}) over CommGroup({self.domain.type.name}, "
                f"{self.domain.replicaGroupSize}), full {self.full_info}")


class ShardVariables:
    """Pass: shard the variables whose location asks for RTS (module docstring).

    Runs after the optimizer and the accumulator reset, and reads what they left on the Ir:
    ``weight_grads`` (the tensors the updates read; rewritten to the shards they read now),
    ``optimizer_tensors`` (state and updated ids; the updated id of a sharded update becomes
    its ``CopyVarUpdate``) and ``accumulators``. In an inference session these are empty and
    nothing is sharded.
    """

    name = "shard_variables"

    def __init__(self, options, global_replicas: int, local_replicas: int):
        self.options = options
        self.global_replicas = global_replicas
        self.local_replicas = local_replicas

    # --- deciding -------------------------------------------------------------------------

    def run(self, ir: Ir) -> bool:
        if not self._requested():
            return False
        graph = ir.main
        resolved = resolve_tensor_locations(graph, graph.topo_order(), self.options)
        wanted = {tid: r.location.shardingDomain for tid, r in resolved.items()
                  if r.location.replicatedTensorSharding is ReplicatedTensorSharding.On
                  and graph.tensors[tid].kind is TensorKind.VARIABLE}
        if not wanted:
            return False
        plan: dict[str, Sharding] = {}
        tensors = ir.optimizer_tensors
        trained = dict(ir.weight_grads)
        accumulators = {w: a.tensor_id for w, a in ir.accumulators.items()}
        sharded_updates: dict[str, Sharding] = {}  # weight -> how its update is split
        for weight_id in trained:
            state = [t for t in tensors.state.get(weight_id, ())
                     if graph.tensors[t].role is TensorRole.OPTIMIZER_STATE]
            members = [weight_id, *state]
            asked = [t for t in members if t in wanted]
            if asked:
                sharding = self._sharding(graph, asked, wanted, "its optimizer instance")
                for t in state:
                    plan[t] = self._with_info(sharding, graph, t)
                sharded_updates[weight_id] = self._with_info(sharding, graph, weight_id)
                if len(asked) < len(members):
                    _log.info("shard_variables: %s sharded with %s (one optimizer instance "
                              "shares its sharding)", sorted(set(members) - set(asked)), asked)
            accum = accumulators.get(weight_id)
            if accum is not None and accum in wanted:
                sharding = self._sharding(graph, [accum], wanted, "the accumulator")
                update = sharded_updates.get(weight_id)
                if update is not None and update.domain != sharding.domain:
                    raise popart_exception(
                        f"Accumulator '{accum}' is sharded over {_domain(sharding.domain)} but "
                        f"weight '{weight_id}' and its optimizer state over "
                        f"{_domain(update.domain)}; the tensors of one optimizer "
                        f"instance must share a sharding domain."
                    )
                plan[accum] = sharding
        untrained: list[str] = []
        for tid in wanted:
            if tid in plan or tid in sharded_updates or tid in accumulators.values():
                continue
            tensor = graph.tensors[tid]
            if tensor.role is TensorRole.WEIGHT and tid not in trained:
                untrained.append(tid)
            elif tensor.role is not TensorRole.WEIGHT:
                _log.info("shard_variables: '%s' (%s) is not sharded: only weights, their "
                          "optimizer state and accumulators are equal on every replica",
                          tid, tensor.role.value if tensor.role else "-")
        if untrained:
            _log.warning("shard_variables: replicatedTensorSharding has no effect on %d weight(s) "
                         "without a weight update (%s): weights stay whole on every replica; "
                         "sharding splits only the optimizer state and the weight update.",
                         len(untrained), ", ".join(sorted(untrained)[:5]))
        changed = self._rewrite(ir, plan, sharded_updates, trained, accumulators)
        self._check_anchors(ir, changed)
        for tid, sharding in plan.items():
            _log.debug("shard_variables: '%s': %s", tid, sharding.describe())
        return True

    def _requested(self) -> bool:
        """Does any location setting ask for RTS? (Most sessions: no, and nothing to do.)"""
        locations = [getattr(self.options, f).location for f in _SETTINGS_FIELDS]
        locations += list(self.options.tensorLocationSettingsOverride.values())
        return any(loc.replicatedTensorSharding is ReplicatedTensorSharding.On
                   for loc in locations)

    def _sharding(self, graph: Graph, ids: list[str], wanted: dict[str, CommGroup],
                  what: str) -> Sharding:
        domains = {(wanted[t].type, wanted[t].replicaGroupSize) for t in ids}
        if len(domains) > 1:
            listed = ", ".join(f"'{t}' {_domain(wanted[t])}" for t in ids)
            raise popart_exception(
                f"The tensors of {what} ask for different sharding domains: {listed}; the "
                f"tensors of one optimizer instance must share a sharding domain. "
                f"Give the weight and optimizer-state settings the same shardingDomain."
            )
        domain = wanted[ids[0]]
        where = f"Tensor '{ids[0]}' ({what})"
        k = check_sharding_domain(domain, where, self.local_replicas, self.global_replicas)
        return Sharding(graph.tensors[ids[0]].info, domain, k, self.global_replicas)

    @staticmethod
    def _with_info(sharding: Sharding, graph: Graph, tid: str) -> Sharding:
        return Sharding(graph.tensors[tid].info, sharding.domain, sharding.num_shards,
                        sharding.num_replicas)

    @staticmethod
    def _check_anchors(ir: Ir, changed: set[str]) -> None:
        anchored = sorted(a for a in ir.anchors if a in changed)
        if anchored:
            raise popart_exception(
                f"Anchors {anchored} hold replicated shards (sharded variables or their "
                f"updates); an anchor cannot stream a sharded tensor. Read the variables with "
                f"weightsToHost() / readWeights(), or set their replicatedTensorSharding Off."
            )

    # --- rewriting ------------------------------------------------------------------------

    def _rewrite(self, ir: Ir, plan: dict[str, Sharding], sharded_updates: dict[str, Sharding],
                 trained: dict[str, str], accumulators: dict[str, str]) -> set[str]:
        """Shard the variables of ``plan`` and split the updates of ``sharded_updates``;
        returns the ids whose info changed."""
        graph = ir.main
        updates = ir.optimizer_tensors.updated if ir.optimizer_tensors is not None else {}
        update_ops = {w: graph.tensors[updates[w]].producer for w in sharded_updates}
        touched: set[str] = set()
        for tid, sharding in plan.items():
            graph.tensors[tid].info = sharding.shard_info
            touched.add(tid)
        ir.sharded_variables.update(plan)
        for weight_id, op in update_ops.items():
            touched.add(self._slice_weight(graph, weight_id, op, sharded_updates[weight_id]))
        shard_grads: dict[str, Sharding] = {}  # sharded gradient the update reads -> sharding
        for weight_id, grad_id in trained.items():
            accum = accumulators.get(weight_id)
            accum_sharding = plan.get(accum) if accum is not None else None
            update_sharding = sharded_updates.get(weight_id)
            if accum_sharding is None and update_sharding is None:
                continue
            reduced, changed = self._rewrite_reduction(graph, weight_id, grad_id, accum,
                                                       accum_sharding, update_sharding)
            touched |= changed
            ir.weight_grads[weight_id] = reduced
            if update_sharding is not None:
                shard_grads[reduced] = update_sharding
        changed = _propagate(graph, touched) | set(plan)
        for weight_id, op in update_ops.items():
            if getattr(op.attrs, "mode", None) in _LAMB_MODES:
                self._shard_lamb_norms(graph, op, sharded_updates[weight_id])
        for op in list(graph.ops_of_type("GlobalNormClipFactor")):
            self._shard_clip_norm(graph, op, shard_grads)
        for weight_id, op in update_ops.items():
            updates[weight_id] = self._gather_update(graph, weight_id, op,
                                                     sharded_updates[weight_id])
        return changed

    def _slice_weight(self, graph: Graph, weight_id: str, update: Op,
                      sharding: Sharding) -> str:
        """Make ``update`` (which wrote the whole ``weight_id`` in place) update this replica's
        shard of it instead: ``w/shard = ReplicatedReduceScatter(w, local)``. Returns the
        shard's id."""
        shard = self._add(graph, "ReplicatedReduceScatter", [weight_id],
                          weight_id + SHARD_SUFFIX, update.settings.execution_context, sharding,
                          ipu=update.settings.ipu, num_shards=sharding.num_shards, local=True)
        graph.replace_input(update, 0, shard)
        return shard

    def _gather_update(self, graph: Graph, weight_id: str, update: Op,
                       sharding: Sharding) -> str:
        """All-gather the updated shards and copy the whole weight back into ``weight_id``,
        once per weight update; returns the id of the updated weight."""
        context = update.settings.execution_context
        gathered = self._add(graph, "ReplicatedAllGather", [update.outputs[0].id],
                             weight_id + GATHERED_SUFFIX, context, sharding,
                             ipu=update.settings.ipu, shape=tuple(sharding.full_info.shape),
                             num_shards=sharding.num_shards)
        out = graph.unique_id(update.outputs[0].id + "/whole")
        copy = create_op("CopyVarUpdate", {},
                         OpSettings(name=out, execution_context=context,
                                    ipu=update.settings.ipu),
                         domain=AI_GRAPHCORE, where=out)
        graph.add_op(copy, [weight_id, gathered], [out])
        return out

    def _rewrite_reduction(self, graph: Graph, weight_id: str, grad_id: str, accum: str | None,
                           accum_sharding: Sharding | None, update_sharding: Sharding | None,
                           ) -> tuple[str, set[str]]:
        """Replace w's gradient all-reduce by a reduce-scatter (module docstring); returns the
        tensor the gradient's readers now read, and the ids of new shards."""
        reduce_op = graph.tensors[grad_id].producer
        if reduce_op is None or reduce_op.op_type != "ReplicatedAllReduce":
            raise popart_exception(
                f"shard_variables: the gradient '{grad_id}' of weight '{weight_id}' is not "
                f"all-reduced; replicated tensor sharding needs the replication pass first."
            )
        source = reduce_op.inputs[0].id
        context = reduce_op.settings.execution_context
        readers = list(graph.tensors[grad_id].consumers)
        touched: set[str] = set()
        if accum_sharding is not None:
            # Reduce-scatter every micro-batch, accumulate the shard.
            accumulate = next(op for op in graph.tensors[accum].consumers
                              if op.op_type == "Accumulate" and _writes(op, accum))
            micro_grad = accumulate.inputs[1].id
            shard = self._scatter(graph, micro_grad, accumulate.settings.execution_context,
                                  accum_sharding, ipu=accumulate.settings.ipu)
            graph.replace_input(accumulate, 1, shard)
            touched.add(shard)
            reduced = source  # the accumulator (or its scaled alias) already holds the sum
            if update_sharding is None:
                reduced = self._add(graph, "ReplicatedAllGather", [source],
                                    accum + GATHERED_SUFFIX, context, accum_sharding,
                                    ipu=reduce_op.settings.ipu,
                                    shape=tuple(accum_sharding.full_info.shape),
                                    num_shards=accum_sharding.num_shards)
        else:
            reduced = self._scatter(graph, source, context, update_sharding,
                                    ipu=reduce_op.settings.ipu)
            touched.add(reduced)
        for op in readers:
            for i, t in enumerate(op.inputs):
                if t is not None and t.id == grad_id:
                    _read(graph, op, i, reduced)
        graph.remove_op(reduce_op)
        graph.remove_tensor(graph.tensors[grad_id])
        return reduced, touched

    def _shard_lamb_norms(self, graph: Graph, update: Op, sharding: Sharding) -> None:
        """Feed a sharded Lamb update the (Σw², Σu²) of the whole weight (module docstring)."""
        attrs = dataclasses.replace(update.attrs, sharded_norms=True)
        context = update.settings.execution_context
        name = graph.unique_id(update.outputs[0].id + "/lambSquareNorms")
        probe = create_op("LambSquareNorms", dataclasses.asdict(attrs),
                          dataclasses.replace(update.settings, name=name),
                          domain=AI_GRAPHCORE, where=name)
        graph.add_op(probe, [t.id if t is not None else "" for t in update.inputs], [name])
        summed = self._add(graph, "ReplicatedAllReduce", [name], name + "/allreduced", context,
                           sharding, ipu=update.settings.ipu)
        # The update reads the same inputs plus the sums; its state was sized for shards.
        update.attrs = attrs
        graph.append_input(update, summed)
        graph._infer(update)  # the one Graph inference entry point: checks the new input

    def _shard_clip_norm(self, graph: Graph, clip: Op, shard_grads: dict[str, Sharding]) -> None:
        """Make a global-norm clip factor read sums of squares of sharded gradients, summed over
        their domain, in place of the shards (module docstring)."""
        inputs = [t.id for t in clip.inputs]
        loss_scaling = [inputs.pop()] if clip.attrs.divide_loss_scaling else []
        sharded = [t for t in inputs if t in shard_grads]
        if not sharded:
            return
        whole = [t for t in inputs if t not in shard_grads]
        by_group: dict[tuple[int, int], list[str]] = {}
        for t in sharded:
            by_group.setdefault(shard_grads[t].comm_group, []).append(t)
        context = clip.settings.execution_context
        sums = []
        for group_ids in by_group.values():
            sharding = shard_grads[group_ids[0]]
            name = graph.unique_id(clip.outputs[0].id + "/shardSquares")
            op = create_op("GradientSquareSum", {},
                           OpSettings(name=name, execution_context=context),
                           domain=AI_GRAPHCORE, where=name)
            graph.add_op(op, group_ids, [name])
            sums.append(self._add(graph, "ReplicatedAllReduce", [name], name + "/allreduced",
                                  context, sharding))
        old = clip.outputs[0]
        attrs = dataclasses.replace(clip.attrs, square_sums=len(sums))
        out = graph.unique_id(old.id)
        new = create_op("GlobalNormClipFactor", dataclasses.asdict(attrs),
                        dataclasses.replace(clip.settings, name=out), domain=AI_GRAPHCORE,
                        where=out)
        graph.add_op(new, [*whole, *sums, *loss_scaling], [out])
        graph.replace_all_uses(old, graph.tensors[out])
        graph.remove_op(clip)
        graph.remove_tensor(old)

    def _scatter(self, graph: Graph, source: str, context: ExecutionContext,
                 sharding: Sharding, ipu: int | None = None) -> str:
        """Reduce-scatter ``source`` within each shard group, then all-reduce the shard over
        the groups when there are several; both on ``ipu``, the weight's."""
        out = self._add(graph, "ReplicatedReduceScatter", [source], source + SCATTERED_SUFFIX,
                        context, sharding, ipu=ipu, num_shards=sharding.num_shards)
        groups = sharding.num_replicas // sharding.num_shards
        if groups > 1:
            across = (CommGroupType.Orthogonal.value, groups)
            name = graph.unique_id(out + "/allreduced")
            op = create_op("ReplicatedAllReduce", {},
                           OpSettings(name=name, execution_context=context, comm_group=across,
                                      ipu=ipu),
                           domain=AI_GRAPHCORE, where=name)
            graph.add_op(op, [out], [name])
            out = name
        return out

    @staticmethod
    def _add(graph: Graph, op_type: str, inputs: list[str], output: str,
             context: ExecutionContext, sharding: Sharding, ipu: int | None = None,
             **attrs) -> str:
        """Add a collective on ``ipu`` (None: placed later from its neighbours)."""
        out = graph.unique_id(output)
        op = create_op(op_type, attrs,
                       OpSettings(name=out, execution_context=context,
                                  comm_group=sharding.comm_group, ipu=ipu),
                       domain=AI_GRAPHCORE, where=out)
        graph.add_op(op, inputs, [out])
        return out


def _domain(domain: CommGroup) -> str:
    return f"CommGroup({domain.type.name}, {domain.replicaGroupSize})"


def _writes(op: Op, tid: str) -> bool:
    return any(i < len(op.inputs) and op.inputs[i] is not None and op.inputs[i].id == tid
               for i in op.modifies_inputs)


def _read(graph: Graph, op: Op, index: int, tid: str) -> None:
    """Make ``op`` read ``tid`` at ``index`` and run before the tensor's in-place writers, as
    ``Graph.add_op`` orders a new reader."""
    graph.replace_input(op, index, tid)
    if _writes(op, tid):
        return
    for writer in graph.tensors[tid].consumers:
        if writer is not op and _writes(writer, tid):
            graph.add_constraint(op, writer)


def _propagate(graph: Graph, touched: set[str]) -> set[str]:
    """Re-infer the ops reading a tensor whose info changed, in schedule order (in-place
    outputs of a shard are shards too); each op's infer() checks its new inputs."""
    changed = set(touched)
    for op in graph.topo_order():
        if not any(t is not None and t.id in changed for t in op.inputs):
            continue
        infos = graph._infer(op)  # noqa: SLF001 - the one Graph inference entry point
        for tensor, info in zip(op.outputs, infos):
            if tensor is not None and tensor.info != info:
                tensor.info = info
                changed.add(tensor.id)
    return changed
