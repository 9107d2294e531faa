"""Inter-IPU copies: a value read on another IPU than the one computing it moves
there through an explicit ``IpuCopy`` op (ai.graphcore), whose bytes the cost model charges to
the IPU-Links.

``InsertIpuCopies`` handles sharded execution (virtual graphs without pipelining): one copy per
(value, destination IPU), shared by every reader there. Pipelining places its copies itself
(``transforms/pipelining.py``), stage by stage, with ``add_ipu_copy``.

Before:  h = MatMul(x, w1)   # ipu0         After:  h = MatMul(x, w1)   # ipu0
         y = Relu(h)         # ipu1                 h_c1 = IpuCopy(h)   # ipu0 -> ipu1
                                                    y = Relu(h_c1)      # ipu1

Host streams, weights and constants are not copied: streams are written to the IPU that reads
them and each IPU holds the variables its ops use.
"""

from __future__ import annotations

import logging

from ..ir.graph import Graph
from ..ir.op import ExecutionContext, OpSettings
from ..ops.ipu_copy import IpuCopy
from ..ops.registry import AI_GRAPHCORE, create_op
from .virtual_graphs import Placement

_log = logging.getLogger("popart:transform")


def add_ipu_copy(graph: Graph, tensor_id: str, source_ipu: int, dest_ipu: int,
                 stage: int | None = None) -> str:
    """Add ``<id>_c<dest> = IpuCopy(<id>)`` and return the copy's id."""
    out = graph.unique_id(f"{tensor_id}_c{dest_ipu}")
    settings = OpSettings(name=f"IpuCopy___{out}", ipu=source_ipu, pipeline_stage=stage)
    op = create_op("IpuCopy", {"source_ipu": source_ipu, "dest_ipu": dest_ipu}, settings,
                   domain=AI_GRAPHCORE, where=out)
    graph.add_op(op, [tensor_id], [out])
    return out


class InsertIpuCopies:
    """Pass: an ``IpuCopy`` wherever an op reads an activation computed on another IPU
    (sharded execution; pipelined sessions copy in ``InsertPipelineStashes``)."""

    name = "insert_ipu_copies"

    def __init__(self, placement: Placement):
        self.placement = placement

    def run(self, ir) -> bool:
        if not self.placement.sharded or ir.stage_ipus:
            return False
        graph = ir.main
        copies: dict[tuple[str, int], str] = {}
        for op in graph.topo_order():
            if op.settings.execution_context is not ExecutionContext.Normal:
                continue
            for index, t in enumerate(op.inputs):
                # A copy's settings name its source IPU; its value is already on the reader's.
                if t is None or t.producer is None or isinstance(t.producer, IpuCopy):
                    continue
                source, dest = t.producer.settings.ipu, op.settings.ipu
                if source == dest:
                    continue
                key = (t.id, dest)
                if key not in copies:
                    copies[key] = add_ipu_copy(graph, t.id, source, dest)
                graph.replace_input(op, index, copies[key])
        _log.debug("insert_ipu_copies: %d copies", len(copies))
        return bool(copies)
