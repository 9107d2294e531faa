"""The ai.onnx.preview.training Gradient op, built at import from our autodiff.

``dy/dx, ... = Gradient[xs, zs, y](x values..., z values...)`` names the graph to differentiate
by tensor ids: y as a function of the independent tensors xs and zs. The importer copies the
ops computing y from them (in the graph imported so far) into a subgraph whose formal inputs
are xs then zs, grows its backward with ``transforms.autodiff`` (seeded with ones, so a
non-scalar y gives the gradient of its sum), and calls it with the node's inputs: the gradient
is evaluated at the values the node is given, which need not be the forward's.

Before:  c = Add(a, b) ; da, db = Gradient[xs=[a, b], y=c](a, b)
After:   c = Add(a, b) ; da, db = Call[callee: (a, b) -> Add ; backward -> (dc/da, dc/db)](a, b)

Tensors y depends on other than xs and zs are read by the subgraph from the enclosing graph
(constants are copied). xs and zs must be independent: y's ops are taken up to them.
"""

from __future__ import annotations

import numpy as np
import onnx

from ..errors import ModelError, ShapeError
from ..ir.graph import Graph
from ..ir.op import Op
from ..ir.tensor import TensorKind
from ..ops.control_flow import Body
from ..ops.registry import AI_GRAPHCORE, create_op
from ..transforms.autodiff import Autodiff

PREVIEW_TRAINING = "ai.onnx.preview.training"


def is_gradient_node(node: onnx.NodeProto) -> bool:
    return node.op_type == "Gradient" and node.domain == PREVIEW_TRAINING


def add_gradient(graph: Graph, node: onnx.NodeProto, attrs: dict, settings) -> Op:
    """Import one Gradient node into ``graph`` as a Call of its gradient subgraph."""
    where = f"Gradient '{node.name or node.output[0]}'"
    unknown = sorted(set(attrs) - {"xs", "zs", "y"})
    if unknown or "xs" not in attrs or "y" not in attrs:
        raise ModelError(
            f"{where}: Gradient-1 takes attributes xs, y (required) and zs; got {sorted(attrs)}."
        )
    xs, zs, y = list(attrs["xs"]), list(attrs.get("zs", ())), attrs["y"]
    independent = xs + zs
    if len(node.input) != len(independent):
        raise ModelError(
            f"{where}: it has {len(node.input)} inputs for the {len(independent)} tensors of xs "
            f"and zs ({independent}); give one value per tensor, xs first."
        )
    if len(node.output) > len(xs):
        raise ModelError(f"{where}: {len(node.output)} outputs for {len(xs)} tensors in xs.")
    missing = [t for t in [*independent, y] if t not in graph.tensors]
    if missing:
        raise ModelError(
            f"{where}: {missing} are not tensors of the graph imported before the node; xs, zs "
            f"and y must be computed before the Gradient node."
        )
    for name, value in zip(independent, node.input):
        a, b = graph.tensors[name].info, graph.tensors[value].info
        if a != b:
            raise ShapeError(f"{where}: input '{value}' is {b}, but '{name}' is {a}.")
    body, captured = _gradient_body(graph, independent, xs, y, where)
    outputs = [o or graph.unique_id(f"{node.name or 'Gradient'}/unused{i}")
               for i, o in enumerate(node.output)]
    outputs += [graph.unique_id(f"{node.name or 'Gradient'}/unused{i}")
                for i in range(len(outputs), len(xs))]
    op = create_op("Call", {"callee": body}, settings, domain=AI_GRAPHCORE, where=where)
    graph.add_op(op, [*node.input, *captured], outputs)
    return op


def _gradient_body(graph: Graph, independent: list[str], xs: list[str], y: str, where: str
                   ) -> tuple[Body, list[str]]:
    """The subgraph (independent) -> (dy/dx for x in xs) and the enclosing tensors it reads."""
    ops = _ops_between(graph, set(independent), y)
    ir = graph.ir
    base = f"{graph.id}/{where.split(' ', 1)[1].strip(chr(39))}/gradient"
    graph_id, n = base, 0
    while graph_id in ir.graphs:
        n += 1
        graph_id = f"{base}__{n}"
    body = ir.create_graph(graph_id)
    for tid in independent:
        body.add_tensor(tid, graph.tensors[tid].info, TensorKind.STREAM)
        body.inputs.append(tid)
    captured: list[str] = []
    for op in ops:
        for t in op.inputs:
            if t is None or t.id in body.tensors:
                continue
            if t.is_const:
                body.add_const(t.id, t.data)
            else:
                body.add_tensor(t.id, t.info, TensorKind.STREAM)
                captured.append(t.id)
        clone = op.clone_with()
        body.add_op(clone, [t.id if t is not None else "" for t in op.inputs],
                    [t.id if t is not None else "" for t in op.outputs])
    body.inputs.extend(captured)
    if y not in body.tensors:  # y is one of xs / zs itself
        body.add_tensor(y, graph.tensors[y].info, TensorKind.STREAM)
    info = body.tensors[y].info
    if not info.dtype.is_float:
        raise ShapeError(f"{where}: y '{y}' is {info}; only floating-point tensors have gradients.")
    seed = body.unique_id(f"{y}/seed")
    body.add_const(seed, np.ones(info.shape, info.dtype.numpy))
    grads = Autodiff(None).differentiate(body, {y: seed}, xs) if ops or y in xs else {}
    outputs = []
    for x in xs:
        if x == y:
            grads[x] = seed
        if x in grads:
            outputs.append(grads[x])
            continue
        x_info = body.tensors[x].info
        zeros = body.unique_id(f"{x}/zero_grad")
        body.add_const(zeros, np.zeros(x_info.shape, x_info.dtype.numpy))
        outputs.append(zeros)
    body.outputs = outputs
    return Body(body, len(independent)), captured


def _ops_between(graph: Graph, independent: set[str], y: str) -> list[Op]:
    """The ops y is computed by, back to the independent tensors, in topological order."""
    needed: set[int] = set()
    stack = [graph.tensors[y]]
    while stack:
        tensor = stack.pop()
        if tensor.id in independent or tensor.producer is None or tensor.producer.id in needed:
            continue
        needed.add(tensor.producer.id)
        stack.extend(t for t in tensor.producer.inputs if t is not None)
    return [op for op in graph.topo_order() if op.id in needed]
