"""PopTorch's API over popart_backend: ``import poptorch_lite as poptorch``.

New code wraps a module with ``ipu_model(model, options, optimizer)``; PopTorch code keeps
calling ``inferenceModel`` / ``trainingModel``. The frontend reaches the backend only through
ONNX and the public ``popart_backend`` API.

This file only gathers the public names; each lives in the module that owns it (the wrapper
functions in ``executor/executor.py``, the compile hooks in ``executor/compilation.py``,
``isRunningOnIpu`` with the tracing state in ``blocks.py``).
"""

from __future__ import annotations

from . import enums, optim, profiling, testing  # noqa: F401
from .blocks import *  # noqa: F401,F403
from .custom_args import *  # noqa: F401,F403
from .data import *  # noqa: F401,F403
from .enums import *  # noqa: F401,F403
from .errors import *  # noqa: F401,F403
from .executor.compilation import *  # noqa: F401,F403
from .executor.executor import *  # noqa: F401,F403
from .internals import *  # noqa: F401,F403
from .ops import *  # noqa: F401,F403
from .options.enums import *  # noqa: F401,F403
from .options.groups import *  # noqa: F401,F403
from .options.logs import *  # noqa: F401,F403
from .options.options import *  # noqa: F401,F403
from .printing import *  # noqa: F401,F403

__version__ = "0.1.0"


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:  # noqa: N802
    """The simulated machine is always there."""
    return num_ipus >= 1


def ipuHardwareVersion() -> int:  # noqa: N802
    return 2
