"""Ir: the main graph plus what the whole model shares (opsets, anchors, options), and the
facts one pass leaves for later passes and the session.

Passes communicate only through the Ir: a pass that produces a cross-pass fact (the weight
gradients, the accumulators, what the optimizer added, the pipeline stages ...) writes it to the
typed field documented below, and the passes after it read that field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import popart_exception
from ..options.patterns import Patterns
from .graph import Graph


# Prefixes of the training state modelToHost writes next to the weights (momenta, moments, step
# counters, gradient accumulators): a model read back with them resumes where it stopped.
CHECKPOINT_PREFIXES = ("Accl___", "Accl1___", "Accl2___", "Accl3___", "Step___", "Accum___")


@dataclass(frozen=True)
class Accumulator:
    """A trained weight's gradient accumulator (transforms/grad_accumulation.py)."""

    tensor_id: str  # the ACCUMULATOR variable, Accum___<weight>
    # What the optimizer reads as the gradient: the accumulator, or its in-place scaled alias
    # (Mean / PostAndLoss); the reset writes through it so every reader runs first.
    read_id: str


@dataclass
class OptimizerTensors:
    """What ``Optimizer.apply()`` added: tensors the session writes, reads or resets."""

    # tensor id -> (key without "default", e.g. "learningRate" or "lossScaling"; weight id, or
    # None for the value shared by every weight without a specific one)
    hyper_params: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    # weight id -> its state variables (moments, velocity, step counter)
    state: dict[str, list[str]] = field(default_factory=dict)
    # weight id -> the update op's output (aliases the weight)
    updated: dict[str, str] = field(default_factory=dict)


class Ir:
    """The intermediate representation of one session's model."""

    MAIN = "maingraph"

    def __init__(self, opsets: dict[str, int] | None = None):
        self.opsets: dict[str, int] = dict(opsets or {})
        self.graphs: dict[str, Graph] = {}
        self.main = self.create_graph(self.MAIN)
        # The session's replicas over all instances (global replication factor), which a
        # collective over CommGroup All spans; None when no session builds the Ir (the
        # Builder's own shape inference). Set by the importer.
        self.replicas: int | None = None
        # Filled by the session: tensor ids the host reads back after a run.
        self.anchors: list[str] = []
        # Training issue: id of the final loss tensor, if any.
        self.loss_id: str | None = None
        # Variables stored as per-replica shards (replicated tensor sharding, filled by
        # transforms/rts.py): id -> transforms.rts.Sharding. Their info is one shard; their
        # data stays the full host value (the host view of a sharded tensor is unsharded).
        self.sharded_variables: dict = {}
        # Replica-grouped variables (VariableSettings with several groups, or AllReplicas
        # retrieval; ir/replica_grouping.py), filled by the importer: id -> GroupedVariable.
        # Their info is one replica's value; their data the host value, one entry per group.
        self.grouped_variables: dict = {}
        # Variables the model marks as not trained (model metadata ``__frozen_variable:<id>``,
        # written by poptorch_lite for requires_grad=False parameters and read-only float
        # buffers), filled by the importer. Autodiff grows no gradient for them unless one is
        # anchored, and never lists them in ``weight_grads``: no update, state, accumulator or
        # all-reduce. They stay weights for host IO (writeWeights, weightsToHost ...).
        self.frozen_variables: frozenset[str] = frozenset()
        # Sequence / optional values of the graph's inputs and outputs (an
        # importer.value_io.ValueIO, set by the importer; the session reads it).
        self.value_io = None
        # The session's Patterns (options/patterns.py): the rewrites of
        # transforms/apply_patterns.py and the in-place pass read which ones are enabled.
        self.patterns: Patterns = Patterns()

        # --- facts passes leave for later passes (written by the first, read by the others) --
        # The ops of the forward graph (assign_virtual_graphs, before autodiff; read by
        # assign_pipeline_stages and recompute).
        self.forward_op_ids: frozenset[int] = frozenset()
        # Pipelining (assign_pipeline_stages): stage -> IPU of every forward and backward
        # stage (empty without pipelining), and the loss's stage. Read by
        # insert_pipeline_stashes, insert_ipu_copies and recompute.
        self.stage_ipus: dict[int, int] = {}
        self.loss_stage: int | None = None
        # Training: weight id -> the tensor its optimizer update reads as its gradient.
        # autodiff sets Gradient___<w> for each trained WEIGHT; accumulate_gradients rewrites it
        # to the accumulator, all_reduce_gradients to the all-reduced tensor, shard_variables
        # to the reduce-scattered shard. apply_optimizer and shard_variables read it.
        self.weight_grads: dict[str, str] = {}
        # weight id -> its gradient accumulator (accumulate_gradients; read by
        # reset_accumulators and shard_variables).
        self.accumulators: dict[str, Accumulator] = {}
        # The running-mean micro-batch counters (accumulate_gradients adds one, reset by
        # reset_accumulators; assign_pipeline_stages splits it into one per stage).
        self.accumulation_counters: tuple[str, ...] = ()
        # Gradient tensors a fusion computed inside their reader and removed (id -> info;
        # fuse_grad_update). They stay tensor ids of the session (getAllTensorIds, getInfo).
        self.fused_gradients: dict = {}
        # Tensors whose gradient autodiff names Gradient___<id> when it makes one, anchored or
        # not (track_conv_and_matmul_gradients, for automatic loss scaling's histogram).
        self.named_gradients: set[str] = set()
        # What the optimizer added (apply_optimizer; read by shard_variables and the session's
        # updateOptimizerFromHost). None until the optimizer ran.
        self.optimizer_tensors: OptimizerTensors | None = None
        # Training state stored in the model (a checkpoint written by modelToHost): tensor id
        # -> value. The importer fills it with the unused initializers named with a
        # CHECKPOINT_PREFIXES prefix; the passes that create that state take their start
        # values from it (``initial_state``); the session reports what no pass took.
        self.restored_state: dict[str, np.ndarray] = {}
        # Stored state of a replica-grouped weight, one value per group ([G, *S], as
        # modelToHost writes it): ``initial_state`` parks it here and the state starts from its
        # default; GroupOptimizerState, which groups that state, takes it
        # (``grouped_initial_state``) and refuses what no grouping took.
        self.restored_grouped_state: dict[str, np.ndarray] = {}

    def initial_state(self, tensor_id: str, default: np.ndarray) -> np.ndarray:
        """The start value of the state variable ``tensor_id``: the model's stored value if it
        has one (checked against ``default``'s shape and dtype), else ``default``."""
        stored = self.restored_state.pop(tensor_id, None)
        if stored is None:
            return default
        if (stored.dtype == default.dtype and stored.ndim == default.ndim + 1
                and stored.shape[0] > 1 and stored.shape[1:] == default.shape):
            # One value per replica group: GroupOptimizerState decides whether it fits.
            self.restored_grouped_state[tensor_id] = stored
            return default
        if stored.shape != default.shape or stored.dtype != default.dtype:
            raise _state_mismatch(tensor_id, stored, default.dtype, default.shape)
        return np.array(stored, copy=True)

    def grouped_initial_state(self, tensor_id: str, default: np.ndarray,
                              groups: int) -> np.ndarray:
        """The start value ``[groups, *S]`` of a state variable grouped like its replica-grouped
        weight: the model's stored per-group value if ``initial_state`` parked one (its leading
        dimension checked against ``groups``), else ``default`` (one group's value ``S``)
        repeated for every group."""
        stored = self.restored_grouped_state.pop(tensor_id, None)
        if stored is None:
            return np.stack([np.asarray(default)] * groups)
        if stored.shape[0] != groups:
            raise _state_mismatch(tensor_id, stored, stored.dtype,
                                  (groups, *stored.shape[1:]), groups)
        return np.array(stored, copy=True)

    def refuse_unused_grouped_state(self) -> None:
        """Raise for a parked per-group value that no grouped state took: this session keeps
        that state as one value, the model one value per group."""
        for tensor_id, stored in self.restored_grouped_state.items():
            raise _state_mismatch(tensor_id, stored, stored.dtype, stored.shape[1:], 1)

    def create_graph(self, graph_id: str) -> Graph:
        graph = Graph(graph_id, self)
        self.graphs[graph_id] = graph
        return graph

    def opset(self, domain: str = "ai.onnx") -> int:
        return self.opsets.get(domain, 1)


def _state_mismatch(tensor_id: str, stored: np.ndarray, dtype, shape,
                    groups: int | None = None) -> Exception:
    """The error for a stored training state whose shape or dtype this session cannot take."""
    if groups is None:
        hint = ""
    elif groups == 1:
        hint = (" (the model keeps one value per replica group; this session keeps one value "
                "for that state: its weight has no VariableSettings, or they give one group at "
                "this replication factor)")
    else:
        hint = f" (one value per replica group: this session's weight has {groups} groups)"
    return popart_exception(
        f"The model stores '{tensor_id}' as {stored.dtype}{list(stored.shape)}, but this "
        f"session's training state of that name is {np.dtype(dtype)}{list(shape)}{hint}. "
        f"Build the session with the optimizer (and its accumulator / state types) and the "
        f"VariableSettings the model was saved with, or remove the initializer '{tensor_id}' "
        f"from the model to start that state afresh."
    )
