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
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

import numpy as np

from .dtypes import DataType
from .errors import popart_exception
from .ir.ir import Ir
from .ir.op import ExecutionContext, OpSettings
from .ir.tensor import Tensor, TensorInfo, TensorKind, TensorRole
from .ops.registry import AI_GRAPHCORE, create_op

__all__ = [
    "AdamMode", "AdaptiveMode", "ClipNormSettings", "Optimizer", "OptimizerTensors",
    "OptimizerValue", "OptimizerValueMap", "SGDAccumulatorAndMomentum", "WeightDecayMode",
    "SGD", "ConstSGD", "Adam", "Adaptive",
]

_log = logging.getLogger("popart:optimizer")

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


@dataclass
class OptimizerTensors:
    """What ``apply()`` added: tensors the session writes, reads or resets."""

    # tensor id -> (key without "default", e.g. "learningRate" or "lossScaling"; weight id, or
    # None for the value shared by every weight without a specific one)
    hyper_params: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    # weight id -> its state variables (moments, velocity, step counter)
    state: dict[str, list[str]] = field(default_factory=dict)
    # weight id -> the update op's output (aliases the weight)
    updated: dict[str, str] = field(default_factory=dict)


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


class Optimizer:
    """Base of the optimizers: value bookkeeping, validation and the IR update."""

    # key (no "default" prefix) -> (update-op attribute, default value); set by subclasses
    KEYS: dict[str, tuple[str, float]] = {}
    OP_TYPE = ""

    def __init__(self, values, clip_norm_settings):
        name = type(self).__name__
        self._maps = {
            k: OptimizerValueMap(OptimizerValue(d, True)) for k, (_, d) in self.KEYS.items()
        }
        self._loss_scaling = OptimizerValue(1.0, True)
        for key, raw in dict(values or {}).items():
            value = _as_value(raw, f"{name} key '{key}'")
            if key == LOSS_SCALING_KEY:
                self._loss_scaling = value
                continue
            short = key[len("default"):] if key.startswith("default") else ""
            short = short[:1].lower() + short[1:]
            if short not in self.KEYS:
                raise popart_exception(
                    f"{name}: unknown key '{key}'. Valid keys: {', '.join(self.valid_keys())}."
                )
            self._maps[short] = OptimizerValueMap(value)
        if not self._loss_scaling.val() > 0:
            raise popart_exception(
                f"{name}: lossScaling must be positive, got {self._loss_scaling.val()}."
            )
        self._validate({k: m.getDefault().val() for k, m in self._maps.items()}, "defaults")
        self.clip_norm_settings = list(clip_norm_settings or [])
        for setting in self.clip_norm_settings:
            if not isinstance(setting, ClipNormSettings):
                raise popart_exception(
                    f"{name}: clip_norm_settings must be ClipNormSettings, got {setting!r}."
                )

    # --- values -----------------------------------------------------------------------------

    @classmethod
    def valid_keys(cls) -> list[str]:
        return ["default" + k[:1].upper() + k[1:] for k in cls.KEYS] + [LOSS_SCALING_KEY]

    def insertSpecific(self, weightId: str, values: dict) -> None:  # noqa: N802,N803
        """Override values for one weight; keys without the "default" prefix. Keys not given
        take the current default."""
        name = type(self).__name__
        given = {}
        for key, raw in dict(values).items():
            if key not in self.KEYS:
                raise popart_exception(
                    f"{name}.insertSpecific('{weightId}'): unknown key '{key}'. Valid keys: "
                    f"{', '.join(self.KEYS)} (lossScaling is global)."
                )
            given[key] = _as_value(raw, f"{name}.insertSpecific('{weightId}') key '{key}'")
        complete = {k: given.get(k, m.getDefault()) for k, m in self._maps.items()}
        self._validate({k: v.val() for k, v in complete.items()}, f"weight '{weightId}'")
        for key, value in complete.items():
            self._maps[key]._specifics[weightId] = value

    def hasSpecific(self, weightId: str) -> bool:  # noqa: N802,N803
        return any(m.hasSpecific(weightId) for m in self._maps.values())

    def valueMap(self, key: str) -> OptimizerValueMap:  # noqa: N802
        if key not in self._maps:
            raise popart_exception(
                f"{type(self).__name__}: unknown key '{key}'; keys are {list(self.KEYS)}."
            )
        return self._maps[key]

    def learningRates(self) -> OptimizerValueMap:  # noqa: N802
        return self._maps["learningRate"]

    def weightDecays(self) -> OptimizerValueMap:  # noqa: N802
        return self._maps["weightDecay"]

    def lossScaling(self) -> OptimizerValue:  # noqa: N802
        return self._loss_scaling

    def getLossScalingVal(self) -> float:  # noqa: N802
        return self._loss_scaling.val()

    def loss_scaling_is_const(self) -> bool:
        return self._loss_scaling.isConst()

    def values_for(self, weight_id: str | None) -> dict[str, OptimizerValue]:
        return {k: m.get(weight_id) for k, m in self._maps.items()}

    def hyper_parameter_values(self, weight_id: str | None) -> dict[str, float]:
        """Current values for ``weight_id`` (None: the defaults), plus ``lossScaling``."""
        values = {k: v.val() for k, v in self.values_for(weight_id).items()}
        values[LOSS_SCALING_KEY] = self._loss_scaling.val()
        return values

    def accumulator_dtype(self, weight_dtype: DataType) -> DataType:
        """Element type of a gradient accumulator (``Accum___<w>``) for a weight of this type."""
        return weight_dtype if self._accum_type is DataType.UNDEFINED else self._accum_type

    # --- updateOptimizerFromHost ------------------------------------------------------------

    def check_update(self, new: "Optimizer") -> None:
        """Raise popart_exception unless ``new`` may replace this optimizer in a built session:
        the same class and structure, and only non-const values changed (spec §4.3)."""
        name = type(self).__name__
        # ConstSGD is an SGD whose values are const, as in PopART: they may replace each other.
        if not isinstance(new, Optimizer) or new.OP_TYPE != self.OP_TYPE:
            raise popart_exception(
                f"updateOptimizerFromHost: the session was built with {name}, got "
                f"{type(new).__name__}. The optimizer class cannot change; build a new session."
            )
        mine, theirs = self._structure(), new._structure()
        for what in mine:
            if mine[what] != theirs[what]:
                raise popart_exception(
                    f"updateOptimizerFromHost: {name} {what} changed from {mine[what]} to "
                    f"{theirs[what]}; it is fixed when the session is built."
                )
        self._loss_scaling.validReplacement(new._loss_scaling, f"{name} lossScaling")
        for key, old_map in self._maps.items():
            new_map = new._maps[key]
            old_map.getDefault().validReplacement(new_map.getDefault(), f"{name} default {key}")
            if set(old_map._specifics) != set(new_map._specifics):
                raise popart_exception(
                    f"updateOptimizerFromHost: {name} has specific values for weights "
                    f"{sorted(old_map._specifics)} but the new optimizer for "
                    f"{sorted(new_map._specifics)}; insertSpecific the same weights."
                )
            for weight_id, value in old_map._specifics.items():
                value.validReplacement(new_map._specifics[weight_id],
                                       f"{name} {key} of weight '{weight_id}'")

    def _structure(self) -> dict:
        return {"clip_norm_settings": self.clip_norm_settings}

    # --- the IR update ----------------------------------------------------------------------

    def apply(self, ir: Ir, weight_grads: dict[str, str],
              context: ExecutionContext = ExecutionContext.Normal,
              grad_scale: float = 1.0) -> OptimizerTensors:
        """Add an update op per weight (reading its gradient) and the variables it needs.

        ``grad_scale`` multiplies every gradient first; it includes 1/lossScaling only when
        lossScaling is const (otherwise the ops divide by the ``lossScaling_FLOAT`` tensor).
        """
        graph = ir.main
        out = OptimizerTensors()
        for weight_id, grad_id in weight_grads.items():
            tensor = graph.tensor(weight_id)
            if tensor.kind is not TensorKind.VARIABLE:
                raise popart_exception(
                    f"{type(self).__name__}: '{weight_id}' is {tensor.kind.value}, not a variable; "
                    f"only variables can be trained."
                )
            graph.tensor(grad_id)
        for weight_id in sorted({w for m in self._maps.values() for w in m._specifics}):
            if weight_id not in weight_grads:
                _log.warning(
                    "%s: insertSpecific values for '%s', which is not a trained weight (trained: "
                    "%s); they are not used.", type(self).__name__, weight_id, sorted(weight_grads)
                )
        loss_scaling_id = None
        if not self._loss_scaling.isConst():
            loss_scaling_id = self._param_tensor(graph, LOSS_SCALING_TENSOR, LOSS_SCALING_KEY,
                                                 None, self._loss_scaling.val(), out)
        clip = self._add_clip_ops(graph, weight_grads, context, grad_scale, loss_scaling_id)
        for weight_id, grad_id in weight_grads.items():
            weight = graph.tensor(weight_id)
            values = self.values_for(weight_id)
            specific = self.hasSpecific(weight_id)
            attrs = {self.KEYS[k][0]: v.val() for k, v in values.items()}
            dynamic, dynamic_ids = [], []
            for key, value in values.items():
                if not value.isConst():
                    tid = f"{key}___specific___{weight_id}" if specific else f"{key}___default"
                    dynamic.append(self.KEYS[key][0])
                    dynamic_ids.append(self._param_tensor(
                        graph, tid, key, weight_id if specific else None, value.val(), out))
            if loss_scaling_id is not None:
                dynamic.append("loss_scaling")
                dynamic_ids.append(loss_scaling_id)
            attrs.update(self._op_attrs(), loss_scaling=self._loss_scaling.val(),
                         grad_scale=float(grad_scale), dynamic=tuple(dynamic))
            state_ids = []
            for spec in self._state_specs(weight, values):
                if spec is None:
                    state_ids.append("")
                    continue
                prefix, dtype, init, role, shape = spec
                tid = graph.unique_id(prefix + weight_id)
                data = np.full(shape, init, dtype.numpy)
                state = graph.add_tensor(tid, TensorInfo(dtype, shape), TensorKind.VARIABLE, data)
                state.role = role
                state_ids.append(tid)
            out.state[weight_id] = [t for t in state_ids if t]
            name = f"{self.OP_TYPE}___{weight_id}"
            op = create_op(self.OP_TYPE, attrs, domain=AI_GRAPHCORE, where=name,
                           settings=OpSettings(name=name, execution_context=context))
            updated = graph.unique_id("UpdatedVar___" + weight_id)
            graph.add_op(op, [weight_id, grad_id, *state_ids, clip.get(weight_id, ""),
                              *dynamic_ids], [updated])
            out.updated[weight_id] = updated
        return out

    def _param_tensor(self, graph, tid: str, key: str, weight_id: str | None, value: float,
                      out: OptimizerTensors) -> str:
        if tid not in graph.tensors:
            tensor = graph.add_tensor(tid, TensorInfo(DataType.FLOAT, ()), TensorKind.VARIABLE,
                                      np.array(value, np.float32))
            tensor.role = TensorRole.OPTIMIZER_PARAM
        out.hyper_params[tid] = (key, weight_id)
        return tid

    def _add_clip_ops(self, graph, weight_grads, context, grad_scale, loss_scaling_id) -> dict:
        """One GlobalNormClipFactor op per ClipNormSettings; weight id -> factor tensor id."""
        factor_of: dict[str, str] = {}
        for index, setting in enumerate(self.clip_norm_settings):
            weights = list(weight_grads) if setting.all_weights else setting.weightIds
            unknown = [w for w in weights if w not in weight_grads]
            if unknown:
                raise popart_exception(
                    f"{type(self).__name__}: {setting} names {unknown}, which are not trained "
                    f"weights (trained: {sorted(weight_grads)})."
                )
            twice = [w for w in weights if w in factor_of]
            if twice:
                raise popart_exception(
                    f"{type(self).__name__}: weights {twice} are in more than one ClipNormSettings."
                )
            name = f"GlobalNormClipFactor___{index}"
            op = create_op("GlobalNormClipFactor",
                           {"max_norm": setting.maxNorm, "grad_scale": float(grad_scale),
                            "divide_loss_scaling": loss_scaling_id is not None},
                           domain=AI_GRAPHCORE, where=name,
                           settings=OpSettings(name=name, execution_context=context))
            factor_id = graph.unique_id(f"clipFactor___{index}")
            inputs = [weight_grads[w] for w in weights]
            if loss_scaling_id is not None:
                inputs.append(loss_scaling_id)
            graph.add_op(op, inputs, [factor_id])
            for w in weights:
                factor_of[w] = factor_id
        return factor_of

    # --- per class ----------------------------------------------------------------------------

    def _validate(self, values: dict[str, float], where: str) -> None:
        name = type(self).__name__
        for key in ("learningRate", "weightDecay"):
            if values[key] < 0:
                raise popart_exception(f"{name} {where}: {key} must be >= 0, got {values[key]}.")

    def _op_attrs(self) -> dict:
        return {}

    def _state_specs(self, weight: Tensor, values: dict[str, OptimizerValue]) -> list:
        """Per state input of the update op: None or (prefix, dtype, initial value, role, shape)."""
        raise NotImplementedError

    @staticmethod
    def _may_be_nonzero(value: OptimizerValue) -> bool:
        return not value.isConst() or value.val() != 0.0

    def __repr__(self) -> str:
        defaults = {k: m.getDefault() for k, m in self._maps.items()}
        return f"{type(self).__name__}({defaults}, lossScaling={self._loss_scaling})"


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
        if values["nesterov"] not in (0.0, 1.0):
            raise popart_exception(
                f"{name} {where}: nesterov must be 0 (off) or 1 (on), got {values['nesterov']}.")
        if values["nesterov"] and (values["momentum"] <= 0 or values["dampening"] != 0):
            raise popart_exception(
                f"{name} {where}: Nesterov momentum needs momentum > 0 and dampening 0, got "
                f"momentum {values['momentum']}, dampening {values['dampening']}.")

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


def _resolve(dtype: DataType, weight: Tensor) -> DataType:
    return weight.info.dtype if dtype is DataType.UNDEFINED else dtype
