"""Pass: a trained SoftmaxCrossEntropyLoss computes its softmax once, in the forward.

Unfused, the loss forward computes the log-softmax of the scores (a temporary the size of the
scores: 206 MB for a GPT-2 LM head over 1024 tokens) only to read one value per row, and the
gradient computes the softmax of the same scores again. Fused, one Softmax writes P (an
ordinary activation, so it gets an arena buffer), the loss reads -log P at the labels, and the
gradient scales P in place into d scores: one pass over the scores fewer, and no temporary.

Before:  loss = SoftmaxCrossEntropyLoss(x, labels, w)
         dx   = SoftmaxCrossEntropyLossGrad(dloss, x, labels, w)
After:   p    = Softmax(x, axis=1)
         loss = SoftmaxCrossEntropyFromProbs(p, x, labels, w)   # x only for tiny P at a label
         dx   = SoftmaxCrossEntropyGradFromProbs(dloss, p, labels, w)   # writes p in place

It fires only for float32/float64 scores of rank 2 (the class axis 1 is then contiguous; a
float16 softmax would underflow at the label too often), a loss with one output (no
log-probabilities for anyone to read), a gradient without a log-probability gradient, the same
reduction and ignore_index on both ops, and the same placement (IPU, stage, phase,
recomputation, context). The gradient is numerically the same as unfused (the same softmax,
scaling and subtraction); the loss is -log P instead of the log-softmax at the label, equal to
a few float32 ulps, with labels whose P is below the smallest normal number taken from the
scores. With pipelining the loss and its gradient share the last stage, so P never crosses
stages; the phased and pipelined runs fuse as the plain one does and give the same numbers.
``enabled=False`` turns the pass off (tests comparing both).
"""

from __future__ import annotations

import dataclasses

from ..dtypes import DataType
from ..ir.ir import Ir
from ..ops.registry import AI_GRAPHCORE, create_op
from .fuse_common import replace_chain, same_placement

__all__ = ["FuseCrossEntropyGrad"]

_FLOAT_DTYPES = (DataType.FLOAT, DataType.DOUBLE)


class FuseCrossEntropyGrad:
    """Pass: SoftmaxCrossEntropyLoss + its gradient -> Softmax, loss from P, gradient over P
    in place (module doc)."""

    name = "fuse_grad_cross_entropy"

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def run(self, ir: Ir) -> bool:
        if not self.enabled:
            return False
        graph = ir.main
        changed = False
        for op in list(graph.ops.values()):
            if (op.id in graph.ops and op.op_type == "SoftmaxCrossEntropyLossGrad"
                    and op.domain == AI_GRAPHCORE):
                changed |= self._fuse(graph, op)
        return changed

    @staticmethod
    def _forward(grad):
        """The SoftmaxCrossEntropyLoss ``grad`` differentiates, when the fusion applies."""
        if len(grad.inputs) > 4 and grad.inputs[4] is not None:
            return None  # the log-probabilities have a gradient too
        dloss, scores, labels = grad.inputs[:3]
        weights = grad.inputs[3] if len(grad.inputs) > 3 else None
        if dloss is None or scores is None or labels is None:
            return None
        if scores.info.rank != 2 or scores.info.dtype not in _FLOAT_DTYPES:
            return None
        for loss in scores.consumers:
            if (loss.op_type != "SoftmaxCrossEntropyLoss" or loss.domain != "ai.onnx"
                    or loss.inputs[0] is not scores or loss.inputs[1] is not labels
                    or (loss.inputs[2] if len(loss.inputs) > 2 else None) is not weights):
                continue
            if any(t is not None for t in loss.outputs[1:]) or loss.outputs[0] is None:
                return None
            if (loss.attrs.reduction != grad.attrs.reduction
                    or loss.attrs.ignore_index != grad.attrs.ignore_index):
                return None
            return loss if same_placement([loss, grad]) else None
        return None

    def _fuse(self, graph, grad) -> bool:
        loss = self._forward(grad)
        if loss is None:
            return False
        dloss, scores, labels = grad.inputs[:3]
        weights = grad.inputs[3] if len(grad.inputs) > 3 else None
        weights_id = weights.id if weights is not None else ""
        attrs = {"reduction": loss.attrs.reduction, "ignore_index": loss.attrs.ignore_index}
        # The unfused loss always used the stable log-softmax: so does this softmax.
        softmax = create_op("Softmax", {"axis": 1},
                            dataclasses.replace(loss.settings, non_stable=False), version=13,
                            where=loss.debug_name)
        probs = graph.unique_id(scores.id + "/softmax")
        graph.add_op(softmax, [scores.id], [probs])
        forward = create_op("SoftmaxCrossEntropyFromProbs", attrs,
                            dataclasses.replace(loss.settings), domain=AI_GRAPHCORE,
                            where=loss.debug_name)
        replace_chain(graph, [loss], forward, [probs, scores.id, labels.id, weights_id],
                      loss.outputs[0])
        # Added after the loss reads P, so the graph schedules that read before the write.
        backward = create_op("SoftmaxCrossEntropyGradFromProbs", attrs,
                             dataclasses.replace(grad.settings), domain=AI_GRAPHCORE,
                             where=grad.debug_name)
        replace_chain(graph, [grad], backward, [dloss.id, probs, labels.id, weights_id],
                      grad.outputs[0])
        return True
