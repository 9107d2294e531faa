"""ONNX translations the frontend adds to torch's exporter for training semantics.

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
Translations for ATen ops torchlib cannot convert, or converts with other numbers than torch:

- ``aten.rrelu_with_noise_functional`` (``F.rrelu``, ``nn.RReLU``): in evaluation the fixed
  slope ``(lower + upper) / 2``; in training a slope drawn per negative element from
  ``U(lower, upper)`` by the device generator (``RandomUniformLike``, seeded like Dropout).
- ``aten.scatter_reduce.two``: "mean" (torchlib writes a plain scatter), and the gradients of
  "amin"/"amax", which torch shares evenly between the tied maxima/minima, and of "prod"
  (the product of the other values, zeros included). Those are written
  as ``Detach(result) + (L - Detach(L))`` where ``L`` is linear in ``self`` and ``src`` with
  torch's gradient weights: the forward values are the scatter's, the gradient is L's.
- ``aten.arange.start_step`` with mixed integer/float arguments (``torch.arange(1, 4.0)``):
  every argument is cast to the result dtype as torch computes it.
- ``aten.add.Tensor`` of two bool tensors: torch's result is the logical or.
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


def _rrelu_with_noise(self, noise, lower: float = 0.125, upper: float = 1.0 / 3.0,
                      training: bool = False, generator=None):
    """``F.rrelu``: returns (output, noise) as aten does; noise holds the slope used (1 where
    the input is positive)."""
    positive = op.Greater(self, _scalar(0.0, self))
    if training:
        slope = op.RandomUniformLike(self, low=float(lower), high=float(upper))
        noise = op.Where(positive, _scalar(1.0, self), op.CastLike(slope, self))
        return op.Mul(self, noise), noise
    out = op.Where(positive, self, op.Mul(self, _scalar((lower + upper) / 2.0, self)))
    return out, noise


_INTEGER_TYPES = {ir.DataType.INT8, ir.DataType.INT16, ir.DataType.INT32, ir.DataType.INT64,
                  ir.DataType.UINT8}


def _extreme(dtype, largest: bool):
    if dtype in _FLOAT_TYPES:
        return math.inf if largest else -math.inf
    info = torch.iinfo({ir.DataType.INT8: torch.int8, ir.DataType.INT16: torch.int16,
                        ir.DataType.INT32: torch.int32, ir.DataType.UINT8: torch.uint8}.get(
                            dtype, torch.int64))
    return info.max if largest else info.min


def _fill(value, like):
    """A tensor of ``like``'s shape and dtype filled with ``value``."""
    return op.Expand(op.CastLike(op.Constant(value_float=float(value)) if like.dtype in
                                 _FLOAT_TYPES else op.Constant(value_int=int(value)), like),
                     op.Shape(like))


def _scatter_reduce(self, dim: int, index, src, reduce: str, include_self: bool = True):
    """``aten.scatter_reduce.two`` with torch's values and gradients (see the module
    docstring). ``hits`` counts the sources written to each position of ``self``."""
    scalar_self = len(self.shape) == 0
    if scalar_self:
        flat = op.Constant(value_ints=[-1])
        self, index, src = op.Reshape(self, flat), op.Reshape(index, flat), op.Reshape(src, flat)
    hits = op.ScatterElements(_fill(0, self), index, _fill(1, src), axis=dim, reduction="add")
    scattered = op.Greater(hits, _fill(0, hits))
    onnx_reduce = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min",
                   "mean": "add"}[reduce]
    base = self
    if not include_self:
        neutral = {"add": 0, "mul": 1, "max": _extreme(self.dtype, False),
                   "min": _extreme(self.dtype, True)}[onnx_reduce]
        base = op.Where(scattered, _fill(neutral, self), self)
    product_gradient = reduce == "prod" and self.dtype in _FLOAT_TYPES
    if product_gradient:
        # The product of detached values (the backend has no gradient of a "mul" scatter);
        # _product_gradient adds the gradient.
        result = op.ScatterElements(_GC.Detach(base), index, _GC.Detach(src), axis=dim,
                                    reduction="mul")
    else:
        result = op.ScatterElements(base, index, src, axis=dim, reduction=onnx_reduce)
    if reduce == "mean":
        count = hits if not include_self else op.Add(hits, _fill(1, hits))
        count = op.Max(count, _fill(1, count))
        if self.dtype in _FLOAT_TYPES:
            mean = op.Div(result, count)
        else:  # torch floors the integer mean
            as_float = op.Div(op.Cast(result, to=ir.DataType.DOUBLE),
                              op.Cast(count, to=ir.DataType.DOUBLE))
            mean = op.CastLike(op.Floor(as_float), self)
        result = mean if include_self else op.Where(scattered, mean, self)
    elif reduce in ("amax", "amin") and self.dtype in _FLOAT_TYPES:
        result = _shared_extreme_gradient(self, dim, index, src, result, include_self,
                                          scattered)
    elif product_gradient:
        result = _product_gradient(self, dim, index, src, result, include_self, scattered)
    if scalar_self:
        result = op.Reshape(result, op.Constant(value_ints=[]))
    return result


def _shared_extreme_gradient(self, dim, index, src, result, include_self, scattered):
    """``result`` with torch's amax/amin gradient: the incoming gradient of a position is
    divided by the number of values (self's and the sources') equal to its result."""
    fixed = _GC.Detach(result)
    value = op.GatherElements(fixed, index, axis=dim)
    self_is = op.CastLike(op.Equal(_GC.Detach(self), fixed), self)
    src_is = op.CastLike(op.Equal(_GC.Detach(src), value), src)
    ties = op.ScatterElements(self_is, index, src_is, axis=dim, reduction="add")
    self_weight = op.Div(self_is, ties)
    if not include_self:
        self_weight = op.Where(scattered, _fill(0, self), self_weight)
    src_weight = op.Div(src_is, op.GatherElements(ties, index, axis=dim))
    linear = op.Add(op.Mul(self, self_weight),
                    op.ScatterElements(_fill(0, self), index, op.Mul(src, src_weight),
                                       axis=dim, reduction="add"))
    return op.Add(fixed, op.Sub(linear, _GC.Detach(linear)))


def _product_gradient(self, dim, index, src, result, include_self, scattered):
    """``result`` with torch's "prod" gradient, zeros included: a value's gradient weight is
    the product of the other values reduced into its position (self's too with
    ``include_self``), computed without dividing by a zero."""
    fixed = result
    base, source = _GC.Detach(self), _GC.Detach(src)
    src_zero = op.Equal(source, _fill(0, source))
    nonzero_src = op.Where(src_zero, _fill(1, source), source)
    if include_self:
        self_zero = op.Equal(base, _fill(0, base))
        zeros_base = op.CastLike(self_zero, base)
        product_base = op.Where(self_zero, _fill(1, base), base)
        self_weight = op.ScatterElements(_fill(1, base), index, source, axis=dim,
                                         reduction="mul")
    else:
        zeros_base, product_base = _fill(0, base), _fill(1, base)
        self_weight = op.Where(scattered, _fill(0, base), _fill(1, base))
    # Per position: how many of its values are zero, and the product of the non-zero ones.
    zeros = op.GatherElements(op.ScatterElements(zeros_base, index, op.CastLike(src_zero, base),
                                                 axis=dim, reduction="add"), index, axis=dim)
    product = op.GatherElements(op.ScatterElements(product_base, index, nonzero_src, axis=dim,
                                                   reduction="mul"), index, axis=dim)
    none = op.Equal(zeros, _fill(0, zeros))
    one = op.Equal(zeros, _fill(1, zeros))
    src_weight = op.Where(src_zero, op.Where(one, product, _fill(0, product)),
                          op.Where(none, op.Div(product, nonzero_src), _fill(0, product)))
    linear = op.Add(op.Mul(self, self_weight),
                    op.ScatterElements(_fill(0, self), index, op.Mul(src, src_weight),
                                       axis=dim, reduction="add"))
    return op.Add(fixed, op.Sub(linear, _GC.Detach(linear)))


def _is_integral(value) -> bool:
    if isinstance(value, (int, float)):
        return isinstance(value, int)
    return value.dtype in _INTEGER_TYPES


_TORCH_DTYPES = {ir.DataType.FLOAT: torch.float32, ir.DataType.FLOAT16: torch.float16,
                 ir.DataType.DOUBLE: torch.float64, ir.DataType.BFLOAT16: torch.bfloat16,
                 ir.DataType.INT64: torch.int64, ir.DataType.INT32: torch.int32,
                 ir.DataType.INT16: torch.int16, ir.DataType.INT8: torch.int8,
                 ir.DataType.UINT8: torch.uint8}


def _arange_start_step(start, end, step=1, dtype: int = -1, layout: str = "",
                       device: str = "", pin_memory: bool = False):
    """``torch.arange(start, end, step)`` with torch's dtype rule: integer only when every
    argument is. Python-number arguments (the usual case) are evaluated by torch itself, so
    the length and values are exactly torch's; tensor arguments are cast to the result
    dtype (float arithmetic for mixed ones)."""
    integral = all(_is_integral(v) for v in (start, end, step))
    if dtype is None or dtype == -1:
        dtype = ir.DataType.INT64 if integral else ir.DataType.FLOAT
    dtype = ir.DataType(dtype)
    if all(isinstance(v, (int, float)) for v in (start, end, step)) and dtype in _TORCH_DTYPES:
        values = torch.arange(start, end, step, dtype=_TORCH_DTYPES[dtype])
        return op.Constant(value=ir.tensor(values.numpy()))
    compute = ir.DataType.INT64 if integral else ir.DataType.FLOAT
    first, last, delta = (op.Cast(v if not isinstance(v, (int, float)) else
                                  op.Constant(value_float=float(v)), to=compute)
                          for v in (start, end, step))
    return op.Cast(op.Range(first, last, delta), to=dtype)


def _arange_start(start, end, dtype: int = -1, layout: str = "", device: str = "",
                  pin_memory: bool = False):
    return _arange_start_step(start, end, 1, dtype, layout, device, pin_memory)


def _add(self, other, alpha: float = 1.0):
    """``aten.add.Tensor``; two bool tensors give their logical or, as in torch."""
    if self.dtype == ir.DataType.BOOL and other.dtype == ir.DataType.BOOL:
        return op.Or(self, other)
    if alpha != 1.0:
        other = op.Mul(other, op.CastLike(op.Constant(value_float=float(alpha)), other))
    return op.Add(self, other)


_register_schemas()


def translation_table() -> dict:
    return {torch.ops.aten.embedding.default: _embedding,
            torch.ops.aten.cross_entropy_loss.default: _cross_entropy,
            torch.ops.aten.rrelu_with_noise_functional.default: _rrelu_with_noise,
            torch.ops.aten.scatter_reduce.two: _scatter_reduce,
            torch.ops.aten.arange.start_step: _arange_start_step,
            torch.ops.aten.arange.start: _arange_start,
            torch.ops.aten.add.Tensor: _add}
