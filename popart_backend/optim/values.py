"""The optimizers' shared pieces: the mode enums, ``OptimizerValue`` and
``OptimizerValueMap`` (a hyper-parameter value and its per-weight overrides), gradient clipping
settings, and the argument checks every optimizer uses."""

from __future__ import annotations

import enum

import numpy as np

from ..dtypes import DataType
from ..errors import popart_exception
from ..ir.tensor import Tensor

__all__ = [
    "AdamMode",
    "AdaptiveMode",
    "ClipNormSettings",
    "OptimizerValue",
    "OptimizerValueMap",
    "SGDAccumulatorAndMomentum",
    "WeightDecayMode",
]

LOSS_SCALING_KEY = "lossScaling"
LOSS_SCALING_TENSOR = "lossScaling_FLOAT"


class SGDAccumulatorAndMomentum(enum.Enum):
    """Combined: one velocity tensor (also the gradient accumulator); Separate: two tensors."""

    Combined = 0
    Separate = 1


class AdamMode(enum.Enum):
    Adam = 0
    AdamNoBias = 1
    AdaMax = 2
    Lamb = 3
    LambNoBias = 4


class AdaptiveMode(enum.Enum):
    AdaGrad = 0
    RMSProp = 1
    CenteredRMSProp = 2
    AdaDelta = 3


class WeightDecayMode(enum.Enum):
    """Decay: decoupled, w -= lr·wd·w (AdamW); L2Regularization: g += wd·w."""

    Decay = 0
    L2Regularization = 1


class OptimizerValue:
    """A hyper-parameter value and whether it is fixed at compile time."""

    def __init__(self, val: float = 0.0, isConst: bool = True):  # noqa: N803 - PopART's name
        self._val = float(val)
        self._is_const = bool(isConst)

    def val(self) -> float:
        return self._val

    def isConst(self) -> bool:  # noqa: N802
        return self._is_const

    def validReplacement(self, other: "OptimizerValue", what: str = "value") -> None:  # noqa: N802
        """Raise unless ``other`` may replace this value in a compiled session."""
        if self._is_const != other._is_const:
            raise popart_exception(
                f"Cannot replace {what}: const-ness differs ({self} -> {other}). Whether a value "
                f"is const is fixed when the session is built."
            )
        if self._is_const and self._val != other._val:
            raise popart_exception(
                f"Cannot change a const value: {what} is const {self._val}, the new optimizer has "
                f"{other._val}. Build the session with ({self._val}, False) to change it later."
            )

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, OptimizerValue)
            and self._val == other._val
            and self._is_const == other._is_const
        )

    def __repr__(self) -> str:
        return f"OptimizerValue({self._val}, isConst={self._is_const})"


class OptimizerValueMap:
    """A default OptimizerValue plus per-weight overrides."""

    def __init__(self, default: OptimizerValue):
        self._default = default
        self._specifics: dict[str, OptimizerValue] = {}

    def getDefault(self) -> OptimizerValue:  # noqa: N802
        return self._default

    def get(self, weight_id: str | None) -> OptimizerValue:
        if weight_id is None:
            return self._default
        return self._specifics.get(weight_id, self._default)

    def hasSpecific(self, weight_id: str) -> bool:  # noqa: N802
        return weight_id in self._specifics

    def specifics(self) -> dict[str, OptimizerValue]:
        return dict(self._specifics)


class ClipNormSettings:
    """Scale the listed weights' gradients by min(1, maxNorm/‖g‖) over their global 2-norm."""

    def __init__(self, weightIds: list[str], maxNorm: float):  # noqa: N803
        if not maxNorm > 0:
            raise popart_exception(f"ClipNormSettings: maxNorm must be positive, got {maxNorm}.")
        self.weightIds = list(weightIds)
        self.maxNorm = float(maxNorm)
        self.all_weights = False

    @classmethod
    def clipWeights(cls, weightIds: list[str],  # noqa: N802,N803
                    maxNorm: float) -> "ClipNormSettings":  # noqa: N803
        return cls(weightIds, maxNorm)

    @classmethod
    def clipAllWeights(cls, maxNorm: float) -> "ClipNormSettings":  # noqa: N802,N803
        settings = cls([], maxNorm)
        settings.all_weights = True
        return settings

    def getWeightIds(self) -> list[str]:  # noqa: N802
        return list(self.weightIds)

    def getMaxNorm(self) -> float:  # noqa: N802
        return self.maxNorm

    def _key(self):
        return (tuple(self.weightIds), self.maxNorm, self.all_weights)

    def __eq__(self, other) -> bool:
        return isinstance(other, ClipNormSettings) and self._key() == other._key()

    def __repr__(self) -> str:
        ids = "all weights" if self.all_weights else self.weightIds
        return f"ClipNormSettings({ids}, maxNorm={self.maxNorm})"


def _as_value(value, where: str) -> OptimizerValue:
    if isinstance(value, OptimizerValue):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return OptimizerValue(float(value[0]), bool(value[1]))
    if isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool):
        return OptimizerValue(float(value), True)
    raise popart_exception(
        f"{where}: value {value!r} is not an OptimizerValue, a (value, isConst) tuple or a number."
    )


def _dtype(value, where: str) -> DataType:
    if value is None:
        return DataType.UNDEFINED
    if not isinstance(value, DataType):
        raise popart_exception(f"{where}: expected a popart.DataType, got {value!r}.")
    if value not in (DataType.UNDEFINED, DataType.FLOAT, DataType.FLOAT16):
        raise popart_exception(
            f"{where}: optimizer state must be FLOAT or FLOAT16, got {value.name}.")
    return value


def _enum(value, enum_type, where: str):
    if not isinstance(value, enum_type):
        raise popart_exception(
            f"{where}: expected a popart.{enum_type.__name__} "
            f"({', '.join(m.name for m in enum_type)}), got {value!r}."
        )
    return value


def _resolve(dtype: DataType, weight: Tensor) -> DataType:
    return weight.info.dtype if dtype is DataType.UNDEFINED else dtype
