"""Profiling reports of a compiled session: the summary text, the
``Report`` object (JSON, HTML) and the Chrome-trace timeline, all read from a ``DeviceModel``, and
the files of Poplar's automatic report (``autoReport.*``, auto.py)."""

from __future__ import annotations

from .auto import (
    REPORT_FILES,
    engine_options,
    profiling_enabled,
    report_directory,
    write_auto_report,
)
from .report import Report
from .summary import PROFILING_DISABLED, summary_text
from .trace import chrome_trace

__all__ = ["PROFILING_DISABLED", "REPORT_FILES", "Report", "chrome_trace", "engine_options",
           "profiling_enabled", "report_directory", "summary_text", "write_auto_report"]
