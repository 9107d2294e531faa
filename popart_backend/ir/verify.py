"""Structural checks of a Graph: edges agree both ways, shapes agree with inference."""

from __future__ import annotations

from ..errors import popart_internal_exception
from .graph import Graph
from .printer import format_op


def verify(graph: Graph) -> None:
    """Raise popart_internal_exception naming the bad op and its neighbours on any broken rule."""
    # Edges first, in creation order: a broken edge would also break the topological sort.
    order = sorted(graph.ops.values(), key=lambda op: op.id)
    position = {op.id: i for i, op in enumerate(order)}
    for op in order:
        for t in op.inputs:
            if t is None:
                continue
            if graph.tensors.get(t.id) is not t:
                _fail(graph, order, position[op.id], f"input '{t.id}' is not in the graph")
            if op not in t.consumers:
                _fail(graph, order, position[op.id], f"'{t.id}' does not list it as consumer")
        for t in op.outputs:
            if t is not None and t.producer is not op:
                _fail(graph, order, position[op.id], f"output '{t.id}' names another producer")
    order = graph.topo_order()
    position = {op.id: i for i, op in enumerate(order)}
    for op in order:
        infos = op.infer(*op.input_infos())
        infos = [infos] if not isinstance(infos, (list, tuple)) else list(infos)
        for t, info in zip(op.outputs, infos):
            if t is not None and t.info != info:
                _fail(graph, order, position[op.id], f"output '{t.id}' is {t.info}, infer says {info}")
    for tid in graph.outputs:
        if tid not in graph.tensors:
            raise popart_internal_exception(f"Graph output '{tid}' is not a tensor of the graph.")


def _fail(graph: Graph, order, index: int, what: str) -> None:
    around = order[max(0, index - 2) : index + 3]
    lines = "\n".join(("> " if op is order[index] else "  ") + format_op(op) for op in around)
    raise popart_internal_exception(
        f"verify({graph.id}): {order[index].debug_name}: {what}.\n{lines}"
    )
