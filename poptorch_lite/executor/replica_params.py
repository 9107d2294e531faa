"""Per-replica parameter settings: ``executor.<param>.replicaGrouping(...)`` and
``executor.per_replica_params`` (PopTorch's replica-grouped variables).

PopTorch lets a parameter hold one value per group of replicas (``CommGroupType`` and group
size ``shards``) and read back one copy per group or per replica (``VariableRetrievalMode``).
The simulated backend keeps one value per variable that every replica shares, so a grouping
is accepted when it forms a single group (``All``; ``Consecutive`` / ``Orthogonal`` with
``shards`` = replicationFactor; ``NoGrouping`` with one replica) and read back once per group
(``OnePerGroup``, or ``AllReplicas`` with one replica): exactly what the device does. Any
other grouping is refused with an Error, never silently shared.

The setter is an attribute of each of the wrapped model's parameters (installed at wrap
time, and re-bound to the wrapper a parameter is read through), so
``executor.fc.weight.replicaGrouping(...)`` works as in PopTorch.
"""

from __future__ import annotations

import weakref

import torch

from ..enums import VariableRetrievalMode
from ..errors import Error
from ..options.enums import CommGroupType

__all__ = ["ReplicaGroupingSetter", "bind", "install_setters"]

ATTR = "replicaGrouping"


class ReplicaGroupingSetter:
    """``param.replicaGrouping(comm_group_type, shards, variable_retrieval_mode)``."""

    __slots__ = ("_name", "_wrapper")

    def __init__(self, wrapper, name: str):
        self._wrapper = weakref.ref(wrapper) if wrapper is not None else None
        self._name = name

    def __call__(self, comm_group_type, shards, variable_retrieval_mode):
        wrapper = self._wrapper() if self._wrapper is not None else None
        if wrapper is None:
            raise Error(f"replicaGrouping on parameter '{self._name}': the parameter is not "
                        f"held by a live wrapper; call it as wrapper.{self._name}"
                        f".replicaGrouping(...) on the wrapper that compiles the model.")
        set_grouping(wrapper, self._name, comm_group_type, shards, variable_retrieval_mode)

    def __reduce__(self):
        # Pickling a parameter (torch.save(model)) keeps the attribute without the wrapper.
        return ReplicaGroupingSetter, (None, self._name)

    def __deepcopy__(self, memo):
        return ReplicaGroupingSetter(None, self._name)


def install_setters(wrapper, model: torch.nn.Module) -> None:
    for name, param in model.named_parameters():
        bind(wrapper, name, param)


def bind(wrapper, name: str, param: torch.nn.Parameter) -> None:
    param.__dict__[ATTR] = ReplicaGroupingSetter(wrapper, name)


def _groups(kind: CommGroupType, shards: int, replicas: int) -> int:
    if kind is CommGroupType.All:
        return 1
    if kind is CommGroupType.NoGrouping:
        return replicas
    if shards < 1 or replicas % shards:
        raise Error(f"replicaGrouping({kind!r}, shards={shards}): the group size must divide "
                    f"replicationFactor({replicas}).")
    return replicas // shards


def set_grouping(wrapper, name: str, comm_group_type, shards, variable_retrieval_mode) -> None:
    what = f"wrapper.{name}.replicaGrouping({comm_group_type!r}, {shards!r}, " \
           f"{variable_retrieval_mode!r})"
    if not isinstance(comm_group_type, CommGroupType):
        raise TypeError(f"{what}: comm_group_type must be a poptorch_lite.CommGroupType.")
    if not isinstance(shards, int) or isinstance(shards, bool):
        raise TypeError(f"{what}: shards must be an int (the replica group size).")
    if not isinstance(variable_retrieval_mode, VariableRetrievalMode):
        raise TypeError(f"{what}: variable_retrieval_mode must be a "
                        f"poptorch_lite.VariableRetrievalMode.")
    if wrapper.isCompiled():
        raise Error(f"{what}: the model is already compiled; set replica groupings before the "
                    f"first call (or build a new wrapper).")
    replicas = wrapper.options.replication_factor
    groups = _groups(comm_group_type, shards, replicas)
    if groups != 1:
        raise Error(f"{what}: this grouping gives {groups} groups of replicas, each with its own "
                    f"value of '{name}'. The simulated backend keeps one value of each variable "
                    f"that all {replicas} replicas share; use CommGroupType.All (or a group "
                    f"size equal to replicationFactor) for a shared value.",
                    type="unsupported_feature")
    if variable_retrieval_mode is VariableRetrievalMode.AllReplicas and replicas > 1:
        raise Error(f"{what}: AllReplicas would read back {replicas} copies of '{name}' (one "
                    f"per replica); the host keeps one tensor per parameter. Use "
                    f"VariableRetrievalMode.OnePerGroup.", type="unsupported_feature")
    wrapper.per_replica_params[name] = (comm_group_type, shards, variable_retrieval_mode)
