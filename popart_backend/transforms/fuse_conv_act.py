"""Pass: Conv + Relu and Conv + Add(residual) + Relu become one ConvBiasAct op.

The residual add and the ReLU run in place on the fresh convolution output, so the block
allocates one tensor instead of three. Run it after ``fold_batchnorm_into_conv`` so that
Conv + BatchNormalization + Relu fuses too.

Before:  c = Conv(x, w, b)         # f32[8,16,32,32]
         s = Add(c, r)             # r f32[8,16,32,32], the block's shortcut
         y = Relu(s)
After:   y = popart.fused::ConvBiasAct(x, w, b, r, activation='relu', residual=1)
"""

from __future__ import annotations

from ..ops.fused import ConvBiasAct
from .fuse_common import is_float, only_consumer, other_input, replace_chain


class FuseConvActivation:
    name = "fuse_conv_activation"

    def run(self, ir) -> bool:
        graph = ir.main
        changed = False
        for conv in list(graph.ops_of_type("Conv")):
            if conv.id in graph.ops and conv.domain == "ai.onnx":
                changed |= self._fuse(graph, conv)
        return changed

    def _fuse(self, graph, conv) -> bool:
        c = conv.outputs[0]
        if not is_float(c):
            return False
        chain = [conv]
        inputs = list(conv.inputs) + [None] * (3 - len(conv.inputs))
        residual = None
        nxt = only_consumer(c)
        if nxt is not None and nxt.op_type == "Add" and nxt.domain == "ai.onnx":
            other = other_input(nxt, c)
            relu = only_consumer(nxt.outputs[0], "Relu")
            # In place: the residual must not change the conv output's shape or dtype.
            if (other is None or relu is None or getattr(nxt.attrs, "broadcast", None) is not None
                    or nxt.outputs[0].info != c.info or other.info.dtype != c.info.dtype):
                return False
            residual = other
            chain += [nxt, relu]
        elif nxt is not None and nxt.op_type == "Relu" and nxt.domain == "ai.onnx":
            chain.append(nxt)
        else:
            return False
        out = chain[-1].outputs[0]
        ids = [t.id if t is not None else "" for t in inputs]
        infos = [t.info if t is not None else None for t in inputs]
        if residual is not None:
            ids.append(residual.id)
            infos.append(residual.info)
        fused = ConvBiasAct(
            ConvBiasAct.Attrs(activation="relu", residual=int(residual is not None)),
            conv.settings, infos, out.info, conv,
        )
        replace_chain(graph, chain, fused, ids, out)
        return True
