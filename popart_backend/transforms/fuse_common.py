"""Pattern helpers shared by the fusion passes (``fuse_*.py``): matching and chain replacement.

A fusion replaces a chain of ops ending in tensor ``out`` by one new op that writes a tensor
with the same id, so anchors, graph outputs and later consumers are untouched.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ir.graph import Graph
from ..ir.op import Op
from ..ir.tensor import Tensor, TensorKind
from .autodiff import GRADIENT_PREFIX, differentiated_variables


def only_consumer(tensor: Tensor | None, op_type: str | None = None) -> Op | None:
    """The single consumer of an internal tensor (one use, not an output/anchor), else None."""
    if tensor is None or len(tensor.consumers) != 1 or is_observed(tensor):
        return None
    op = tensor.consumers[0]
    if op_type is not None and (op.op_type != op_type or op.domain != "ai.onnx"):
        return None
    return op


def is_observed(tensor: Tensor) -> bool:
    """True if the host reads ``tensor`` or its gradient (graph output, anchor, anchored
    ``Gradient___<id>``): it must keep existing."""
    graph = tensor.graph
    anchors = graph.ir.anchors if graph.ir is not None else ()
    return (tensor.id in graph.outputs or tensor.id in anchors
            or GRADIENT_PREFIX + tensor.id in anchors)


def producer(tensor: Tensor | None, op_type: str) -> Op | None:
    op = tensor.producer if tensor is not None else None
    if op is None or op.op_type != op_type or op.domain != "ai.onnx":
        return None
    return op


def other_input(op: Op, tensor: Tensor) -> Tensor | None:
    """The other operand of a binary op, given one of them (None if ``tensor`` is both)."""
    a, b = op.inputs[0], op.inputs[1]
    if a is tensor and b is not tensor:
        return b
    if b is tensor and a is not tensor:
        return a
    return None


def scalar_value(tensor: Tensor | None) -> float | None:
    """The value of a one-element floating constant, else None."""
    if tensor is None or not tensor.is_const or tensor.data.size != 1:
        return None
    if not np.issubdtype(tensor.data.dtype, np.floating):
        return None
    return float(tensor.data.reshape(()))


def is_scalar(tensor: Tensor | None, value: float, rtol: float = 1e-6) -> bool:
    got = scalar_value(tensor)
    return got is not None and abs(got - value) <= rtol * max(abs(value), 1e-30)


def is_float(tensor: Tensor) -> bool:
    return tensor.info.dtype.torch.is_floating_point


def same_placement(chain: Sequence[Op]) -> bool:
    """True when every op of ``chain`` has the same IPU, pipeline stage, phase, recomputation
    and execution context: a training fusion must not move work across IPUs or stages."""
    keys = {(op.settings.ipu, op.settings.pipeline_stage, op.settings.execution_phase,
             op.settings.recompute, op.settings.execution_context) for op in chain}
    return len(keys) == 1


def variable_dependent(graph: Graph) -> set[str]:
    """Ids of the float tensors computed from a float VARIABLE autodiff differentiates (not a
    frozen one): those autodiff may need gradients of (a training fusion must keep them
    differentiable)."""
    need = differentiated_variables(graph)
    for op in graph.topo_order():
        if any(t is not None and t.id in need for t in op.inputs):
            need.update(t.id for t in op.outputs if t is not None and t.info.dtype.is_float)
    return need


def replace_chain(graph: Graph, chain: Sequence[Op], new_op: Op, input_ids: Sequence[str],
                  out: Tensor, extra_outputs: Sequence[str] = ()) -> Op:
    """Remove ``chain`` (whose last output is ``out``) and let ``new_op`` produce ``out``'s id.

    ``extra_outputs`` are new tensor ids for the fused op's further outputs (saved statistics
    its gradient reads). Tensors the chain made that nobody reads any more are deleted, and so
    are constants that only the chain read (folded weights replace them).
    """
    temp_id = graph.unique_id(out.id + "__fused")
    graph.add_op(new_op, list(input_ids), [temp_id, *extra_outputs])
    new_out = graph.tensors[temp_id]
    graph.replace_all_uses(out, new_out)
    dropped = []
    for op in chain:
        dropped += [t for t in op.inputs if t is not None]
        dropped += [t for t in op.outputs if t is not None]
        graph.remove_op(op)
    for t in dict.fromkeys(dropped):  # unique, in order
        removable = t.kind in (TensorKind.ACT_GRAD, TensorKind.CONST)
        if removable and t.producer is None and not t.consumers and not is_observed(t):
            graph.remove_tensor(t)
    # Give the fused output the original id back.
    del graph.tensors[temp_id]
    new_out.id = out.id
    graph.tensors[out.id] = new_out
    graph.outputs = [out.id if t == temp_id else t for t in graph.outputs]
    return new_op
