"""Pass (inference only): Conv + eval-mode BatchNormalization whose weights are variables
(``constantWeights = False``, as every PopTorch session) becomes one ConvBatchNorm op that
folds the statistics into the convolution at run time, and again after each weight write
(``ops/fused_conv.py``). A following Relu, or residual Add + Relu, joins it in place.

Run it after ``fold_batchnorm_into_conv`` (which folds the all-constant case once, at compile
time) and before ``fuse_conv_activation``.

Before:  c = Conv(x, w)                                  # w, scale, beta, mean, var variables
         n = BatchNormalization(c, scale, beta, mean, var, epsilon=1e-5)
         s = Add(n, r)                                   # optional residual
         y = Relu(s)
After:   y = popart.fused::ConvBatchNorm(x, w, "", scale, beta, mean, var, r,
                                         activation='relu', residual=1)
"""

from __future__ import annotations

from ..ops.fused_conv import ConvBatchNorm
from .fuse_common import is_float, only_consumer, other_input, replace_chain


def _epilogue(n):
    """The ops after the BN output ``n`` that run in place: ([], None), ([Relu], None) or
    ([Add, Relu], residual)."""
    nxt = only_consumer(n)
    if nxt is None or nxt.domain != "ai.onnx":
        return [], None
    if nxt.op_type == "Relu":
        return [nxt], None
    if nxt.op_type == "Add":
        other = other_input(nxt, n)
        relu = only_consumer(nxt.outputs[0], "Relu")
        # In place: the residual must not change the output's shape or dtype.
        if (other is None or relu is None or nxt.outputs[0].info != n.info
                or other.info.dtype != n.info.dtype):
            return [], None
        return [nxt, relu], other
    return [], None


class FoldVariableBatchNormIntoConv:
    name = "fold_variable_batchnorm_into_conv"

    def run(self, ir) -> bool:
        graph = ir.main
        changed = False
        for conv in list(graph.ops_of_type("Conv")):
            if conv.id in graph.ops and conv.domain == "ai.onnx":
                changed |= self._fuse(graph, conv)
        return changed

    def _fuse(self, graph, conv) -> bool:
        c = conv.outputs[0]
        bn = only_consumer(c, "BatchNormalization")
        if bn is None or bn.inputs[0] is not c or not is_float(c):
            return False
        if sum(t is not None for t in bn.outputs) != 1 or bn.outputs[0] is None:
            return False
        # Versions without these attributes are inference-form and spatial.
        if getattr(bn.attrs, "training_mode", 0) or not getattr(bn.attrs, "spatial", 1):
            return False
        params = bn.inputs[1:5]
        if len(params) != 4 or any(t is None or not is_float(t) for t in params):
            return False
        channels = c.info.shape[1]
        if any(t.info.shape != (channels,) for t in params):
            return False
        n = bn.outputs[0]
        if n.info != c.info:
            return False
        epilogue, residual = _epilogue(n)
        chain = [conv, bn, *epilogue]
        out = chain[-1].outputs[0]
        conv_inputs = list(conv.inputs) + [None] * (3 - len(conv.inputs))
        inputs = conv_inputs + list(params) + ([residual] if residual is not None else [])
        fused = ConvBatchNorm(
            ConvBatchNorm.Attrs(epsilon=float(bn.attrs.epsilon),
                                activation="relu" if epilogue else "none",
                                residual=int(residual is not None)),
            conv.settings, [t.info if t is not None else None for t in inputs], out.info, conv,
        )
        replace_chain(graph, chain, fused, [t.id if t is not None else "" for t in inputs], out)
        return True
