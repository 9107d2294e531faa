"""The newcomer examples keep working: each runs as a script and exits 0 (README set-up)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_runs_and_matches():
    """F1, F2, §2.1: examples/quickstart.py builds, exports and runs; it exits 1 on a mismatch."""
    env = dict(os.environ)
    # Works from a checkout without `pip install -e .` too.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "max |popart - numpy|" in result.stdout
    assert "max |popart - torch|" in result.stdout
    assert result.stdout.rstrip().endswith("OK")
