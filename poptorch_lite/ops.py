"""IPU-specific ops usable inside ``forward`` (spec §2.8-§2.9, P57-P62).

Each op is a ``torch.library`` custom op (eager kernel + fake kernel + autograd), so it runs on
CPU like any torch op, is kept opaque by ``torch.export``, and is translated to its
``ai.graphcore`` ONNX node through ``translation_table()`` (schemas registered at import).
"""

from __future__ import annotations

import onnx
import onnx.defs
import torch
from onnxscript import values as onnxscript_values

from .errors import Error

__all__ = ["identity_loss", "nop", "set_available_memory", "ipu_print_tensor"]

GRAPHCORE = "ai.graphcore"
_REDUCTIONS = {"sum": 0, "mean": 1, "none": 2}


# --- identity_loss ------------------------------------------------------------------------------


@torch.library.custom_op("poptorch_lite::identity_loss", mutates_args=())
def _identity_loss(x: torch.Tensor, reduction: int) -> torch.Tensor:
    if reduction == 0:
        return x.sum()
    if reduction == 1:
        return x.mean()
    return x.clone()


@_identity_loss.register_fake
def _(x, reduction):
    return x.new_empty(()) if reduction in (0, 1) else torch.empty_like(x)


def _identity_loss_backward(ctx, grad):
    x_shape, reduction, numel = ctx.x_shape, ctx.reduction, ctx.numel
    if reduction == 0:
        return grad.expand(x_shape), None
    if reduction == 1:
        return (grad / numel).expand(x_shape), None
    return grad, None


def _identity_loss_setup(ctx, inputs, output):
    x, reduction = inputs
    ctx.x_shape = x.shape
    ctx.numel = x.numel()
    ctx.reduction = reduction


_identity_loss.register_autograd(_identity_loss_backward, setup_context=_identity_loss_setup)


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    """Mark ``x`` as the loss: ``"sum"`` ⇒ Σx, ``"mean"`` ⇒ mean(x), ``"none"`` ⇒ x (P58)."""
    if not isinstance(x, torch.Tensor):
        raise Error(f"identity_loss: expected a tensor, got {type(x).__name__}.")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"identity_loss: reduction must be 'sum', 'mean' or 'none', got "
                         f"{reduction!r}.")
    return _identity_loss(x, _REDUCTIONS[reduction])


# --- identity-like helpers ----------------------------------------------------------------------


def nop(tensor: torch.Tensor) -> torch.Tensor:
    """An identity the compiler never removes; on the simulated IPU a plain identity."""
    return tensor


def set_available_memory(tensor: torch.Tensor, available_memory_proportion: float):
    """Memory hint for the producing op; numerically an identity (P60)."""
    if not isinstance(tensor, torch.Tensor):
        raise Error(f"set_available_memory: expected a tensor, got {type(tensor).__name__}.")
    if not 0.0 <= float(available_memory_proportion) <= 1.0:
        raise ValueError(f"set_available_memory: proportion must be in [0, 1], got "
                         f"{available_memory_proportion}.")
    return tensor


def ipu_print_tensor(tensor: torch.Tensor, title: str = "", print_gradient: bool = True,
                     **_format):
    """Print ``tensor`` when executed on CPU (host runs); identity in the traced graph."""
    if not isinstance(tensor, torch.Tensor):
        raise Error(f"ipu_print_tensor: expected a tensor, got {type(tensor).__name__}.")
    from .blocks import _state

    if not _state["tracing"]:
        print(title, tensor)
    return tensor


# --- ONNX translation -----------------------------------------------------------------------------

_GC = onnxscript_values.Opset(GRAPHCORE, 1)


def _register_schemas() -> None:
    if onnx.defs.has("IdentityLoss", GRAPHCORE):
        return
    schema = onnx.defs.OpSchema(
        "IdentityLoss", GRAPHCORE, 1,
        inputs=[onnx.defs.OpSchema.FormalParameter("x", "T")],
        outputs=[onnx.defs.OpSchema.FormalParameter("y", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(double)"], "")],
        attributes=[onnx.defs.OpSchema.Attribute("reduction", onnx.defs.OpSchema.AttrType.INT,
                                                 "0 sum, 1 mean, 2 none")],
    )
    onnx.defs.register_schema(schema)


def _translate_identity_loss(x, reduction: int):
    return _GC.IdentityLoss(x, reduction=reduction)


_register_schemas()


def translation_table() -> dict:
    """``custom_translation_table`` entries for ``torch.onnx.export``."""
    return {torch.ops.poptorch_lite.identity_loss.default: _translate_identity_loss}
