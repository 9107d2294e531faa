"""Weights of a session: the host copies and the device copies (PopART's weightsFromHost,
weightsToHost, readWeights, writeWeights, resetHostWeights, modelToHost)."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from .dataflow import PyWeightsIO
from .errors import popart_exception
from .files import confined_path, write_atomic, write_bytes_atomic
from .importer.onnx_model import initializer_value, load_model
from .ir.ir import CHECKPOINT_PREFIXES
from .ir.tensor import TensorKind, TensorRole

__all__ = ["HostWeights", "WeightsMixin"]

_log = logging.getLogger("popart:session")
_TRACE = 5  # PopART's TRACE level (popart_backend.logging.TRACE)
# The variables modelToHost adds to the model besides the weights it already holds.
_STATE_ROLES = frozenset({TensorRole.OPTIMIZER_STATE, TensorRole.STEP, TensorRole.ACCUMULATOR})


class HostWeights(MutableMapping):
    """The host copies of a session's variables, each made when first read or written: until
    then the value is the IR's (the model's initializer, or zeros for state the passes add).
    Building a session and preparing it on an offline device so hold one copy of the weights,
    not two."""

    def __init__(self, tensors: Mapping, ids: Iterable[str]):
        self._tensors = tensors  # the IR's main graph tensors (id -> Tensor with .data)
        self._ids = dict.fromkeys(ids)  # ordered set
        self._copies: dict[str, np.ndarray] = {}
        # Replica-grouped variables read back with AllReplicas / AllReduceReplicas: every
        # replica's value ([replicas, *S]) as of the last weightsToHost; dropped when the host
        # value is written (then each replica's value is its group's host entry).
        self.replica_values: dict[str, np.ndarray] = {}

    def __getitem__(self, tensor_id: str) -> np.ndarray:
        value = self._copies.get(tensor_id)
        if value is None:
            if tensor_id not in self._ids:
                raise KeyError(tensor_id)
            value = self._copies[tensor_id] = np.array(self._tensors[tensor_id].data, copy=True)
        return value

    def __setitem__(self, tensor_id: str, value: np.ndarray) -> None:
        self._ids[tensor_id] = None
        self._copies[tensor_id] = value

    def __delitem__(self, tensor_id: str) -> None:
        del self._ids[tensor_id]
        self._copies.pop(tensor_id, None)

    def __contains__(self, tensor_id) -> bool:
        return tensor_id in self._ids

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def copied(self) -> int:
        """How many host copies exist so far."""
        return len(self._copies)


class WeightsMixin:
    """The weight methods of ``SessionBase``; they use the session's ``_host_weights``,
    ``_device``, ``_program``, ``_model`` and ``_ir``."""

    def weightsFromHost(self) -> None:
        """Copy the host weights to the device (F36)."""
        _log.log(_TRACE, "Session::weightsFromHost")
        device = self._ready_device("weightsFromHost()")
        device.write_weights(self._host_weights)
        self._weights_written = True

    def weightsToHost(self) -> None:
        """Copy the device weights to the host copies (F37)."""
        _log.log(_TRACE, "Session::weightsToHost")
        device = self._ready_device("weightsToHost()")
        for tensor_id, value in device.read_weights(self._program.weights).items():
            self._host_weights[tensor_id][...] = value
        grouped = self._ir.grouped_variables
        every_replica = [t for t in self._program.weights
                         if t in grouped and grouped[t].retrieval != "OnePerGroup"]
        if every_replica:
            self._host_weights.replica_values.update(device.read_replicas(every_replica))
        self._host_weights_in_sync = True

    def readWeights(self, weightsIo: PyWeightsIO) -> None:
        """Host weights -> the user's arrays in ``weightsIo``. A replica-grouped variable
        gives what its VariableRetrievalMode asks (ir/replica_grouping.py)."""
        for tensor_id, array in self._weights_io_items(weightsIo, "readWeights"):
            if not array.flags.writeable:
                raise popart_exception(
                    f"readWeights: the array for weight '{tensor_id}' is read-only."
                )
            array[...] = self._retrieved(tensor_id)

    def _retrieved(self, tensor_id: str) -> np.ndarray:
        host = self._host_weights[tensor_id]
        grouping = self._ir.grouped_variables.get(tensor_id)
        if grouping is None or grouping.retrieval == "OnePerGroup":
            return host
        replicas = self._host_weights.replica_values.get(tensor_id)
        return grouping.retrieve(grouping.per_replica(host) if replicas is None else replicas)

    def writeWeights(self, weightsIo: PyWeightsIO) -> None:
        """The user's arrays in ``weightsIo`` -> host weights (then call weightsFromHost())."""
        for tensor_id, array in self._weights_io_items(weightsIo, "writeWeights"):
            self._host_weights[tensor_id][...] = array
            self._host_weights.replica_values.pop(tensor_id, None)

    def _weights_io_items(self, weights_io, what: str):
        if not isinstance(weights_io, PyWeightsIO):
            raise popart_exception(f"{what} needs a PyWeightsIO, not {type(weights_io).__name__}.")
        items = []
        for tensor_id, array in weights_io.weights.items():
            if tensor_id not in self._host_weights:
                raise popart_exception(
                    f"{what}: '{tensor_id}' is not a weight of this session. "
                    + self._weights_hint(tensor_id)
                )
            expected = self._host_weights[tensor_id]
            grouping = self._ir.grouped_variables.get(tensor_id)
            if grouping is not None and what == "readWeights":
                shape = grouping.retrieved_shape(self._ir.main.tensors[tensor_id].info.shape)
                expected = np.empty(shape, expected.dtype)  # the retrieval mode's shape
            if not isinstance(array, np.ndarray) or array.shape != expected.shape or (
                array.dtype != expected.dtype
            ):
                given = (f"{array.dtype}{list(array.shape)}" if isinstance(array, np.ndarray)
                         else type(array).__name__)
                raise popart_exception(
                    f"{what}: the array for weight '{tensor_id}' is {given}; the weight is "
                    f"{expected.dtype}{list(expected.shape)}. PyWeightsIO arrays hold whole "
                    f"weights" + (f" (replica-grouped: {grouping.num_groups} groups, retrieval "
                                  f"{grouping.retrieval})." if grouping is not None else ".")
                )
            items.append((tensor_id, array))
        return items

    def _weights_hint(self, tensor_id: str) -> str:
        tensor = self._ir.main.tensors.get(tensor_id)
        if tensor is not None and tensor.kind is TensorKind.CONST and self._constant_weights():
            return ("It is a constant because SessionOptions.constantWeights is True; build the "
                    "session with constantWeights = False to read or write it.")
        close = difflib.get_close_matches(tensor_id, list(self._host_weights), n=3)
        known = ", ".join(repr(c) for c in (close or sorted(self._host_weights)[:10]))
        return f"Weights: {known}." if known else "The session has no weights."

    def resetHostWeights(
        self,
        modelProtoOrFilename,
        ignoreWeightsInModelWithoutCorrespondingHostWeight: bool = False,
    ) -> None:
        """Replace the host weights by the initializers of another model (then weightsFromHost)."""
        loaded = load_model(modelProtoOrFilename)
        updates = {}
        for init in loaded.proto.graph.initializer:
            if init.name not in self._host_weights:
                if ignoreWeightsInModelWithoutCorrespondingHostWeight:
                    continue
                raise popart_exception(
                    f"resetHostWeights: the model has initializer '{init.name}', which is not a "
                    f"weight of this session. Pass "
                    f"ignoreWeightsInModelWithoutCorrespondingHostWeight=True to skip it."
                )
            value = initializer_value(init, loaded.base_dir)
            expected = self._host_weights[init.name]
            if value.shape != expected.shape or value.dtype != expected.dtype:
                raise popart_exception(
                    f"resetHostWeights: initializer '{init.name}' is {value.dtype}"
                    f"{list(value.shape)}, the session's weight is {expected.dtype}"
                    f"{list(expected.shape)}."
                )
            updates[init.name] = value
        for tensor_id, value in updates.items():
            self._host_weights[tensor_id][...] = value
            self._host_weights.replica_values.pop(tensor_id, None)

    def modelToHost(self, fn: str) -> None:
        """Write the model with the device's current weights to ``fn`` (F51).

        Initializers stored as external data are written to data files next to ``fn`` (never
        outside its folder, never into the files of the model the session was built from
        unless ``fn`` is that model). Every file is replaced atomically.
        """
        if self._device is not None and self._engine_loaded:
            self.weightsToHost()
        proto = onnx.ModelProto()
        proto.CopyFrom(self._model.proto)
        target = Path(fn).resolve()
        external: dict[str, list[tuple[onnx.TensorProto, np.ndarray]]] = {}
        for init in proto.graph.initializer:
            value = self._host_weights.get(init.name)
            if value is None:
                value = initializer_value(init, self._model.base_dir)
            if init.data_location == onnx.TensorProto.EXTERNAL:
                location = {e.key: e.value for e in init.external_data}.get("location", "")
                external.setdefault(location, []).append((init, value))
            else:
                init.CopyFrom(numpy_helper.from_array(value, init.name))
        proto.graph.initializer.extend(self._training_state_initializers(proto))
        sources = self._source_data_files()
        same_model = self._model.path is not None and self._model.path.resolve() == target
        used: set[str] = set()
        for location, items in external.items():
            new_location = _data_location(location, target, sources, same_model, used)
            _write_external(items, target.parent, new_location)
        write_bytes_atomic(target, proto.SerializeToString())

    def _training_state_initializers(self, proto: onnx.ModelProto) -> list[onnx.TensorProto]:
        """The optimizer state (momenta, Adam moments, step counters) and gradient accumulators
        the model does not hold yet, as initializers under their reserved names: a training
        session built from the written model resumes with them."""
        present = {init.name for init in proto.graph.initializer}
        tensors = self._ir.main.tensors
        return [numpy_helper.from_array(np.asarray(value), tensor_id)
                for tensor_id, value in self._host_weights.items()
                if tensor_id not in present and tensor_id.startswith(CHECKPOINT_PREFIXES)
                and tensors[tensor_id].role in _STATE_ROLES]

    def _source_data_files(self) -> set[Path]:
        """Resolved external data files of the model the session was built from."""
        files = set()
        for init in self._model.proto.graph.initializer:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                location = {e.key: e.value for e in init.external_data}.get("location", "")
                files.add((self._model.base_dir / location).resolve())
        return files


def _data_location(location: str, target: Path, sources: set[Path], same_model: bool,
                   used: set[str]) -> str:
    """Where (relative to ``target``'s folder) to write the data stored at ``location``: the
    same name when it stays inside the folder and is not a file of the source model (unless
    ``target`` replaces the source model), else a new name derived from ``target``."""
    try:
        dest = confined_path(target.parent, location, f"modelToHost('{target}')")
        keep = same_model or dest not in sources
    except popart_exception:
        keep = False
    if keep and location not in used:
        used.add(location)
        return location
    stem = Path(location).name or "data"
    candidate, n = f"{target.name}.{stem}", 0
    while candidate in used or (target.parent / candidate).resolve() in sources:
        n += 1
        candidate = f"{target.name}.{n}.{stem}"
    used.add(candidate)
    return candidate


def _write_external(items: list[tuple[onnx.TensorProto, np.ndarray]], target_dir: Path,
                    location: str) -> None:
    """Write the values of ``items`` one after another into ``location`` (in ``target_dir``,
    atomically) and point each initializer at its bytes there."""
    path = confined_path(target_dir, location, f"external data file '{location}'")
    path.parent.mkdir(parents=True, exist_ok=True)
    chunks, offset = [], 0
    for init, value in items:
        raw = numpy_helper.from_array(np.asarray(value), init.name).raw_data
        del init.external_data[:]
        for key, entry in (("location", location), ("offset", str(offset)),
                           ("length", str(len(raw)))):
            init.external_data.add(key=key, value=entry)
        init.data_location = onnx.TensorProto.EXTERNAL
        init.ClearField("raw_data")
        chunks.append(raw)
        offset += len(raw)

    def write(f) -> None:
        for chunk in chunks:
            f.write(chunk)

    write_atomic(path, write)
