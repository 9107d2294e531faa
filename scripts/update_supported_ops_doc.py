"""Regenerate docs/supported_ops.md from the op registry (``--check``: exit 1 if it is stale)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from popart_backend.supported_ops import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
