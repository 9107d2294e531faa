"""Walks over ONNX GraphProtos shared by the importer: the names a node's subgraphs read from
enclosing graphs, nodes in topological order, the names a graph defines, and renaming.
"""

from __future__ import annotations

import onnx

from ..errors import ModelError


def captured_names(node: onnx.NodeProto) -> set[str]:
    """Names the subgraphs of ``node`` read from enclosing graphs."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else (
            [attr.g] if attr.type == onnx.AttributeProto.GRAPH else [])
        for sub in graphs:
            defined = {i.name for i in sub.input} | {i.name for i in sub.initializer} | {""}
            defined |= {o for n in sub.node for o in n.output}
            reads = {n for inner in sub.node for n in inner.input} | {o.name for o in sub.output}
            reads |= {n for inner in sub.node for n in captured_names(inner)}
            names |= reads - defined
    return names


def nodes_in_order(graph: onnx.GraphProto, outer_ok: bool = False) -> list[onnx.NodeProto]:
    """Nodes in topological order (ONNX requires it, but some producers do not comply).

    A node waits for its inputs and for what its subgraphs read from this graph. With
    ``outer_ok`` (subgraphs) names no node of ``graph`` produces come from enclosing graphs."""
    known = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    if outer_ok:
        produced = {o for n in graph.node for o in n.output}
        known |= {n for node in graph.node for n in (*node.input, *captured_names(node))
                  if n not in produced}
    pending = list(graph.node)
    ordered = []
    while pending:
        rest = []
        for node in pending:
            if all(n in known for n in node.input) and all(
                n in known for n in captured_names(node)
            ):
                ordered.append(node)
                known.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            missing = sorted({n for node in rest for n in (*node.input, *captured_names(node))
                              if n not in known})
            raise ModelError(
                f"{len(rest)} node(s) read tensors no node or input produces: {missing[:10]}. "
                f"First: {rest[0].op_type} '{rest[0].name}'."
            )
        pending = rest
    return ordered


def local_names(graph: onnx.GraphProto, top: bool = False) -> set[str]:
    """Names ``graph`` defines: initializers, node outputs and, in nested bodies, also their
    inputs (the top graph's inputs are bound by the caller)."""
    names = {i.name for i in graph.initializer} | {o for n in graph.node for o in n.output}
    if not top:
        names |= {i.name for i in graph.input}
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names |= local_names(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    names |= local_names(g)
    return names


def renamed(graph: onnx.GraphProto, mapping: dict[str, str]) -> onnx.GraphProto:
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
