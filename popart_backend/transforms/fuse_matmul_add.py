"""Pass: MatMul + bias Add (+ Relu), and Gemm + Relu, become one LinearBias (addmm) op.

The exporters write ``nn.Linear`` on 3-D activations as MatMul(x, W) followed by Add(., b);
addmm does both in one pass over the output, and a following Relu runs in place.

Before:  m = MatMul(x, w)   # x f32[2,8,64], w f32[64,32]
         y = Add(m, b)      # b f32[32]
         r = Relu(y)
After:   r = popart.fused::LinearBias(x, w, b, transposed_weight=0, activation='relu')

Before:  y = Gemm(x, w, b, transB=1)   # alpha = beta = 1, no transA
         r = Relu(y)
After:   r = popart.fused::LinearBias(x, w, b, transposed_weight=1, activation='relu')
"""

from __future__ import annotations

from ..ops.fused import LinearBias
from .fuse_common import is_float, only_consumer, other_input, replace_chain


def _bias_ok(mm_out, bias, out) -> bool:
    """A bias broadcast over the last dim only: shape [N] or [1, ..., 1, N]."""
    n = mm_out.info.shape[-1]
    shape = bias.info.shape
    return (
        bias.info.dtype == mm_out.info.dtype
        and len(shape) >= 1
        and shape[-1] == n
        and all(d == 1 for d in shape[:-1])
        and len(shape) <= mm_out.info.rank
        and out.info.shape == mm_out.info.shape
    )


def _with_relu(out):
    """The Relu reading ``out`` when it is ``out``'s only use: fused as an in-place epilogue."""
    return only_consumer(out, "Relu")


class FuseMatMulAdd:
    name = "fuse_matmul_add"

    def run(self, ir) -> bool:
        graph = ir.main
        changed = False
        for op in graph.topo_order():
            if op.graph is None or op.id not in graph.ops:
                continue
            if op.op_type == "MatMul" and op.domain == "ai.onnx":
                changed |= self._fuse_matmul(graph, op)
            elif op.op_type == "Gemm" and op.domain == "ai.onnx":
                changed |= self._fuse_gemm_relu(graph, op)
        return changed

    def _fuse_matmul(self, graph, mm) -> bool:
        x, w = mm.inputs
        mm_out = mm.outputs[0]
        if w.info.rank != 2 or x.info.rank < 2 or not is_float(mm_out):
            return False
        add = only_consumer(mm_out, "Add")
        if add is None or getattr(add.attrs, "broadcast", None) is not None:
            return False  # opset < 7 Add has legacy broadcasting
        bias = other_input(add, mm_out)
        out = add.outputs[0]
        if bias is None or not _bias_ok(mm_out, bias, out):
            return False
        if bias.info.rank != 1 and not bias.is_const:
            return False
        chain = [mm, add]
        relu = _with_relu(out)
        if relu is not None:
            chain.append(relu)
            out = relu.outputs[0]
        b_id = bias.id
        if bias.info.rank != 1:
            b_id = self._flat_bias(graph, bias)
        fused = LinearBias(
            LinearBias.Attrs(transposed_weight=0, activation="relu" if relu else "none"),
            add.settings,
            [x.info, w.info, graph.tensors[b_id].info],
            out.info,
        )
        replace_chain(graph, chain, fused, [x.id, w.id, b_id], out)
        return True

    def _fuse_gemm_relu(self, graph, gemm) -> bool:
        at = gemm.attrs
        # Only the plain fully connected form: Y = X @ W.T + C with a [N] or [1, N] bias.
        if getattr(at, "broadcast", None) is not None:
            return False
        if at.transA or not at.transB or at.alpha != 1.0 or at.beta != 1.0:
            return False
        relu = _with_relu(gemm.outputs[0])
        if relu is None or not is_float(gemm.outputs[0]):
            return False
        x, w = gemm.inputs[0], gemm.inputs[1]
        bias = gemm.inputs[2] if len(gemm.inputs) > 2 else None
        if bias is not None and bias.info.shape not in ((w.info.shape[0],), (1, w.info.shape[0])):
            return False
        out = relu.outputs[0]
        inputs = [x, w] + ([bias] if bias is not None else [])
        fused = LinearBias(
            LinearBias.Attrs(transposed_weight=1, activation="relu"),
            gemm.settings,
            [t.info for t in inputs],
            out.info,
        )
        replace_chain(graph, [gemm, relu], fused, [t.id for t in inputs], out)
        return True

    @staticmethod
    def _flat_bias(graph, bias) -> str:
        """A [1, .., N] constant bias as a new [N] constant (F.linear wants 1-D)."""
        flat_id = graph.unique_id(bias.id + "__flat")
        graph.add_const(flat_id, bias.data.reshape(-1))
        return flat_id
