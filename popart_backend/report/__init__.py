"""Profiling reports of a compiled session (spec §4.7; F54, F55): the summary text, the
``Report`` object (JSON) and the Chrome-trace timeline, all read from a ``DeviceModel``."""

from __future__ import annotations

from .report import Report
from .summary import PROFILING_DISABLED, profiling_enabled, summary_text
from .trace import chrome_trace

__all__ = ["PROFILING_DISABLED", "Report", "chrome_trace", "profiling_enabled", "summary_text"]
