"""Debug information (PopART's ``DebugContext``, ``DebugInfo``, ``SourceLocation`` and the
``initializePoplarDebugInfo`` / ``closePoplarDebugInfo`` file).

A ``DebugContext`` is the name an op or tensor is created with; it is a ``str`` so every
Builder method taking ``debugContext`` accepts it. ``DebugInfo`` records named values under a
context; between ``initializePoplarDebugInfo(path)`` and ``closePoplarDebugInfo()`` every
``DebugInfo`` is written to ``path`` as JSON. The ops the Builder creates carry their name in
the ONNX node only: they have no DebugInfo record in that file (logged once).
"""

from __future__ import annotations

import inspect
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ..errors import popart_exception

__all__ = [
    "DebugContext",
    "DebugInfo",
    "SourceLocation",
    "closePoplarDebugInfo",
    "initializePoplarDebugInfo",
]

_log = logging.getLogger("popart:builder")


@dataclass(frozen=True)
class SourceLocation:
    """Where in the user's code something was created: function, file, line."""

    functionName: str = ""  # noqa: N815 - PopART's names
    fileName: str = ""  # noqa: N815
    lineNumber: int = 0  # noqa: N815

    @classmethod
    def caller(cls, depth: int = 2) -> SourceLocation:
        frame = inspect.stack()[depth]
        return cls(frame.function, frame.filename, frame.lineno)

    def to_json(self) -> dict:
        return {"function": self.functionName, "file": self.fileName, "line": self.lineNumber}


class DebugContext(str):
    """``DebugContext(name="", loc)``, ``(debugInfo, name="", loc)``: a name (the string
    itself), the parent DebugInfo it was derived from, and a source location (the caller's
    when not given)."""

    def __new__(cls, *args):
        parent = args[0] if args and isinstance(args[0], DebugInfo) else None
        rest = list(args[1:] if parent is not None else args)
        name = rest.pop(0) if rest else ""
        loc = rest.pop(0) if rest else None
        if rest or not isinstance(name, str) or not (
                loc is None or isinstance(loc, SourceLocation)):
            raise popart_exception(
                f"DebugContext{args!r}: expected (name, loc), (debugInfo, name, loc) or a "
                f"prefix of them; name a str, loc a SourceLocation."
            )
        obj = super().__new__(cls, name)
        obj.parent = parent
        obj.location = loc if loc is not None else SourceLocation.caller()
        return obj

    def getPathName(self) -> str:  # noqa: N802 - PopART's name
        return str(self)


class _Stream:
    """The open debug-info file, if any."""

    path: Path | None = None
    records: list[dict] = []
    next_id = 1


class DebugInfo:
    """A record of named values under ``debugContext``, from ``layer`` ("popart", "poptorch"
    ...). Its id is unique in the process."""

    def __init__(self, debugContext, layer: str):  # noqa: N803
        if not isinstance(debugContext, str) or not isinstance(layer, str):
            raise popart_exception(
                f"DebugInfo(debugContext, layer): expected a DebugContext (or name) and a layer "
                f"string, got {debugContext!r}, {layer!r}."
            )
        context = debugContext if isinstance(debugContext, DebugContext) else DebugContext(
            debugContext, SourceLocation.caller())
        self._id = _Stream.next_id
        _Stream.next_id += 1
        parent = context.parent
        self._record = {"id": self._id, "name": str(context), "layer": layer,
                        "location": context.location.to_json()}
        if parent is not None:
            self._record["parentId"] = parent.getId()
        if _Stream.path is not None:
            _Stream.records.append(self._record)

    def getId(self) -> int:  # noqa: N802
        return self._id

    def setValue(self, name: str, value) -> bool:  # noqa: N802
        """Attach ``value`` (str, number, bool or a list / dict of them) under ``name``."""
        if name in ("id", "name", "layer", "location", "parentId"):
            raise popart_exception(f"DebugInfo.setValue: '{name}' is a reserved key.")
        try:
            json.dumps(value)
        except TypeError as exc:
            raise popart_exception(
                f"DebugInfo.setValue('{name}'): the value must be JSON-like (str, number, bool, "
                f"list, dict), got {type(value).__name__}."
            ) from exc
        self._record[name] = value
        return True


def initializePoplarDebugInfo(filename, format: str = "json") -> None:  # noqa: N802,A002
    """Start recording every DebugInfo created from now on; written by closePoplarDebugInfo."""
    if format != "json":
        raise popart_exception(
            f"initializePoplarDebugInfo: format '{format}' is not written by the simulator; use "
            f"'json'."
        )
    _log.warning("initializePoplarDebugInfo: the file records the DebugInfo objects created "
                 "in Python; the simulated compiler adds no records of its own ops.")
    _Stream.path, _Stream.records = Path(filename), []


def closePoplarDebugInfo() -> None:  # noqa: N802
    """Write the recorded DebugInfo objects to the file and stop recording."""
    if _Stream.path is None:
        raise popart_exception(
            "closePoplarDebugInfo: no debug-info file is open; call initializePoplarDebugInfo "
            "first."
        )
    with open(_Stream.path, "w") as f:
        json.dump({"contexts": _Stream.records}, f, indent=1)
    _Stream.path, _Stream.records = None, []
