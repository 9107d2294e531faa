"""Coverage-guided fuzzing of the model loader with atheris, for long local runs.

Each input is the bytes of an ONNX model (the corpus starts from the tiny models of
tests/hardening/models.py); it is loaded and run in an InferenceSession. Only popart_exception
subclasses may escape; anything else is a crash that atheris reports and saves. Keep a crash as
a tiny .onnx file in tests/hardening/regressions/ (tests/hardening/test_regressions.py loads
them all) and fix the backend.

atheris is not a test dependency. Install it into the project's venv first:

    .venv/bin/pip install atheris

then, from the project root:

    .venv/bin/python scripts/fuzz_atheris.py -max_total_time=300 [more libFuzzer flags]

The resource guard is set to 64 MiB (POPART_SIM_MAX_BYTES) unless the environment sets it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("POPART_SIM_MAX_BYTES", str(64 << 20))

try:
    import atheris
except ImportError:
    sys.exit("atheris is not installed: run `.venv/bin/pip install atheris`, then run this "
             "script again (see its docstring).")

# The heavy dependencies first, uninstrumented: coverage is collected in the backend only.
import numpy  # noqa: F401
import onnx  # noqa: F401
import torch  # noqa: F401

with atheris.instrument_imports(include=["popart_backend"]):
    import popart_backend as popart

from tests.hardening.models import SEEDS, load_and_run


def one_input(data: bytes) -> None:
    try:
        load_and_run(data)
    except popart.popart_exception:
        pass


def main() -> None:
    corpus = Path(tempfile.mkdtemp(prefix="popart_fuzz_corpus_"))
    for name, build in SEEDS.items():
        (corpus / f"{name}.onnx").write_bytes(build().SerializeToString())
    for path in sorted((ROOT / "tests" / "hardening" / "regressions").glob("*.onnx")):
        (corpus / path.name).write_bytes(path.read_bytes())
    args = [sys.argv[0], *sys.argv[1:], str(corpus)]
    atheris.Setup(args, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
