"""The frontend's console log: ``poptorch_lite.logger``, ``setLogLevel(level)`` and the
``POPTORCH_LOG_LEVEL`` environment variable, read once at import.

Every frontend module logs on the stdlib logger ``"poptorch_lite"`` (``logger`` here). Like
PopTorch's ``poptorch::python`` logger it prints to the console (stderr, as it is at emit time)
in PopTorch's line format, does not propagate to the application's root logger, and starts at
INFO. The backend's loggers (``popart:*``) keep their own level: set them with
``popart_backend.getLogger().setLevel(...)`` or ``POPART_LOG_LEVEL``.

Repeated messages (``Options.maxRepeatLogs``, default 4): a message logged back to back more
than the limit is shown the limit number of times, then once more with "further repeats
suppressed", then not until another message comes. ``setRepeatLimit(None)`` shows them all.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

__all__ = ["logger", "setLogLevel", "setRepeatLimit"]

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


class _RepeatFilter(logging.Filter):
    """Suppresses a message repeated back to back beyond ``limit`` times (None: no limit)."""

    def __init__(self, limit: int | None):
        super().__init__()
        self.limit = limit
        self._last: tuple[int, str] | None = None
        self._count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, record.getMessage())
        if key != self._last:
            self._last, self._count = key, 0
        self._count += 1
        if self.limit is None or self._count <= self.limit:
            return True
        if self._count == self.limit + 1:
            record.msg = (f"{record.getMessage()} [repeated {self.limit} times; further repeats "
                          f"suppressed (Options.maxRepeatLogs)]")
            record.args = None
            return True
        return False


_repeats = _RepeatFilter(4)
logger.addFilter(_repeats)


def setRepeatLimit(limit: int | None) -> None:  # noqa: N802 - next to setLogLevel
    """Show a message repeated back to back at most ``limit`` times (None: always)."""
    _repeats.limit = limit


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
