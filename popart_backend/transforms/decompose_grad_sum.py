"""SessionOptions.decomposeGradSum (training): each gradient sum autodiff made (a ``Sum`` of the
partial gradients of a tensor read by several ops) becomes a chain of two-input ``Add`` ops in
the order of its inputs, so each partial can be added, and die, as soon as it and the running
total exist, instead of every partial staying live until the last one is made.

The values are unchanged: the Sum kernel adds its inputs left to right, as the chain does.
The device model sees one op (one superstep) per addition, and the liveness walk of
device/memory.py moves each Add of a chain to just after its inputs (the Adds are marked
``OpSettings.early_in_liveness``; device/option_model.py ``early_op_order``).

Before:  Gradient___x = Sum(g0, g1, g2)
After:   Gradient___x/sum0 = Add(g0, g1)
         Gradient___x = Add(Gradient___x/sum0, g2)
"""

from __future__ import annotations

import dataclasses

from ..ir.ir import Ir
from ..ops.registry import create_op
from .autodiff import GRADIENT_PREFIX
from .fuse_common import replace_chain

__all__ = ["DecomposeGradSums"]


class DecomposeGradSums:
    """Pass: gradient ``Sum`` ops with two or more inputs become chains of ``Add``."""

    name = "decompose_grad_sums"

    def run(self, ir: Ir) -> bool:
        graph = ir.main
        changed = False
        for op in list(graph.topo_order()):
            out = op.outputs[0] if op.outputs else None
            if (op.op_type != "Sum" or out is None or not out.id.startswith(GRADIENT_PREFIX)
                    or len(op.inputs) < 2 or any(t is None for t in op.inputs)):
                continue
            parts = [t.id for t in op.inputs]
            total = parts[0]
            for i, part in enumerate(parts[1:-1]):
                name = f"{out.id}/sum{i}"
                add = create_op("Add", {}, dataclasses.replace(
                    op.settings, name=name, early_in_liveness=True), where=name)
                graph.add_op(add, [total, part], [graph.unique_id(name)])
                total = add.outputs[0].id
            last = create_op("Add", {}, dataclasses.replace(op.settings, early_in_liveness=True),
                             where=out.id)
            replace_chain(graph, [op], last, [total, parts[-1]], out)
            changed = True
        return changed
