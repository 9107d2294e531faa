"""In-place accumulator ops of gradient accumulation: ai.graphcore
``Accumulate`` and ``AccumulatorScale``.

Both write their first input's storage (``modifies_inputs = (0,)``) and return it, so the
output aliases the accumulator variable (docs/training.md). The gradient-accumulation pass adds
them; they never come from a model.

- ``Accumulate(accum, update[, count])``: ``Add`` sums ``accum += update``; ``Mean`` keeps a
  running mean, ``accum += (update - accum) / (count + 1)``, where ``count`` is the number of
  updates accumulated before this one (the Running mean-reduction strategy).
- ``AccumulatorScale(accum)``: ``accum *= factor``; factor 0 resets it to zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ShapeError
from ..ir.op import Op
from .registry import AI_GRAPHCORE, register_op

ACCUMULATION_TYPES = ("Add", "Mean")


@register_op("Accumulate", versions=1, domain=AI_GRAPHCORE)
class Accumulate(Op):
    """accum += update (Add), or the running mean of the updates so far (Mean)."""

    modifies_inputs = (0,)
    foldable = False

    @dataclass(frozen=True)
    class Attrs:
        accumulation_type: str = "Add"

    def infer(self, accum, update, count=None):
        kind = self.attrs.accumulation_type
        if kind not in ACCUMULATION_TYPES:
            raise ShapeError(
                f"{self.debug_name}: accumulation_type '{kind}' is not one of "
                f"{list(ACCUMULATION_TYPES)}."
            )
        if update.shape != accum.shape or not (update.dtype.is_float and accum.dtype.is_float):
            raise ShapeError(
                f"{self.debug_name}: the update {update} must have the accumulator's shape "
                f"{accum}, both floating point."
            )
        if (kind == "Mean") != (count is not None):
            raise ShapeError(
                f"{self.debug_name}: a Mean accumulation reads a count input and an Add "
                f"accumulation none; accumulation_type is '{kind}', count is "
                f"{'absent' if count is None else count}."
            )
        if count is not None and (count.rank != 0 or not count.dtype.is_float):
            raise ShapeError(
                f"{self.debug_name}: the count {count} must be a floating-point scalar."
            )
        return accum

    def kernel(self, accum, update, count=None):
        # The accumulator may be narrower than the gradient (accumType): add_ rounds into it.
        if count is None:
            return accum.add_(update)
        update = update.to(accum.dtype)
        # lerp_ is accum + w·(update − accum) in one pass, without temporaries of accum's size.
        return accum.lerp_(update, (count + 1.0).reciprocal().to(accum.dtype))


@register_op("AccumulatorScale", versions=1, domain=AI_GRAPHCORE)
class AccumulatorScale(Op):
    """accum *= factor; factor 0 zeroes it (the reset after each weight update)."""

    modifies_inputs = (0,)
    foldable = False

    @dataclass(frozen=True)
    class Attrs:
        factor: float = 0.0

    def infer(self, accum):
        if not accum.dtype.is_float:
            raise ShapeError(f"{self.debug_name}: the accumulator {accum} must be floating point.")
        return accum

    def kernel(self, accum):
        if self.attrs.factor == 0.0:
            return accum.zero_()
        return accum.mul_(self.attrs.factor)

