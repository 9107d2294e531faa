"""Tensor locations: where each tensor of a scheduled graph lives.

``resolve_tensor_locations`` is a pure function the device analysis calls once the schedule is
fixed. It does not change the graph: the simulator computes the same values wherever a tensor
is stored; the memory model (device/memory.py) takes off-chip tensors out of SRAM and the cycle
model (device/cost.py) charges their RemoteLoad / RemoteStore transfers.

Per tensor:

1. Classify by ``TensorRole``: weights (and running statistics, which PopART holds as plain
   variables), optimizer state, accumulators; op outputs and pipeline stashes are activations.
   Optimizer hyper-parameters, counters, constants and host streams stay on chip.
2. Location = ``tensorLocationSettingsOverride[id]``, else the builder's
   ``outputTensorLocation`` on the producing node (ignored with a warning when the producer is
   annotated ``RecomputeType.Recompute``: a recomputed tensor is not stored anywhere), else the
   setting of the tensor's type.
3. OffChip with fewer than ``minElementsForOffChip`` elements (of the type's settings) => OnChip.
4. Replicated tensor sharding (step 4): activations are never sharded; a
   variable with fewer than ``minElementsForReplicatedTensorSharding`` elements, or in a
   session without replication, is not sharded (the latter with the warning "Unable to shard
   tensor ... due to lack of replication"). The pass ``transforms/rts.py`` shards the remaining
   candidates that can be sharded and records them in ``Ir.sharded_variables``; given that
   record (``sharded=``), the resolution reports exactly the tensors the pass sharded as On.
5. An off-chip activation whose readers all run right after its producer has no window to be
   moved off chip: it stays OnChip. The readers of a value written in place into its storage
   (``aliases``) are its readers too. A device without streaming memory keeps everything OnChip.

Execution phases (transforms/execution_phases.py) make the streaming explicit: a tensor only
RemoteLoad / RemoteStore ops read (a streamed weight, an activation's remote buffer) is OffChip
whatever the settings ("streamed per execution phase").

Every decision is logged at debug on ``popart:transform``.

Example (optimizerStateTensorLocationSettings = OffChip, Adam on w f32[64,64]):
    w                 weight           OnChip   settings
    Accl1___w         optimizer state  OffChip  settings
    Accl2___w         optimizer state  OffChip  settings
    learningRate___   -                OnChip   optimizer hyper-parameter
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Mapping, Sequence

import onnx

from ..errors import popart_exception
from ..ir.graph import Graph
from ..ir.op import Op, RecomputeType
from ..ir.tensor import Tensor, TensorKind, TensorRole
from ..options.enums import (CommGroupType, ReplicatedTensorSharding, TensorStorage,
                             VirtualGraphMode)
from ..options.session_options import SessionOptions
from ..options.structs import CommGroup, TensorLocation, TensorLocationSettings
from ..tensorinfo import TileSet

__all__ = [
    "OUTPUT_LOCATION_ATTR",
    "ResolvedLocation",
    "TensorType",
    "output_locations_from_model",
    "resolve_one",
    "resolve_tensor_locations",
    "streamed_by_phases",
]

_log = logging.getLogger("popart:transform")

# The node attribute builder.outputTensorLocation writes.
OUTPUT_LOCATION_ATTR = "__output_tensor_location"


class TensorType(enum.Enum):
    """The tensor types with their own TensorLocationSettings."""

    Activation = "activation"
    Weight = "weight"
    OptimizerState = "optimizer state"
    Accumulator = "accumulator"


_SETTINGS_FIELD = {
    TensorType.Activation: "activationTensorLocationSettings",
    TensorType.Weight: "weightTensorLocationSettings",
    TensorType.OptimizerState: "optimizerStateTensorLocationSettings",
    TensorType.Accumulator: "accumulatorTensorLocationSettings",
}
_ROLE_TYPE = {
    TensorRole.WEIGHT: TensorType.Weight,
    TensorRole.RUNNING_STAT: TensorType.Weight,
    TensorRole.OPTIMIZER_STATE: TensorType.OptimizerState,
    TensorRole.ACCUMULATOR: TensorType.Accumulator,
    TensorRole.STASH: TensorType.Activation,
}
_FIXED_ON_CHIP = {
    TensorRole.OPTIMIZER_PARAM: "optimizer hyper-parameter",
    TensorRole.STEP: "counter",
}


_NO_STREAMING = "; OnChip as the device has no streaming memory"


@dataclass(frozen=True)
class ResolvedLocation:
    """Where one tensor lives and why."""

    tensor_id: str
    tensor_type: TensorType | None  # None: a tensor no location setting applies to
    location: TensorLocation
    reason: str
    alias_of: str | None = None  # the tensor whose storage an in-place output shares

    @property
    def off_chip(self) -> bool:
        return self.location.storage is TensorStorage.OffChip

    @property
    def on_io_tiles(self) -> bool:
        """Off-chip tensor whose on-chip buffer is loaded to and kept on the IO tiles."""
        return (self.off_chip and self.location.loadTileSet is TileSet.IO
                and self.location.storageTileSet is TileSet.IO)


def output_locations_from_model(model: onnx.ModelProto) -> dict[str, TensorLocation]:
    """Output tensor id -> the ``outputTensorLocation`` of its node in the main graph."""
    result = {}
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.name == OUTPUT_LOCATION_ATTR:
                location = _decode(list(attr.ints), node.name or node.op_type)
                for output in node.output:
                    if output:
                        result[output] = location
    return result


def _decode(values: list[int], where: str) -> TensorLocation:
    """``[storage, loadTileSet, storageTileSet, rts, commGroupType, groupSize]``."""
    if len(values) not in (4, 6):
        raise popart_exception(
            f"Node '{where}': attribute {OUTPUT_LOCATION_ATTR} = {values} must hold 4 or 6 "
            f"integers (storage, loadTileSet, storageTileSet, replicatedTensorSharding[, "
            f"commGroupType, replicaGroupSize]); write it with builder.outputTensorLocation."
        )
    try:
        domain = (CommGroup(CommGroupType(values[4]), values[5]) if len(values) == 6
                  else CommGroup())
        return TensorLocation(TensorStorage(values[0]), TileSet(values[1]), TileSet(values[2]),
                              ReplicatedTensorSharding(values[3]), domain)
    except ValueError as error:
        raise popart_exception(
            f"Node '{where}': attribute {OUTPUT_LOCATION_ATTR} = {values} is not a valid "
            f"TensorLocation ({error})."
        ) from None


def classify(tensor: Tensor) -> tuple[TensorType | None, str]:
    """The tensor's type, or None with the reason it always stays on chip."""
    if tensor.kind is TensorKind.VARIABLE:
        if tensor.role in _FIXED_ON_CHIP:
            return None, _FIXED_ON_CHIP[tensor.role]
        if tensor.role not in _ROLE_TYPE:
            raise popart_exception(
                f"Variable '{tensor.id}' has TensorRole {tensor.role}, which has no tensor "
                f"location type; the pass that created it must set a role (docs/training.md)."
            )
        return _ROLE_TYPE[tensor.role], ""
    if tensor.kind is TensorKind.CONST:
        return None, "constant"
    if tensor.kind is TensorKind.STREAM:
        return None, "host input stream"
    producer = tensor.producer
    if producer is not None and producer.remote_transfer:
        return None, f"the on-chip copy {producer.debug_name} loaded from streaming memory"
    if producer is not None and producer.inputs and all(
            t is not None and t.kind is TensorKind.CONST for t in producer.inputs):
        return None, "copy of a constant"
    return TensorType.Activation, ""


def resolve_tensor_locations(graph: Graph, order: Sequence[Op], options: SessionOptions,
                             output_locations: Mapping[str, TensorLocation] | None = None,
                             has_streaming_memory: bool = True,
                             aliases: Mapping[str, str] | None = None,
                             sharded: Mapping[str, object] | None = None,
                             ) -> dict[str, ResolvedLocation]:
    """The location of every tensor of ``graph`` scheduled in ``order`` (module docstring).

    ``output_locations``: the builder's ``outputTensorLocation`` per tensor id
    (``output_locations_from_model``). ``aliases``: in-place outputs -> the tensor whose
    storage they share, which decides their location. ``sharded``: the variables the RTS
    pass sharded (``Ir.sharded_variables``, id -> ``transforms.rts.Sharding``); None resolves
    the sharding candidates before that pass ran (and logs the lack-of-replication warning).
    """
    aliases = aliases or {}
    output_locations = output_locations or {}
    overrides = options.tensorLocationSettingsOverride
    position = {op.id: i for i, op in enumerate(order)}
    result: dict[str, ResolvedLocation] = {}
    # Per storage root, the readers of the values written in place into it: they use the
    # root's storage too, so they count for its window (step 5).
    alias_readers: dict[str, list[Op]] = {}
    for tid, root in aliases.items():
        if tid in graph.tensors:
            alias_readers.setdefault(root, []).extend(graph.tensors[tid].consumers)
    for tensor in graph.tensors.values():
        if tensor.id in aliases:
            continue
        kind, fixed_reason = classify(tensor)
        if streamed_by_phases(tensor):
            resolved = _phase_streamed(tensor, kind, has_streaming_memory)
        elif kind is None:
            resolved = ResolvedLocation(tensor.id, None, _location(),
                                        f"OnChip: {fixed_reason}")
        else:
            resolved = _resolve(tensor, kind, options, overrides, output_locations, position,
                                has_streaming_memory, sharded,
                                alias_readers=alias_readers.get(tensor.id, ()))
        result[tensor.id] = resolved
    for tid, root in aliases.items():
        if root in result and tid in graph.tensors:
            r = result[root]
            result[tid] = ResolvedLocation(tid, r.tensor_type, r.location,
                                           f"{r.location.storage.name}: shares the storage of "
                                           f"'{root}' (written in place)", root)
    if not has_streaming_memory and any(r.reason.endswith(_NO_STREAMING) for r in result.values()):
        _log.warning("The device has no streaming memory: tensors set OffChip stay on chip.")
    if _log.isEnabledFor(logging.DEBUG):
        for r in result.values():
            if r.tensor_type is not None or r.off_chip:
                _log.debug("tensor_locations: '%s' (%s): %s", r.tensor_id,
                           r.tensor_type.value if r.tensor_type else "-", r.reason)
    return result


def resolve_one(tensor: Tensor, options: SessionOptions, position: dict[int, int],
                sharded: Mapping[str, object] | None = None) -> ResolvedLocation:
    """Steps 1-4 for one tensor, from the session options alone (the override map and the
    settings of its type; builder ``outputTensorLocation`` attributes are not consulted):
    the execution-phase pass asks which tensors to stream."""
    kind, fixed_reason = classify(tensor)
    if kind is None:
        return ResolvedLocation(tensor.id, None, _location(), f"OnChip: {fixed_reason}")
    return _resolve(tensor, kind, options, options.tensorLocationSettingsOverride, {},
                    position, True, sharded if sharded is not None else {}, phase_query=True)


def streamed_by_phases(tensor: Tensor) -> bool:
    """A tensor only RemoteLoad / RemoteStore ops read: a weight or activation buffer the
    execution-phase pass (transforms/execution_phases.py) keeps in streaming memory."""
    made_on_chip = tensor.producer is not None and tensor.producer.remote_transfer
    return (not made_on_chip and bool(tensor.consumers)
            and all(op.remote_transfer for op in tensor.consumers))


def _phase_streamed(tensor: Tensor, kind: TensorType | None,
                    has_streaming_memory: bool) -> ResolvedLocation:
    kind = kind or TensorType.Activation  # an activation's buffer (made by Init)
    if not has_streaming_memory:
        return ResolvedLocation(tensor.id, kind, _location(),
                                "OnChip: streamed per execution phase" + _NO_STREAMING)
    return ResolvedLocation(tensor.id, kind, _location(TensorStorage.OffChip),
                            "OffChip: streamed per execution phase (RemoteLoad / RemoteStore)")


def _resolve(tensor: Tensor, kind: TensorType, options: SessionOptions,
             overrides: Mapping[str, TensorLocation],
             output_locations: Mapping[str, TensorLocation], position: dict[int, int],
             has_streaming_memory: bool,
             sharded: Mapping[str, object] | None = None,
             phase_query: bool = False,
             alias_readers: Sequence[Op] = ()) -> ResolvedLocation:
    """``phase_query``: the execution-phase pass asking whether to stream the tensor.
    ``alias_readers``: the readers of the values written in place into the tensor's storage."""
    settings: TensorLocationSettings = getattr(options, _SETTINGS_FIELD[kind])
    producer = tensor.producer
    if tensor.id in overrides:
        location, source = overrides[tensor.id], "tensorLocationSettingsOverride"
    elif tensor.id in output_locations and producer is not None and (
            producer.settings.recompute is RecomputeType.Recompute):
        _log.warning(
            "Ignoring the outputTensorLocation of tensor '%s': its producer %s is set to "
            "recompute, so the tensor is not stored.", tensor.id, producer.debug_name)
        location, source = settings.location, f"{_SETTINGS_FIELD[kind]} (attribute ignored)"
    elif tensor.id in output_locations:
        location, source = output_locations[tensor.id], "builder outputTensorLocation"
    else:
        location, source = settings.location, _SETTINGS_FIELD[kind]

    storage = location.storage
    reason = f"{storage.name} from {source}"
    # A sharded variable's info is its shard; the thresholds apply to the whole tensor.
    sharding = sharded.get(tensor.id) if sharded is not None else None
    nelms = sharding.full_info.nelms if sharding is not None else tensor.info.nelms
    if storage is TensorStorage.OffChip and nelms < settings.minElementsForOffChip:
        storage = TensorStorage.OnChip
        reason += (f"; OnChip as it has {nelms} element(s) < minElementsForOffChip = "
                   f"{settings.minElementsForOffChip}")
    if storage is TensorStorage.OffChip and not has_streaming_memory:
        storage = TensorStorage.OnChip
        reason += _NO_STREAMING
    if storage is TensorStorage.OffChip and kind is TensorType.Activation and (
            producer is not None):
        uses = sorted({position[op.id] for op in (producer, *tensor.consumers, *alias_readers)
                       if op.id in position})
        if all(b - a <= 1 for a, b in zip(uses, uses[1:])):
            storage = TensorStorage.OnChip
            reason += "; OnChip as its readers run right after its producer (no window)"

    if storage is TensorStorage.OffChip and kind is TensorType.Activation and (
            options.virtualGraphMode is VirtualGraphMode.ExecutionPhases) and not phase_query:
        storage = TensorStorage.OnChip
        reason += ("; OnChip as execution phases stream activations explicitly and this one "
                   "is read in its own phase or the next")
    rts, why = rts_candidate(tensor, kind, location, settings, options, nelms,
                             warn=sharded is None)
    domain = location.shardingDomain
    if why:
        reason += f"; {why}"
    if sharded is not None and tensor.kind is TensorKind.VARIABLE:
        if sharding is not None:
            rts, domain = ReplicatedTensorSharding.On, sharding.domain
            reason += f"; sharded: {sharding.describe()}"
        elif rts is ReplicatedTensorSharding.On:
            rts = ReplicatedTensorSharding.Off
            reason += "; not sharded (transforms/rts.py logs why)"
    resolved = _location(storage, location.loadTileSet, location.storageTileSet, rts, domain)
    return ResolvedLocation(tensor.id, kind, resolved, reason)


def _location(storage: TensorStorage = TensorStorage.OnChip,
              load_tiles: TileSet = TileSet.Compute, storage_tiles: TileSet = TileSet.Compute,
              rts: ReplicatedTensorSharding = ReplicatedTensorSharding.Off,
              domain: CommGroup | None = None) -> TensorLocation:
    """A TensorLocation of values already checked (enum members, a CommGroup of a checked
    struct): skips the public constructor's per-field type checks, which dominated resolving
    every tensor's location. Equal to ``TensorLocation(storage, load_tiles, ...)``."""
    location = object.__new__(TensorLocation)
    vars(location).update(storage=storage, loadTileSet=load_tiles, storageTileSet=storage_tiles,
                          replicatedTensorSharding=rts,
                          shardingDomain=domain if domain is not None else CommGroup())
    return location


def replication_of(options: SessionOptions) -> int:
    """All replicas of all instances (1 without replication): the replicas a shard group
    can span."""
    local = options.replicatedGraphCount if options.enableReplicatedGraphs else 1
    if options.enableDistributedReplicatedGraphs:
        return max(local, options.globalReplicationFactor)
    return local


def rts_candidate(tensor: Tensor, kind: TensorType, location: TensorLocation,
                  settings: TensorLocationSettings, options: SessionOptions, nelms: int,
                  warn: bool = True) -> tuple[ReplicatedTensorSharding, str]:
    """Step 4: whether the location asks to shard ``tensor`` and may (On), with the
    reason when it may not ("" when RTS is simply Off)."""
    if location.replicatedTensorSharding is not ReplicatedTensorSharding.On:
        return ReplicatedTensorSharding.Off, ""
    off = ReplicatedTensorSharding.Off
    if kind is TensorType.Activation:
        return off, "activations are never sharded"
    if nelms < settings.minElementsForReplicatedTensorSharding:
        return off, (f"RTS Off as it has {nelms} element(s) < "
                     f"minElementsForReplicatedTensorSharding = "
                     f"{settings.minElementsForReplicatedTensorSharding}")
    if replication_of(options) <= 1:
        if warn:
            _log.warning("Unable to shard tensor %s due to lack of replication", tensor.id)
        return off, "RTS Off: unable to shard the tensor due to lack of replication"
    return ReplicatedTensorSharding.On, ""
