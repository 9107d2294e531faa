"""Pass: a weight read both by a product and by a Gather (a language model's tied token
embedding) sums two gradients, the product's dense one and a zero-filled table with the
gathered rows added back. The Gather's rows are added straight into the product's gradient
instead: no zero fill of the table and no full-table addition.

Before:  gm = LinearBiasWeightGrad(dlogits, h, transposed_weight=1)   # [V, D]
         ge = GatherGrad(dx, ids, axis=0, shape=[V, D])                 # zeros + rows
         Gradient___emb = Sum(gm, ge)
After:   gm = LinearBiasWeightGrad(dlogits, h, transposed_weight=1)
         Gradient___emb = GatherGradAdd(dx, ids, gm, axis=0, shape=[V, D])  # gm += rows

GatherGradAdd writes ``gm``'s storage, so the pass fires only when the Sum is the one reader of
both terms (neither anchored), ``gm`` comes from a product gradient (a fresh tensor, never a
view of a weight or an input: LinearBiasWeightGrad, MatMulRhsGrad), the dtypes and shapes
agree, and every op has the same placement. The values are the same sums up to the order of
the float additions (each gathered row is added to the product's row rather than to zero
first).
"""

from __future__ import annotations

import dataclasses

from ..ir.ir import Ir
from ..ir.tensor import TensorKind
from ..ops.registry import AI_GRAPHCORE, create_op
from .fuse_common import only_consumer, replace_chain, same_placement

__all__ = ["FuseTiedGatherGrad"]

# Product gradients whose kernels return a new tensor (safe to add into in place).
_FRESH_PRODUCTS = {("popart.fused", "LinearBiasWeightGrad"), (AI_GRAPHCORE, "MatMulRhsGrad")}


class FuseTiedGatherGrad:
    """Pass: Sum(product weight gradient, GatherGrad) -> GatherGradAdd (module doc)."""

    name = "fuse_tied_gather_grad"

    def run(self, ir: Ir) -> bool:
        graph = ir.main
        changed = False
        for op in list(graph.ops.values()):
            if (op.id in graph.ops and op.op_type == "Sum" and op.domain == "ai.onnx"
                    and len(op.inputs) == 2):
                changed |= self._fuse(graph, op)
        return changed

    def _fuse(self, graph, total) -> bool:
        out = total.outputs[0]
        a, b = total.inputs
        if a is None or b is None or a is b:
            return False
        for acc, rows in ((a, b), (b, a)):
            gather = rows.producer
            product = acc.producer
            if (gather is None or product is None or gather.op_type != "GatherGrad"
                    or gather.domain != AI_GRAPHCORE
                    or (product.domain, product.op_type) not in _FRESH_PRODUCTS):
                continue
            if (only_consumer(rows) is not total or only_consumer(acc) is not total
                    or acc.kind is not TensorKind.ACT_GRAD
                    or acc.info != out.info or rows.info != out.info):
                return False
            if not same_placement([product, gather, total]):
                return False
            fused = create_op("GatherGradAdd", {"axis": gather.attrs.axis,
                                                "shape": tuple(gather.attrs.shape)},
                              dataclasses.replace(total.settings), domain=AI_GRAPHCORE,
                              where=out.id)
            dy, indices = gather.inputs
            replace_chain(graph, [gather, total], fused, [dy.id, indices.id, acc.id], out)
            return True
        return False
