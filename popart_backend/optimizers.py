"""The user-facing optimizers (spec §4.3, F38, F39): SGD, ConstSGD, Adam, Adaptive.

An optimizer holds hyper-parameter values: a default per key (``defaultLearningRate`` ...),
optional per-weight overrides (``insertSpecific``) and the global ``lossScaling``. Each value is
an ``OptimizerValue(val, isConst)``; in dicts a ``(val, isConst)`` tuple or a plain number
(const). Const values are compiled into the update ops; non-const ones become OPTIMIZER_PARAM
variables the session rewrites at ``updateOptimizerFromHost`` (docs/training.md).

``optimizer.apply(ir, ...)`` adds one in-place update op per weight
(``ops/optimizer_updates.py``, where the formulas are written out) and its state variables.
The maths matches torch.optim (SGD, Adam, AdamW, Adamax, RMSprop, Adagrad, Adadelta), which
the tests check step by step.

Nesterov momentum (SDK 3 added it to PopART's SGD) is the key ``defaultNesterov`` /
``nesterov``: 0 (off, default) or 1 (on, needs momentum > 0 and dampening 0, as in torch).

The shared pieces (mode enums, OptimizerValue, ClipNormSettings, argument checks) live in
optimizer_values.py, the ``Optimizer`` base in optimizer_base.py, and the families in
optimizer_sgd.py, optimizer_adam.py and optimizer_adaptive.py; every name stays importable from
here.
"""

from __future__ import annotations

from .optimizer_adam import Adam
from .optimizer_adaptive import Adaptive
from .optimizer_base import Optimizer, _log  # noqa: F401 - _log re-exported
from .optimizer_sgd import SGD, ConstSGD
from .optimizer_values import (  # noqa: F401 - re-exported: the names of this module
    LOSS_SCALING_KEY,
    LOSS_SCALING_TENSOR,
    AdamMode,
    AdaptiveMode,
    ClipNormSettings,
    OptimizerTensors,
    OptimizerValue,
    OptimizerValueMap,
    SGDAccumulatorAndMomentum,
    WeightDecayMode,
    _as_value,
    _dtype,
    _enum,
    _resolve,
)

__all__ = [
    "AdamMode", "AdaptiveMode", "ClipNormSettings", "Optimizer", "OptimizerTensors",
    "OptimizerValue", "OptimizerValueMap", "SGDAccumulatorAndMomentum", "WeightDecayMode",
    "SGD", "ConstSGD", "Adam", "Adaptive",
]
