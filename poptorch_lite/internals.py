"""PopTorch's internal helpers that its package re-exports: ``createPoptorchError``,
``accessAttributes``, ``getIpuTensorId`` and ``importPoptorchMetadataFromFile``.

- ``accessAttributes(id)`` reads an attribute dict stored with ``store_attributes`` (the
  backing of op attribute scopes such as ``poptorch.Attribute``): an unknown id raises.
- ``importPoptorchMetadataFromFile(filename)`` reads the metadata block of a file written by
  ``compileAndExport`` / ``save``, through the reader that the saving code installs with
  ``set_metadata_reader``; without one the call raises rather than guess a format.
"""

from __future__ import annotations

import os

from .errors import PY_ERROR, Error

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


def getIpuTensorId(x) -> int:  # noqa: N802
    """Refused: poptorch_lite captures ``forward`` whole with torch.export, so no tensor
    lives on the IPU from Python's side and none has a per-tensor IPU id."""
    raise Error(f"getIpuTensorId: {type(x).__name__} is a host tensor; poptorch_lite traces "
                f"forward with torch.export, so tensors never live on the IPU one by one and "
                f"have no IPU tensor id. Use wrapper.getTensorNames() for the compiled model's "
                f"tensor ids, and Options.anchorTensor to read one back.")


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
