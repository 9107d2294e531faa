"""Static sequence and optional ops: resolved at import into tensor ops, never in the IR.

The simulated IPU has static shapes, so a sequence is a compile-time list of IR tensors and an
optional is its value or known to be absent. Each class here is registered like any op (its
ONNX since-versions, attributes and compile-time inputs are what getSupportedOperations lists)
and sets ``import_time``: the importer calls its ``expand`` with the ``StaticSequences`` of the
graph being imported (importer/sequences.py), whose sequence values it reads and edits and into
whose graph it adds ordinary ops. Positions and split sizes must be constants.

Before:  s = SplitToSequence(x, [2, 2]) ; a = SequenceAt(s, 1)
After:   x_0, x_1 = Split(x, [2, 2])    ; a = Identity(x_1)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ..errors import ModelError, ShapeError, UnsupportedOpError
from ..ir.op import Op
from .registry import register_op


class ImportTimeOp(Op):
    """An op the importer expands (``expand``); see the module docstring."""

    import_time = True


@register_op("SplitToSequence", versions=(11, 24))
class SplitToSequence(ImportTimeOp):
    const_inputs = (1,)

    @dataclass(frozen=True)
    class Attrs:
        axis: int = 0
        keepdims: int = 1

    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        x = values.graph.tensor(node.input[0])
        axis = attrs.axis
        rank = x.info.rank
        if not -rank <= axis < rank:
            raise ShapeError(f"{where}: axis {axis} is out of range for {x.info}.")
        axis %= rank
        dim = x.info.shape[axis]
        split = values.const_input(node, 1, where)
        if split is None:
            sizes = [1] * dim
        elif split.ndim == 0:
            chunk = int(split)
            sizes = [chunk] * (dim // chunk) + ([dim % chunk] if dim % chunk else [])
        else:
            sizes = [int(s) for s in split]
        if sum(sizes) != dim:
            raise ShapeError(f"{where}: split sizes {sizes} do not add up to dimension {dim}.")
        outs = [values.unique_id(f"{node.output[0]}__{i}") for i in range(len(sizes))]
        sizes_id = values.unique_id(f"{node.output[0]}__sizes")
        values.graph.add_const(sizes_id, np.array(sizes, np.int64))
        values.add_op("Split", [x.id, sizes_id], outs, settings, where, axis=axis)
        if split is None and not attrs.keepdims:
            axes_id = values.unique_id(f"{node.output[0]}__axes")
            values.graph.add_const(axes_id, np.array([axis], np.int64))
            squeezed = [values.unique_id(f"{o}__sq") for o in outs]
            for o, s in zip(outs, squeezed):
                values.add_op("Squeeze", [o, axes_id], [s], settings, where)
            outs = squeezed
        values.values[node.output[0]] = outs


@register_op("SequenceAt", versions=11)
class SequenceAt(ImportTimeOp):
    const_inputs = (1,)

    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        seq = values.sequence(node.input[0], where)
        if len(node.input) < 2 or not node.input[1]:
            raise ShapeError(f"{where}: SequenceAt needs a position.")
        pos = values.position(node, 1, len(seq), where)
        values.add_op("Identity", [seq[pos]], [node.output[0]], settings, where)


@register_op("SequenceConstruct", versions=11)
class SequenceConstruct(ImportTimeOp):
    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        values.values[node.output[0]] = list(node.input)


@register_op("SequenceEmpty", versions=11)
class SequenceEmpty(ImportTimeOp):
    @dataclass(frozen=True)
    class Attrs:
        dtype: int = onnx.TensorProto.FLOAT

    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        values.values[node.output[0]] = []


@register_op("SequenceInsert", versions=11)
class SequenceInsert(ImportTimeOp):
    const_inputs = (2,)

    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        seq = list(values.sequence(node.input[0], where))
        pos = values.position(node, 2, len(seq), where, insert=True)
        seq.insert(pos, node.input[1])
        values.values[node.output[0]] = seq


@register_op("SequenceErase", versions=11)
class SequenceErase(ImportTimeOp):
    const_inputs = (1,)

    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        seq = list(values.sequence(node.input[0], where))
        if not seq:
            raise ShapeError(f"{where}: cannot erase from an empty sequence.")
        del seq[values.position(node, 1, len(seq), where)]
        values.values[node.output[0]] = seq


@register_op("SequenceLength", versions=11)
class SequenceLength(ImportTimeOp):
    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        length = len(values.sequence(node.input[0], where))
        values.graph.add_const(node.output[0], np.array(length, np.int64))


@register_op("ConcatFromSequence", versions=11)
class ConcatFromSequence(ImportTimeOp):
    @dataclass(frozen=True)
    class Attrs:
        axis: int
        new_axis: int = 0

    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        seq = values.sequence(node.input[0], where)
        if not seq:
            raise ShapeError(f"{where}: cannot concatenate an empty sequence.")
        axis = attrs.axis
        if attrs.new_axis:
            axes_id = values.unique_id(f"{node.output[0]}__axes")
            values.graph.add_const(axes_id, np.array([axis], np.int64))
            expanded = [values.unique_id(f"{t}__unsq") for t in seq]
            for t, e in zip(seq, expanded):
                values.add_op("Unsqueeze", [t, axes_id], [e], settings, where)
            seq = expanded
        values.add_op("Concat", seq, [node.output[0]], settings, where, axis=axis)


@register_op("SequenceMap", versions=17)
class SequenceMap(ImportTimeOp):
    """The body runs once per element, inlined (names prefixed per iteration)."""

    @dataclass(frozen=True)
    class Attrs:
        body: onnx.GraphProto

    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        body = attrs.body
        if not node.input or not values.is_sequence(node.input[0]):
            raise ShapeError(f"{where}: input 0 must be a sequence.")
        length = len(values.values[node.input[0]])
        extra = list(node.input[1:])
        for name in extra:
            if values.is_sequence(name) and len(values.values[name]) != length:
                raise ShapeError(
                    f"{where}: sequence '{name}' has {len(values.values[name])} elements, "
                    f"'{node.input[0]}' {length}; SequenceMap needs equal lengths."
                )
        if len(body.input) != 1 + len(extra) or len(body.output) != len(node.output):
            raise ModelError(
                f"{where}: the body takes {len(body.input)} inputs and gives {len(body.output)} "
                f"outputs; the node has {1 + len(extra)} inputs and {len(node.output)} outputs."
            )
        results: list[list[str]] = [[] for _ in node.output]
        for i in range(length):
            bound = {}
            for k, name in enumerate(node.input):
                value = values.values[name][i] if values.is_sequence(name) else name
                if values.scope is not None and not values.is_sequence(name):
                    values.scope.lookup(name, where)
                bound[body.input[k].name] = value
            outs = values.inline(body, bound, f"{node.output[0]}/map{i}", where)
            for acc, out in zip(results, outs):
                if values.is_sequence(out):
                    raise UnsupportedOpError(
                        f"{where}: the body returns the sequence '{out}'; SequenceMap bodies "
                        f"return tensors."
                    )
                acc.append(out)
        for name, ids in zip(node.output, results):
            if name:
                values.values[name] = ids


# --- optionals: a value (tensor or sequence) or known to be absent ------------------------------


@register_op("Optional", versions=(15, 28))
class Optional(ImportTimeOp):
    @dataclass(frozen=True)
    class Attrs:
        type: onnx.TypeProto | None = None

    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        if node.input and node.input[0]:
            values.alias(node.input[0], node.output[0], settings, where)
        else:
            values.absent.add(node.output[0])


@register_op("OptionalHasElement", versions=(15, 18, 28))
class OptionalHasElement(ImportTimeOp):
    """A constant: whether the optional is present is known at compile time."""

    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        name = node.input[0] if node.input else ""
        present = bool(name) and not values.is_absent(name)
        values.graph.add_const(node.output[0], np.array(present))


@register_op("OptionalGetElement", versions=(15, 18, 28))
class OptionalGetElement(ImportTimeOp):
    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        if values.is_absent(node.input[0]):
            raise ShapeError(
                f"{where}: the optional '{node.input[0]}' is empty (compiled absent), so it has "
                f"no element to get."
            )
        values.alias(node.input[0], node.output[0], settings, where)
