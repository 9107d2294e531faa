"""One-op-per-line text view of a Graph: ``y = MatMul(x, w)  # f32[8,10] ipu1 stage1``."""

from __future__ import annotations

from .graph import Graph
from .op import Op


def format_op(op: Op) -> str:
    outs = ", ".join(t.id if t is not None else "_" for t in op.outputs)
    ins = ", ".join(t.id if t is not None else "_" for t in op.inputs)
    attrs = op.attr_dict()
    attr_text = ", ".join(f"{k}={v!r}" for k, v in attrs.items())
    call = f"{op.op_type}({ins}{', ' if ins and attr_text else ''}{attr_text})"
    notes = [" ".join(str(t.info) for t in op.outputs if t is not None)]
    if op.settings.ipu is not None:
        notes.append(f"ipu{op.settings.ipu}")
    if op.settings.pipeline_stage is not None:
        notes.append(f"stage{op.settings.pipeline_stage}")
    return f"{outs} = {call}  # {' '.join(n for n in notes if n)}"


def format_graph(graph: Graph) -> str:
    lines = [f"graph {graph.id}:"]
    for tid in graph.inputs:
        t = graph.tensors[tid]
        lines.append(f"  input {tid}: {t.info} {t.kind.value}")
    for t in graph.tensors.values():
        if t.kind.value == "variable":
            lines.append(f"  variable {t.id}: {t.info}")
    for op in graph.topo_order():
        lines.append("  " + format_op(op))
    lines.append(f"  return {', '.join(graph.outputs)}")
    return "\n".join(lines)
