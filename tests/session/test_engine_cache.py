"""The engine cache's corrupted entries: reported once per entry (a warning), counted, and
rebuilt, so the next session hits the rewritten entry."""

from __future__ import annotations

import logging

import popart_backend as popart
from popart_backend.executable.session_mixin import engine_cache_stats
from tests.session.executable_worker import make_session


def test_corrupt_entry_reported_once_and_rebuilt(tmp_path, caplog):
    options = popart.SessionOptions()
    options.enableEngineCaching = True
    options.cachePath = str(tmp_path)
    make_session(options).prepareDevice()  # miss: written
    (entry,) = tmp_path.glob("*.popart")
    stats = engine_cache_stats
    corrupt, hits = stats["corrupt"], stats["hits"]
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        for _ in range(2):
            entry.write_bytes(b"not an archive")
            make_session(options).prepareDevice()
    assert stats["corrupt"] == corrupt + 2  # both corruptions were seen ...
    warnings = [r for r in caplog.records if "unusable" in r.getMessage()]
    assert len(warnings) == 1 and str(entry) in warnings[0].getMessage()  # ... reported once
    make_session(options).prepareDevice()
    assert stats["hits"] == hits + 1  # the rebuilt entry is valid
