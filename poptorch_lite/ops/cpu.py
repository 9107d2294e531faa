"""``CPU(func, ID)``: a host callback in the middle of the IPU graph (P62).

Each ``CPU`` object registers a backend custom op (``popart_backend.custom``, domain
``poptorch_lite.cpu``, named after ``ID``) whose compute calls ``func`` on the host with the op's
inputs as torch tensors. Called inside a traced ``forward``, the object runs ``func`` once on
the traced (fake) inputs to learn its outputs' shapes and dtypes, then emits that custom op
through ``custom_op``; the simulated IPU calls back into Python when the op executes. Called
eagerly on CPU, it calls ``func`` directly. The callback is not differentiable (no gradient
reaches its inputs), as in PopTorch.
"""

from __future__ import annotations

import re

import numpy as np
import torch
from torch.utils._python_dispatch import _disable_current_modes

import popart_backend as popart

from ..blocks import isRunningOnIpu
from ..errors import Error
from .core import custom_op

__all__ = ["CPU"]

DOMAIN = "poptorch_lite.cpu"
_DTYPES = {torch.float32: "FLOAT", torch.float16: "FLOAT16", torch.int32: "INT32",
           torch.int64: "INT64", torch.bool: "BOOL", torch.float64: "DOUBLE"}


def _outputs(result) -> list[torch.Tensor]:
    values = list(result) if isinstance(result, (list, tuple)) else [result]
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        raise Error(f"CPU op: the host function must return a tensor or a non-empty list of "
                    f"tensors, got {type(result).__name__}.")
    return values


class CPU:
    """Wrap ``layer_to_call`` (any callable taking and returning tensors) as a host op named
    ``ID``; ``cpu(*inputs)`` inside ``forward`` runs it on the host mid-graph."""

    def __init__(self, layer_to_call, ID: str):
        if not callable(layer_to_call):
            raise Error(f"CPU: layer_to_call must be callable, got "
                        f"{type(layer_to_call).__name__}.")
        if not isinstance(ID, str) or not ID:
            raise Error(f"CPU: ID must be a non-empty string, got {ID!r}.")
        self.layer_to_call = layer_to_call
        self.ID = ID
        self.name = "Cpu_" + re.sub(r"\W", "_", ID)
        self.in_tensors: list[torch.Tensor] = []
        self.out_tensors: list[torch.Tensor] = []
        self._specs: list[tuple[str, tuple[int, ...]]] | None = None
        self._register()

    def _register(self) -> None:
        owner = self
        opid = popart.OperatorIdentifier(DOMAIN, self.name, 1)

        class HostCallback(popart.custom.Op):
            def __init__(self, opid, attributes, settings):
                super().__init__(opid, settings)

            def setup(self, in_infos):
                if owner._specs is None:
                    raise Error(f"CPU op '{owner.ID}': its output shapes are unknown; call it "
                                f"inside forward before compiling.")
                return [popart.TensorInfo(dtype, list(shape)) for dtype, shape in owner._specs]

            def compute(self, ctx, *arrays):
                owner.in_tensors = [torch.from_numpy(np.array(a)) for a in arrays]
                owner.execute()
                return [t.detach().cpu().numpy() for t in owner.out_tensors]

        if opid in popart.custom.registered_custom_ops():
            # A new CPU object with the same ID replaces the previous callback.
            popart.custom.unregister_op(opid)
        popart.custom.register_op(opid)(HostCallback)

    def execute(self) -> None:
        """Run the host function on ``in_tensors``; its results go to ``out_tensors``."""
        with torch.no_grad():
            self.out_tensors = _outputs(self.layer_to_call(*self.in_tensors))

    def registerPersistentData(self) -> None:
        """PopTorch pins host buffers for the callback here; the simulated IPU hands the
        callback fresh arrays on each call, so there is nothing to register."""

    def __call__(self, *input, **kwargs):
        if kwargs:
            raise Error(f"CPU op '{self.ID}': keyword arguments {sorted(kwargs)} cannot cross "
                        f"to the host; pass tensors positionally.")
        inputs = list(input)
        if not inputs or not all(isinstance(x, torch.Tensor) for x in inputs):
            raise Error(f"CPU op '{self.ID}': the inputs must be one or more tensors.")
        if not isRunningOnIpu():
            return self.layer_to_call(*inputs)
        # The traced inputs are fake tensors a host function (numpy ...) cannot read: its
        # output shapes come from one call on real zeros of the same shapes and dtypes.
        with _real_tensors(), torch.no_grad():
            zeros = [torch.zeros(tuple(x.shape), dtype=x.dtype) for x in inputs]
            examples = [t.clone() for t in _outputs(self.layer_to_call(*zeros))]
        for t in examples:
            if t.dtype not in _DTYPES:
                raise Error(f"CPU op '{self.ID}': output dtype {t.dtype} is not supported; "
                            f"use one of {sorted(str(d) for d in _DTYPES)}.")
        self._specs = [(_DTYPES[t.dtype], tuple(t.shape)) for t in examples]
        results = custom_op([x.detach() for x in inputs], self.name, DOMAIN, 1, examples)
        return results[0] if len(results) == 1 else results


def _real_tensors():
    """Leave torch.export's fake and proxy modes for the shape-finding host call."""
    return _disable_current_modes()


def translation_table() -> dict:
    return {}
