"""The SGD updates that end a step, run as one fused in-place kernel after everything else.

A training step of a single micro-batch usually ends with one ``SGDUpdate`` per weight. Inside
a run they write through the run journal (ops/state_journal.py): each first write goes to a
spare buffer, which keeps a failed run from changing state but costs a pass over cold memory
per weight and per state tensor. When those updates are the last steps of the run, nothing
after them can fail but the anchor writes; so the run loop (``SimulatedDevice._run_one``) runs
the other steps, writes the anchors, and only then updates every weight in place with one
``torch._fused_sgd_`` call: one pass over each weight, gradient and velocity, and no Python
per weight. A call either raises before writing (its argument checks) or completes, so a run
that fails anywhere still changes no state.

``UpdateTail.of(plan, held)`` finds the trailing updates that qualify (float32 SGD with
momentum, no velocity scaling, dampening, gradient factor, clipping, stochastic rounding,
overflow skipping, step counter or kernel checks; the weights, velocities and updated weights
not read by an anchor or kept after the run); ``bind(values)`` reads this run's
hyper-parameters and returns the call, or None when the updates differ in them (then the tail
runs as ordinary steps, before the anchor writes, as any other run).

Before:  steps = [..., SGDUpdate(w1, g1, v1, lr, mm), SGDUpdate(w2, g2, v2, lr, mm)]
After:   body = [...]; after the anchors: _fused_sgd_([w1, w2], [g1, g2], [v1, v2], lr, mm)
"""

from __future__ import annotations

import torch

from ..dtypes import DataType
from ..ops.optimizer_updates import SGDUpdate
from ..ops.rounding import generic_rounding

# SGDUpdate inputs: weight, gradient, velocity, step, clip factor, then the dynamic ones.
_WEIGHT, _GRAD, _VELOCITY, _STEP, _CLIP = range(5)
_FUSED_DYNAMIC = frozenset({"lr", "momentum", "weight_decay"})


def _qualifies(op, ins) -> bool:
    if type(op) is not SGDUpdate or len(ins) < 5:
        return False
    settings, attrs = op.settings, op.attrs
    checks = settings.checks
    if (settings.stochastic_rounding or settings.skip_on_overflow or generic_rounding(op)
            or checks.floating_point or checks.alias or checks.modify):
        return False
    if ins[_VELOCITY] < 0 or ins[_STEP] >= 0 or ins[_CLIP] >= 0 or ins[_WEIGHT] < 0:
        return False
    if not set(attrs.dynamic) <= _FUSED_DYNAMIC or attrs.grad_scale != 1.0:
        return False
    if attrs.dampening != 0.0 or attrs.velocity_scaling != 1.0 or attrs.nesterov not in (0, 1):
        return False
    return all(op.inputs[i] is not None and op.inputs[i].info.dtype is DataType.FLOAT
               for i in (_WEIGHT, _GRAD, _VELOCITY))


class UpdateTail:
    """The trailing SGD updates of a plan's Normal fragment (module doc)."""

    __slots__ = (
        "_dynamic",
        "_frees",
        "_grads",
        "_ops",
        "_outs",
        "_velocities",
        "_weights",
        "body",
        "steps",
    )

    def __init__(self, body: list[tuple], steps: list[tuple]):
        self.body, self.steps = body, steps
        self._ops = [step[5] for step in steps]
        self._weights = [step[1][_WEIGHT] for step in steps]
        self._grads = [step[1][_GRAD] for step in steps]
        self._velocities = [step[1][_VELOCITY] for step in steps]
        self._outs = [step[2] for step in steps]
        self._frees = [s for step in steps for s in step[4]]
        # Per op: (name, slot) of each dynamic hyper-parameter.
        self._dynamic = [tuple(zip(op.attrs.dynamic, step[1][5:]))
                         for op, step in zip(self._ops, steps)]

    @classmethod
    def of(cls, steps: list[tuple], held: set[int]) -> UpdateTail | None:
        """The tail of ``steps`` (a Normal fragment) or None; ``held``: slots the tail must not
        touch, as something reads them after the steps (anchors, kept tensors, views)."""
        start = len(steps)
        while start > 0:
            step = steps[start - 1]
            if not (step[3] and _qualifies(step[5], step[1])):
                break
            start -= 1
        tail = steps[start:]
        if not tail:
            return None
        touched = {s for step in tail for s in (*step[1], step[2]) if s >= 0}
        if touched & held or len({step[1][_WEIGHT] for step in tail}) != len(tail):
            return None
        return cls(steps[:start], tail)

    def bind(self, values: list):
        """This run's fused update of ``values`` (a no-argument callable), or None when the
        updates' hyper-parameters differ (the steps then run as they are)."""
        first = None
        read: dict[int, float] = {}  # each scalar slot read once (the updates share them)
        for op, dynamic in zip(self._ops, self._dynamic):
            const = op.attrs
            h = {"lr": const.lr, "momentum": const.momentum, "weight_decay": const.weight_decay}
            for name, slot in dynamic:
                value = read.get(slot)
                if value is None:
                    value = read[slot] = float(values[slot])
                h[name] = value
            key = (h["lr"], h["momentum"], h["weight_decay"], const.nesterov)
            if first is None:
                first = key
            elif key != first:
                return None
        lr, momentum, weight_decay, nesterov = first
        if momentum == 0.0:
            return None  # SGDUpdate then keeps the gradient as its velocity
        weights = [values[s] for s in self._weights]
        grads = [values[s] for s in self._grads]
        velocities = [values[s] for s in self._velocities]
        for w, g, v in zip(weights, grads, velocities):
            if not (g.shape == w.shape == v.shape and g.dtype is w.dtype is v.dtype
                    is torch.float32):
                return None

        def update() -> None:
            torch._fused_sgd_(weights, grads, velocities, weight_decay=weight_decay,
                              momentum=momentum, lr=lr, dampening=0.0,
                              nesterov=bool(nesterov), maximize=False, is_first_step=False)
            for out, w in zip(self._outs, weights):
                values[out] = w
            for s in self._frees:
                values[s] = None

        return update
