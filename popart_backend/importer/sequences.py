"""Static ONNX sequences and optionals: sequence ops resolved at import into ordinary tensor ops.

The torch exporter emits SplitToSequence / SequenceAt for ``torch.split`` and ``chunk``. The
simulated IPU has static shapes, so a sequence is a compile-time list of IR tensors: each
sequence op edits that list, reads an element (Identity of it) or concatenates it. Positions
and split sizes must therefore be constants; anything else raises with the reason.

Before:  s = SplitToSequence(x, [2, 2]) ; a = SequenceAt(s, 1)
After:   x_0, x_1 = Split(x, [2, 2])    ; a = Identity(x_1)

Optional values (Optional, OptionalHasElement, OptionalGetElement) are static too: an optional
is either its value (a tensor or a sequence) or known to be absent, so OptionalHasElement is a
constant. Ops with bodies that produce or carry sequences are expanded at import:

- SequenceMap runs its body once per element, inlined (names prefixed per iteration);
- If with sequence outputs and a computed condition inlines both branches and selects each
  element with Where (equal lengths and shapes required); a constant condition inlines one;
- Loop carrying sequences (or reading a sequence of the enclosing graph) is unrolled: its trip
  count and condition must be constants, and the body's condition must fold to a constant.

Sequence and optional graph inputs and outputs (``ValueIO``): a sequence input of n elements is
n host streams ``name[0]`` ... ``name[n-1]``, whose number and shapes come from
``InputShapeInfo().add(name, [TensorInfo, ...])`` (static per compiled session; an empty list
for an empty sequence); an optional input is compiled present (its TensorInfo, list or the
model's static shape) or absent (``add(name, None)``). A sequence output is anchored as its
elements ``name[i]``; the session feeds and returns python lists (None for an absent optional).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import numpy_helper

from ..dtypes import DataType
from ..errors import ModelError, ShapeError, UnsupportedOpError
from ..ir.graph import Graph
from ..ir.op import OpSettings
from ..ir.tensor import TensorInfo, TensorKind
from ..ops.registry import create_op
from ..transforms.const_fold import try_fold
from .value_io import ValueIO, element_id, static_shape, value_kind

SEQUENCE_OPS = frozenset(
    {
        "SplitToSequence", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceInsert",
        "SequenceErase", "SequenceLength", "ConcatFromSequence",
    }
)


OPTIONAL_OPS = frozenset({"Optional", "OptionalHasElement", "OptionalGetElement"})
# Resolved here, not registered: the supported-ops listing names these (supported_ops.py).
IMPORT_TIME_OPS = SEQUENCE_OPS | OPTIONAL_OPS | {"SequenceMap"}


class StaticSequences:
    """Sequence and optional values of one graph being imported, by ONNX name.

    ``scope`` (an ``onnx_model._Scope``) imports the nodes of inlined bodies."""

    def __init__(self, graph: Graph, scope=None):
        self.graph = graph
        self.scope = scope
        self.values: dict[str, list[str]] = {}
        self.absent: set[str] = set()
        # Settings (placement) of the node that made each sequence, for the ops reading it out.
        self.origin: dict[str, OpSettings] = {}

    def handles(self, node: onnx.NodeProto) -> bool:
        if node.domain not in ("", "ai.onnx"):
            return False
        if node.op_type in IMPORT_TIME_OPS:
            return True
        if node.op_type == "Identity":
            return bool(node.input) and self.is_value(node.input[0])
        if node.op_type == "If":
            return self._if_makes_sequences(node)
        if node.op_type == "Loop":
            return self._loop_needs_unrolling(node)
        return False

    def is_sequence(self, name: str) -> bool:
        return name in self.values

    def is_value(self, name: str) -> bool:
        """A sequence or an absent optional (not a tensor)."""
        return name in self.values or name in self.absent

    def visible(self, name: str) -> bool:
        """``is_value`` here or in an enclosing graph being imported."""
        scope = self.scope
        if scope is None:
            return self.is_value(name)
        while scope is not None:
            if scope.sequences.is_value(name):
                return True
            scope = scope.parent
        return False

    # --- graph inputs and outputs -------------------------------------------------------------

    def add_graph_input(self, value_info: onnx.ValueInfoProto, shape_info: dict,
                        io: ValueIO) -> bool:
        """Bind a sequence or optional graph input; False for a plain tensor input."""
        name = value_info.name
        kind = value_kind(value_info.type)
        given = shape_info.get(name, ...)
        if kind == "tensor" or (kind == "unknown" and isinstance(given, TensorInfo)):
            if given is None or isinstance(given, list):
                raise ShapeError(
                    f"Input '{name}' is a tensor; InputShapeInfo gives it "
                    f"{'None' if given is None else 'a list'}. Give it a TensorInfo."
                )
            return False
        tp = value_info.type
        if kind == "optional":
            inner = tp.optional_type.elem_type
            if given is ...:
                if value_kind(inner) == "tensor" and static_shape(inner) is not None:
                    return False  # present, typed by the model
                raise ShapeError(
                    f"Optional input '{name}' has no static type in the model. Compile it "
                    f"present with InputShapeInfo().add('{name}', TensorInfo(...)) (a list of "
                    f"them for a sequence) or absent with InputShapeInfo().add('{name}', None)."
                )
            if given is None:
                self.absent.add(name)
                io.inputs[name] = None
                return True
            if isinstance(given, TensorInfo):
                return False
            tp = inner
        if given is ... or not isinstance(given, list):
            raise ShapeError(
                f"Sequence input '{name}': its length and element shapes are static per compiled "
                f"session. Give them with InputShapeInfo().add('{name}', [TensorInfo(dtype, "
                f"shape), ...]) (one per element; [] for an empty sequence)."
            )
        elem = tp.sequence_type.elem_type if tp.HasField("sequence_type") else None
        if elem is not None and elem.HasField("tensor_type") and elem.tensor_type.elem_type:
            dtype = DataType.from_onnx(elem.tensor_type.elem_type)
            wrong = [str(i) for i in given if i.dtype != dtype]
            if wrong:
                raise ShapeError(
                    f"Sequence input '{name}' holds {dtype.name.lower()} tensors; InputShapeInfo "
                    f"gives {wrong}."
                )
        ids = [element_id(name, i) for i in range(len(given))]
        for tid, info in zip(ids, given):
            self.graph.add_tensor(tid, info, TensorKind.STREAM)
            self.graph.inputs.append(tid)
        self.values[name] = ids
        io.inputs[name] = ids
        return True

    def add_graph_output(self, name: str, io: ValueIO) -> bool:
        """Bind a sequence or absent optional graph output; False for a tensor output."""
        if name in self.absent:
            io.outputs[name] = None
            return True
        if name not in self.values:
            return False
        ids = []
        for i, tid in enumerate(self.values[name]):
            out = element_id(name, i)
            if out in self.graph.tensors:
                out = self.graph.unique_id(out)
            # On the IPU (and pipeline stage) of the op that produced the element, or of the
            # node that made the sequence when the element is a graph input.
            producer = self.graph.tensors[tid].producer
            placed = producer.settings if producer is not None else self.origin.get(name)
            settings = (dataclasses.replace(placed, name=name) if placed is not None
                        else OpSettings(name=name))
            self._op("Identity", [tid], [out], settings, f"output '{name}'")
            self.graph.outputs.append(out)
            ids.append(out)
        io.outputs[name] = ids
        return True

    def add(self, node: onnx.NodeProto, attrs: dict, settings: OpSettings) -> None:
        where = f"{node.op_type} '{node.name or node.output[0]}'"
        handler = getattr(self, "_" + node.op_type)
        handler(node, attrs, settings, where)
        for out in node.output:
            self.origin.setdefault(out, settings)

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
        if np.asarray(value).size != 1:
            raise ShapeError(f"{where}: the position must be one integer, got {value}.")
        pos = int(np.asarray(value).reshape(()))
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

    # --- optionals ----------------------------------------------------------------------------

    def _alias(self, source: str, target: str, settings, where) -> None:
        """``target`` takes the value of ``source``: a sequence, absent, or a tensor."""
        if source in self.values:
            self.values[target] = list(self.values[source])
        elif source in self.absent:
            self.absent.add(target)
        else:
            if self.scope is not None:
                self.scope.lookup(source, where)
            self._op("Identity", [source], [target], settings, where)

    def _Identity(self, node, attrs, settings, where):  # noqa: N802
        self._alias(node.input[0], node.output[0], settings, where)

    def _Optional(self, node, attrs, settings, where):  # noqa: N802
        if node.input and node.input[0]:
            self._alias(node.input[0], node.output[0], settings, where)
        else:
            self.absent.add(node.output[0])

    def _OptionalHasElement(self, node, attrs, settings, where):  # noqa: N802
        name = node.input[0] if node.input else ""
        present = bool(name) and not self._absent(name)
        self.graph.add_const(node.output[0], np.array(present))

    def _OptionalGetElement(self, node, attrs, settings, where):  # noqa: N802
        if self._absent(node.input[0]):
            raise ShapeError(
                f"{where}: the optional '{node.input[0]}' is empty (compiled absent), so it has "
                f"no element to get."
            )
        self._alias(node.input[0], node.output[0], settings, where)

    def _absent(self, name: str) -> bool:
        scope, seqs = self.scope, self
        while True:
            if name in seqs.absent:
                return True
            if scope is None or scope.parent is None:
                return False
            scope = scope.parent
            seqs = scope.sequences

    # --- bodies inlined at import ---------------------------------------------------------------

    def _inline(self, body: onnx.GraphProto, bound: dict[str, str], prefix: str,
                where: str) -> list[str]:
        """Import ``body``'s nodes into this graph with its inputs bound to ``bound`` values and
        its local names prefixed; returns the names of its outputs here."""
        if self.scope is None:
            raise UnsupportedOpError(f"{where}: bodies can only be inlined during import.")
        mapping = {name: f"{prefix}/{name}" for name in _local_names(body, top=True) if name}
        mapping.update(bound)
        graph = _renamed(body, mapping)
        for init in graph.initializer:
            self.graph.add_const(init.name, numpy_helper.to_array(init).copy())
        from .onnx_model import _nodes_in_order

        for inner in _nodes_in_order(graph, outer_ok=True):
            self.scope.add(inner)
        return [o.name for o in graph.output]

    def _SequenceMap(self, node, attrs, settings, where):  # noqa: N802
        body = attrs["body"]
        if not node.input or not self.is_sequence(node.input[0]):
            raise ShapeError(f"{where}: input 0 must be a sequence.")
        length = len(self.values[node.input[0]])
        extra = list(node.input[1:])
        for name in extra:
            if self.is_sequence(name) and len(self.values[name]) != length:
                raise ShapeError(
                    f"{where}: sequence '{name}' has {len(self.values[name])} elements, "
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
                value = self.values[name][i] if self.is_sequence(name) else name
                if self.scope is not None and not self.is_sequence(name):
                    self.scope.lookup(name, where)
                bound[body.input[k].name] = value
            outs = self._inline(body, bound, f"{node.output[0]}/map{i}", where)
            for acc, out in zip(results, outs):
                if self.is_sequence(out):
                    raise UnsupportedOpError(
                        f"{where}: the body returns the sequence '{out}'; SequenceMap bodies "
                        f"return tensors."
                    )
                acc.append(out)
        for name, ids in zip(node.output, results):
            if name:
                self.values[name] = ids

    def _if_makes_sequences(self, node: onnx.NodeProto) -> bool:
        branches = [a.g for a in node.attribute if a.name in ("then_branch", "else_branch")]
        if not any(value_kind(o.type) in ("sequence", "optional")
                   for g in branches for o in g.output):
            return False
        if not node.input:
            return False
        if self.scope is not None:
            self.scope.lookup(node.input[0], f"If '{node.name}'")
        cond = self.graph.tensors.get(node.input[0])
        return cond is None or not cond.is_const  # a constant condition inlines one branch

    def _If(self, node, attrs, settings, where):  # noqa: N802
        if self.scope is not None:
            self.scope.lookup(node.input[0], where)
        cond = node.input[0]
        outs = {}
        for name in ("then_branch", "else_branch"):
            outs[name] = self._inline(attrs[name], {}, f"{node.output[0]}/{name}", where)
        for k, out in enumerate(node.output):
            then_out, else_out = outs["then_branch"][k], outs["else_branch"][k]
            if not out:
                continue
            if self.is_value(then_out) or self.is_value(else_out):
                self.values[out] = self._select_sequence(cond, then_out, else_out, out, settings,
                                                         where)
            else:
                self._select(cond, then_out, else_out, out, settings, where)

    def _select_sequence(self, cond, then_out, else_out, out, settings, where) -> list[str]:
        if then_out in self.absent or else_out in self.absent:
            raise UnsupportedOpError(
                f"{where}: a branch returns an empty optional while the condition is computed; "
                f"static shapes need both branches to agree."
            )
        a, b = self._seq(then_out, where), self._seq(else_out, where)
        if len(a) != len(b):
            raise ShapeError(
                f"{where}: the branches return sequences of {len(a)} and {len(b)} elements; with "
                f"a computed condition both must have the same length (static shapes)."
            )
        ids = []
        for i, (x, y) in enumerate(zip(a, b)):
            target = self._tmp(f"{out}__{i}")
            self._select(cond, x, y, target, settings, where)
            ids.append(target)
        return ids

    def _select(self, cond, x, y, out, settings, where) -> None:
        if self.scope is not None:
            self.scope.lookup(x, where)
            self.scope.lookup(y, where)
        ix, iy = self.graph.tensor(x).info, self.graph.tensor(y).info
        if ix != iy:
            raise ShapeError(
                f"{where}: the branches give {ix} and {iy} for one output; with a computed "
                f"condition both must agree (static shapes)."
            )
        self._op("Where", [cond, x, y], [out], settings, where)

    def _loop_needs_unrolling(self, node: onnx.NodeProto) -> bool:
        from .onnx_model import _captured_names

        reads = [n for n in node.input[2:] if n] + sorted(_captured_names(node))
        return any(self.visible(n) for n in reads)

    def _Loop(self, node, attrs, settings, where):  # noqa: N802
        body = attrs["body"]
        trip = self._const(node, 0, where)
        cond_name = node.input[1] if len(node.input) > 1 else ""
        go = True if not cond_name else bool(np.asarray(self._const(node, 1, where)))
        if trip is None and not cond_name:
            raise ShapeError(f"{where}: has neither a trip count nor a condition; it never ends.")
        carried = list(node.input[2:])
        n_carried = len(carried)
        n_scan = len(body.output) - 1 - n_carried
        if n_scan < 0:
            raise ModelError(f"{where}: the body has too few outputs for {n_carried} carried values.")
        scans: list[list[str]] = [[] for _ in range(n_scan)]
        limit = None if trip is None else int(np.asarray(trip).reshape(()))
        i = 0
        while go and (limit is None or i < limit):
            prefix = f"{node.output[0] if node.output else node.name}/iter{i}"
            iter_id = self._tmp(f"{prefix}/i")
            cond_id = self._tmp(f"{prefix}/cond")
            self.graph.add_const(iter_id, np.array(i, np.int64))
            self.graph.add_const(cond_id, np.array(go))
            bound = {body.input[0].name: iter_id, body.input[1].name: cond_id}
            for formal, value in zip(body.input[2:], carried):
                bound[formal.name] = value
            outs = self._inline(body, bound, prefix, where)
            cond_out = self.graph.tensors.get(outs[0])
            if cond_out is None or not cond_out.is_const:
                raise ShapeError(
                    f"{where}: the loop carries sequences, so it is unrolled at compile time, but "
                    f"its body computes its condition from data ('{outs[0]}'). Static shapes need "
                    f"the number of iterations known at compile time."
                )
            go = bool(np.asarray(cond_out.data))
            carried = outs[1 : 1 + n_carried]
            for acc, out in zip(scans, outs[1 + n_carried :]):
                acc.append(out)
            i += 1
            if i > 100_000:
                raise ShapeError(f"{where}: unrolling stopped after {i} iterations.")
        for out, value in zip(node.output, carried):
            if out:
                self._alias(value, out, settings, where)
        for k, out in enumerate(node.output[n_carried:]):
            if not out:
                continue
            if not scans[k]:
                raise ShapeError(
                    f"{where}: scan output '{out}' of a loop that ran no iteration has no "
                    f"static shape."
                )
            self._stack(scans[k], out, settings, where)

    def _stack(self, ids: list[str], out: str, settings, where) -> None:
        axes_id = self._tmp(f"{out}__axes")
        self.graph.add_const(axes_id, np.array([0], np.int64))
        expanded = []
        for t in ids:
            e = self._tmp(f"{t}__unsq")
            self._op("Unsqueeze", [t, axes_id], [e], settings, where)
            expanded.append(e)
        self._op("Concat", expanded, [out], settings, where, axis=0)


def _local_names(graph: onnx.GraphProto, top: bool = False) -> set[str]:
    """Names ``graph`` defines: initializers, node outputs and, in nested bodies, also their
    inputs (the top graph's inputs are bound by the caller)."""
    names = {i.name for i in graph.initializer} | {o for n in graph.node for o in n.output}
    if not top:
        names |= {i.name for i in graph.input}
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names |= _local_names(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    names |= _local_names(g)
    return names


def _renamed(graph: onnx.GraphProto, mapping: dict[str, str]) -> onnx.GraphProto:
    """A copy of ``graph`` with every name in ``mapping`` replaced, in nested bodies too (ONNX
    names are unique across a model's graphs, so no inner name shadows an outer one)."""
    out = onnx.GraphProto()
    out.CopyFrom(graph)
    _rename_in(out, mapping)
    return out


def _rename_in(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    for init in graph.initializer:
        init.name = mapping.get(init.name, init.name)
    for vi in (*graph.input, *graph.output, *graph.value_info):
        vi.name = mapping.get(vi.name, vi.name)
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename_in(attr.g, mapping)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    _rename_in(g, mapping)
