"""PopART's logging on top of Python's ``logging``.

Each PopART module logs on a stdlib logger named ``popart:<module>`` (the backend simply calls
``logging.getLogger("popart:ir")``). This module gives those loggers PopART's levels, line
format and sink, reads ``POPART_LOG_LEVEL`` / ``POPART_LOG_DEST`` / ``POPART_LOG_CONFIG`` /
``POPART_LOG_FORMAT`` at import, and provides ``popart.getLogger(name).setLevel(level)``.

The loggers do not propagate to the root logger: like PopART's spdlog sink, their output does
not depend on (or duplicate through) the application's own logging set-up.
"""

from __future__ import annotations

import datetime
import json
import logging as _pylogging  # the stdlib (absolute import), not this module
import os
import re
import sys
import threading
import warnings
from typing import Mapping

from .errors import popart_exception

__all__ = ["Logger", "getLogger"]

# Python level numbers for PopART's levels. OFF sits above CRITICAL so nothing passes.
TRACE = 5
DEBUG = _pylogging.DEBUG
INFO = _pylogging.INFO
WARN = _pylogging.WARNING
ERR = _pylogging.ERROR
CRITICAL = _pylogging.CRITICAL
OFF = CRITICAL + 10

LEVELS: dict[str, int] = {
    "TRACE": TRACE,
    "DEBUG": DEBUG,
    "INFO": INFO,
    "WARN": WARN,
    "ERR": ERR,
    "CRITICAL": CRITICAL,
    "OFF": OFF,
}
DEFAULT_LEVEL = "WARN"  # the SDK 2.3 code's default, not the user guide's OFF

_pylogging.addLevelName(TRACE, "TRACE")

# Module name -> logger name. "none" is PopART's catch-all module.
MODULES: dict[str, str] = {
    name: f"popart:{name}"
    for name in (
        "popart",
        "session",
        "ir",
        "devicex",
        "transform",
        "pattern",
        "builder",
        "op",
        "opx",
        "ces",
        "python",
    )
}
MODULES["none"] = "popart:<unknown>"

_LETTERS = {TRACE: "T", DEBUG: "D", INFO: "I", WARN: "W", ERR: "E", CRITICAL: "C"}
_SPDLOG_NAMES = {
    TRACE: "trace",
    DEBUG: "debug",
    INFO: "info",
    WARN: "warning",
    ERR: "error",
    CRITICAL: "critical",
}
DEFAULT_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ %n %P.%t %L: %v"


def level_from_string(level: str) -> int:
    """PopART level name -> Python level; an unknown name means OFF, as in PopART (with a
    Python warning, so a typo does not silence the log unnoticed)."""
    number = LEVELS.get(str(level).upper())
    if number is None:
        warnings.warn(
            f"Unknown PopART log level '{level}', using OFF. Valid levels: {', '.join(LEVELS)}.",
            stacklevel=3,
        )
        return OFF
    return number


def _level_letter(levelno: int) -> str:
    below = [n for n in _LETTERS if n <= levelno]
    return _LETTERS[max(below)] if below else "T"


def _level_name(levelno: int) -> str:
    below = [n for n in _SPDLOG_NAMES if n <= levelno]
    return _SPDLOG_NAMES[max(below)] if below else "trace"


class PopartFormatter(_pylogging.Formatter):
    """Formats records with a spdlog-style pattern (``POPART_LOG_FORMAT``); the default gives
    ``2022-05-18T12:39:14.459971Z popart:session 90915.90915 T: msg`` (UTC)."""

    _FLAG = re.compile(r"%(.)")

    def __init__(self, pattern: str = DEFAULT_FORMAT):
        super().__init__()
        self.pattern = pattern

    def format(self, record: _pylogging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, tz=datetime.timezone.utc)
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        fields = {
            "Y": f"{when.year:04d}",
            "m": f"{when.month:02d}",
            "d": f"{when.day:02d}",
            "H": f"{when.hour:02d}",
            "M": f"{when.minute:02d}",
            "S": f"{when.second:02d}",
            "e": f"{when.microsecond // 1000:03d}",
            "f": f"{when.microsecond:06d}",
            "F": f"{when.microsecond * 1000:09d}",
            "n": record.name,
            "P": str(record.process),
            # Formatting runs in the logging thread, so its native id is the record's.
            "t": str(threading.get_native_id()),
            "L": _level_letter(record.levelno),
            "l": _level_name(record.levelno),
            "v": message,
            "^": "",  # colour range start/end: no colours here
            "$": "",
            "%": "%",
        }
        # Unknown flags are written literally, as spdlog does.
        return self._FLAG.sub(lambda m: fields.get(m.group(1), m.group(0)), self.pattern)


class _StdStreamHandler(_pylogging.StreamHandler):
    """Writes to ``sys.stdout``/``sys.stderr`` as they are at emit time (so redirection works)."""

    def __init__(self, which: str):
        super().__init__(getattr(sys, which))
        self._which = which

    def emit(self, record: _pylogging.LogRecord) -> None:
        self.stream = getattr(sys, self._which)
        super().emit(record)


_handler: _pylogging.Handler | None = None


def _make_handler(dest: str) -> _pylogging.Handler:
    if dest in ("stdout", "stderr"):
        return _StdStreamHandler(dest)
    return _pylogging.FileHandler(dest, mode="w", encoding="utf-8")  # truncated on open


def _module_of(name: str) -> str:
    module = name[len("popart:") :] if name.startswith("popart:") else name
    if module not in MODULES:
        raise popart_exception(
            f"Unknown PopART log module '{name}'. Valid modules: all, {', '.join(MODULES)}."
        )
    return module


def set_level(module: str, level: str | int) -> None:
    """Set one module's level (``module="all"``: every module)."""
    number = level if isinstance(level, int) else level_from_string(level)
    modules = MODULES if module == "all" else [_module_of(module)]
    for name in modules:
        _pylogging.getLogger(MODULES[name]).setLevel(number)


def configure(
    level: str = DEFAULT_LEVEL,
    dest: str = "stderr",
    module_levels: Mapping[str, str] | None = None,
    pattern: str = DEFAULT_FORMAT,
) -> None:
    """(Re)configure every PopART logger: sink, line format, default level, per-module levels."""
    global _handler
    new_handler = _make_handler(dest)
    new_handler.setFormatter(PopartFormatter(pattern))
    old_handler, _handler = _handler, new_handler
    for logger_name in MODULES.values():
        logger = _pylogging.getLogger(logger_name)
        if old_handler is not None:
            logger.removeHandler(old_handler)
        logger.addHandler(new_handler)
        logger.propagate = False
    if old_handler is not None:
        old_handler.close()
    set_level("all", level)
    for module, module_level in (module_levels or {}).items():
        set_level(module, module_level)


def configure_from_env(environ: Mapping[str, str] = os.environ) -> None:
    """Apply POPART_LOG_LEVEL, POPART_LOG_DEST, POPART_LOG_CONFIG and POPART_LOG_FORMAT."""
    module_levels = {}
    config_path = environ.get("POPART_LOG_CONFIG")
    if config_path:
        try:
            with open(config_path, encoding="utf-8") as f:
                module_levels = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise popart_exception(
                f"POPART_LOG_CONFIG='{config_path}' could not be read as a JSON object of "
                f'module -> level (e.g. {{"devicex": "INFO"}}): {e}'
            ) from e
        if not isinstance(module_levels, dict):
            raise popart_exception(
                f"POPART_LOG_CONFIG='{config_path}' must hold a JSON object of module -> level, "
                f"got {type(module_levels).__name__}."
            )
    configure(
        level=environ.get("POPART_LOG_LEVEL", DEFAULT_LEVEL),
        dest=environ.get("POPART_LOG_DEST", "stderr"),
        module_levels=module_levels,
        pattern=environ.get("POPART_LOG_FORMAT", DEFAULT_FORMAT),
    )


class Logger:
    """``popart.getLogger(name)``: sets levels and logs on the ``python`` module."""

    def __init__(self, name: str = "all"):
        self.name = name if name == "all" else _module_of(name)
        self._python = _pylogging.getLogger(MODULES["python"])

    def setLevel(self, level: str) -> None:  # noqa: N802 - PopART's name
        set_level(self.name, level)

    def getLevel(self) -> str:  # noqa: N802
        """The module's level name (for ``all``: the default ``popart`` module's)."""
        module = "popart" if self.name == "all" else self.name
        number = _pylogging.getLogger(MODULES[module]).level
        names = [name for name, n in LEVELS.items() if n == number]
        return names[0] if names else _pylogging.getLevelName(number)

    def trace(self, msg: str) -> None:
        self._python.log(TRACE, msg)

    def debug(self, msg: str) -> None:
        self._python.debug(msg)

    def info(self, msg: str) -> None:
        self._python.info(msg)

    def warn(self, msg: str) -> None:
        self._python.warning(msg)

    def error(self, msg: str) -> None:
        self._python.error(msg)

    def critical(self, msg: str) -> None:
        self._python.critical(msg)


def getLogger(name: str = "all") -> Logger:  # noqa: N802
    return Logger(name)


configure_from_env()
