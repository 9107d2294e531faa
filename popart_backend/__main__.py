"""``python -m popart_backend MODEL.onnx ...``: the command-line tool of popart_backend/cli.py."""

import sys

from .cli import main

sys.exit(main())
