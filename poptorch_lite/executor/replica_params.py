"""Per-replica parameter settings: ``executor.<param>.replicaGrouping(...)`` and
``executor.per_replica_params`` (PopTorch's replica-grouped variables).

A parameter may hold one value per group of replicas (``CommGroupType`` and group size
``shards``; ``NoGrouping``: every replica alone): each group trains its own copy on its own
replicas' data, its gradients summed within the group only. The backend receives the settings
as a ``popart.VariableSettings`` recorded on the parameter's initializer, whose initial value
gets a leading dimension of one entry per group: every group starts from the parameter's
current value.

The torch parameter keeps one replica's shape. ``copyWeightsToHost`` puts replica 0's value
(the first group's) in it and the whole read-back in ``executor.per_replica_weights[name]``:
``[groups, *shape]`` for ``OnePerGroup``, ``[replicationFactor, *shape]`` for ``AllReplicas``.
``copyWeightsToDevice`` keeps every group's value when the parameter still holds what was read
back, and gives all groups the parameter's value when it was changed on the host.

The setter is an attribute of each of the wrapped model's parameters (installed at wrap
time, and re-bound to the wrapper a parameter is read through), so
``executor.fc.weight.replicaGrouping(...)`` works as in PopTorch.
"""

from __future__ import annotations

import dataclasses
import weakref

import numpy as np
import onnx
import torch
from onnx import numpy_helper

import popart_backend as popart

from ..enums import VariableRetrievalMode
from ..errors import Error
from ..options.enums import CommGroupType

__all__ = ["ReplicaGroupingSetter", "annotate", "annotated", "bind", "from_device", "groups_of",
           "install_setters", "read_shape", "state_to_device", "to_device"]

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


def groups_of(kind: CommGroupType, shards: int, replicas: int) -> list[list[int]]:
    """The replica ids of each group (the spec's CommGroup layouts)."""
    count = _groups(kind, shards, replicas)
    if kind is CommGroupType.All:
        return [list(range(replicas))]
    if kind is CommGroupType.NoGrouping:
        return [[r] for r in range(replicas)]
    if kind is CommGroupType.Consecutive:
        return [list(range(g * shards, (g + 1) * shards)) for g in range(count)]
    return [list(range(g, replicas, count)) for g in range(count)]


def _grouping(wrapper, fqn: str):
    entry = wrapper.per_replica_params.get(fqn)
    if entry is None:
        return None
    kind, shards, mode = entry
    return groups_of(kind, shards, wrapper.options.replication_factor), mode


def annotated(wrapper, traced):
    """``traced`` with the groupings recorded on a copy of its model (``annotate``); the
    traced model itself keeps the parameters' one-replica values."""
    if not wrapper.per_replica_params:
        return traced
    proto = onnx.ModelProto()
    proto.CopyFrom(traced.proto)
    annotate(wrapper, proto, traced.param_map)
    return dataclasses.replace(traced, proto=proto)


def annotate(wrapper, proto, param_map: dict[str, str]) -> None:
    """Record the groupings on the traced model's initializers (``param_map``: ONNX name ->
    parameter name), each initial value repeated once per group."""
    if not wrapper.per_replica_params:
        return
    by_name = {fqn: onnx_name for onnx_name, fqn in param_map.items()}
    inits = {init.name: init for init in proto.graph.initializer}
    for name, (kind, shards, mode) in wrapper.per_replica_params.items():
        onnx_name = by_name.get(name)
        if onnx_name is None or onnx_name not in inits:
            raise Error(f"replicaGrouping on '{name}': the traced model does not use this "
                        f"parameter as a weight, so it has no per-replica value. Remove the "
                        f"grouping or use the parameter in forward().")
        groups = groups_of(kind, shards, wrapper.options.replication_factor)
        init = inits[onnx_name]
        if len(groups) > 1:
            value = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array(
                np.ascontiguousarray(np.stack([value] * len(groups))), onnx_name))
        domain = popart.CommGroup(popart.CommGroupType(kind.value), shards)
        popart.VariableSettings(domain, popart.VariableRetrievalMode(mode.value))._record(
            proto, onnx_name)


def read_shape(wrapper, fqn: str, shape: tuple) -> tuple:
    """The shape the backend returns for parameter ``fqn`` of one-replica shape ``shape``."""
    grouping = _grouping(wrapper, fqn)
    if grouping is None:
        return tuple(shape)
    groups, mode = grouping
    count = (wrapper.options.replication_factor if mode is VariableRetrievalMode.AllReplicas
             else len(groups))
    return tuple(shape) if count == 1 else (count, *shape)


def from_device(wrapper, fqn: str, array: np.ndarray, keep: bool = True) -> np.ndarray:
    """The host value (replica 0's) of parameter ``fqn`` or of its optimizer state from what
    the backend returned; ``keep``: the whole read-back goes to ``per_replica_weights``."""
    grouping = _grouping(wrapper, fqn)
    if grouping is None:
        return array
    if keep:
        wrapper.per_replica_weights[fqn] = torch.from_numpy(np.array(array, copy=True))
    return array[0] if read_shape(wrapper, fqn, ()) != () else array


def state_to_device(wrapper, fqn: str, value: np.ndarray) -> np.ndarray:
    """Optimizer state of parameter ``fqn`` from the host (one replica's shape): every group
    gets it."""
    grouping = _grouping(wrapper, fqn)
    if grouping is None or len(grouping[0]) == 1:
        return value
    return np.ascontiguousarray(np.stack([value] * len(grouping[0])))


def to_device(wrapper, fqn: str, value: np.ndarray) -> np.ndarray:
    """What the backend writes for parameter ``fqn`` (host value ``value``): one entry per
    group, kept from the last read-back unless the parameter was changed since."""
    grouping = _grouping(wrapper, fqn)
    if grouping is None:
        return value
    groups, mode = grouping
    last = wrapper.per_replica_weights.get(fqn)
    if last is not None and read_shape(wrapper, fqn, ()) != ():
        last = last.numpy()
        if np.array_equal(last[0], value):
            if mode is VariableRetrievalMode.AllReplicas:
                last = last[[g[0] for g in groups]]
            return last if len(groups) > 1 else last[0]
    return np.ascontiguousarray(np.stack([value] * len(groups))) if len(groups) > 1 else value


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
    _groups(comm_group_type, shards, wrapper.options.replication_factor)
    wrapper.per_replica_params[name] = (comm_group_type, shards, variable_retrieval_mode)
