"""``Adam`` and its modes: Adam, AdamW, AdamNoBias, AdaMax, Lamb, LambNoBias."""

from __future__ import annotations

from ..dtypes import DataType
from ..errors import popart_exception
from ..ir.tensor import TensorRole
from .base import Optimizer
from .values import AdamMode, OptimizerValueMap, WeightDecayMode, _dtype, _enum, _resolve

__all__ = ["Adam"]


class Adam(Optimizer):
    """Adam, AdamW, AdamNoBias, AdaMax, Lamb, LambNoBias (see ``AdamUpdate`` for the formula)."""

    KEYS = {
        "learningRate": ("lr", 0.1),
        "weightDecay": ("weight_decay", 0.0),
        "beta1": ("beta1", 0.9),
        "beta2": ("beta2", 0.999),
        "eps": ("eps", 1e-6),
        "maxWeightNorm": ("max_weight_norm", 10.0),
    }
    PLAIN_KEYS = ("maxWeightNorm",)
    OP_TYPE = "AdamUpdate"

    def __init__(self, values=None, mode=AdamMode.Adam, weight_decay_mode=WeightDecayMode.Decay,
                 accum_type=DataType.UNDEFINED, accl1_type=DataType.FLOAT,
                 accl2_type=DataType.FLOAT, clip_norm_settings=(), scaled_optimizer_state=False):
        super().__init__(values, clip_norm_settings)
        self.mode = _enum(mode, AdamMode, "Adam mode")
        self.weight_decay_mode = _enum(weight_decay_mode, WeightDecayMode, "Adam weight_decay_mode")
        self._accum_type = _dtype(accum_type, "Adam accum_type")
        self._accl1_type = _dtype(accl1_type, "Adam accl1_type")
        self._accl2_type = _dtype(accl2_type, "Adam accl2_type")
        self.scaled_optimizer_state = bool(scaled_optimizer_state)

    def beta1s(self) -> OptimizerValueMap:
        return self._maps["beta1"]

    def beta2s(self) -> OptimizerValueMap:
        return self._maps["beta2"]

    def epss(self) -> OptimizerValueMap:
        return self._maps["eps"]

    def maxWeightNorms(self) -> OptimizerValueMap:  # noqa: N802
        return self._maps["maxWeightNorm"]

    def _validate(self, values, where):
        super()._validate(values, where)
        name = type(self).__name__
        for key in ("beta1", "beta2"):
            if not 0 <= values[key] < 1:
                raise popart_exception(
                    f"{name} {where}: {key} must be in [0, 1), got {values[key]}.")
        for key in ("eps", "maxWeightNorm"):
            if values[key] < 0:
                raise popart_exception(f"{name} {where}: {key} must be >= 0, got {values[key]}.")

    def _structure(self):
        return {**super()._structure(), "mode": self.mode,
                "weight_decay_mode": self.weight_decay_mode, "accum_type": self._accum_type,
                "accl1_type": self._accl1_type, "accl2_type": self._accl2_type,
                "scaled_optimizer_state": self.scaled_optimizer_state}

    def _op_attrs(self):
        return {"mode": self.mode.name, "weight_decay_mode": self.weight_decay_mode.name,
                "scaled_state": self.scaled_optimizer_state}

    def _state_specs(self, weight, values):
        shape, role = weight.info.shape, TensorRole.OPTIMIZER_STATE
        return [
            ("Accl1___", _resolve(self._accl1_type, weight), 0.0, role, shape),
            ("Accl2___", _resolve(self._accl2_type, weight), 0.0, role, shape),
            ("Step___", DataType.FLOAT, 0.0, TensorRole.STEP, ()),
        ]
