"""Registering custom ops (``register_op``, ``register_grad_op``, ``unregister_op``), loading a
module of them (``loadCustomOpModule``) and running one eagerly (``run_forward``,
``run_backward``); the package docstring describes the whole API."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import re
import sys
import types
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import popart_exception
from ..ir.op import OpSettings
from ..ir.tensor import TensorInfo as IrTensorInfo
from ..ops import registry
from ..supported_ops import OpDefinition, OperatorIdentifier
from .adapter import (
    CustomOpAdapter,
    _make_adapter,
)
from .api import _CUSTOM, ComputeContext, GradOp, GradOpInType, Op, _Entry
from .definitions import (
    _check_grad_tables,
    _normalize_definition,
)

__all__ = [
    "loadCustomOpModule",
    "register_grad_op",
    "register_op",
    "registered_custom_ops",
    "run_backward",
    "run_forward",
    "unregister_op",
]

_log = logging.getLogger("popart:op")


# --- registration ---------------------------------------------------------------------------------


def register_op(opid: OperatorIdentifier, definition: OpDefinition | None = None,
                public: bool = True):
    """Class decorator registering a custom ``Op`` subclass under ``opid`` (F88, F93).

    ``definition`` lets the backend check input/output dtypes and attribute values (a
    violation raises ``popart_exception`` when a session or ``getTensorShape`` imports the
    node). Registering an identifier that exists replaces it, with a warning.
    """
    return _decorator(opid, definition, public, grad=False)


def register_grad_op(opid: OperatorIdentifier):
    """Class decorator registering a custom ``GradOp`` subclass under ``opid`` (F89)."""
    return _decorator(opid, None, False, grad=True)


def _decorator(opid, definition, public, grad):
    if not isinstance(opid, OperatorIdentifier):
        raise popart_exception(
            f"register_op: the identifier must be a popart.OperatorIdentifier(domain, type, "
            f"version), not {type(opid).__name__} {opid!r}.")
    definition = _normalize_definition(opid, definition)

    def decorate(cls: type) -> type:
        base = GradOp if grad else Op
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise popart_exception(
                f"{'register_grad_op' if grad else 'register_op'}({opid}): {cls!r} must be a "
                f"subclass of popart.custom.{base.__name__}.")
        if grad:
            _check_grad_tables(opid, cls)
        adapter = _make_adapter(cls, opid, definition, public, grad)
        previous = registry.unregister_op(opid.type, opid.version, opid.domain)
        if previous is not None:
            message = (f"Custom op {opid} is already registered (by "
                       f"{previous.__module__}.{previous.__qualname__}); "
                       f"{cls.__module__}.{cls.__qualname__} replaces it.")
            _log.warning(message)
            warnings.warn(message, UserWarning, stacklevel=3)
        registry.register_op(opid.type, opid.version, opid.domain)(adapter)
        old = _CUSTOM.get(opid)
        replaced = old.replaced if old is not None else previous
        _CUSTOM[opid] = _Entry(cls, adapter, replaced)
        return cls

    return decorate


def unregister_op(opid: OperatorIdentifier) -> None:
    """Remove a custom op registration, restoring the op it replaced (if any)."""
    entry = _CUSTOM.pop(opid, None)
    if entry is None:
        raise popart_exception(f"unregister_op: {opid} is not a registered custom op.")
    registry.unregister_op(opid.type, opid.version, opid.domain)
    if entry.replaced is not None:
        registry.register_op(opid.type, opid.version, opid.domain)(entry.replaced)


def registered_custom_ops() -> dict[OperatorIdentifier, type]:
    """Identifier -> user class of every registered custom op and grad op."""
    return {opid: entry.user_class for opid, entry in _CUSTOM.items()}


def loadCustomOpModule(path) -> types.ModuleType:  # noqa: N802 - PopART-style name
    """Import the Python file at ``path``, whose decorators register its ops (the analogue of
    ``ctypes.cdll.LoadLibrary`` for a custom-op library). Returns the module."""
    path = Path(path)
    if not path.is_file():
        raise popart_exception(f"loadCustomOpModule: no file '{path}'. Give the path of a .py "
                               f"file that registers custom ops.")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    stem = re.sub(r"\W", "_", path.stem)
    name = f"popart_custom_ops_{stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise popart_exception(f"loadCustomOpModule: '{path}' is not a Python module (.py).")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise popart_exception(
            f"loadCustomOpModule('{path}') failed while importing it: {type(exc).__name__}: "
            f"{exc}") from exc
    return module


# --- running a custom op outside a session (frontends' eager CPU path) -------------------------


def _user_class(domain: str, op_type: str, version: int) -> type:
    cls, _ = registry.resolve(op_type, domain, version)
    if not issubclass(cls, CustomOpAdapter):
        raise popart_exception(f"{domain}::{op_type}-{version} is a built-in op, not a custom op.")
    return cls


def _eager_ctx(name: str) -> ComputeContext:
    return ComputeContext(name=name, replica=0, num_replicas=1, ipu=0, micro_batch=0, seed=None)


def run_forward(domain: str, op_type: str, version: int, attributes: dict,
                inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Outputs of the registered custom op on numpy inputs, on the host (no session).

    For frontends running a model eagerly on CPU; checked against ``setup`` like on device."""
    adapter = _user_class(domain, op_type, version)
    op = adapter(adapter.build_attrs(version, dict(attributes), op_type), OpSettings(name=op_type))
    infos = op.infer(*[IrTensorInfo.of(np.asarray(x)) for x in inputs])
    result = op.impl.compute(_eager_ctx(op_type), *[np.asarray(x) for x in inputs])
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    return [op._to_torch(i, r).numpy() for i, r in enumerate(results[:len(infos)])]


def run_backward(domain: str, op_type: str, version: int, attributes: dict,
                 inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                 output_grads: Sequence[np.ndarray]) -> list[np.ndarray | None]:
    """Input gradients from the op's registered grad ops, on the host (None: no gradient)."""
    adapter = _user_class(domain, op_type, version)
    impl = adapter(adapter.build_attrs(version, dict(attributes), op_type),
                   OpSettings(name=op_type)).impl
    grads: list[np.ndarray | None] = [None] * len(inputs)
    for grad_op in impl.grad_ops() or []:
        sources = {GradOpInType.In: inputs, GradOpInType.Out: outputs,
                   GradOpInType.GradOut: output_grads}
        args = [np.asarray(sources[GradOpInType(kind)][i]) for _, i, kind in
                sorted(tuple(m) for m in grad_op.grad_input_info)]
        result = grad_op.compute(_eager_ctx(op_type + "Grad"), *args)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        for grad_out, forward_in in grad_op.grad_out_to_non_grad_in.items():
            value = np.asarray(results[grad_out])
            grads[forward_in] = value if grads[forward_in] is None else grads[forward_in] + value
    return grads
