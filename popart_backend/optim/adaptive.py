"""``Adaptive``: AdaGrad, RMSProp, centered RMSProp and AdaDelta."""

from __future__ import annotations

from ..dtypes import DataType
from ..errors import popart_exception
from ..ir.tensor import TensorRole
from .base import Optimizer
from .values import AdaptiveMode, OptimizerValueMap, WeightDecayMode, _dtype, _enum, _resolve

__all__ = ["Adaptive"]


class Adaptive(Optimizer):
    """AdaGrad, RMSProp, centered RMSProp, AdaDelta (see ``AdaptiveUpdate`` for the formula).

    ``alpha`` is RMSProp's smoothing constant and AdaDelta's rho.
    """

    KEYS = {
        "learningRate": ("lr", 0.01),
        "weightDecay": ("weight_decay", 0.0),
        "alpha": ("alpha", 0.99),
        "momentum": ("momentum", 0.0),
        "eps": ("eps", 1e-6),
    }
    OP_TYPE = "AdaptiveUpdate"

    def __init__(self, values=None, mode=AdaptiveMode.RMSProp,
                 weight_decay_mode=WeightDecayMode.Decay, accum_type=DataType.UNDEFINED,
                 accl1_type=DataType.FLOAT, accl2_type=DataType.FLOAT,
                 accl3_type=DataType.UNDEFINED, rmsprop_tf_variant=False, clip_norm_settings=()):
        # clip_norm_settings is an extension: PopART 2.3's Adaptive has no clipping argument.
        super().__init__(values, clip_norm_settings)
        self.mode = _enum(mode, AdaptiveMode, "Adaptive mode")
        self.weight_decay_mode = _enum(weight_decay_mode, WeightDecayMode,
                                       "Adaptive weight_decay_mode")
        self._accum_type = _dtype(accum_type, "Adaptive accum_type")
        self._accl1_type = _dtype(accl1_type, "Adaptive accl1_type")
        self._accl2_type = _dtype(accl2_type, "Adaptive accl2_type")
        self._accl3_type = _dtype(accl3_type, "Adaptive accl3_type")
        self.rmsprop_tf_variant = bool(rmsprop_tf_variant)

    def alphas(self) -> OptimizerValueMap:
        return self._maps["alpha"]

    def momentums(self) -> OptimizerValueMap:
        return self._maps["momentum"]

    def epss(self) -> OptimizerValueMap:
        return self._maps["eps"]

    def _validate(self, values, where):
        super()._validate(values, where)
        name = type(self).__name__
        if not 0 <= values["alpha"] <= 1:
            raise popart_exception(
                f"{name} {where}: alpha must be in [0, 1], got {values['alpha']}.")
        for key in ("momentum", "eps"):
            if values[key] < 0:
                raise popart_exception(f"{name} {where}: {key} must be >= 0, got {values[key]}.")

    def _structure(self):
        return {**super()._structure(), "mode": self.mode,
                "weight_decay_mode": self.weight_decay_mode, "accum_type": self._accum_type,
                "accl1_type": self._accl1_type, "accl2_type": self._accl2_type,
                "accl3_type": self._accl3_type, "rmsprop_tf_variant": self.rmsprop_tf_variant}

    def _op_attrs(self):
        return {"mode": self.mode.name, "weight_decay_mode": self.weight_decay_mode.name,
                "tf_variant": self.rmsprop_tf_variant}

    def _state_specs(self, weight, values):
        shape, role = weight.info.shape, TensorRole.OPTIMIZER_STATE
        # TensorFlow's RMSProp starts the mean square at 1.
        rms = self.mode in (AdaptiveMode.RMSProp, AdaptiveMode.CenteredRMSProp)
        init1 = 1.0 if self.rmsprop_tf_variant and rms else 0.0
        needs2 = self.mode in (AdaptiveMode.CenteredRMSProp, AdaptiveMode.AdaDelta)
        return [
            ("Accl1___", _resolve(self._accl1_type, weight), init1, role, shape),
            ("Accl2___", _resolve(self._accl2_type, weight), 0.0, role, shape) if needs2 else None,
            ("Accl3___", _resolve(self._accl3_type, weight), 0.0, role, shape)
            if self._may_be_nonzero(values["momentum"]) else None,
        ]
