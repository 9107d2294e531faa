"""Pass: a gradient ``Sum`` of ``SliceGrad``s that tile one axis becomes one ``Concat``.

A tensor split into pieces along an axis (``q, k, v = qkv.split(d, -1)``: three Slices of one
tensor) gets, from autodiff, one SliceGrad per piece - each a zero-filled tensor of the full
shape with its piece written in - and a Sum of them. When the pieces are unit-step slices of
one axis that do not overlap and cover it, the sum is exactly the pieces side by side: one
Concat, with no zero fills and no additions (torch's autograd does the same for ``split``).

Before:  g0 = SliceGrad(d0, shape=[8,128,768], starts=[0],   ends=[256], axes=[2])
         g1 = SliceGrad(d1, shape=[8,128,768], starts=[256], ends=[512], axes=[2])
         g2 = SliceGrad(d2, shape=[8,128,768], starts=[512], ends=[768], axes=[2])
         Gradient___qkv = Sum(g2, g1, g0)
After:   Gradient___qkv = Concat(d0, d1, d2, axis=2)

It fires only when every SliceGrad output is read by the Sum alone (and is not an anchor),
every piece has the Sum's dtype, and all ops share placement (IPU, stage, phase, context).
Values are unchanged: each element of the sum is one piece's element plus zeros.
"""

from __future__ import annotations

import dataclasses

from ..ir.ir import Ir
from ..ops.registry import create_op
from .fuse_common import only_consumer, replace_chain, same_placement

__all__ = ["FuseSliceGradSum"]


def _piece(op, shape) -> tuple[int, int, int] | None:
    """(axis, start, end) of a SliceGrad writing one unit-step range of one axis, else None."""
    if op.op_type != "SliceGrad" or tuple(op.attrs.shape) != tuple(shape):
        return None
    index = op.index
    ranged = [(axis, s) for axis, s in enumerate(index) if s != slice(None)]
    if op.flip or len(ranged) != 1:
        return None
    axis, s = ranged[0]
    start, stop, step = s.indices(shape[axis])
    if step != 1 or stop <= start:
        return None
    return axis, start, stop


class FuseSliceGradSum:
    """Pass: Sum(SliceGrad ...) tiling one axis -> Concat (module doc)."""

    name = "fuse_slice_grad_sum"

    def run(self, ir: Ir) -> bool:
        graph = ir.main
        changed = False
        for op in list(graph.ops.values()):
            if op.id in graph.ops and op.op_type == "Sum" and op.domain == "ai.onnx":
                changed |= self._fuse(graph, op)
        return changed

    def _fuse(self, graph, total) -> bool:
        out = total.outputs[0]
        if len(total.inputs) < 2 or any(t is None for t in total.inputs):
            return False
        if len(set(t.id for t in total.inputs)) != len(total.inputs):
            return False
        pieces = []
        for t in total.inputs:
            grad = t.producer
            if grad is None or only_consumer(t) is not total or t.info != out.info:
                return False
            where = _piece(grad, out.info.shape)
            if where is None or grad.inputs[0].info.dtype != out.info.dtype:
                return False
            pieces.append((where, grad))
        axes = {axis for (axis, _, _), _ in pieces}
        if len(axes) != 1:
            return False
        axis = axes.pop()
        pieces.sort(key=lambda p: p[0][1])
        position = 0
        for (_, start, stop), _ in pieces:
            if start != position:
                return False
            position = stop
        if position != out.info.shape[axis]:
            return False
        chain = [grad for _, grad in pieces] + [total]
        if not same_placement(chain):
            return False
        concat = create_op("Concat", {"axis": axis}, dataclasses.replace(total.settings),
                           where=out.id)
        replace_chain(graph, chain, concat, [grad.inputs[0].id for _, grad in pieces], out)
        return True
