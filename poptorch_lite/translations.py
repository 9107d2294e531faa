"""ONNX translations the frontend adds to torch's exporter for training semantics (spec §4.3).

ONNX has no notion of "no gradient here", but the backend differentiates the whole graph, so
ATen ops whose *backward* differs from the derivative of their forward get a translation that
keeps the forward values and stops the gradient with ``ai.graphcore::Detach``:

- ``aten.embedding`` with ``padding_idx``: torch gives the padding row no gradient
  (``nn.Embedding(padding_idx=...)``, e.g. BERT's word embeddings); the table is read through
  ``Where(row == padding_idx, Detach(weight), weight)``.
"""

from __future__ import annotations

import onnx
import onnx.defs
import torch
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


_register_schemas()


def translation_table() -> dict:
    return {torch.ops.aten.embedding.default: _embedding}
