"""Automatic loss scaling's ops (ai.graphcore; SessionOptions.automaticLossScalingSettings,
added by transforms/auto_loss_scaling.py).

- ``LossScaleHistogram(stats, *gradients) -> finite``: a two-bin histogram of the absolute
  values of the loss-scaled gradients the optimizer reads, with the bin edge at
  ``bin_edge_location`` x the largest finite value of the gradient's type (inf and NaN count in
  the upper bin), added to ``stats``, a float32 [3] variable (weight updates since the last
  scale change, upper-bin elements, all elements), written in place. ``finite`` (BOOL scalar)
  is False when a gradient overflowed: the update ops then skip this weight update.
- ``LossScaleUpdate(loss_scale, stats, finite)``: after ``update_period`` weight updates, when
  the upper bin holds more than ``threshold_upper_count_proportion`` of all the elements
  counted, the gradients are near the top of their range (or overflowed) and the scale (the
  optimizer's ``lossScaling_FLOAT`` variable, written in place after every update op read it)
  halves; otherwise it doubles, within [``min_scale``, ``max_scale``]. Then ``stats`` restarts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .registry import AI_GRAPHCORE, register_op

__all__ = ["LossScaleHistogram", "LossScaleUpdate"]


def _check_stats(op, stats) -> None:
    if stats.shape != (3,) or stats.dtype is not DataType.FLOAT:
        raise ShapeError(f"{op.debug_name}: the statistics must be float32 [3], got {stats}.")


@register_op("LossScaleHistogram", versions=1, domain=AI_GRAPHCORE)
class LossScaleHistogram(Op):
    """stats += (1, upper-bin count, element count); finite = no gradient overflowed."""

    public = False  # added by the automatic loss scaling pass only
    modifies_inputs = (0,)
    foldable = False

    @dataclass(frozen=True)
    class Attrs:
        bin_edge_location: float = 1.0

    def infer(self, stats, *gradients):
        _check_stats(self, stats)
        if not gradients or any(g is None or not g.dtype.is_float for g in gradients):
            raise ShapeError(f"{self.debug_name}: needs one or more float gradients, got "
                             f"{list(gradients)}.")
        return TensorInfo(DataType.BOOL, ())

    def kernel(self, stats, *gradients):
        upper, total, finite = 0.0, 0.0, True
        for g in gradients:
            edge = self.attrs.bin_edge_location * torch.finfo(g.dtype).max
            magnitude = g.detach().abs().float()
            overflowed = ~torch.isfinite(magnitude)
            finite = finite and not bool(overflowed.any())
            upper += float(((magnitude >= edge) | overflowed).sum())
            total += g.numel()
        stats[0] += 1.0
        stats[1] += upper
        stats[2] += total
        return torch.tensor(finite)


@register_op("LossScaleUpdate", versions=1, domain=AI_GRAPHCORE)
class LossScaleUpdate(Op):
    """scale' = scale / 2 when the gradients' upper-bin share exceeds the threshold, else 2x."""

    modifies_inputs = (0, 1)
    foldable = False

    @dataclass(frozen=True)
    class Attrs:
        threshold_upper_count_proportion: float = 1e-7
        update_period: int = 1
        factor: float = 2.0
        min_scale: float = 1.0
        max_scale: float = 2.0**15

    def infer(self, scale, stats, finite):
        if scale.nelms != 1 or not scale.dtype.is_float:
            raise ShapeError(f"{self.debug_name}: the loss scale must be a float scalar, got "
                             f"{scale}.")
        _check_stats(self, stats)
        return scale

    def kernel(self, scale, stats, finite):
        a = self.attrs
        if float(stats[0]) >= a.update_period:
            share = float(stats[1]) / max(float(stats[2]), 1.0)
            factor = 1.0 / a.factor if share > a.threshold_upper_count_proportion else a.factor
            scale.mul_(factor).clamp_(a.min_scale, a.max_scale)
            stats.zero_()
        return scale
