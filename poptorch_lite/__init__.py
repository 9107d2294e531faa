"""PopTorch's API over popart_backend: ``import poptorch_lite as poptorch`` (spec P1-P77).

New code wraps a module with ``ipu_model(model, options, optimizer)``; PopTorch code keeps
calling ``inferenceModel`` / ``trainingModel``. The frontend reaches the backend only through
ONNX and the public ``popart_backend`` API.
"""

from __future__ import annotations

import warnings

import torch

from . import optim, testing  # noqa: F401
from .blocks import *  # noqa: F401,F403
from .data import *  # noqa: F401,F403
from .errors import *  # noqa: F401,F403
from .executor.executor import PoplarExecutor
from .executor.compilation import _post_compile_hooks, _pre_compile_hooks
from .ops import *  # noqa: F401,F403
from .options.enums import *  # noqa: F401,F403
from .options.groups import *  # noqa: F401,F403
from .options.options import Options

__version__ = "0.1.0"


def inferenceModel(model: torch.nn.Module, options: Options | None = None) -> PoplarExecutor:  # noqa: N802
    """Wrap ``model`` for inference on the simulated IPU (P2); compiled on the first call."""
    return PoplarExecutor(model, options, training=False)


def trainingModel(model: torch.nn.Module, options: Options | None = None,  # noqa: N802
                  optimizer=None) -> PoplarExecutor:
    """Wrap ``model`` for training (P3); no optimizer means ``optim.SGD(lr=0.01)``."""
    if optimizer is None:
        optimizer = optim.SGD(model.parameters(), lr=0.01)
    return PoplarExecutor(model, options, training=True, optimizer=optimizer)


def ipu_model(model: torch.nn.Module, options: Options | None = None,
              optimizer=None) -> PoplarExecutor:
    """Training wrapper iff ``optimizer`` is given, else inference wrapper (P1)."""
    if optimizer is not None:
        return trainingModel(model, options, optimizer)
    if model.training:
        warnings.warn("ipu_model(): no optimizer given, so an inference wrapper was built for a "
                      "model in training mode; pass an optimizer (or use trainingModel(), which "
                      "defaults to SGD) to train.", UserWarning, stacklevel=2)
    return inferenceModel(model, options)


def registerPreCompileHook(hook) -> None:  # noqa: N802
    _pre_compile_hooks.append(hook)


def registerPostCompileHook(hook) -> None:  # noqa: N802
    _post_compile_hooks.append(hook)


def isRunningOnIpu() -> bool:  # noqa: N802
    """True while the frontend traces ``forward`` for the IPU, False when it runs on CPU."""
    from .blocks import _state

    return bool(_state["tracing"])


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:  # noqa: N802
    """The simulated machine is always there (spec §2.5)."""
    return num_ipus >= 1


def ipuHardwareVersion() -> int:  # noqa: N802
    return 2
