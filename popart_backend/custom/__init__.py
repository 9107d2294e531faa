"""Custom operators in Python: ``import popart_backend.custom``.

PopART users write an Op, a GradOp and two Opx classes in C++ and load a shared library. Here
they write one Python class per op (shape inference, attributes, grad ops, a numpy ``compute``)
and register it with a decorator; registration is the Python analogue of loading the library.

The public custom-op API *is* the internal op API (DESIGN decision 2): ``register_op`` wraps the
user's class in an adapter subclass of the IR ``Op`` and puts it in the same registry the
built-in ops use, so the importer, ``Builder.customOp``, ``getTensorShape``, autodiff, the
cost model and the simulator treat it like any other op:

- ``infer`` calls the user's ``setup(in_infos)`` (public ``TensorInfo`` objects) and checks
  the result against the op's ``OpDefinition``;
- ``kernel`` hands the torch inputs to ``compute(ctx, *arrays)`` as zero-copy numpy views
  (read-only unless the op declares ``modifies_inputs``), then checks each result's shape and
  dtype against ``setup`` before wrapping it back zero-copy;
- ``grad`` inserts the user's ``grad_ops()`` wired by their ``grad_input_info`` and
  ``grad_out_to_non_grad_in`` tables;
- every custom op reads the session's ``randomSeed___`` tensor ([user seed, micro-batch
  counter], docs/training.md): that is how ``ctx`` learns the micro-batch and replica it runs
  for, and, for ops with ``requires_random_seed``, a per-op seed.

This package's face is the public custom-op API. The user-facing classes live in ``api.py``,
the definition checks in ``definitions.py``, the IR adapter in ``adapter.py``, and registration,
the module loader and the eager runs in ``registration.py``.
"""

from ..supported_ops import OpDefinition, OperatorIdentifier
from .api import ComputeContext, GradInOutMapper, GradOp, GradOpInType, Op
from .registration import (
    loadCustomOpModule,
    register_grad_op,
    register_op,
    registered_custom_ops,
    run_backward,
    run_forward,
    unregister_op,
)

__all__ = [
    "ComputeContext", "GradInOutMapper", "GradOp", "GradOpInType", "Op", "OpDefinition",
    "OperatorIdentifier", "loadCustomOpModule", "register_grad_op", "register_op",
    "registered_custom_ops", "run_backward", "run_forward", "unregister_op",
]
