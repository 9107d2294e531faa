"""The SGD family: ``SGD`` with momentum, dampening, velocity scaling and
Nesterov, and ``ConstSGD``, whose values are all compiled in."""

from __future__ import annotations

from ..dtypes import DataType
from ..errors import popart_exception
from ..ir.tensor import TensorRole
from .base import Optimizer
from .values import OptimizerValueMap, SGDAccumulatorAndMomentum, _dtype, _enum

__all__ = ["SGD", "ConstSGD"]


class SGD(Optimizer):
    """Stochastic gradient descent with momentum (see ``SGDUpdate`` for the formula).

    ``SGD(0.01)`` is shorthand for ``SGD({"defaultLearningRate": (0.01, True)})``.
    ``Separate`` keeps the gradient accumulator and the velocity in two tensors (types
    ``accumType`` and ``accl1Type``); ``Combined`` uses one (type ``accumType``). Both give the
    same trajectory.
    """

    KEYS = {
        "learningRate": ("lr", 0.1),
        "weightDecay": ("weight_decay", 0.0),
        "momentum": ("momentum", 0.0),
        "dampening": ("dampening", 0.0),
        "velocityScaling": ("velocity_scaling", 1.0),
        "nesterov": ("nesterov", 0.0),
    }
    PLAIN_KEYS = ("nesterov",)
    OP_TYPE = "SGDUpdate"

    def __init__(self, params=None, clip_norm_settings=(),
                 accumulatorAndMomentum=SGDAccumulatorAndMomentum.Combined,  # noqa: N803
                 accumType=DataType.UNDEFINED, accl1Type=DataType.UNDEFINED):  # noqa: N803
        if isinstance(params, (int, float)) and not isinstance(params, bool):
            params = {"defaultLearningRate": (float(params), True)}
        super().__init__(params, clip_norm_settings)
        self.accumulatorAndMomentum = _enum(accumulatorAndMomentum, SGDAccumulatorAndMomentum,
                                            "SGD accumulatorAndMomentum")
        self._accum_type = _dtype(accumType, "SGD accumType")
        self._accl1_type = _dtype(accl1Type, "SGD accl1Type")

    def momentums(self) -> OptimizerValueMap:
        return self._maps["momentum"]

    def dampenings(self) -> OptimizerValueMap:
        return self._maps["dampening"]

    def velocityScalings(self) -> OptimizerValueMap:  # noqa: N802
        return self._maps["velocityScaling"]

    def nesterov(self) -> OptimizerValueMap:
        return self._maps["nesterov"]

    def _validate(self, values, where):
        super()._validate(values, where)
        name = type(self).__name__
        if values["momentum"] < 0:
            raise popart_exception(
                f"{name} {where}: momentum must be >= 0, got {values['momentum']}.")
        if not 0 <= values["dampening"] <= 1:
            raise popart_exception(
                f"{name} {where}: dampening must be in [0, 1], got {values['dampening']}.")
        if not values["velocityScaling"] > 0:
            raise popart_exception(
                f"{name} {where}: velocityScaling must be > 0, got {values['velocityScaling']}.")
        # PopART keeps nesterov as a number: any non-zero value switches it on. With momentum 0
        # there is no velocity, and Nesterov's step g + momentum * v is the plain step.
        if values["nesterov"] and values["momentum"] > 0 and values["dampening"] != 0:
            raise popart_exception(
                f"{name} {where}: Nesterov momentum needs dampening 0, got dampening "
                f"{values['dampening']} (momentum {values['momentum']}).")

    def _structure(self):
        return {**super()._structure(), "accumulatorAndMomentum": self.accumulatorAndMomentum,
                "accumType": self._accum_type, "accl1Type": self._accl1_type}

    def _state_specs(self, weight, values):
        if not self._may_be_nonzero(values["momentum"]):
            return [None, None]
        combined = self.accumulatorAndMomentum is SGDAccumulatorAndMomentum.Combined
        chosen = self._accum_type if combined else self._accl1_type
        dtype = weight.info.dtype if chosen is DataType.UNDEFINED else chosen
        velocity = ("Accl___", dtype, 0.0, TensorRole.OPTIMIZER_STATE, weight.info.shape)
        # The counter makes the first momentum step undampened, as torch does.
        step = (("Step___", DataType.FLOAT, 0.0, TensorRole.STEP, ())
                if self._may_be_nonzero(values["dampening"]) else None)
        return [velocity, step]


class ConstSGD(SGD):
    """SGD whose values are all const (no momentum)."""

    def __init__(self, learning_rate: float, weight_decay: float = 0.0, loss_scaling: float = 1.0,
                 clip_norm_settings=()):
        super().__init__(
            {
                "defaultLearningRate": (learning_rate, True),
                "defaultWeightDecay": (weight_decay, True),
                "lossScaling": (loss_scaling, True),
            },
            clip_norm_settings,
        )
