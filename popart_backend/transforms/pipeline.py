"""The ordered list of IR passes a session runs (DESIGN: one list, in order).

A pass is an object with a ``name`` and ``run(ir) -> bool`` (True when it changed the IR).
With ``debug=True`` the IR is verified after every pass.
"""

from __future__ import annotations

import logging

from ..ir.verify import verify
from .const_fold import FoldConstants

_log = logging.getLogger("popart:transform")


def inference_passes(options=None) -> list:
    """Passes for an InferenceSession, in order. ``options`` is the session's SessionOptions."""
    return [
        FoldConstants(),
    ]


def run_passes(ir, passes, debug: bool = False) -> None:
    for p in passes:
        changed = p.run(ir)
        _log.debug("pass %s: %s", p.name, "changed" if changed else "no change")
        if debug:
            verify(ir.main)
