"""PopTorch's optimizer classes (spec §2.7, P51-P56): torch optimizers plus IPU settings.

Each class is the torch optimizer of the same name with the extra PopTorch arguments
(``loss_scaling``, accumulator dtypes, ...) kept as attributes; a training wrapper reads the
hyper-parameters per param group and builds the matching ``popart_backend`` optimizer. Their
Python ``step()`` never runs for a wrapped model: the device applies the update.
"""

from __future__ import annotations

import torch

__all__ = ["SGD", "Adam", "AdamW", "RMSprop", "VariableAttributes"]


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


def _ipu_init(opt, passed: dict, loss_scaling: float, accum: dict) -> None:
    opt.loss_scaling = float(loss_scaling)
    for name, dtype in accum.items():
        if dtype not in (torch.float32, torch.float16, None):
            raise ValueError(f"{type(opt).__name__}: {name} must be torch.float32 or "
                             f"torch.float16, got {dtype!r}.")
        setattr(opt, name, dtype or torch.float32)
    allowed = set(opt.defaults) | {"loss_scaling"}
    opt.variable_attrs = VariableAttributes({k for k in passed if k in allowed} | {"lr"},
                                            allowed)


class SGD(torch.optim.SGD):
    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, maximize=False, loss_scaling=1.0, velocity_scaling=1.0,
                 use_combined_accum=False, accum_type=None, velocity_accum_type=None,
                 max_grad_norm=float("inf")):
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening,
                         weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
        self.velocity_scaling = float(velocity_scaling)
        self.use_combined_accum = bool(use_combined_accum)
        self.max_grad_norm = max_grad_norm
        passed = {k for k, v in dict(momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay).items() if v}
        _ipu_init(self, passed, loss_scaling, {"accum_type": accum_type,
                                               "velocity_accum_type": velocity_accum_type})


class Adam(torch.optim.Adam):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, loss_scaling=1.0, accum_type=None,
                 first_order_momentum_accum_type=None, second_order_momentum_accum_type=None,
                 max_grad_norm=float("inf")):
        if amsgrad:
            raise ValueError("poptorch_lite.optim.Adam: amsgrad is not supported on the IPU.")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.max_grad_norm = max_grad_norm
        _ipu_init(self, {"betas", "eps", "weight_decay"}, loss_scaling, {
            "accum_type": accum_type,
            "first_order_momentum_accum_type": first_order_momentum_accum_type,
            "second_order_momentum_accum_type": second_order_momentum_accum_type})


class AdamW(torch.optim.AdamW):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, bias_correction=True, loss_scaling=1.0, accum_type=None,
                 first_order_momentum_accum_type=None, second_order_momentum_accum_type=None,
                 max_grad_norm=float("inf")):
        if amsgrad:
            raise ValueError("poptorch_lite.optim.AdamW: amsgrad is not supported on the IPU.")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.bias_correction = bool(bias_correction)
        self.max_grad_norm = max_grad_norm
        _ipu_init(self, {"betas", "eps", "weight_decay"}, loss_scaling, {
            "accum_type": accum_type,
            "first_order_momentum_accum_type": first_order_momentum_accum_type,
            "second_order_momentum_accum_type": second_order_momentum_accum_type})


class RMSprop(torch.optim.RMSprop):
    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                 centered=False, loss_scaling=1.0, accum_type=None,
                 first_order_momentum_accum_type=None, second_order_momentum_accum_type=None,
                 use_tf_variant=False):
        super().__init__(params, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                         momentum=momentum, centered=centered)
        self.use_tf_variant = bool(use_tf_variant)
        _ipu_init(self, {"alpha", "eps", "weight_decay", "momentum"}, loss_scaling, {
            "accum_type": accum_type,
            "first_order_momentum_accum_type": first_order_momentum_accum_type,
            "second_order_momentum_accum_type": second_order_momentum_accum_type})


def to_backend_optimizer(optimizer, model: torch.nn.Module, fqn_to_onnx: dict[str, str]):
    """The ``popart_backend`` optimizer equivalent to a torch/lite optimizer.

    Group 0 gives the defaults; parameters of other groups get weight-specific values.
    ``lr`` is always variable (changeable by setOptimizer); other values are constant unless
    marked variable.
    """
    import popart_backend as popart

    from .errors import Error

    if not isinstance(optimizer, torch.optim.SGD):
        raise Error(f"{type(optimizer).__name__} is not supported by training wrappers yet "
                    f"(issue #4, second part); use torch.optim.SGD or poptorch_lite.optim.SGD.")
    names = {id(p): fqn for fqn, p in model.named_parameters()}
    variable = getattr(optimizer, "variable_attrs", None)

    def values(group, prefix):
        def entry(key, value):
            const = key != "lr" and (variable is None or variable.isConstant(key))
            return (float(value), const)

        return {
            f"{prefix}LearningRate": entry("lr", group["lr"]),
            f"{prefix}Momentum": entry("momentum", group["momentum"]),
            f"{prefix}Dampening": entry("dampening", group["dampening"]),
            f"{prefix}WeightDecay": entry("weight_decay", group["weight_decay"]),
            f"{prefix}Nesterov": (1.0 if group["nesterov"] else 0.0, True),
        }

    groups = optimizer.param_groups
    params = values(groups[0], "default")
    params["lossScaling"] = (getattr(optimizer, "loss_scaling", 1.0), True)
    backend = popart.SGD(params)
    for group in groups[1:]:
        specific = {k.replace("default", "", 1)[0].lower() + k.replace("default", "", 1)[1:]: v
                    for k, v in values(group, "default").items()}
        for param in group["params"]:
            fqn = names.get(id(param))
            if fqn in fqn_to_onnx:
                backend.insertSpecific(fqn_to_onnx[fqn], specific)
    return backend
