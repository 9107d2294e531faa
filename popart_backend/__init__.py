"""PopART's Python API on a simulated IPU: ``import popart_backend as popart``.

Each module owns a part of the public surface and lists it in its ``__all__``; this file only
gathers them.
"""

from . import ops  # noqa: F401  (registers every op)
from .errors import *  # noqa: F401,F403
from .errors import make_throw_hooks as _make_throw_hooks
from .dtypes import DataType  # noqa: F401
from .logging import *  # noqa: F401,F403
from .options.enums import *  # noqa: F401,F403
from .options.structs import *  # noqa: F401,F403
from .options.patterns import *  # noqa: F401,F403
from .options.session_options import *  # noqa: F401,F403
from .device.spec import *  # noqa: F401,F403
from .device.manager import *  # noqa: F401,F403
from .tensorinfo import *  # noqa: F401,F403
from .dataflow import *  # noqa: F401,F403
from .builder.builder import *  # noqa: F401,F403
from .builder.public_types import *  # noqa: F401,F403
from .builder.variable_settings import *  # noqa: F401,F403
from .builder.debug_context import *  # noqa: F401,F403
from .builder.graph_transformer import *  # noqa: F401,F403
from .builder.numerics_report import *  # noqa: F401,F403
from .ir.tensor_names import *  # noqa: F401,F403
from .session import *  # noqa: F401,F403
from .executable import *  # noqa: F401,F403  (executable files, for poptorch_lite)
from .optim.values import *  # noqa: F401,F403
from .optim.base import *  # noqa: F401,F403
from .optim.sgd import *  # noqa: F401,F403
from .optim.adam import *  # noqa: F401,F403
from .optim.adaptive import *  # noqa: F401,F403
from .supported_ops import *  # noqa: F401,F403
from . import custom  # noqa: F401  (popart.custom: custom ops in Python)
from .custom.registration import loadCustomOpModule  # noqa: F401

globals().update(_make_throw_hooks())

__version__ = "0.1.0"
defaultAiOnnxOpset = 10
defaultAiGraphcoreOpset = 1
defaultAiOnnxMlOpset = 1


def versionString() -> str:  # noqa: N802 - PopART's name
    return __version__


def versionNumber() -> tuple[int, int, int]:  # noqa: N802
    major, minor, point = (int(p) for p in __version__.split("."))
    return major, minor, point


def packageHash() -> str:  # noqa: N802
    return "popart_backend-" + __version__


def reservedGradientPrefix() -> str:  # noqa: N802
    return "Gradient___"


def reservedUpdatedVarPrefix() -> str:  # noqa: N802
    return "UpdatedVar___"


def reservedAccumPrefix() -> str:  # noqa: N802
    return "Accum___"


def reservedAcclPrefix() -> str:  # noqa: N802
    return "Accl___"


def reservedStashedPrefix() -> str:  # noqa: N802
    return "Stashed___"


def reservedRestoredPrefix() -> str:  # noqa: N802
    return "Restored___"


def reservedStepPrefix() -> str:  # noqa: N802
    return "Step___"


def reservedRandomSeedPrefix() -> str:  # noqa: N802
    return "randomSeed___"


def reservedLossScalingPrefix() -> str:  # noqa: N802
    return "lossScaling_"
