"""``Optimizer``, the base of the user-facing optimizers: value bookkeeping,
validation, and ``apply()``, which adds the update ops and their state variables to the IR."""

from __future__ import annotations

import logging
import math

import numpy as np

from ..dtypes import DataType
from ..errors import popart_exception
from ..ir.ir import Ir, OptimizerTensors
from ..ir.op import ExecutionContext, OpSettings
from ..ir.tensor import Tensor, TensorInfo, TensorKind, TensorRole
from ..ops.registry import AI_GRAPHCORE, create_op
from .values import (
    LOSS_SCALING_KEY,
    LOSS_SCALING_TENSOR,
    ClipNormSettings,
    OptimizerValue,
    OptimizerValueMap,
    _as_value,
)

__all__ = ["Optimizer"]

_log = logging.getLogger("popart:optimizer")

# Keys whose +inf means "no limit" (LAMB's maxWeightNorm: no clipping of the weight norm).
_MAY_BE_INFINITE = frozenset({"maxWeightNorm"})


class Optimizer:
    """Base of the optimizers: value bookkeeping, validation and the IR update."""

    # key (no "default" prefix) -> (update-op attribute, default value); set by subclasses
    KEYS: dict[str, tuple[str, float]] = {}
    # Constructor keys PopART spells without the "default" prefix (SGD "nesterov", Adam
    # "maxWeightNorm"); each sets the default of the KEYS entry of the same name.
    PLAIN_KEYS: tuple[str, ...] = ()
    OP_TYPE = ""

    def __init__(self, values, clip_norm_settings):
        name = type(self).__name__
        self._maps = {
            k: OptimizerValueMap(OptimizerValue(d, True)) for k, (_, d) in self.KEYS.items()
        }
        self._loss_scaling = OptimizerValue(1.0, True)
        if values is not None and not isinstance(values, dict):
            raise popart_exception(
                f"{name}: the values must be a dict {{key: (value, isConst)}}, e.g. "
                f"{{'defaultLearningRate': (0.1, False)}}; got {type(values).__name__} "
                f"{values!r}."
            )
        for key, raw in dict(values or {}).items():
            value = _as_value(raw, f"{name} key '{key}'")
            if key == LOSS_SCALING_KEY:
                self._loss_scaling = value
                continue
            short = key[len("default"):] if key.startswith("default") else ""
            short = short[:1].lower() + short[1:]
            if key in self.PLAIN_KEYS:
                # PopART spells these constructor keys without the "default" prefix.
                short = key
            if short not in self.KEYS:
                raise popart_exception(
                    f"{name}: unknown key '{key}'. Valid keys: {', '.join(self.valid_keys())}."
                )
            self._maps[short] = OptimizerValueMap(value)
        if not 0 < self._loss_scaling.val() < math.inf:
            raise popart_exception(
                f"{name}: lossScaling must be positive and finite, got "
                f"{self._loss_scaling.val()}."
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
        return (["default" + k[:1].upper() + k[1:] for k in cls.KEYS] + list(cls.PLAIN_KEYS)
                + [LOSS_SCALING_KEY])

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
        the same class and structure, and only non-const values changed."""
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
                # Zeros from np.zeros take no host memory until written (a big model's
                # optimizer state is planned, never held, on an offline device).
                data = ir.initial_state(tid, np.zeros(shape, dtype.numpy) if init == 0
                                        else np.full(shape, init, dtype.numpy))
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
        for key, value in values.items():
            # A NaN or infinite value turns every weight NaN at the first update, silently.
            if math.isnan(value) or (math.isinf(value) and key not in _MAY_BE_INFINITE):
                raise popart_exception(
                    f"{name} {where}: {key} must be a finite number, got {value}. "
                    f"Give a finite value (a NaN or infinite one makes every weight NaN)."
                )
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
