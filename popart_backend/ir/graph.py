"""Graph: tensors and ops with their edges. Only Graph methods edit edges."""

from __future__ import annotations

import difflib
import heapq
from typing import Iterable, Sequence

import numpy as np

from ..errors import ShapeError, popart_exception, popart_internal_exception
from .op import Op
from .tensor import Tensor, TensorInfo, TensorKind


class Graph:
    """A set of ops over tensors, with ordered graph inputs and outputs."""

    def __init__(self, graph_id: str = "", ir=None):
        self.id = graph_id
        self.ir = ir
        self.tensors: dict[str, Tensor] = {}
        self.ops: dict[int, Op] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self._next_op_id = 0
        # Scheduling constraints beyond data edges: op id -> ids of ops that must run before it.
        self.constraints: dict[int, set[int]] = {}

    # --- tensors ------------------------------------------------------------------------------

    def add_tensor(
        self, tensor_id: str, info: TensorInfo, kind: TensorKind, data: np.ndarray | None = None
    ) -> Tensor:
        if tensor_id in self.tensors:
            raise popart_exception(f"Tensor '{tensor_id}' is already in graph '{self.id}'.")
        if data is not None:
            data = np.asarray(data)
            if data.shape != info.shape:
                raise popart_internal_exception(
                    f"Tensor '{tensor_id}': data shape {data.shape} != info {info}."
                )
        tensor = Tensor(tensor_id, info, kind, self, data)
        self.tensors[tensor_id] = tensor
        return tensor

    def add_const(self, tensor_id: str, value: np.ndarray) -> Tensor:
        value = np.asarray(value, order="C")  # keeps 0-d values 0-d
        return self.add_tensor(tensor_id, TensorInfo.of(value), TensorKind.CONST, value)

    def tensor(self, tensor_id: str) -> Tensor:
        try:
            return self.tensors[tensor_id]
        except KeyError:
            raise popart_exception(
                f"No tensor '{tensor_id}' in graph '{self.id or 'main'}'."
                + _suggest(tensor_id, self.tensors)
            ) from None

    def unique_id(self, base: str) -> str:
        if base not in self.tensors:
            return base
        n = 1
        while f"{base}__{n}" in self.tensors:
            n += 1
        return f"{base}__{n}"

    def make_const(self, tensor: Tensor, value: np.ndarray) -> None:
        """Turn a tensor without producer into a compile-time constant holding ``value``."""
        if tensor.producer is not None:
            raise popart_internal_exception(
                f"Cannot make '{tensor.id}' constant: {tensor.producer.debug_name} produces it."
            )
        tensor.kind = TensorKind.CONST
        tensor.data = np.asarray(value, order="C")  # keeps 0-d values 0-d

    def remove_tensor(self, tensor: Tensor) -> None:
        if tensor.producer is not None or tensor.consumers:
            raise popart_internal_exception(
                f"Cannot remove tensor '{tensor.id}': it still has a producer or consumers."
            )
        del self.tensors[tensor.id]

    # --- ops ----------------------------------------------------------------------------------

    def add_op(self, op: Op, input_ids: Sequence[str], output_ids: Sequence[str]) -> Op:
        """Connect ``op`` to existing inputs ('' = absent optional input), infer and create outputs.

        ``output_ids`` may contain '' for optional outputs nobody uses.
        """
        op.graph = self
        op.id = self._next_op_id
        self._next_op_id += 1
        op.inputs = [self.tensor(t) if t else None for t in input_ids]
        op.num_outputs = len(output_ids)
        infos = self._infer(op)
        if len(output_ids) > len(infos):
            raise ShapeError(
                f"{op.debug_name}: {len(output_ids)} outputs requested, the op has {len(infos)}."
            )
        op.outputs = []
        for out_id, info in zip(output_ids, infos):
            if not out_id:
                op.outputs.append(None)
                continue
            tensor = self.add_tensor(out_id, info, TensorKind.ACT_GRAD)
            tensor.producer = op
            op.outputs.append(tensor)
        for t in op.inputs:
            if t is not None:
                t.consumers.append(op)
        self.ops[op.id] = op
        for index in op.modifies_inputs:
            tensor = op.inputs[index] if index < len(op.inputs) else None
            if tensor is not None:
                for reader in tensor.consumers:
                    if reader is not op:
                        self.add_constraint(reader, op)
        for t in op.inputs:
            # A later reader of a tensor some op modifies in place must read it before. A later
            # writer runs after the earlier ones instead (the loop above), or two writers of one
            # accumulator would each wait for the other.
            if t is not None and not _modifies(op, t):
                for writer in t.consumers:
                    if writer is not op and _modifies(writer, t):
                        self.add_constraint(op, writer)
        return op

    def append_input(self, op: Op, tensor_id: str) -> None:
        """Connect ``tensor_id`` as a new last input of ``op`` (the random seed, say)."""
        tensor = self.tensor(tensor_id)
        op.inputs.append(tensor)
        tensor.consumers.append(op)

    def append_output(self, op: Op, tensor_id: str, info: TensorInfo) -> Tensor:
        """Give ``op`` a new last output ``tensor_id`` (a subgraph op whose body now returns
        one more value: autodiff's stitching, transforms/autodiff_stitch.py)."""
        tensor = self.add_tensor(tensor_id, info, TensorKind.ACT_GRAD)
        tensor.producer = op
        op.outputs.append(tensor)
        op.num_outputs = len(op.outputs)
        return tensor

    def replace_input(self, op: Op, index: int, tensor_id: str) -> None:
        """Make input ``index`` of ``op`` read ``tensor_id`` (one edge; other uses unchanged)."""
        new = self.tensor(tensor_id)
        old = op.inputs[index]
        if old is not None:
            old.consumers.remove(op)  # one entry per edge
        op.inputs[index] = new
        new.consumers.append(op)

    def add_constraint(self, before: Op, after: Op) -> None:
        """Schedule ``before`` ahead of ``after`` even without a data edge between them."""
        if before.id == after.id:
            raise popart_internal_exception(f"{before.debug_name} cannot be scheduled before itself.")
        self.constraints.setdefault(after.id, set()).add(before.id)

    def _infer(self, op: Op) -> list[TensorInfo]:
        try:
            result = op.infer(*op.input_infos())
        except ShapeError:
            raise
        except popart_exception:
            raise
        except Exception as exc:  # re-raised with the op and its inputs, never swallowed
            ins = ", ".join(
                f"'{t.id}' {t.info}" if t is not None else "<absent>" for t in op.inputs
            )
            raise ShapeError(f"{op.debug_name}: shape inference failed on inputs {ins}: {exc}") from exc
        return [result] if isinstance(result, TensorInfo) else list(result)

    def remove_op(self, op: Op) -> None:
        """Disconnect and delete ``op``; its output tensors stay (producer cleared)."""
        for t in op.inputs:
            if t is not None:
                t.consumers.remove(op)
        for t in op.outputs:
            if t is not None:
                t.producer = None
        del self.ops[op.id]
        self.constraints.pop(op.id, None)
        for before in self.constraints.values():
            before.discard(op.id)

    def replace_all_uses(self, old: Tensor, new: Tensor) -> None:
        """Make every consumer of ``old`` (and the graph outputs) read ``new`` instead."""
        for op in list(old.consumers):
            op.inputs = [new if t is old else t for t in op.inputs]
            new.consumers.append(op)
        old.consumers = []
        self.outputs = [new.id if t == old.id else t for t in self.outputs]

    # --- order --------------------------------------------------------------------------------

    def topo_order(self) -> list[Op]:
        """Ops in a topological order. Among ops whose inputs are ready, the higher
        ``settings.schedule_priority`` (PopART's ``__schedule_priority``) runs first; creation
        order (op id) breaks ties."""
        pending = {
            op.id: sum(1 for t in op.inputs if t is not None and t.producer is not None)
            + len(self.constraints.get(op.id, ()))
            for op in self.ops.values()
        }
        after: dict[int, list[int]] = {}
        for later, befores in self.constraints.items():
            for before in befores:
                after.setdefault(before, []).append(later)
        ops = self.ops

        def key(op_id: int) -> tuple[float, int]:
            return -ops[op_id].settings.schedule_priority, op_id

        ready = [key(op_id) for op_id, n in pending.items() if n == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            op = ops[heapq.heappop(ready)[1]]
            order.append(op)
            for t in op.outputs:
                if t is None:
                    continue
                # ``consumers`` holds one entry per edge, as ``pending`` counts them.
                for consumer in t.consumers:
                    pending[consumer.id] -= 1
                    if pending[consumer.id] == 0:
                        heapq.heappush(ready, key(consumer.id))
            for later in after.get(op.id, ()):
                pending[later] -= 1
                if pending[later] == 0:
                    heapq.heappush(ready, key(later))
        if len(order) != len(self.ops):
            stuck = [self.ops[i].debug_name for i, n in pending.items() if n > 0][:5]
            raise popart_exception(f"Graph '{self.id}' has a cycle through ops {stuck}.")
        return order

    def ops_of_type(self, op_type: str) -> Iterable[Op]:
        return (op for op in self.ops.values() if op.op_type == op_type)


def _modifies(op: Op, tensor: Tensor) -> bool:
    return any(i < len(op.inputs) and op.inputs[i] is tensor for i in op.modifies_inputs)


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=3)
    return f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
