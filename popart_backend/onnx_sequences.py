"""Static ONNX sequences: sequence ops resolved at import into ordinary tensor ops.

The torch exporter emits SplitToSequence / SequenceAt for ``torch.split`` and ``chunk``. The
simulated IPU has static shapes, so a sequence is a compile-time list of IR tensors: each
sequence op edits that list, reads an element (Identity of it) or concatenates it. Positions
and split sizes must therefore be constants; anything else raises with the reason.

Before:  s = SplitToSequence(x, [2, 2]) ; a = SequenceAt(s, 1)
After:   x_0, x_1 = Split(x, [2, 2])    ; a = Identity(x_1)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from .errors import ShapeError, UnsupportedOpError
from .ir.graph import Graph
from .ir.op import OpSettings
from .ops.registry import create_op
from .transforms.const_fold import try_fold

SEQUENCE_OPS = frozenset(
    {
        "SplitToSequence", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceInsert",
        "SequenceErase", "SequenceLength", "ConcatFromSequence",
    }
)


class StaticSequences:
    """Sequence values of one graph being imported, by ONNX name."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.values: dict[str, list[str]] = {}

    def handles(self, node: onnx.NodeProto) -> bool:
        return node.op_type in SEQUENCE_OPS and node.domain in ("", "ai.onnx")

    def is_sequence(self, name: str) -> bool:
        return name in self.values

    def add(self, node: onnx.NodeProto, attrs: dict, settings: OpSettings) -> None:
        where = f"{node.op_type} '{node.name or node.output[0]}'"
        handler = getattr(self, "_" + node.op_type)
        handler(node, attrs, settings, where)

    # --- helpers ------------------------------------------------------------------------------

    def _const(self, node: onnx.NodeProto, index: int, where: str):
        if index >= len(node.input) or not node.input[index]:
            return None
        tensor = self.graph.tensor(node.input[index])
        if not tensor.is_const:
            raise ShapeError(
                f"{where}: input {index} '{tensor.id}' must be a constant: sequences are resolved "
                f"at compile time on the simulated IPU (static shapes)."
            )
        return np.asarray(tensor.data)

    def _seq(self, name: str, where: str) -> list[str]:
        try:
            return self.values[name]
        except KeyError:
            raise UnsupportedOpError(
                f"{where}: '{name}' is not a sequence built by a sequence op of this graph."
            ) from None

    def _position(self, node, index, length, where, insert=False) -> int:
        value = self._const(node, index, where)
        if value is None:
            return length if insert else length - 1
        pos = int(value)
        hi = length if insert else length - 1
        if not -length <= pos <= hi:
            raise ShapeError(f"{where}: position {pos} is out of range for a sequence of {length}.")
        return pos + length if pos < 0 else pos

    def _op(self, op_type, inputs, outputs, settings, where, **attrs):
        op = create_op(op_type, attrs, dataclasses.replace(settings), where=where)
        self.graph.add_op(op, inputs, outputs)
        try_fold(self.graph, op)
        return op

    def _tmp(self, base: str) -> str:
        return self.graph.unique_id(base)

    # --- the ops ------------------------------------------------------------------------------

    def _SplitToSequence(self, node, attrs, settings, where):  # noqa: N802
        x = self.graph.tensor(node.input[0])
        axis = int(attrs.get("axis", 0))
        keepdims = int(attrs.get("keepdims", 1))
        rank = x.info.rank
        if not -rank <= axis < rank:
            raise ShapeError(f"{where}: axis {axis} is out of range for {x.info}.")
        axis %= rank
        dim = x.info.shape[axis]
        split = self._const(node, 1, where)
        if split is None:
            sizes = [1] * dim
        elif split.ndim == 0:
            chunk = int(split)
            sizes = [chunk] * (dim // chunk) + ([dim % chunk] if dim % chunk else [])
        else:
            sizes = [int(s) for s in split]
        if sum(sizes) != dim:
            raise ShapeError(f"{where}: split sizes {sizes} do not add up to dimension {dim}.")
        outs = [self._tmp(f"{node.output[0]}__{i}") for i in range(len(sizes))]
        sizes_id = self._tmp(f"{node.output[0]}__sizes")
        self.graph.add_const(sizes_id, np.array(sizes, np.int64))
        self._op("Split", [x.id, sizes_id], outs, settings, where, axis=axis)
        if split is None and not keepdims:
            axes_id = self._tmp(f"{node.output[0]}__axes")
            self.graph.add_const(axes_id, np.array([axis], np.int64))
            squeezed = [self._tmp(f"{o}__sq") for o in outs]
            for o, s in zip(outs, squeezed):
                self._op("Squeeze", [o, axes_id], [s], settings, where)
            outs = squeezed
        self.values[node.output[0]] = outs

    def _SequenceAt(self, node, attrs, settings, where):  # noqa: N802
        seq = self._seq(node.input[0], where)
        if len(node.input) < 2 or not node.input[1]:
            raise ShapeError(f"{where}: SequenceAt needs a position.")
        pos = self._position(node, 1, len(seq), where)
        self._op("Identity", [seq[pos]], [node.output[0]], settings, where)

    def _SequenceConstruct(self, node, attrs, settings, where):  # noqa: N802
        self.values[node.output[0]] = list(node.input)

    def _SequenceEmpty(self, node, attrs, settings, where):  # noqa: N802
        self.values[node.output[0]] = []

    def _SequenceInsert(self, node, attrs, settings, where):  # noqa: N802
        seq = list(self._seq(node.input[0], where))
        pos = self._position(node, 2, len(seq), where, insert=True)
        seq.insert(pos, node.input[1])
        self.values[node.output[0]] = seq

    def _SequenceErase(self, node, attrs, settings, where):  # noqa: N802
        seq = list(self._seq(node.input[0], where))
        if not seq:
            raise ShapeError(f"{where}: cannot erase from an empty sequence.")
        del seq[self._position(node, 1, len(seq), where)]
        self.values[node.output[0]] = seq

    def _SequenceLength(self, node, attrs, settings, where):  # noqa: N802
        length = len(self._seq(node.input[0], where))
        self.graph.add_const(node.output[0], np.array(length, np.int64))

    def _ConcatFromSequence(self, node, attrs, settings, where):  # noqa: N802
        seq = self._seq(node.input[0], where)
        if not seq:
            raise ShapeError(f"{where}: cannot concatenate an empty sequence.")
        axis = int(attrs["axis"])
        if int(attrs.get("new_axis", 0)):
            axes_id = self._tmp(f"{node.output[0]}__axes")
            self.graph.add_const(axes_id, np.array([axis], np.int64))
            expanded = [self._tmp(f"{t}__unsq") for t in seq]
            for t, e in zip(seq, expanded):
                self._op("Unsqueeze", [t, axes_id], [e], settings, where)
            seq = expanded
        self._op("Concat", seq, [node.output[0]], settings, where, axis=axis)
