"""The frontend's console log (spec P35): ``poptorch_lite.logger``, ``setLogLevel(level)`` and the
``POPTORCH_LOG_LEVEL`` environment variable, read once at import.

Every frontend module logs on the stdlib logger ``"poptorch_lite"`` (``logger`` here). Like
PopTorch's ``poptorch::python`` logger it prints to the console (stderr, as it is at emit time)
in PopTorch's line format, does not propagate to the application's root logger, and starts at
INFO. The backend's loggers (``popart:*``) keep their own level: set them with
``popart_backend.getLogger().setLevel(...)`` or ``POPART_LOG_LEVEL``.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

__all__ = ["logger", "setLogLevel"]

# PopTorch's level names -> Python levels. TRACE is the backend's TRACE (5, below DEBUG); OFF
# sits above CRITICAL so nothing passes.
_TRACE = 5
_LEVELS = {"TRACE": _TRACE, "TRACE_ALL": _TRACE, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
           "WARN": logging.WARNING, "ERR": logging.ERROR, "OFF": logging.CRITICAL + 10}
_DEFAULT = "INFO"

logging.addLevelName(_TRACE, "TRACE")

logger = logging.getLogger("poptorch_lite")


class _ConsoleHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at emit time (so redirection and capture work)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


_handler = _ConsoleHandler(sys.stderr)
_handler.setFormatter(logging.Formatter(
    "[%(asctime)s.%(msecs)03d] [poptorch:python] [%(levelname)s] %(message)s", "%H:%M:%S"))
logger.addHandler(_handler)
logger.propagate = False


def _level_number(level, where: str) -> int:
    if isinstance(level, str):
        if level.upper() not in _LEVELS:
            raise ValueError(f"{where}: unknown log level {level!r}; expected one of "
                             f"{', '.join(_LEVELS)} (or a logging level int).")
        return _LEVELS[level.upper()]
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"{where}: expected a level name or a logging level int, got "
                        f"{type(level).__name__} ({level!r}).")
    return level


def setLogLevel(level) -> None:  # noqa: N802 - PopTorch's name
    """Set what the frontend prints: ``"TRACE"``, ``"DEBUG"``, ``"INFO"`` (default), ``"WARN"``,
    ``"ERR"`` or ``"OFF"`` (``"TRACE_ALL"`` = TRACE), or a Python logging level int
    (``logging.DEBUG`` ...)."""
    logger.setLevel(_level_number(level, "setLogLevel"))


def _from_env() -> None:
    value = os.environ.get("POPTORCH_LOG_LEVEL")
    try:
        setLogLevel(value if value else _DEFAULT)
    except ValueError as exc:
        warnings.warn(f"POPTORCH_LOG_LEVEL: {exc} Using {_DEFAULT}.", stacklevel=2)
        setLogLevel(_DEFAULT)


_from_env()
