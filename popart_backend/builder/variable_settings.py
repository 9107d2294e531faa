"""``VariableSettings``: how a variable is shared between replicas and returned to the host
(PopART's replica-grouped variables), and ``VariableRetrievalMode``.

A variable shared by every replica (CommGroup All, the default) keeps one value that every
replica holds. With more than one group each group holds and trains its own copy: its initial
value has a leading dimension of one entry per group, its gradients are all-reduced within the
group only, and ``readWeights`` returns one value per group (OnePerGroup), the mean over each
group's replicas (AllReduceReplicas) or every replica's value (AllReplicas). The Builder
records the settings in the model (``encoded()``); the importer resolves the groups once the
replication factor is known (``ir/replica_grouping.py``).
"""

from __future__ import annotations

import enum

from ..errors import popart_exception
from ..ir.replica_grouping import VARIABLE_SETTINGS_KEY_PREFIX, encode_variable_settings
from ..options.enums import CommGroupType
from ..options.structs import CommGroup, ReplicaGrouping

__all__ = ["VariableRetrievalMode", "VariableSettings"]


class VariableRetrievalMode(enum.Enum):
    """What the host receives: one value per group (the group's first replica), one value per
    group reduced over its replicas, or every replica's value."""

    OnePerGroup = 0
    AllReduceReplicas = 1
    AllReplicas = 2


class VariableSettings:
    """``VariableSettings()``, ``(commGroup)``, ``(retrievalMode)``, ``(commGroup,
    retrievalMode)`` or ``(stride, groupSize, retrievalMode)``."""

    def __init__(self, *args):
        self._domain: CommGroup | None = CommGroup()
        self._stride, self._group_size = 1, 0
        self._mode = VariableRetrievalMode.OnePerGroup
        rest = list(args)
        if rest and isinstance(rest[0], CommGroup):
            self._domain = rest.pop(0)
        elif len(rest) == 3 or (len(rest) == 2 and not isinstance(rest[1], VariableRetrievalMode)):
            stride, size = rest.pop(0), rest.pop(0)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (stride, size)):
                raise popart_exception(
                    f"VariableSettings(stride, groupSize, mode): stride and groupSize must be "
                    f"ints, got {stride!r}, {size!r}."
                )
            self._domain, self._stride, self._group_size = None, stride, size
        if rest:
            mode = rest.pop(0)
            if not isinstance(mode, VariableRetrievalMode):
                raise popart_exception(
                    f"VariableSettings: retrievalMode must be a VariableRetrievalMode, got "
                    f"{mode!r}."
                )
            self._mode = mode
        if rest:
            raise popart_exception(
                f"VariableSettings{args!r}: expected (), (commGroup), (retrievalMode), "
                f"(commGroup, retrievalMode) or (stride, groupSize, retrievalMode)."
            )
        self.verify()

    # --- what the settings say --------------------------------------------------------------
    def isUsingCommGroup(self) -> bool:  # noqa: N802 - PopART's names
        return self._domain is not None

    def getSharedVariableDomain(self) -> CommGroup:  # noqa: N802
        if self._domain is not None:
            return self._domain
        kind = self.getCommGroupType()
        size = 0 if kind in (CommGroupType.All, CommGroupType.Ungrouped) else self._group_size
        return CommGroup(kind, size)

    def getCommGroupType(self) -> CommGroupType:  # noqa: N802
        if self._domain is not None:
            return self._domain.type
        if self._group_size == 0:
            return CommGroupType.All
        if self._group_size == 1:
            return CommGroupType.Ungrouped
        return CommGroupType.Consecutive if self._stride == 1 else CommGroupType.Orthogonal

    def getRetrievalMode(self) -> VariableRetrievalMode:  # noqa: N802
        return self._mode

    def getStride(self) -> int:  # noqa: N802
        """Distance between the replicas of a group; an Orthogonal CommGroup's stride depends on
        the replica count (use ``getReplicaGrouping(replicaCount)``)."""
        if self._domain is None:
            return self._stride
        if self._domain.type is CommGroupType.Orthogonal:
            raise popart_exception(
                "VariableSettings.getStride(): an Orthogonal CommGroup's stride is replicaCount "
                "/ replicaGroupSize; call getReplicaGrouping(replicaCount).getStride()."
            )
        return 1

    def getGroupSize(self) -> int:  # noqa: N802
        """Replicas per group; 0 means all replicas (CommGroup All)."""
        if self._domain is None:
            return self._group_size
        return {CommGroupType.All: 0, CommGroupType.Ungrouped: 1}.get(
            self._domain.type, self._domain.replicaGroupSize)

    def getReplicaGrouping(self, replicaCount: int) -> ReplicaGrouping:  # noqa: N802,N803
        if self._domain is not None:
            return self._domain.toReplicaGrouping(replicaCount)
        return ReplicaGrouping(replicaCount, self._stride, self._group_size or replicaCount)

    # --- per replica count ------------------------------------------------------------------
    def getRealGroupSize(self, replicaCount: int) -> int:  # noqa: N802,N803
        return self.getReplicaGrouping(replicaCount).getGroupSize()

    def getGroupCount(self, replicaCount: int) -> int:  # noqa: N802,N803
        return self.getReplicaGrouping(replicaCount).getNumGroups()

    def numReplicasReturningVariable(self, replicaCount: int) -> int:  # noqa: N802,N803
        if self._mode is VariableRetrievalMode.AllReplicas:
            return replicaCount
        return self.getGroupCount(replicaCount)

    def groups(self, replicaCount: int) -> list[list[int]]:  # noqa: N803
        return self.getReplicaGrouping(replicaCount).groups()

    def getGroupRepresentative(self, group: int) -> int:  # noqa: N802
        """The first replica of ``group``."""
        kind, size = self.getCommGroupType(), self.getGroupSize()
        if kind is CommGroupType.All:
            if group != 0:
                raise popart_exception(
                    f"VariableSettings.getGroupRepresentative({group}): CommGroup All has one "
                    f"group, 0."
                )
            return 0
        if kind is CommGroupType.Consecutive:
            return group * size
        if kind is CommGroupType.Ungrouped or self._domain is not None:
            return group  # Orthogonal: groups start at replicas 0 .. numGroups-1
        stride = self._stride
        return group % stride + (group // stride) * stride * size

    def shapeOnReplica(self, full_shape, replicaCount: int, name: str = "") -> list[int]:  # noqa: N802,N803
        """One replica's shape of a variable given with its host shape (a leading group dim
        when there is more than one group)."""
        full = [int(d) for d in full_shape]
        count = self.getGroupCount(replicaCount)
        if count == 1:
            return full
        if not full or full[0] != count:
            raise popart_exception(
                f"VariableSettings: variable '{name}' has shape {full}; with {count} groups of "
                f"replicas its host value needs a leading dimension of {count}."
            )
        return full[1:]

    def shapeOnHost(self, replica_shape, replicaCount: int) -> list[int]:  # noqa: N802,N803
        shape = [int(d) for d in replica_shape]
        count = self.numReplicasReturningVariable(replicaCount)
        return shape if count == 1 else [count, *shape]

    def verify(self) -> None:
        """Raise if the grouping is malformed (negative sizes, a CommGroup without size)."""
        if self._domain is not None:
            kind, size = self._domain.type, self._domain.replicaGroupSize
            if kind in (CommGroupType.Consecutive, CommGroupType.Orthogonal) and size < 1:
                raise popart_exception(
                    f"VariableSettings: CommGroup {kind.name} needs replicaGroupSize >= 1, got "
                    f"{size}."
                )
        elif self._stride < 1 or self._group_size < 0:
            raise popart_exception(
                f"VariableSettings: stride must be >= 1 and groupSize >= 0, got stride "
                f"{self._stride}, groupSize {self._group_size}."
            )

    def encoded(self) -> tuple[int, int, int, int]:
        """(CommGroupType value, group size, stride, retrieval mode value) as the model records
        them (stride 0: a CommGroup's own layout)."""
        if self._domain is not None or self._group_size == 0:
            domain = self.getSharedVariableDomain()
            return domain.type.value, domain.replicaGroupSize, 0, self._mode.value
        return self.getCommGroupType().value, self._group_size, self._stride, self._mode.value

    def _record(self, model, tensor_id: str) -> None:
        """Record these settings for initializer ``tensor_id`` in ``model`` (an
        ``onnx.ModelProto``), replacing earlier ones; the default settings record nothing.
        Used by the Builder and by poptorch_lite's ``replicaGrouping``."""
        key = VARIABLE_SETTINGS_KEY_PREFIX + tensor_id
        kept = [p for p in model.metadata_props if p.key != key]
        del model.metadata_props[:]
        model.metadata_props.extend(kept)
        if not self.is_default():
            model.metadata_props.add(key=key, value=encode_variable_settings(*self.encoded()))

    def is_default(self) -> bool:
        """CommGroup All read back once: the settings of a plain variable."""
        return (self.getCommGroupType() is CommGroupType.All
                and self._mode is VariableRetrievalMode.OnePerGroup)

    def __repr__(self) -> str:
        if self._domain is not None:
            return f"VariableSettings({self._domain!r}, {self._mode})"
        return f"VariableSettings(stride={self._stride}, groupSize={self._group_size}, {self._mode})"
