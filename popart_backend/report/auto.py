"""Poplar's automatic report (``autoReport.*`` engine options): which engine options
a session sees, whether profiling is on, and the report files written into
``autoReport.directory``.

The engine options are ``SessionOptions.engineOptions`` overlaid by the JSON object of the
``POPLAR_ENGINE_OPTIONS`` environment variable (the variable wins, as in Poplar).
``autoReport.all = "true"`` turns profiling on (``getReport()``, ``getSummaryReport()``). Files
are written when a directory is known: ``autoReport.directory``, or the current directory when
the environment variable itself turns profiling on (Poplar's default). A session writes into
``<directory>/<session name>/`` (PopTorch: the model name, else ``inference`` / ``training``):

- ``profile.json``: ``Report.to_json`` (memory and cycles of the simulated IPU);
- ``profile.html``: ``Report.to_html``;
- ``trace.json``: the Chrome trace of one step (``Report.to_chrome_trace``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..device.analysis import DeviceModel
from ..errors import popart_exception
from .report import Report

__all__ = ["ENV_ENGINE_OPTIONS", "REPORT_FILES", "engine_options", "profiling_enabled",
           "report_directory", "write_auto_report"]

ENV_ENGINE_OPTIONS = "POPLAR_ENGINE_OPTIONS"
REPORT_FILES = ("profile.json", "profile.html", "trace.json")
# The engine options the simulated device reads; any other (Poplar tuning, report content
# selection) is logged once as having no effect.
READ_KEYS = frozenset({"autoReport.all", "autoReport.directory"})
_LOGGED: set[str] = set()

_log = logging.getLogger("popart:session")


def _env_engine_options() -> dict[str, str]:
    text = os.environ.get(ENV_ENGINE_OPTIONS, "").strip()
    if not text:
        return {}
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise popart_exception(
            f"{ENV_ENGINE_OPTIONS}={text!r} is not JSON ({exc}); expected an object such as "
            f'{{"autoReport.all": "true", "autoReport.directory": "./report"}}.'
        ) from exc
    if not isinstance(values, dict):
        raise popart_exception(
            f"{ENV_ENGINE_OPTIONS}={text!r}: expected a JSON object of engine options."
        )
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in values.items()}


def engine_options(options) -> dict[str, str]:
    """The engine options of a session: ``options.engineOptions``, then the environment's.

    Keys the simulated device does not read are logged once (WARNING) as having no effect."""
    values = {**dict(options.engineOptions), **_env_engine_options()}
    for key in values.keys() - READ_KEYS - _LOGGED:
        _LOGGED.add(key)
        _log.warning("Engine option %r has no effect on the simulated IPU: it reads only %s "
                     "(the report files always hold the whole profile).", key,
                     ", ".join(sorted(READ_KEYS)))
    return values


def profiling_enabled(options) -> bool:
    """True when the engine options ask for the automatic report (``autoReport.all``)."""
    return str(engine_options(options).get("autoReport.all", "false")).lower() == "true"


def report_directory(options, session_name: str) -> Path | None:
    """Where the session's report files go; None when none are written (see module doc)."""
    if not profiling_enabled(options):
        return None
    directory = engine_options(options).get("autoReport.directory")
    if directory is None:
        env = _env_engine_options()
        if str(env.get("autoReport.all", "false")).lower() != "true":
            return None  # set by the program without a directory: in-memory report only
        directory = "."
    return Path(directory) / (session_name or "session")


def write_auto_report(model: DeviceModel, runs: int, directory: Path) -> list[Path]:
    """Write the report files of ``model`` (``runs`` profiled so far) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    report = Report(model, runs)
    paths = [directory / name for name in REPORT_FILES]
    report.to_json(paths[0])
    report.to_html(paths[1])
    report.to_chrome_trace(paths[2])
    _log.info("Profile of %s (%d run(s)) written to %s", model.device, runs, directory)
    return paths
