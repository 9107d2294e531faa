"""Replica-grouped variables (PopART's ``VariableSettings`` with more than one group).

A variable may be shared by groups of replicas instead of by all of them: each group holds and
trains its own copy. The Builder records the setting in the model's metadata as
``"__variable_settings:<tensor id>" -> "<CommGroupType value>,<group size>,<stride>,<retrieval
mode>"`` (stride 0: the CommGroup's own layout; otherwise PopART's ``(stride, groupSize)`` form).
The importer, which knows the replication factor, turns it into a ``GroupedVariable``
(``Ir.grouped_variables``): the tensor's info is then one replica's shape, while its data stays
the host value with a leading dimension of one entry per group (as a sharded variable keeps its
full host value). The gradient all-reduce spans the variable's group only
(transforms/replication.py), and the device gives each replica its group's value.

Host shapes, for G groups of k replicas (R = G·k) and a replica shape S:
the initial value and ``writeWeights`` take ``[G, *S]`` (``S`` when G = 1); ``readWeights``
gives ``[G, *S]`` for OnePerGroup (each group's first replica), ``[R, *S]`` for AllReplicas
(every replica) and ``[G, *S]`` for AllReduceReplicas (the mean over each group's replicas,
equal to the group's value while they stay in sync).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import popart_exception
from ..options.enums import CommGroupType
from ..options.structs import CommGroup, ReplicaGrouping

__all__ = [
    "RETRIEVAL_MODES",
    "VARIABLE_SETTINGS_KEY_PREFIX",
    "GroupedVariable",
    "encode_variable_settings",
    "grouped_variable",
    "variable_settings_from_model",
]

VARIABLE_SETTINGS_KEY_PREFIX = "__variable_settings:"
# VariableRetrievalMode values, in PopART's order.
RETRIEVAL_MODES = ("OnePerGroup", "AllReduceReplicas", "AllReplicas")


def encode_variable_settings(kind: int, size: int, stride: int, mode: int) -> str:
    return f"{int(kind)},{int(size)},{int(stride)},{int(mode)}"


def variable_settings_from_model(model) -> dict[str, tuple[int, int, int, int]]:
    """The recorded settings of an ``onnx.ModelProto``: tensor id -> (kind, size, stride,
    mode)."""
    result = {}
    for prop in model.metadata_props:
        if not prop.key.startswith(VARIABLE_SETTINGS_KEY_PREFIX):
            continue
        parts = prop.value.split(",")
        try:
            kind, size, stride, mode = (int(p) for p in parts)
            CommGroupType(kind)
            RETRIEVAL_MODES[mode]
        except (ValueError, IndexError):
            raise popart_exception(
                f"Model metadata '{prop.key}' = '{prop.value}' is not '<CommGroupType value>,"
                f"<group size>,<stride>,<retrieval mode 0-2>'."
            ) from None
        result[prop.key[len(VARIABLE_SETTINGS_KEY_PREFIX):]] = (kind, size, stride, mode)
    return result


@dataclass(frozen=True)
class GroupedVariable:
    """How one variable is shared between the ``replicas`` replicas (module docstring)."""

    groups: tuple[tuple[int, ...], ...]  # replica ids of each group, ascending
    comm_group: tuple[int, int]  # (CommGroupType value, group size): the all-reduce's groups
    retrieval: str  # one of RETRIEVAL_MODES
    replicas: int

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def group_of(self, replica: int) -> int:
        return next(g for g, members in enumerate(self.groups) if replica in members)

    def host_shape(self, replica_shape) -> tuple[int, ...]:
        """The shape of the initial value and of ``writeWeights``."""
        shape = tuple(int(d) for d in replica_shape)
        return shape if self.num_groups == 1 else (self.num_groups, *shape)

    def retrieved_shape(self, replica_shape) -> tuple[int, ...]:
        """The shape ``readWeights`` gives."""
        shape = tuple(int(d) for d in replica_shape)
        if self.retrieval == "AllReplicas":
            return (self.replicas, *shape)
        return self.host_shape(shape)

    def retrieve(self, per_replica: np.ndarray) -> np.ndarray:
        """What the host reads, from every replica's value (``[replicas, *S]``)."""
        if self.retrieval == "AllReplicas":
            return np.array(per_replica, copy=True)
        if self.retrieval == "OnePerGroup":
            out = np.stack([per_replica[members[0]] for members in self.groups])
        else:
            out = np.stack([per_replica[list(members)].mean(axis=0, dtype=np.float64)
                            for members in self.groups]).astype(per_replica.dtype)
        return out if self.num_groups > 1 else out[0]

    def per_replica(self, host_value: np.ndarray) -> np.ndarray:
        """Every replica's value (``[replicas, *S]``) from the host value (``[G, *S]``)."""
        grouped = host_value if self.num_groups > 1 else host_value[None]
        return np.stack([grouped[self.group_of(r)] for r in range(self.replicas)])


def grouped_variable(settings: tuple[int, int, int, int], replicas: int,
                     tensor_id: str) -> GroupedVariable:
    """The grouping of ``settings`` (from ``variable_settings_from_model``) over ``replicas``
    replicas; refused when the groups do not tile the replicas or are not a CommGroup's."""
    kind, size, stride, mode = settings
    kind = CommGroupType(kind)
    where = f"Variable '{tensor_id}'"
    try:
        if stride:
            grouping = ReplicaGrouping(replicas, stride, size)
        else:
            grouping = CommGroup(kind, size).toReplicaGrouping(replicas)
    except popart_exception as error:
        raise popart_exception(
            f"{where}: its VariableSettings do not fit the replication factor {replicas}: "
            f"{error}"
        ) from None
    groups = tuple(tuple(g) for g in grouping.groups())
    size = grouping.getGroupSize()
    candidates = [(CommGroupType.Consecutive, size), (CommGroupType.Orthogonal, size)]
    comm_group = None
    if len(groups) == 1:
        comm_group = (CommGroupType.All.value, 0)
    elif size == 1:
        comm_group = (CommGroupType.Ungrouped.value, 1)
    else:
        for cand_kind, cand_size in candidates:
            cand = CommGroup(cand_kind, cand_size).toReplicaGrouping(replicas).groups()
            if tuple(tuple(g) for g in cand) == groups:
                comm_group = (cand_kind.value, cand_size)
                break
    if comm_group is None:
        raise popart_exception(
            f"{where}: VariableSettings(stride={stride}, groupSize={size}) gives replica "
            f"groups {[list(g) for g in groups]}, which are neither consecutive blocks nor "
            f"the orthogonal groups of {replicas} replicas; the gradient all-reduce supports "
            f"CommGroup groupings only. Use a CommGroup (Consecutive or Orthogonal)."
        )
    return GroupedVariable(groups, comm_group, RETRIEVAL_MODES[mode], replicas)
