"""Executable files (F53): our own safe container for a compiled model and its state.

A file is a zip archive of exactly four members:

- ``meta.json``: the format name and version, the kind of file (a PopART session, an engine
  cache entry, a PopTorch executable ...), the package versions it was written with, the
  SHA-256 of the other members and the writer's own JSON metadata;
- ``model.onnx``: an ONNX model (protobuf bytes, possibly empty);
- ``tensors.json``: one entry per array: name, dtype (from a fixed list of plain numeric
  types), shape, byte offset and length in ``tensors.bin``;
- ``tensors.bin``: the arrays' raw bytes, little-endian, C order.

Nothing in it is pickled or evaluated: reading parses JSON, checks every hash, size, dtype and
shape, and only then hands back plain arrays. A truncated, corrupted, crafted or
version-mismatched file raises ``popart_exception`` before any caller state changes. Files
are written atomically (``files.write_atomic``), so a crash midway leaves no half file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import zipfile
from pathlib import Path

import numpy as np

from ..errors import popart_exception
from ..files import write_atomic

__all__ = ["ExecutableContents", "read_executable_file", "write_executable_file"]

FORMAT = "popart-lite-executable"
FORMAT_VERSION = 1
_MEMBERS = ("meta.json", "model.onnx", "tensors.json", "tensors.bin")
# Plain numeric dtypes only: never object arrays.
_DTYPES = frozenset({"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                     "uint64", "float16", "float32", "float64"})
# A member larger than this is refused before it is read (a crafted archive could claim any
# size); override with POPART_EXECUTABLE_MAX_BYTES.
_DEFAULT_MAX_BYTES = 8 << 30


@dataclasses.dataclass
class ExecutableContents:
    """What an executable file holds, validated: the writer's metadata, the ONNX bytes and
    the named arrays."""

    meta: dict
    model: bytes
    tensors: dict[str, np.ndarray]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_executable_file(path: str | os.PathLike, kind: str, versions: dict[str, str],
                          meta: dict, model: bytes = b"",
                          tensors: dict[str, np.ndarray] | None = None) -> Path:
    """Write an executable file atomically; ``meta`` must be JSON-serialisable."""
    table, chunks, offset = [], [], 0
    for name, array in (tensors or {}).items():
        array = np.asarray(array, order="C")
        dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        if dtype.name not in _DTYPES:
            raise popart_exception(
                f"Cannot save the array '{name}' in an executable file: its dtype {dtype} is not "
                f"one of {sorted(_DTYPES)}.")
        raw = array.astype(dtype.newbyteorder("<"), copy=False).tobytes()
        table.append({"name": name, "dtype": dtype.name, "shape": list(array.shape),
                      "offset": offset, "nbytes": len(raw)})
        chunks.append(raw)
        offset += len(raw)
    members = {"model.onnx": bytes(model),
               "tensors.json": json.dumps(table).encode(),
               "tensors.bin": b"".join(chunks)}
    header = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": kind,
              "versions": dict(versions),
              "sha256": {name: _sha(data) for name, data in members.items()},
              "meta": meta}
    try:
        header_bytes = json.dumps(header, sort_keys=True).encode()
    except (TypeError, ValueError) as exc:
        raise popart_exception(
            f"Cannot save the executable '{path}': its metadata is not plain JSON ({exc}).") from exc

    def write(f) -> None:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr("meta.json", header_bytes)
            for name, data in members.items():
                archive.writestr(name, data)

    target = Path(path)
    if target.parent and not target.parent.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(target, write)


def _max_bytes() -> int:
    text = os.environ.get("POPART_EXECUTABLE_MAX_BYTES", "")
    return int(text) if text.isdigit() else _DEFAULT_MAX_BYTES


def read_executable_file(path: str | os.PathLike, kind: str,
                         versions: dict[str, str]) -> ExecutableContents:
    """Read and validate an executable file of ``kind`` written with these ``versions``.

    Everything is checked (members, sizes, hashes, format, kind, versions, dtypes, shapes)
    before anything is returned; any problem raises ``popart_exception`` saying what and where.
    """
    where = f"Cannot load the executable file '{path}'"
    if not os.path.isfile(path):
        raise popart_exception(f"{where}: no such file. Check the path (saved with "
                               f"compileAndExport / saveExecutable?).")
    try:
        with zipfile.ZipFile(path) as archive:
            infos = {info.filename: info for info in archive.infolist()}
            if sorted(infos) != sorted(_MEMBERS):
                raise popart_exception(
                    f"{where}: it is not an executable of this package (members "
                    f"{sorted(infos)}, expected {sorted(_MEMBERS)}). Export it again.")
            limit = _max_bytes()
            for info in infos.values():
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) \
                        or info.file_size > limit:
                    raise popart_exception(
                        f"{where}: member '{info.filename}' has compression "
                        f"{info.compress_type} and {info.file_size} bytes (at most {limit}, "
                        f"stored or deflated). The file is damaged or was not written here.")
            data = {name: archive.read(name) for name in _MEMBERS}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError,
            NotImplementedError) as exc:
        raise popart_exception(
            f"{where}: it is truncated or not a valid archive ({type(exc).__name__}: {exc}). "
            f"Export it again.") from exc
    header = _json(data["meta.json"], where, "meta.json")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise popart_exception(f"{where}: it is not a {FORMAT} file.")
    if header.get("format_version") != FORMAT_VERSION:
        raise popart_exception(
            f"{where}: format version {header.get('format_version')!r}, this package reads "
            f"version {FORMAT_VERSION}. Export it again with this version.")
    if header.get("kind") != kind:
        raise popart_exception(
            f"{where}: it holds a '{header.get('kind')}', not a '{kind}'.")
    if header.get("versions") != versions:
        raise popart_exception(
            f"{where}: it was written with versions {header.get('versions')}, but this process "
            f"runs {versions}. Executables are only loaded by the exact versions that wrote "
            f"them; export it again.")
    hashes = header.get("sha256")
    for name in _MEMBERS[1:]:
        if not isinstance(hashes, dict) or hashes.get(name) != _sha(data[name]):
            raise popart_exception(
                f"{where}: member '{name}' does not match its checksum; the file is corrupted. "
                f"Export it again.")
    meta = header.get("meta")
    if not isinstance(meta, dict):
        raise popart_exception(f"{where}: its metadata is not a JSON object.")
    tensors = _tensors(_json(data["tensors.json"], where, "tensors.json"), data["tensors.bin"],
                       where)
    return ExecutableContents(meta, data["model.onnx"], tensors)


def _json(data: bytes, where: str, member: str):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise popart_exception(f"{where}: '{member}' is not valid JSON ({exc}).") from exc


def _tensors(table, blob: bytes, where: str) -> dict[str, np.ndarray]:
    if not isinstance(table, list):
        raise popart_exception(f"{where}: 'tensors.json' is not a list of arrays.")
    arrays: dict[str, np.ndarray] = {}
    for entry in table:
        ok = (isinstance(entry, dict) and isinstance(entry.get("name"), str)
              and entry.get("dtype") in _DTYPES and isinstance(entry.get("shape"), list)
              and all(type(d) is int and d >= 0 for d in entry["shape"])
              and all(type(entry.get(k)) is int and entry[k] >= 0 for k in ("offset", "nbytes"))
              and entry["name"] not in arrays)
        if ok:
            dtype = np.dtype(entry["dtype"]).newbyteorder("<")
            size = math.prod(entry["shape"]) * dtype.itemsize
            ok = size == entry["nbytes"] and entry["offset"] + size <= len(blob)
        if not ok:
            raise popart_exception(
                f"{where}: the array entry {str(entry)[:200]} is malformed (name, plain dtype, "
                f"shape and a byte range inside 'tensors.bin' expected).")
        chunk = blob[entry["offset"]:entry["offset"] + entry["nbytes"]]
        arrays[entry["name"]] = np.frombuffer(chunk, dtype=dtype).reshape(
            entry["shape"]).astype(dtype.newbyteorder("="))
    return arrays

