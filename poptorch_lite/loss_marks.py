"""Which traced values are torch losses.

While the frontend traces, calls to ``torch.nn.functional``'s loss functions (``nn`` loss modules
go through them) run with a marker in the FX node metadata, so every node they create carries
the loss function's name. ``find_loss`` uses the marks to tell a loss output from another 0-d
output computed beside it (an accuracy, a detached copy of the loss): the final loss is the one
loss or ``identity_loss`` no other loss consumes.
"""

from __future__ import annotations

import contextlib

import torch.fx.traceback as fx_traceback
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["META_KEY", "loss_outputs", "marking_losses"]

META_KEY = "poptorch_lite_loss"

_LOSSES = {fn: fn.__name__ for fn in (
    F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.nll_loss, F.cross_entropy,
    F.binary_cross_entropy, F.binary_cross_entropy_with_logits, F.kl_div,
    F.cosine_embedding_loss, F.margin_ranking_loss, F.soft_margin_loss,
    F.multilabel_soft_margin_loss, F.multilabel_margin_loss, F.multi_margin_loss,
    F.hinge_embedding_loss, F.triplet_margin_loss, F.triplet_margin_with_distance_loss,
    F.poisson_nll_loss, F.gaussian_nll_loss, F.ctc_loss)}


class _LossMarker(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _LOSSES.get(func)
        if name is None:
            return func(*args, **kwargs)
        previous = fx_traceback.current_meta.get("custom")
        custom = dict(previous or {})
        custom[META_KEY] = name
        fx_traceback.current_meta["custom"] = custom
        try:
            return func(*args, **kwargs)
        finally:
            if previous is None:
                fx_traceback.current_meta.pop("custom", None)
            else:
                fx_traceback.current_meta["custom"] = previous


@contextlib.contextmanager
def marking_losses():
    """Active while the frontend traces ``forward``."""
    with _LossMarker():
        yield


def loss_outputs(proto, fx_custom: dict, fx_name_of) -> tuple[str, ...]:
    """Graph outputs produced by a node traced inside a torch loss function."""
    producers = {out: node for node in proto.graph.node for out in node.output}
    marked = []
    for output in proto.graph.output:
        node = producers.get(output.name)
        if node is None:
            continue
        meta = {p.key: p.value for p in node.metadata_props}
        if META_KEY in fx_custom.get(fx_name_of(meta), {}):
            marked.append(output.name)
    return tuple(marked)
