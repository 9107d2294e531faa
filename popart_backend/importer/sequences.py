"""Static ONNX sequences and optionals: sequence ops resolved at import into ordinary tensor ops.

``StaticSequences`` holds the sequence and optional values of a graph being imported and the
helpers the ops resolved at import use: the sequence and optional op classes
(ops/sequences.py, ``Op.import_time``) and If, Loop and Identity when they carry sequences
(their ``expands_at_import``); each class's ``expand`` says what its node becomes.

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
from ..ir.op import Op, OpSettings
from ..ir.tensor import TensorInfo, TensorKind
from ..ops.registry import create_op
from ..transforms.const_fold import try_fold
from .graph_walk import captured_names, local_names, nodes_in_order, renamed
from .value_io import ValueIO, element_id, static_shape, value_kind


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
            self.add_op("Identity", [tid], [out], settings, f"output '{name}'")
            self.graph.outputs.append(out)
            ids.append(out)
        io.outputs[name] = ids
        return True

    def add(self, cls: type[Op], node: onnx.NodeProto, attrs, settings: OpSettings) -> None:
        """Expand ``node``, of op class ``cls`` (its ``expands_at_import`` said so)."""
        where = f"{node.op_type} '{node.name or node.output[0]}'"
        cls.expand(self, node, attrs, settings, where)
        for out in node.output:
            self.origin.setdefault(out, settings)

    # --- helpers ------------------------------------------------------------------------------

    def const_input(self, node: onnx.NodeProto, index: int, where: str):
        if index >= len(node.input) or not node.input[index]:
            return None
        tensor = self.graph.tensor(node.input[index])
        if not tensor.is_const:
            raise ShapeError(
                f"{where}: input {index} '{tensor.id}' must be a constant: sequences are resolved "
                f"at compile time on the simulated IPU (static shapes)."
            )
        return np.asarray(tensor.data)

    def sequence(self, name: str, where: str) -> list[str]:
        try:
            return self.values[name]
        except KeyError:
            raise UnsupportedOpError(
                f"{where}: '{name}' is not a sequence built by a sequence op of this graph."
            ) from None

    def position(self, node, index, length, where, insert=False) -> int:
        value = self.const_input(node, index, where)
        if value is None:
            return length if insert else length - 1
        if np.asarray(value).size != 1:
            raise ShapeError(f"{where}: the position must be one integer, got {value}.")
        pos = int(np.asarray(value).reshape(()))
        hi = length if insert else length - 1
        if not -length <= pos <= hi:
            raise ShapeError(f"{where}: position {pos} is out of range for a sequence of {length}.")
        return pos + length if pos < 0 else pos

    def add_op(self, op_type, inputs, outputs, settings, where, **attrs):
        op = create_op(op_type, attrs, dataclasses.replace(settings), where=where)
        self.graph.add_op(op, inputs, outputs)
        try_fold(self.graph, op)
        return op

    def unique_id(self, base: str) -> str:
        return self.graph.unique_id(base)

    # --- optionals ----------------------------------------------------------------------------

    def alias(self, source: str, target: str, settings, where) -> None:
        """``target`` takes the value of ``source``: a sequence, absent, or a tensor."""
        if source in self.values:
            self.values[target] = list(self.values[source])
        elif source in self.absent:
            self.absent.add(target)
        else:
            if self.scope is not None:
                self.scope.lookup(source, where)
            self.add_op("Identity", [source], [target], settings, where)

    def is_absent(self, name: str) -> bool:
        scope, seqs = self.scope, self
        while True:
            if name in seqs.absent:
                return True
            if scope is None or scope.parent is None:
                return False
            scope = scope.parent
            seqs = scope.sequences

    # --- bodies inlined at import ---------------------------------------------------------------

    def inline(self, body: onnx.GraphProto, bound: dict[str, str], prefix: str,
                where: str) -> list[str]:
        """Import ``body``'s nodes into this graph with its inputs bound to ``bound`` values and
        its local names prefixed; returns the names of its outputs here."""
        if self.scope is None:
            raise UnsupportedOpError(f"{where}: bodies can only be inlined during import.")
        mapping = {name: f"{prefix}/{name}" for name in local_names(body, top=True) if name}
        mapping.update(bound)
        graph = renamed(body, mapping)
        for init in graph.initializer:
            self.graph.add_const(init.name, numpy_helper.to_array(init).copy())
        for inner in nodes_in_order(graph, outer_ok=True):
            self.scope.add(inner)
        return [o.name for o in graph.output]

    def if_makes_sequences(self, node: onnx.NodeProto) -> bool:
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

    def expand_if(self, node, attrs, settings, where) -> None:
        if self.scope is not None:
            self.scope.lookup(node.input[0], where)
        cond = node.input[0]
        outs = {}
        for name in ("then_branch", "else_branch"):
            outs[name] = self.inline(getattr(attrs, name), {}, f"{node.output[0]}/{name}", where)
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
        a, b = self.sequence(then_out, where), self.sequence(else_out, where)
        if len(a) != len(b):
            raise ShapeError(
                f"{where}: the branches return sequences of {len(a)} and {len(b)} elements; with "
                f"a computed condition both must have the same length (static shapes)."
            )
        ids = []
        for i, (x, y) in enumerate(zip(a, b)):
            target = self.unique_id(f"{out}__{i}")
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
        self.add_op("Where", [cond, x, y], [out], settings, where)

    def loop_needs_unrolling(self, node: onnx.NodeProto) -> bool:
        reads = [n for n in node.input[2:] if n] + sorted(captured_names(node))
        return any(self.visible(n) for n in reads)

    def unroll_loop(self, node, attrs, settings, where) -> None:
        body = attrs.body
        trip = self.const_input(node, 0, where)
        cond_name = node.input[1] if len(node.input) > 1 else ""
        go = True if not cond_name else bool(np.asarray(self.const_input(node, 1, where)))
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
            iter_id = self.unique_id(f"{prefix}/i")
            cond_id = self.unique_id(f"{prefix}/cond")
            self.graph.add_const(iter_id, np.array(i, np.int64))
            self.graph.add_const(cond_id, np.array(go))
            bound = {body.input[0].name: iter_id, body.input[1].name: cond_id}
            for formal, value in zip(body.input[2:], carried):
                bound[formal.name] = value
            outs = self.inline(body, bound, prefix, where)
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
                self.alias(value, out, settings, where)
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
        axes_id = self.unique_id(f"{out}__axes")
        self.graph.add_const(axes_id, np.array([0], np.int64))
        expanded = []
        for t in ids:
            e = self.unique_id(f"{t}__unsq")
            self.add_op("Unsqueeze", [t, axes_id], [e], settings, where)
            expanded.append(e)
        self.add_op("Concat", expanded, [out], settings, where, axis=0)
