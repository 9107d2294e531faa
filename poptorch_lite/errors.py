"""The frontend's exceptions and where-in-user-code helpers.

Every message follows the contract of P72: what went wrong, where (the user's source line),
the values involved and what to do. ``location`` holds the ``file:line`` (or the backend op)
separately so tools can read it without parsing the message.
"""

from __future__ import annotations

import os
import traceback

__all__ = ["ConfigFileError", "Error", "RecoverableError", "UnrecoverableError"]

PY_ERROR = "poptorch_lite_py_error"

# Frames from these folders are library code, never "the user's line".
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_MARKERS = (os.sep + "torch" + os.sep, os.sep + "onnxscript" + os.sep,
                  os.sep + "popart_backend" + os.sep, "<frozen ")


class Error(RuntimeError):
    """An error of poptorch_lite or of the backend below it.

    ``message`` is the text without location, ``type`` the category
    (``"poptorch_lite_py_error"``, ``"unsupported_op"``, ``"popart_backend_error"``, ...) and
    ``location`` the user's ``file:line`` or the backend op, "" when unknown.
    """

    def __init__(self, message: str, type: str = PY_ERROR, location: str = ""):  # noqa: A002
        self.message = message
        self.type = type
        self.location = location
        text = message if not location or location in message else f"{message}\n  at {location}"
        super().__init__(text)


class RecoverableError(Error):
    """A transient device fault; ``recovery_action`` says how to recover (e.g. ``"IPU_RESET"``)."""

    def __init__(self, message: str, recovery_action: str = "IPU_RESET", type: str = "recoverable",
                 location: str = ""):  # noqa: A002
        super().__init__(message, type, location)
        self.recovery_action = recovery_action


class UnrecoverableError(Error):
    """A permanent device fault: the device is taken offline."""

    def __init__(self, message: str, type: str = "unrecoverable", location: str = ""):  # noqa: A002
        super().__init__(message, type, location)


class ConfigFileError(Exception):
    """A line of an options file (``Options.loadFromFile``) could not be applied."""


def is_library_file(filename: str, excludes: tuple[str, ...] = ()) -> bool:
    """True for frames of torch, onnxscript, the backend, this package or ``excludes``."""
    path = os.path.abspath(filename)
    if path.startswith(_PACKAGE_DIR + os.sep):
        return True
    if any(marker in path for marker in _TORCH_MARKERS):
        return True
    return any(ex and ex in path for ex in excludes)


def user_location(excludes: tuple[str, ...] = ()) -> str:
    """``file:line`` of the innermost frame of the current stack that is user code."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        if not is_library_file(frame.filename, excludes):
            return f"{frame.filename}:{frame.lineno}"
    return ""


def location_from_stack_trace(stack_trace: str, excludes: tuple[str, ...] = ()) -> str:
    """``file:line`` of the innermost user frame in a torch.export node stack trace.

    The trace lists frames outermost first as ``File "f.py", line 7, in forward`` lines, each
    followed by the source text; the user's line is the last frame outside library code.
    """
    found = ""
    lines = stack_trace.splitlines()
    for i, line in enumerate(lines):
        text = line.strip()
        if not text.startswith('File "'):
            continue
        try:
            filename = text.split('"')[1]
            lineno = int(text.split("line ")[1].split(",")[0])
        except (IndexError, ValueError):
            continue
        if is_library_file(filename, excludes):
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) else ""
        found = f"{filename}:{lineno}" + (f" ({code})" if code else "")
    return found
