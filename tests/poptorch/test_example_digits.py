"""The main example trains a CNN on scikit-learn's digits to > 90 % test accuracy (issue #4,
item 11), here with a reduced epoch count so CI stays fast."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_train_digits_learns():
    pytest.importorskip("sklearn")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["TRAIN_DIGITS_EPOCHS"] = "2"
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "train_digits.py"),
                             "--quiet"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines = result.stdout.splitlines()
    accuracy = next(float(line.split()[2]) for line in lines
                    if line.startswith("test accuracy"))
    assert accuracy > 0.90, result.stdout
    assert any("samples/s" in line for line in lines)
    assert "scheduler.step()" not in result.stderr  # the device steps count as optimizer steps
