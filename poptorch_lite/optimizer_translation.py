"""torch / lite optimizers as ``popart_backend`` optimizers.

``translate(optimizer, model, weights)`` reads the optimizer's param groups and builds the
backend optimizer for the weights of one compiled model: param group 0 gives the defaults,
every weight of another group gets weight-specific values (``insertSpecific``). The table
below is the whole mapping:

| torch class                     | backend                                              |
|---------------------------------|------------------------------------------------------|
| SGD (+ lite SGD)                | SGD, Separate (Combined with ``use_combined_accum``) |
| Adam                            | Adam, mode Adam, L2 weight decay                     |
| AdamW (+ lite AdamW)            | Adam, mode Adam/AdamNoBias, decoupled weight decay   |
| lite LAMB                       | Adam, mode Lamb/LambNoBias, decoupled weight decay   |
| RMSprop (+ lite RMSprop)        | Adaptive, RMSProp / CenteredRMSProp, L2 weight decay |
| Adagrad                         | Adaptive, AdaGrad, L2 weight decay                   |

Constness: ``lr`` is always variable; a lite optimizer's ``variable_attrs`` decide the rest; a
torch optimizer's attribute is variable when some group's value differs from torch's default.
Variable values become backend OPTIMIZER_PARAM tensors, so ``setOptimizer`` changes them with
``updateOptimizerFromHost`` (no recompile); changing a constant is an ``Error``.

Weights that must not change (parameters with ``requires_grad=False``, float buffers that are
not BatchNorm running statistics nor updated in place by ``forward``) are frozen, as in eager
torch: ``mark_frozen`` writes them into the model as ``__frozen_variable:<id>`` metadata, and
the backend grows no gradient, update, optimizer state, accumulator or all-reduce for them.
They stay device weights: ``copyWeightsToDevice`` / ``load_state_dict`` still write them.
Unfreezing one (``requires_grad=True``) after compiling needs a new wrapper (``setOptimizer``
refuses the changed set of trained parameters).

Optimizer state moves between the device tensors (``Accl___<w>``, ``Accl1___<w>``, ...,
``Step___<w>``, named as docs/training.md fixes) and torch's per-parameter state
(``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``, ``square_avg``, ``sum``, ``step`` ...), so a
torch optimizer's ``state_dict()`` after device training resumes identically on CPU.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import warnings

import popart_backend as popart
import torch

from . import optim as lite
from .errors import Error

__all__ = ["Translation", "translate", "check_replacement", "mark_frozen", "StateSlot"]

_SGD_KEYS = {"lr": "learningRate", "momentum": "momentum", "dampening": "dampening",
             "weight_decay": "weightDecay", "nesterov": "nesterov",
             "velocity_scaling": "velocityScaling"}
_ADAM_KEYS = {"lr": "learningRate", "weight_decay": "weightDecay", "betas": ("beta1", "beta2"),
              "eps": "eps", "max_weight_norm": "maxWeightNorm"}
_ADAPTIVE_KEYS = {"lr": "learningRate", "weight_decay": "weightDecay", "alpha": "alpha",
                  "momentum": "momentum", "eps": "eps"}
_DTYPES = {torch.float32: popart.DataType.FLOAT, torch.float16: popart.DataType.FLOAT16}
# Param-group keys read besides the hyper-parameters of the tables above: checked or read by
# _check_supported / _kind / _build, per torch class (LR schedulers add "initial_lr").
_GROUP_KEYS = {"SGD": set(), "Adam": {"amsgrad", "decoupled_weight_decay"},
               "AdamW": {"amsgrad", "decoupled_weight_decay"}, "LAMB": set(),
               "RMSprop": {"centered"}, "Adagrad": {"lr_decay", "initial_accumulator_value"}}
_COMMON_KEYS = {"params", "maximize", "initial_lr"}
# How torch's own step() runs: the device runs its update, so these change nothing there.
_IMPLEMENTATION_KEYS = ("foreach", "fused", "differentiable", "capturable")
_log = logging.getLogger("poptorch_lite")
_LOGGED: set[str] = set()
_TORCH_CLASSES = (torch.optim.SGD, torch.optim.AdamW, torch.optim.Adam, torch.optim.RMSprop,
                  torch.optim.Adagrad)
_LITE_CLASSES = (lite.SGD, lite.Adam, lite.AdamW, lite.RMSprop, lite.LAMB)
# The backend's model metadata key of a variable that is not trained (its importer reads it).
_FROZEN_KEY_PREFIX = "__frozen_variable:"


@dataclasses.dataclass(frozen=True)
class StateSlot:
    """One torch state entry of a weight and where the device keeps it.

    ``backend_id`` None: not a device tensor (torch's ``step`` of RMSprop/Adagrad, counted by
    the wrapper). Device value = torch value × ``scale``.
    """

    torch_key: str
    backend_id: str | None
    scale: float = 1.0


@dataclasses.dataclass
class Translation:
    """A torch/lite optimizer as a backend optimizer for one compiled model."""

    backend: popart.Optimizer
    family: str  # "SGD", "Adam" or "Adaptive"
    kind: str  # the torch class name it came from
    values: dict[tuple[int, str], tuple[float, bool]]  # (group, torch attr) -> (value, const)
    weights: dict[str, torch.Tensor]  # trained backend weight id -> parameter
    state: dict[str, list[StateSlot]]  # backend weight id -> its state slots
    internal_state: dict[str, list[str]]  # backend weight id -> device-only counters
    frozen: list[str] = dataclasses.field(default_factory=list)  # untrained float weight ids

    def describe(self, group: int, attr: str) -> str:
        return f"param_groups[{group}]['{attr}']"


def translate(optimizer, model: torch.nn.Module, weights: dict[str, str],
              running_stats: set[str], compiled: Translation | None = None,
              variable_loss_scaling: bool = False) -> Translation:
    """The backend optimizer for ``optimizer`` over the compiled weights.

    ``weights``: backend weight id -> FQN for every device weight (parameters and buffers);
    ``running_stats``: FQNs the backend updates itself (BatchNorm statistics, never trained);
    ``compiled``: the translation the session was built with (``setOptimizer``), whose
    constness a torch optimizer keeps (a changed constant is then reported by
    ``check_replacement``). ``variable_loss_scaling`` (automatic loss scaling, which updates
    the scale on the device) makes the loss scaling variable; a ``compiled`` translation with a
    variable loss scaling keeps it so.
    """
    kind = _kind(optimizer)
    groups = optimizer.param_groups
    family, keys = {"SGD": ("SGD", _SGD_KEYS), "Adam": ("Adam", _ADAM_KEYS),
                    "AdamW": ("Adam", _ADAM_KEYS), "LAMB": ("Adam", _ADAM_KEYS),
                    "RMSprop": ("Adaptive", _ADAPTIVE_KEYS),
                    "Adagrad": ("Adaptive", _ADAPTIVE_KEYS)}[kind]
    _check_supported(optimizer, kind, groups)
    _check_group_keys(optimizer, kind, groups, keys)
    attrs = [a for a in keys if a in groups[0]]
    if kind == "SGD" and "velocity_scaling" not in groups[0]:
        attrs.append("velocity_scaling")  # torch's SGD has none: always 1
    values = {}
    for index, group in enumerate(groups):
        for attr in attrs:
            value = group.get(attr, 1.0 if attr == "velocity_scaling" else None)
            const = not _is_variable(optimizer, attr, groups)
            if compiled is not None and (index, attr) in compiled.values:
                was_const = compiled.values[(index, attr)][1]
                if hasattr(optimizer, "variable_attrs") and was_const != const:
                    raise Error(
                        f"setOptimizer: {type(optimizer).__name__} attribute '{attr}' was "
                        f"{'constant' if was_const else 'variable'} at compile time and is now "
                        f"marked {'constant' if const else 'variable'}; mark it before the "
                        f"first call.")
                const = was_const
            values[(index, attr)] = (_plain(value), const)
    if kind == "SGD" and not getattr(optimizer, "use_combined_accum", False):
        for index in range(len(groups)):
            vs, const = values[(index, "velocity_scaling")]
            if vs != 1.0:
                warnings.warn(f"{type(optimizer).__name__}: velocity_scaling ({vs}) only applies "
                              f"with use_combined_accum=True; it is ignored.", UserWarning,
                              stacklevel=4)
                values[(index, "velocity_scaling")] = (1.0, const)

    param_group, fqn_of_param = _param_groups(optimizer, model)
    trained: dict[str, torch.Tensor] = {}
    frozen: list[str] = []
    missing = []
    state_tensors = dict(model.named_parameters())
    state_tensors.update(model.named_buffers())
    for backend_id, fqn in weights.items():
        tensor = state_tensors[fqn]
        if fqn in running_stats or not tensor.is_floating_point():
            continue  # the backend trains float variables only, and never running stats
        if not isinstance(tensor, torch.nn.Parameter) or not tensor.requires_grad:
            frozen.append(backend_id)
        elif id(tensor) not in param_group:
            missing.append(fqn)
        else:
            trained[backend_id] = tensor
    if missing:
        raise Error(
            f"{type(optimizer).__name__}: parameter(s) {', '.join(repr(m) for m in missing)} of "
            f"the model are not in any param group of the optimizer, so the device would not "
            f"know how to update them. Pass model.parameters() to the optimizer, add a group "
            f"with optimizer.add_param_group(...), or set requires_grad=False to freeze them.")
    unknown = [i for i in param_group if i not in fqn_of_param]
    if unknown:
        raise Error(
            f"{type(optimizer).__name__}: {len(unknown)} tensor(s) in its param groups are not "
            f"parameters of the wrapped model. Build the optimizer from this model's "
            f"parameters.")

    defaults = _backend_values(keys, values, 0, attrs)
    loss_scaling = float(getattr(optimizer, "loss_scaling", 1.0))
    variable_ls = hasattr(optimizer, "variable_attrs") and not (
        optimizer.variable_attrs.isConstant("loss_scaling"))
    variable_ls = variable_ls or variable_loss_scaling or (
        compiled is not None and not compiled.backend.loss_scaling_is_const())
    defaults["lossScaling"] = (loss_scaling, not variable_ls)
    clip = []
    max_norm = float(getattr(optimizer, "max_grad_norm", math.inf))
    if math.isfinite(max_norm):
        clip = [popart.ClipNormSettings.clipWeights(list(trained), max_norm)]
    backend = _build(optimizer, kind, defaults, clip)
    for backend_id, param in trained.items():
        index = param_group[id(param)]
        if index:
            specific = _backend_values(keys, values, index, attrs)
            backend.insertSpecific(backend_id, {k[len("default"):][0].lower()
                                                + k[len("default") + 1:]: v
                                                for k, v in specific.items()})
    state, internal = {}, {}
    for backend_id, param in trained.items():
        index = param_group[id(param)]
        state[backend_id], internal[backend_id] = _state_slots(
            kind, backend_id, {a: values[(index, a)] for a in attrs}, optimizer)
    return Translation(backend, family, kind, values, trained, state, internal, sorted(frozen))


def mark_frozen(proto, frozen: list[str]) -> None:
    """Write the frozen weights of a translation into the ONNX model's metadata (replacing
    marks from an earlier call), so the backend does not train them."""
    kept = [p for p in proto.metadata_props if not p.key.startswith(_FROZEN_KEY_PREFIX)]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    initializers = {i.name for i in proto.graph.initializer}
    for backend_id in frozen:
        if backend_id in initializers:  # (a weight the export folded away needs no mark)
            proto.metadata_props.add(key=_FROZEN_KEY_PREFIX + backend_id, value="1")


def check_replacement(old: Translation, new: Translation, optimizer) -> None:
    """Raise Error unless ``new`` can replace ``old`` in the compiled session."""
    if old.kind != new.kind:
        raise Error(f"setOptimizer: the model was compiled with {old.kind}; a {new.kind} "
                    f"cannot replace it. Build a new wrapper to change the optimizer class.")
    if len({g for g, _ in old.values}) != len({g for g, _ in new.values}):
        raise Error("setOptimizer: the number of param groups changed; it is fixed at "
                    "compile time. Build a new wrapper.")
    for key, (old_value, old_const) in old.values.items():
        new_value, _ = new.values.get(key, (None, None))
        group, attr = key
        if old_const and new_value != old_value:
            raise Error(f"setOptimizer: {type(optimizer).__name__} attribute '{attr}' "
                        f"(param_groups[{group}]) is constant: compiled with {old_value}, "
                        f"now {new_value}. Call optimizer.variable_attrs.markAsVariable("
                        f"'{attr}') (poptorch_lite.optim classes) or give it a non-default "
                        f"value when building the optimizer, before compiling.")
    if set(old.weights) != set(new.weights) or any(
            old.weights[w] is not new.weights[w] for w in old.weights):
        raise Error("setOptimizer: the new optimizer's param groups hold different "
                    "parameters; they are fixed at compile time. Build a new wrapper.")


# --- helpers ---------------------------------------------------------------------------------


def _kind(optimizer) -> str:
    if isinstance(optimizer, lite.LAMB):
        return "LAMB"
    for cls in _TORCH_CLASSES:  # AdamW before Adam: torch's AdamW subclasses Adam
        if isinstance(optimizer, cls):
            if type(optimizer) not in _TORCH_CLASSES + _LITE_CLASSES:
                warnings.warn(f"{type(optimizer).__name__} subclasses {cls.__name__}: the "
                              f"device runs {cls.__name__}'s update; the subclass's Python "
                              f"step() never runs.", UserWarning, stacklevel=4)
            if cls is torch.optim.Adam and optimizer.defaults.get("decoupled_weight_decay"):
                return "AdamW"
            return cls.__name__
    names = ", ".join(c.__name__ for c in _TORCH_CLASSES)
    raise Error(f"{type(optimizer).__name__} is not supported by training wrappers; use "
                f"torch.optim {names} or poptorch_lite.optim SGD, Adam, AdamW, RMSprop, LAMB.")


def _check_supported(optimizer, kind: str, groups) -> None:
    name = type(optimizer).__name__
    for index, group in enumerate(groups):
        if group.get("maximize"):
            raise Error(f"{name}: maximize=True (param_groups[{index}]) is not supported on "
                        f"the IPU; negate the loss instead.")
        if group.get("amsgrad"):
            raise Error(f"{name}: amsgrad=True (param_groups[{index}]) is not supported on "
                        f"the IPU.")
        if kind == "Adagrad" and group.get("lr_decay", 0.0):
            raise Error(f"{name}: lr_decay={group['lr_decay']} (param_groups[{index}]) is not "
                        f"supported on the IPU; decay lr with an LR scheduler and "
                        f"setOptimizer() instead.")
        if "loss_scaling" in group:
            raise Error(f"{name}: loss_scaling is global; remove it from param_groups[{index}] "
                        f"and pass it to the optimizer's constructor.")


def _check_group_keys(optimizer, kind: str, groups, keys: dict) -> None:
    """Every param-group key is used, checked, or (torch implementation switches) logged
    once as having no effect; any other key is ignored with a warning, once per key."""
    name = type(optimizer).__name__
    known = set(keys) | _GROUP_KEYS[kind] | _COMMON_KEYS | set(_IMPLEMENTATION_KEYS)
    if kind == "SGD":
        known.add("velocity_scaling")
    decoupled = optimizer.defaults.get("decoupled_weight_decay", False)
    for index, group in enumerate(groups):
        for key in sorted(k for k in group if k not in known):
            # PopTorch ignores param-group keys it has no use for (users keep names and
            # bookkeeping there); say so once per key rather than refuse a working program.
            if ("group", key) not in _LOGGED:
                _LOGGED.add(("group", key))
                _log.warning("%s: param_groups[%d] key %r is ignored: %s on the device reads "
                             "only %s.", name, index, key, kind, sorted(known - {"params"}))
        if group.get("decoupled_weight_decay", decoupled) != decoupled:
            raise Error(f"{name}: param_groups[{index}]['decoupled_weight_decay'] differs from "
                        f"the optimizer's ({decoupled}); the device runs one weight decay "
                        f"mode for all groups.")
        for key in _IMPLEMENTATION_KEYS:
            if group.get(key) and key not in _LOGGED:
                _LOGGED.add(key)
                _log.warning("%s: %s=%r has no effect in poptorch_lite: it selects how torch's "
                             "own step() runs, and the device runs the update instead.",
                             name, key, group[key])


def _plain(value):
    if isinstance(value, torch.Tensor):
        return float(value)
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, bool):
        return value
    return float(value)


def _torch_default(optimizer, attr: str):
    for cls in type(optimizer).__mro__:
        if cls in _TORCH_CLASSES:
            param = inspect.signature(cls.__init__).parameters.get(attr)
            if param is not None and param.default is not inspect.Parameter.empty:
                return _plain(param.default)
            break
    return 1.0 if attr == "velocity_scaling" else None


def _is_variable(optimizer, attr: str, groups) -> bool:
    if attr == "lr":
        return True
    variable_attrs = getattr(optimizer, "variable_attrs", None)
    if variable_attrs is not None:
        return not variable_attrs.isConstant(attr)
    default = _torch_default(optimizer, attr)
    return any(_plain(g.get(attr, default)) != default for g in groups)


def _backend_values(keys: dict, values: dict, group: int, attrs: list[str]) -> dict:
    out = {}
    for attr in attrs:
        value, const = values[(group, attr)]
        backend_key = keys[attr]
        if isinstance(backend_key, tuple):  # betas -> beta1, beta2
            for key, part in zip(backend_key, value):
                out["default" + key[0].upper() + key[1:]] = (float(part), const)
        else:
            out["default" + backend_key[0].upper() + backend_key[1:]] = (
                float(value), const or attr == "nesterov")
    return out


def _dtype(optimizer, name: str, default=popart.DataType.UNDEFINED):
    dtype = getattr(optimizer, name, None)
    return default if dtype is None else _DTYPES[dtype]


def _build(optimizer, kind: str, defaults: dict, clip: list):
    if kind == "SGD":
        mode = (popart.SGDAccumulatorAndMomentum.Combined
                if getattr(optimizer, "use_combined_accum", False)
                else popart.SGDAccumulatorAndMomentum.Separate)
        return popart.SGD(defaults, clip_norm_settings=clip, accumulatorAndMomentum=mode,
                          accumType=_dtype(optimizer, "accum_type"),
                          accl1Type=_dtype(optimizer, "velocity_accum_type"))
    if kind in ("Adam", "AdamW", "LAMB"):
        bias = getattr(optimizer, "bias_correction", True)
        if kind == "LAMB":
            mode = popart.AdamMode.Lamb if bias else popart.AdamMode.LambNoBias
        else:
            mode = popart.AdamMode.Adam if bias else popart.AdamMode.AdamNoBias
        decay = (popart.WeightDecayMode.L2Regularization if kind == "Adam"
                 else popart.WeightDecayMode.Decay)
        return popart.Adam(
            defaults, mode=mode, weight_decay_mode=decay,
            accum_type=_dtype(optimizer, "accum_type"),
            accl1_type=_dtype(optimizer, "first_order_momentum_accum_type",
                              popart.DataType.FLOAT),
            accl2_type=_dtype(optimizer, "second_order_momentum_accum_type",
                              popart.DataType.FLOAT),
            clip_norm_settings=clip)
    if kind == "Adagrad":
        mode = popart.AdaptiveMode.AdaGrad
    else:
        centered = optimizer.param_groups[0].get("centered", False)
        mode = popart.AdaptiveMode.CenteredRMSProp if centered else popart.AdaptiveMode.RMSProp
    return popart.Adaptive(
        defaults, mode=mode, weight_decay_mode=popart.WeightDecayMode.L2Regularization,
        accum_type=_dtype(optimizer, "accum_type"),
        accl1_type=_dtype(optimizer, "first_order_momentum_accum_type", popart.DataType.FLOAT),
        accl2_type=_dtype(optimizer, "second_order_momentum_accum_type", popart.DataType.FLOAT),
        rmsprop_tf_variant=getattr(optimizer, "use_tf_variant", False),
        clip_norm_settings=clip)


def _param_groups(optimizer, model):
    group_of = {}
    for index, group in enumerate(optimizer.param_groups):
        for param in group["params"]:
            group_of.setdefault(id(param), index)
    fqn_of = {id(p): fqn for fqn, p in model.named_parameters()}
    return group_of, fqn_of


def _state_slots(kind: str, w: str, values: dict, optimizer):
    """torch state slots of weight ``w`` and the device-only counters it has."""
    def may_be_nonzero(attr):
        value, const = values.get(attr, (0.0, True))
        return not const or value != 0.0

    if kind == "SGD":
        if not may_be_nonzero("momentum"):
            return [], []
        vs = values["velocity_scaling"][0]
        internal = [f"Step___{w}"] if may_be_nonzero("dampening") else []
        return [StateSlot("momentum_buffer", f"Accl___{w}", vs)], internal
    if kind in ("Adam", "AdamW", "LAMB"):
        return [StateSlot("step", f"Step___{w}"), StateSlot("exp_avg", f"Accl1___{w}"),
                StateSlot("exp_avg_sq", f"Accl2___{w}")], []
    if kind == "Adagrad":
        return [StateSlot("step", None), StateSlot("sum", f"Accl1___{w}")], []
    slots = [StateSlot("step", None), StateSlot("square_avg", f"Accl1___{w}")]
    if may_be_nonzero("momentum"):
        slots.append(StateSlot("momentum_buffer", f"Accl3___{w}"))
    if optimizer.param_groups[0].get("centered", False):
        slots.append(StateSlot("grad_avg", f"Accl2___{w}"))
    return slots, []
