"""Grad ops that compute several input gradients in one kernel call.

Conv, ConvTranspose and the normalizations get dX, dW / dScale and dB from one torch backward
function. Their forward op's ``grad()`` creates a single grad op whose ``wrt`` attribute lists
the wanted input indices and whose outputs follow that order; the grad op's kernel computes
only those (the mask torch's backward functions take) and returns them with ``pick_grads``.
"""

from __future__ import annotations

from .registry import AI_GRAPHCORE


def wanted_grads(g, candidates: tuple[int, ...] = (0, 1, 2)) -> tuple[int, ...]:
    """The forward inputs among ``candidates`` that are present and need a gradient."""
    return tuple(i for i in candidates if g.needs_input_grad(i))


def add_multi_grad_op(g, grad_type: str, *inputs: str | None, wrt: tuple[int, ...],
                      **attrs) -> None:
    """Create the ai.graphcore ``grad_type`` op with one output per index in ``wrt`` and set
    those outputs as the gradients of the forward inputs ``wrt``."""
    grads = g.op(grad_type, *inputs, domain=AI_GRAPHCORE, num_outputs=len(wrt), wrt=wrt, **attrs)
    for i, grad in zip(wrt, grads if isinstance(grads, list) else [grads]):
        g.set_input_grad(i, grad)


def pick_grads(grads, wrt: tuple[int, ...]):
    """The gradients listed in ``wrt``; a lone tensor when there is one (single-output op)."""
    return grads[wrt[0]] if len(wrt) == 1 else tuple(grads[i] for i in wrt)
