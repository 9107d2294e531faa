"""Pass (inference only): fold an eval-mode BatchNormalization into the Conv before it.

With s = scale / sqrt(var + eps), BN(Conv(x, W, b)) = Conv(x, W * s[:, None, ...],
(b - mean) * s + B). Applies when the Conv output is read only by the BatchNormalization, the
BN has one output (inference form) and every weight and statistic is a compile-time constant
(SessionOptions.constantWeights, the inference default). The folded weights are computed in
float64 and stored in the model dtype.

Before:  c = Conv(x, w, b)                   # w, b, scale, beta, mean, var constants
         y = BatchNormalization(c, scale, beta, mean, var, epsilon=1e-5)
After:   y = Conv(x, w__bnfold, b__bnfold)
"""

from __future__ import annotations

import numpy as np

from .fuse_common import only_consumer, replace_chain


class FoldBatchNormIntoConv:
    name = "fold_batchnorm_into_conv"

    def run(self, ir) -> bool:
        graph = ir.main
        changed = False
        for conv in list(graph.ops_of_type("Conv")):
            if conv.id in graph.ops and conv.domain == "ai.onnx":
                changed |= self._fold(graph, conv)
        return changed

    def _fold(self, graph, conv) -> bool:
        bn = only_consumer(conv.outputs[0], "BatchNormalization")
        if bn is None or bn.inputs[0] is not conv.outputs[0]:
            return False
        if sum(t is not None for t in bn.outputs) != 1 or bn.outputs[0] is None:
            return False
        if getattr(bn.attrs, "training_mode", 0) or not getattr(bn.attrs, "spatial", 1):
            return False
        w = conv.inputs[1]
        b = conv.inputs[2] if len(conv.inputs) > 2 else None
        params = [w, b, *bn.inputs[1:5]]
        if any(t is not None and not t.is_const for t in params):
            return False
        if not np.issubdtype(w.data.dtype, np.floating):
            return False
        scale, beta, mean, var = (t.data.astype(np.float64) for t in bn.inputs[1:5])
        s = scale / np.sqrt(var + bn.attrs.epsilon)
        bias = b.data.astype(np.float64) if b is not None else np.zeros_like(mean)
        w_new = (w.data.astype(np.float64) * s.reshape((-1,) + (1,) * (w.info.rank - 1)))
        b_new = (bias - mean) * s + beta
        w_id = graph.unique_id(w.id + "__bnfold")
        graph.add_const(w_id, w_new.astype(w.data.dtype))
        b_id = graph.unique_id((b.id if b is not None else w.id + "_bias") + "__bnfold")
        graph.add_const(b_id, b_new.astype(w.data.dtype))
        x = conv.inputs[0]
        new_conv = type(conv)(conv.attrs, conv.settings, conv.version)
        replace_chain(graph, [conv, bn], new_conv, [x.id, w_id, b_id], bn.outputs[0])
        return True
