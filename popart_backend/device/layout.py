"""Memory layouts of an execution plan: channels-last activations for 2-D convolutions.

oneDNN runs a float32 2-D convolution (and its backward) on channels-last ([N, H, W, C] in
memory) tensors directly; on contiguous [N, C, H, W] tensors it reorders the input, output and
gradients to its own layout and back around every call. A convolution network whose
activations stay channels-last from one convolution to the next skips those reorders (about a
fifth of a ResNet training step on one core). Layouts never change values: a tensor keeps its
shape, only its strides differ.

``plan_layouts`` decides, at plan time, over the plan's steps in order:

- a convolution (``Op.channels_last_inputs``) gets those inputs channels-last when they are
  float32 and 4-D (a no-op when they already are; else one copy, e.g. of the image input,
  into a buffer the step keeps and rewrites each call, so a steady step allocates none: each
  step reading the image copies it, the convolution and its weight gradient both);
- an op declaring ``Op.strided_inputs`` (its kernel is correct for any strides: torch's
  elementwise, normalisation, reduction and convolution kernels) takes what it is given, and
  every 4-D output of such an op with a channels-last input is taken to be channels-last (a
  superset of what torch produces, which is what the safety of the next rule needs);
- any other op gets those of its inputs that may be channels-last made contiguous first
  (``Tensor.contiguous``, free when the tensor already is), so kernels that view or hand out
  raw memory see the layout they always saw; so do collectives and the host: a kept output
  (anchor, body output) or a collective's input that may be channels-last is made contiguous
  by the step that produces it.

The static memory plan (arena.py) gives a channels-last view of its arena to an into-kernel
output taken to be channels-last, so ``out=`` kernels keep the layout. A 2-D convolution's
weights are handed to oneDNN channels-last as well, from one kept copy per weight
(``ops/conv.channels_last_weight``); gradients of weights leave their op contiguous, as the
weights (``torch._fused_sgd_`` reads raw memory and needs equal strides).

BatchNorm's backward stays channels-last although torch's channels-last kernel is slower than
its contiguous one at these channel counts (16-64: its input-gradient loop runs per pixel over C
values; its statistics loop is fast). Measured on the CNN and ResNet steps, both ways around it
cost more: converting dY and X to contiguous and dX back (three copies), or building dX from the
kernel's reductions and widened multiply-adds (two more memory passes). ``enabled`` (module flag)
turns channels-last off, for tests comparing both.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from ..dtypes import DataType
from ..ir.op import Op

__all__ = ["StepLayout", "enabled", "plan_layouts", "with_layouts"]

# Testing switch: False keeps every tensor contiguous, as before channels-last plans.
enabled = True

_CL = torch.channels_last


@dataclass
class StepLayout:
    """What one step does about layouts: input positions to make channels-last or contiguous,
    output positions to make contiguous (kept or read by a collective)."""

    to_channels_last: tuple[int, ...] = ()
    to_contiguous: tuple[int, ...] = ()
    contiguous_outputs: tuple[int, ...] = ()
    # The op neither aliases nor writes its inputs: its channels-last copies may be written
    # into buffers the step keeps for its next call (no allocation per step).
    reuse_copies: bool = False

    @property
    def active(self) -> bool:
        return bool(self.to_channels_last or self.to_contiguous or self.contiguous_outputs)


@dataclass
class Layouts:
    """Per step (plan order) its ``StepLayout``; ``channels_last``: the slots taken to hold a
    channels-last tensor."""

    steps: list[StepLayout] = field(default_factory=list)
    channels_last: set[int] = field(default_factory=set)


def _is_4d_float(op_tensor) -> bool:
    info = op_tensor.info
    return info.rank == 4 and info.dtype is DataType.FLOAT and 0 not in info.shape


def plan_layouts(raw_steps: list[tuple[Op, tuple, tuple]], keep: set[int]) -> Layouts:
    """The layouts of ``raw_steps`` ((op, input slots, output slots) in plan order); ``keep``
    are the slots read after the run (see the module doc)."""
    n = len(raw_steps)
    if not enabled or not any(op.channels_last_inputs for op, _i, _o in raw_steps):
        return Layouts([StepLayout() for _ in range(n)])
    cl: set[int] = set()
    steps: list[StepLayout] = []
    for op, ins, outs in raw_steps:
        layout = StepLayout()
        if not op.strided_inputs or op.collective:
            layout.to_contiguous = tuple(i for i, s in enumerate(ins) if s >= 0 and s in cl)
            steps.append(layout)
            continue
        wanted = ()
        if not op.settings.half_partials:
            wanted = tuple(i for i in op.channels_last_inputs
                           if i < len(ins) and ins[i] >= 0 and ins[i] not in cl
                           and _is_4d_float(op.inputs[i]))
        layout.to_channels_last = wanted
        layout.reuse_copies = bool(wanted) and not (op.aliases_inputs or op.modifies_inputs)
        if wanted or any(s >= 0 and s in cl for s in ins):
            for s, t in zip(outs, op.outputs):
                if s >= 0 and t is not None and t.info.rank == 4:
                    cl.add(s)
        steps.append(layout)
    # Kept values and collective inputs leave the plan contiguous: the producer makes them so.
    boundary = set(keep)
    for op, ins, _outs in raw_steps:
        if op.collective:
            boundary.update(s for s in ins if s >= 0)
    for (op, _ins, outs), layout in zip(raw_steps, steps):
        layout.contiguous_outputs = tuple(j for j, s in enumerate(outs)
                                          if s >= 0 and s in cl and s in boundary)
    return Layouts(steps, cl)


def with_layouts(kernel, layout: StepLayout, offset: int, single: bool):
    """``kernel`` with ``layout`` applied; ``offset``: leading arguments that are not op inputs
    (an into-kernel's output buffer)."""
    to_cl = tuple(i + offset for i in layout.to_channels_last)
    to_contiguous = tuple(i + offset for i in layout.to_contiguous)
    outputs = layout.contiguous_outputs
    copies = _CopyBuffers() if layout.reuse_copies else None

    def run(*xs):
        if to_cl or to_contiguous:
            xs = list(xs)
            for i in to_cl:
                xs[i] = (xs[i].contiguous(memory_format=_CL) if copies is None
                         else copies.channels_last(i, xs[i]))
            for i in to_contiguous:
                if xs[i] is not None:
                    xs[i] = xs[i].contiguous()
        result = kernel(*xs)
        if not outputs:
            return result
        if single:
            return result.contiguous()
        result = list(result)
        for j in outputs:
            if result[j] is not None:
                result[j] = result[j].contiguous()
        return tuple(result)

    return run


class _CopyBuffers(threading.local):
    """One step's channels-last copies of its inputs (e.g. the image a convolution reads), each
    written into a buffer the step allocates at its first call and rewrites at every later
    one, per thread. The copy is read during the call only (the op neither aliases nor writes
    its inputs, ``StepLayout.reuse_copies``), so the next call may overwrite it."""

    def __init__(self):
        self.buffers: dict[int, torch.Tensor] = {}

    def channels_last(self, position: int, x: torch.Tensor) -> torch.Tensor:
        if x.is_contiguous(memory_format=_CL):
            return x
        buffer = self.buffers.get(position)
        if buffer is None or buffer.shape != x.shape or buffer.dtype != x.dtype:
            with torch.inference_mode(False):  # a normal tensor: any later call may write it
                buffer = torch.empty_like(x, memory_format=_CL)
            self.buffers[position] = buffer
        return buffer.copy_(x)
