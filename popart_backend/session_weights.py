"""Weights of a session: the host copies and the device copies (PopART's weightsFromHost,
weightsToHost, readWeights, writeWeights, resetHostWeights, modelToHost)."""

from __future__ import annotations

import difflib
import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from .dataflow import PyWeightsIO
from .errors import popart_exception
from .importer.onnx_model import initializer_value, load_model
from .ir.tensor import TensorKind

__all__ = ["WeightsMixin"]

_log = logging.getLogger("popart:session")
_TRACE = 5  # PopART's TRACE level (popart_backend.logging.TRACE)


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

    def readWeights(self, weightsIo: PyWeightsIO) -> None:
        """Host weights -> the user's arrays in ``weightsIo``."""
        for tensor_id, array in self._weights_io_items(weightsIo, "readWeights"):
            if not array.flags.writeable:
                raise popart_exception(
                    f"readWeights: the array for weight '{tensor_id}' is read-only."
                )
            array[...] = self._host_weights[tensor_id]

    def writeWeights(self, weightsIo: PyWeightsIO) -> None:
        """The user's arrays in ``weightsIo`` -> host weights (then call weightsFromHost())."""
        for tensor_id, array in self._weights_io_items(weightsIo, "writeWeights"):
            self._host_weights[tensor_id][...] = array

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
            if not isinstance(array, np.ndarray) or array.shape != expected.shape or (
                array.dtype != expected.dtype
            ):
                given = (f"{array.dtype}{list(array.shape)}" if isinstance(array, np.ndarray)
                         else type(array).__name__)
                raise popart_exception(
                    f"{what}: the array for weight '{tensor_id}' is {given}; the weight is "
                    f"{expected.dtype}{list(expected.shape)}. PyWeightsIO arrays hold whole "
                    f"weights."
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

    def modelToHost(self, fn: str) -> None:
        """Write the model with the device's current weights to ``fn`` (F51).

        Initializers stored as external data are written to their data files next to ``fn``.
        """
        if self._device is not None and self._engine_loaded:
            self.weightsToHost()
        proto = onnx.ModelProto()
        proto.CopyFrom(self._model.proto)
        target_dir = Path(fn).resolve().parent
        for init in proto.graph.initializer:
            value = self._host_weights.get(init.name)
            if value is None:
                value = initializer_value(init, self._model.base_dir)
            if init.data_location == onnx.TensorProto.EXTERNAL:
                _write_external(init, value, target_dir)
            else:
                init.CopyFrom(numpy_helper.from_array(value, init.name))
        with open(fn, "wb") as f:
            f.write(proto.SerializeToString())


def _write_external(init: onnx.TensorProto, value: np.ndarray, target_dir: Path) -> None:
    """Write ``value`` into the external data file of ``init``, relative to ``target_dir``."""
    info = {e.key: e.value for e in init.external_data}
    path = target_dir / info["location"]
    offset = int(info.get("offset", 0))
    mode = "r+b" if path.exists() else "w+b"
    with open(path, mode) as f:
        f.seek(offset)
        f.write(np.ascontiguousarray(value).tobytes())
