"""PopTorch's optimizer classes: torch optimizers plus IPU settings.

Each class is the torch optimizer of the same name with PopTorch's extra arguments
(``loss_scaling``, ``velocity_scaling``, accumulator dtypes, ``max_grad_norm`` ...) kept as
attributes; a training wrapper reads the hyper-parameters per param group and builds the
matching ``popart_backend`` optimizer (``optimizer_translation.py``). Their Python ``step()``
never runs for a wrapped model: the device applies the update.

Which values may change after compile: attributes given a non-default value in the constructor
and ``lr`` are *variable* (``setOptimizer`` changes them without recompiling); the others are
*constant*, baked into the compiled update. ``opt.variable_attrs.markAsVariable(name)`` /
``markAsConstant(name)`` change that before compiling.

``state_dict()`` of a lite optimizer adds ``ipu_state`` (the device's optimizer tensors by
backend id) and ``ipu_param`` (the backend hyper-parameter values) to torch's
``{"state", "param_groups"}``; when a training wrapper holds the optimizer, the state is read
from the device first. ``load_state_dict`` needs those keys (a plain torch state is refused)
and the next run of the wrapper writes the loaded state to the device.
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["SGD", "Adam", "AdamW", "RMSprop", "LAMB", "VariableAttributes"]

_ACCUM_DTYPES = (torch.float32, torch.float16)


class VariableAttributes:
    """Which hyper-parameters may change after compile (``markAsConstant`` / ``markAsVariable``)."""

    def __init__(self, variable: set[str], allowed: set[str]):
        self._variable = set(variable)
        self._allowed = set(allowed)

    def _check(self, attr: str) -> None:
        if attr not in self._allowed:
            raise ValueError(f"Unknown optimizer attribute {attr!r}; known: "
                             f"{sorted(self._allowed)}.")

    def isConstant(self, attr: str) -> bool:  # noqa: N802 - PopTorch's name
        self._check(attr)
        return attr not in self._variable

    def markAsConstant(self, attr: str) -> None:  # noqa: N802
        self._check(attr)
        self._variable.discard(attr)

    def markAsVariable(self, attr: str) -> None:  # noqa: N802
        self._check(attr)
        self._variable.add(attr)


class _IpuOptimizer:
    """What the lite optimizers add to their torch base: IPU attributes and device state."""

    # Constructor defaults of the attributes that may be variable, per class.
    _ATTR_DEFAULTS: dict = {}

    def _ipu_init(self, given: dict, loss_scaling: float, accum: dict,
                  max_grad_norm: float = float("inf")) -> None:
        if not float(loss_scaling) > 0:
            raise ValueError(f"{type(self).__name__}: loss_scaling must be positive, got "
                             f"{loss_scaling}.")
        self.loss_scaling = float(loss_scaling)
        self.max_grad_norm = float(max_grad_norm)
        for name, dtype in accum.items():
            if dtype is not None and dtype not in _ACCUM_DTYPES:
                raise ValueError(f"{type(self).__name__}: {name} must be torch.float32 or "
                                 f"torch.float16, got {dtype!r}.")
            setattr(self, name, dtype)
        allowed = set(self._ATTR_DEFAULTS) | {"lr", "loss_scaling"}
        variable = {"lr"} | {name for name, value in given.items()
                             if name in allowed and value != self._ATTR_DEFAULTS.get(name)}
        self.variable_attrs = VariableAttributes(variable, allowed)
        self._ipu_state: dict[str, torch.Tensor] = {}
        self._ipu_param: dict[str, float] = {}
        self._holder = None  # weakref to the training wrapper running this optimizer
        self._loaded = False  # state loaded while no wrapper held it, not on a device yet

    def _wrapper(self):
        holder = self.__dict__.get("_holder")  # absent after torch's __setstate__ (copies)
        return holder() if holder is not None else None

    @property
    def ipu_state_is_dirty(self) -> bool:
        """True when training runs changed the device state since the host last read it (the
        next ``state_dict()`` reads it)."""
        wrapper = self._wrapper()
        return bool(wrapper is not None and wrapper._optimizer_state_dirty)

    @property
    def host_state_is_dirty(self) -> bool:
        """True when a loaded host state waits to be written to the device (next run)."""
        wrapper = self._wrapper()
        return (self.__dict__.get("_loaded", False)
                or bool(wrapper is not None and wrapper._optimizer_state_pending))

    def has_state(self) -> bool:
        """True if there is IPU optimizer state: read from or waiting on the device, or
        loaded."""
        return bool(self._ipu_state) or self.ipu_state_is_dirty

    def get_state_dict(self):
        """Same as ``state_dict()``."""
        return self.state_dict()

    def set_state_dict(self, state) -> None:
        """Same as ``load_state_dict(state)``: the state needs ``ipu_state`` / ``ipu_param``."""
        self.load_state_dict(state)

    def state_dict(self):
        """torch's state dict (read from the device when a wrapper holds this optimizer) plus
        ``ipu_state`` and ``ipu_param``."""
        state = super().state_dict()  # the wrapper's pre-hook pulls device state first
        state["ipu_state"] = {k: v.clone() for k, v in self._ipu_state.items()}
        state["ipu_param"] = dict(self._ipu_param)
        return state

    def load_state_dict(self, state_dict) -> None:
        if not state_dict or "ipu_state" not in state_dict:
            raise RuntimeError(
                f"{type(self).__name__}.load_state_dict: the state has no 'ipu_state' (it is "
                f"empty or comes from a plain torch optimizer). Load a state saved by a "
                f"poptorch_lite optimizer, or use the torch optimizer class to load a torch "
                f"state.")
        state_dict = dict(state_dict)
        ipu_state = state_dict.pop("ipu_state")
        ipu_param = state_dict.pop("ipu_param", {})
        super().load_state_dict(state_dict)  # the wrapper's post-hook marks it for the device
        self._ipu_state = {k: torch.as_tensor(v).clone() for k, v in ipu_state.items()}
        self._ipu_param = dict(ipu_param)
        self._loaded = True


def hold(optimizer, wrapper) -> None:
    """Record ``wrapper`` (None: released) as the training wrapper running a lite optimizer;
    its dirty flags then come from the wrapper."""
    if isinstance(optimizer, _IpuOptimizer):
        optimizer._holder = weakref.ref(wrapper) if wrapper is not None else None


def written(optimizer) -> None:
    """A wrapper wrote the optimizer's host state to its device."""
    if isinstance(optimizer, _IpuOptimizer):
        optimizer._loaded = False


class SGD(_IpuOptimizer, torch.optim.SGD):
    """torch.optim.SGD plus ``loss_scaling``, ``velocity_scaling`` (per group; only used with
    ``use_combined_accum``), ``accum_type``, ``velocity_accum_type`` and ``max_grad_norm``."""

    _ATTR_DEFAULTS = {"momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0,
                      "nesterov": False, "velocity_scaling": 1.0}

    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, maximize=False, loss_scaling=1.0, velocity_scaling=1.0,
                 use_combined_accum=False, accum_type=None, velocity_accum_type=None,
                 max_grad_norm=float("inf")):
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening,
                         weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
        # velocity_scaling may differ per param group, like lr.
        self.defaults["velocity_scaling"] = float(velocity_scaling)
        for group in self.param_groups:
            group.setdefault("velocity_scaling", float(velocity_scaling))
        self.use_combined_accum = bool(use_combined_accum)
        self._ipu_init(dict(momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                            nesterov=nesterov, velocity_scaling=velocity_scaling),
                       loss_scaling, {"accum_type": accum_type,
                                      "velocity_accum_type": velocity_accum_type},
                       max_grad_norm)


class Adam(_IpuOptimizer, torch.optim.Adam):
    """torch.optim.Adam (L2 weight decay) plus ``loss_scaling``, accumulator dtypes and
    ``max_grad_norm``; ``amsgrad`` is not supported on the IPU."""

    _ATTR_DEFAULTS = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, loss_scaling=1.0, accum_type=None,
                 first_order_momentum_accum_type=None, second_order_momentum_accum_type=None,
                 max_grad_norm=float("inf")):
        if amsgrad:
            raise ValueError("poptorch_lite.optim.Adam: amsgrad is not supported on the IPU.")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self._ipu_init(dict(betas=tuple(betas), eps=eps, weight_decay=weight_decay),
                       loss_scaling, _adam_accum(accum_type, first_order_momentum_accum_type,
                                                 second_order_momentum_accum_type),
                       max_grad_norm)


class AdamW(_IpuOptimizer, torch.optim.AdamW):
    """torch.optim.AdamW (decoupled weight decay); ``bias_correction=False`` drops Adam's bias
    correction."""

    _ATTR_DEFAULTS = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, bias_correction=True, loss_scaling=1.0, accum_type=None,
                 first_order_momentum_accum_type=None, second_order_momentum_accum_type=None,
                 max_grad_norm=float("inf")):
        if amsgrad:
            raise ValueError("poptorch_lite.optim.AdamW: amsgrad is not supported on the IPU.")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.bias_correction = bool(bias_correction)
        self._ipu_init(dict(betas=tuple(betas), eps=eps, weight_decay=weight_decay),
                       loss_scaling, _adam_accum(accum_type, first_order_momentum_accum_type,
                                                 second_order_momentum_accum_type),
                       max_grad_norm)


class RMSprop(_IpuOptimizer, torch.optim.RMSprop):
    """torch.optim.RMSprop plus ``loss_scaling``, accumulator dtypes and ``use_tf_variant``
    (TensorFlow's form: mean square starts at 1, eps inside the square root)."""

    _ATTR_DEFAULTS = {"alpha": 0.99, "eps": 1e-8, "weight_decay": 0.0, "momentum": 0.0}

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                 centered=False, loss_scaling=1.0, accum_type=None,
                 first_order_momentum_accum_type=None, second_order_momentum_accum_type=None,
                 use_tf_variant=False):
        super().__init__(params, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                         momentum=momentum, centered=centered)
        self.use_tf_variant = bool(use_tf_variant)
        self._ipu_init(dict(alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum),
                       loss_scaling, _adam_accum(accum_type, first_order_momentum_accum_type,
                                                 second_order_momentum_accum_type))


class LAMB(_IpuOptimizer, torch.optim.Optimizer):
    """LAMB (You et al.): Adam's update scaled per weight by the trust ratio
    ``min(‖w‖, max_weight_norm) / ‖u‖``; decoupled weight decay is part of ``u``.

    There is no torch implementation, so ``step()`` raises: LAMB runs only on the device.
    """

    _ATTR_DEFAULTS = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2,
                      "max_weight_norm": 65500.0}

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 bias_correction=True, loss_scaling=1.0, max_weight_norm=65500.0,
                 accum_type=None, first_order_momentum_accum_type=None,
                 second_order_momentum_accum_type=None, max_grad_norm=float("inf")):
        # None disables the clipping of the weight norm.
        max_weight_norm = float("inf") if max_weight_norm is None else float(max_weight_norm)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay,
                                      max_weight_norm=max_weight_norm))
        self.bias_correction = bool(bias_correction)
        self._ipu_init(dict(betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                            max_weight_norm=max_weight_norm),
                       loss_scaling, _adam_accum(accum_type, first_order_momentum_accum_type,
                                                 second_order_momentum_accum_type),
                       max_grad_norm)

    def step(self, closure=None):
        raise NotImplementedError(
            "poptorch_lite.optim.LAMB only runs on the device: wrap the model with "
            "poptorch_lite.trainingModel(model, options, optimizer).")


def _adam_accum(accum_type, first, second) -> dict:
    return {"accum_type": accum_type, "first_order_momentum_accum_type": first,
            "second_order_momentum_accum_type": second}
