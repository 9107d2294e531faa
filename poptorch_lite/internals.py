"""PopTorch's internal helpers that its package re-exports: ``createPoptorchError``,
``accessAttributes``, ``getIpuTensorId`` (the backend id of a compiled wrapper's
parameter or buffer) and ``importPoptorchMetadataFromFile``.

- ``accessAttributes(id)`` reads an attribute dict stored with ``store_attributes`` (the
  backing of op attribute scopes such as ``poptorch.Attribute``): an unknown id raises.
- ``importPoptorchMetadataFromFile(filename)`` reads the metadata block of a file written by
  ``compileAndExport`` / ``save``, through the reader that the saving code installs with
  ``set_metadata_reader``; without one the call raises rather than guess a format.
"""

from __future__ import annotations

import os

from .errors import PY_ERROR, Error
from .executor.executor import backend_tensor_id

__all__ = ["accessAttributes", "createPoptorchError", "getIpuTensorId",
           "importPoptorchMetadataFromFile"]

_ATTRIBUTES: dict[str, dict] = {}
_metadata_reader = {"read": None}


def createPoptorchError(msg: str) -> Error:  # noqa: N802 - PopTorch's name
    """A ``poptorch_lite.Error`` (type ``"poptorch_lite_py_error"``) carrying ``msg``."""
    return Error(str(msg), type=PY_ERROR)


def store_attributes(attributes: dict) -> str:
    """Keep ``attributes`` and return the id string ``accessAttributes`` reads it back by."""
    attribute_id = f"attributes_{len(_ATTRIBUTES)}"
    _ATTRIBUTES[attribute_id] = dict(attributes)
    return attribute_id


def accessAttributes(attribute_id_str: str) -> dict:  # noqa: N802
    """The attribute dict stored under ``attribute_id_str``."""
    if attribute_id_str not in _ATTRIBUTES:
        known = ", ".join(repr(k) for k in list(_ATTRIBUTES)[-5:]) or "none"
        raise Error(f"accessAttributes({attribute_id_str!r}): no attributes are stored under "
                    f"that id (latest ids: {known}).")
    return dict(_ATTRIBUTES[attribute_id_str])


def getIpuTensorId(x) -> str:  # noqa: N802
    """The backend tensor id of a parameter or buffer of a compiled wrapper's model: give the
    tensor itself or its name in the model (``"fc.weight"``). PopTorch returns its dispatcher's
    integer id; here the id is the backend's (string) tensor id, the one ``getTensorNames()``
    lists and ``Options.anchorTensor`` takes. Anything else raises ``Error``."""
    return backend_tensor_id(x)


def set_metadata_reader(reader) -> None:
    """Install ``reader(filename) -> dict``, the saving code's reader of its metadata block."""
    _metadata_reader["read"] = reader


def importPoptorchMetadataFromFile(filename: str) -> dict:  # noqa: N802
    """The PopTorch metadata (version, input signature, options ...) of an exported file."""
    if not os.path.isfile(filename):
        raise Error(f"importPoptorchMetadataFromFile: no file {filename!r}.")
    reader = _metadata_reader["read"]
    if reader is None:
        raise Error(f"importPoptorchMetadataFromFile({filename!r}): this build cannot read "
                    f"exported executables (compileAndExport / save are not available).")
    return reader(filename)
