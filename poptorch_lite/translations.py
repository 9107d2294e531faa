"""ONNX translations the frontend adds to torch's exporter for training semantics (spec §4.3).

ONNX has no notion of "no gradient here", but the backend differentiates the whole graph, so
ATen ops whose *backward* differs from the derivative of their forward get a translation that
keeps the forward values and stops the gradient with ``ai.graphcore::Detach``:

- ``aten.embedding`` with ``padding_idx``: torch gives the padding row no gradient
  (``nn.Embedding(padding_idx=...)``, e.g. BERT's word embeddings); the table is read through
  ``Where(row == padding_idx, Detach(weight), weight)``.

Translations that replace torchlib's where it drops an argument (an argument we accept has its
effect, forward and gradient):

- ``aten.cross_entropy_loss``: torchlib emits ``SoftmaxCrossEntropyLoss`` without
  ``label_smoothing`` and with probability targets as if they were class indices. Smoothing and
  probability targets are written out as torch computes them (``LossNLL.cpp``): for class
  indices ``(1 - ε)·nll + ε/C · reduce(-Σ_c w_c·logp_c)`` (ignored positions 0, the mean divided
  like the NLL term: by Σ w[target] of the kept positions), for probabilities
  ``reduce(-Σ_c w_c·logp_c·t'_c)`` with ``t' = t·(1 - ε) + ε/C`` and the mean over the positions.
"""

from __future__ import annotations

import math

import onnx
import onnx.defs
import torch
from onnxscript import ir
from onnxscript import opset18 as op
from onnxscript import values as onnxscript_values

__all__ = ["translation_table"]

GRAPHCORE = "ai.graphcore"
_GC = onnxscript_values.Opset(GRAPHCORE, 1)


def _register_schemas() -> None:
    if onnx.defs.has("Detach", GRAPHCORE):
        return
    formal = onnx.defs.OpSchema.FormalParameter
    onnx.defs.register_schema(onnx.defs.OpSchema(
        "Detach", GRAPHCORE, 1, inputs=[formal("x", "T")], outputs=[formal("y", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(double)"], "")]))


def _embedding(weight, indices, padding_idx: int = -1, scale_grad_by_freq: bool = False,
               sparse: bool = False):
    if padding_idx is not None and padding_idx >= 0:
        rows = op.Range(op.Constant(value_int=0),
                        op.Squeeze(op.Slice(op.Shape(weight), op.Constant(value_ints=[0]),
                                            op.Constant(value_ints=[1]))),
                        op.Constant(value_int=1))
        is_pad = op.Unsqueeze(op.Equal(rows, op.Constant(value_int=padding_idx)),
                              op.Constant(value_ints=[1]))
        weight = op.Where(is_pad, _GC.Detach(weight), weight)
    return op.Gather(weight, indices, axis=0)


_FLOAT_TYPES = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16}
_REDUCTION_NAMES = {0: "none", 1: "mean", 2: "sum"}  # aten's Reduction enum


def _scalar(value: float, like):
    return op.CastLike(op.Constant(value_float=float(value)), like)


def _cross_entropy(self, target, weight=None, reduction: int = 1, ignore_index: int = -100,
                   label_smoothing: float = 0.0):
    """``aten.cross_entropy_loss`` with every argument (see the module docstring); the plain
    class-index case stays one fused ``SoftmaxCrossEntropyLoss``."""
    reduction_name = _REDUCTION_NAMES[reduction]
    probabilities = target.dtype in _FLOAT_TYPES
    if not probabilities and not label_smoothing:
        loss, _ = op.SoftmaxCrossEntropyLoss(self, target, weight, reduction=reduction_name,
                                             ignore_index=ignore_index)
        return loss
    shape = [int(size) for size in self.shape]  # static: read before any op below
    unbatched = len(shape) == 1  # [C] scores with a 0-d class index or [C] probabilities
    if unbatched:
        self = op.Unsqueeze(self, op.Constant(value_ints=[0]))
        target = op.Unsqueeze(target, op.Constant(value_ints=[0]))
        shape = [1, *shape]
    rank, classes = len(shape), shape[1]
    class_axis = op.Constant(value_ints=[1])
    logp = op.LogSoftmax(self, axis=1)
    weighted = logp
    if weight is not None:
        weighted = op.Mul(logp, op.Reshape(weight, op.Constant(
            value_ints=[1, classes] + [1] * (rank - 2))))
    if probabilities:
        if label_smoothing:
            target = op.Add(op.Mul(target, _scalar(1.0 - label_smoothing, target)),
                            _scalar(label_smoothing / classes, target))
        per_position = op.Neg(op.ReduceSum(op.Mul(weighted, target), class_axis, keepdims=0))
        if reduction_name == "none":
            loss = per_position
        else:
            loss = op.ReduceSum(per_position, keepdims=0)
            if reduction_name == "mean":
                loss = op.Div(loss, _scalar(math.prod(shape) // classes, loss))
    else:
        nll = op.NegativeLogLikelihoodLoss(logp, target, weight, reduction=reduction_name,
                                           ignore_index=ignore_index)
        keep = op.Not(op.Equal(target, op.CastLike(op.Constant(value_int=ignore_index), target)))
        zero = _scalar(0.0, logp)
        smooth = op.Where(keep, op.Neg(op.ReduceSum(weighted, class_axis, keepdims=0)), zero)
        if reduction_name == "none":
            smooth_loss = smooth
        else:
            smooth_loss = op.ReduceSum(smooth, keepdims=0)
            if reduction_name == "mean":
                if weight is None:
                    kept = op.CastLike(keep, logp)
                else:
                    safe = op.Where(keep, target, op.CastLike(op.Constant(value_int=0), target))
                    kept = op.Where(keep, op.Gather(weight, safe, axis=0), zero)
                smooth_loss = op.Div(smooth_loss, op.ReduceSum(kept, keepdims=0))
        loss = op.Add(op.Mul(nll, _scalar(1.0 - label_smoothing, nll)),
                      op.Mul(smooth_loss, _scalar(label_smoothing / classes, smooth_loss)))
    if unbatched and reduction_name == "none":
        loss = op.Squeeze(loss, op.Constant(value_ints=[0]))
    return loss


_register_schemas()


def translation_table() -> dict:
    return {torch.ops.aten.embedding.default: _embedding,
            torch.ops.aten.cross_entropy_loss.default: _cross_entropy}
