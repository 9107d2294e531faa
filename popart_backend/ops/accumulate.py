"""In-place accumulator ops of gradient accumulation: ai.graphcore
``Accumulate`` and ``AccumulatorScale``.

Both write their first input's storage (``modifies_inputs = (0,)``) and return it, so the
output aliases the accumulator variable (docs/training.md). The gradient-accumulation pass adds
them; they never come from a model.

- ``Accumulate(accum, update[, count])``: ``Add`` sums ``accum += update``; ``Mean`` keeps a
  running mean, ``accum += (update - accum) / (count + 1)``, where ``count`` is the number of
  updates accumulated before this one (the Running mean-reduction strategy).
- ``AccumulatorScale(accum)``: ``accum *= factor``; factor 0 resets it to zeros.

In a run's journal (ops/state_journal.py) the first write of an accumulator in the run goes out
of place into its ping-pong buffer (the same kernel with ``out=``, so the same numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ShapeError
from ..ir.op import Op
from .registry import AI_GRAPHCORE, register_op
from .state_journal import JournaledWrites

ACCUMULATION_TYPES = ("Add", "Mean")


@register_op("Accumulate", versions=1, domain=AI_GRAPHCORE)
class Accumulate(JournaledWrites, Op):
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
        return self.journaled_kernel(None, accum, update, count)

    def journaled_kernel(self, journal, accum, update, count=None):
        out = accum if journal is None else journal.spare_for(accum)
        # The accumulator may be narrower than the gradient (accumType): add rounds into it.
        if count is None:
            torch.add(accum, update, out=out)
        else:
            update = update.to(accum.dtype)
            # lerp is accum + w·(update − accum) in one pass, without temporaries.
            torch.lerp(accum, update, (count + 1.0).reciprocal().to(accum.dtype), out=out)
        if journal is not None:
            journal.settle(accum, out)
        return accum


@register_op("AccumulatorScale", versions=1, domain=AI_GRAPHCORE)
class AccumulatorScale(JournaledWrites, Op):
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
        return self.journaled_kernel(None, accum)

    def journaled_kernel(self, journal, accum):
        out = accum if journal is None else journal.spare_for(accum)
        if self.attrs.factor == 0.0:
            out.zero_()
        else:
            torch.mul(accum, self.attrs.factor, out=out)
        if journal is not None:
            journal.settle(accum, out)
        return accum

