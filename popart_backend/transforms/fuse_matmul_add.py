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

With ``training=True`` (the training pass list, before autodiff), a weight the exporters
transpose at run time (a trained ``nn.Linear`` weight is a variable, so constant folding leaves
its Transpose) is read in its own [N, K] layout, so its gradient is computed there too instead
of being transposed back:

Before:  wt = Transpose(w, perm=[1, 0])     # w f32[32,64], a variable
         m = MatMul(x, wt)
         y = Add(m, b)
After:   y = popart.fused::LinearBias(x, w, b, transposed_weight=1, activation='none')

In training the pass also fuses a MatMul by a transposed weight without a bias, and fuses only
chains that sit on one IPU and stage.
LinearBias's gradient is one mm per operand plus a row sum for the bias, as addmm's is.
"""

from __future__ import annotations

import dataclasses

from ..ops.fused import LinearBias
from .fuse_common import is_float, only_consumer, other_input, replace_chain, same_placement


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


def _transposed_weight(w):
    """(W, the Transpose) when ``w`` = Transpose(W, perm=[1, 0]) of a 2-D W, read only here."""
    op = w.producer
    if op is None or op.op_type != "Transpose" or op.domain != "ai.onnx":
        return None
    if only_consumer(w) is None or tuple(op.attrs.perm or (1, 0)) != (1, 0):
        return None
    return op.inputs[0], op


class FuseMatMulAdd:
    name = "fuse_matmul_add"

    def __init__(self, training: bool = False):
        self.training = training

    def run(self, ir) -> bool:
        graph = ir.main
        changed = False
        for op in graph.topo_order():
            if op.graph is None or op.id not in graph.ops:
                continue
            if op.settings.half_partials:
                continue  # partialsTypeMatMuls: its float16 accumulation stays its own
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
        transposed = _transposed_weight(w) if self.training else None
        chain = [mm] if transposed is None else [transposed[1], mm]
        if transposed is not None:
            w = transposed[0]
        add = only_consumer(mm_out, "Add")
        if add is not None and getattr(add.attrs, "broadcast", None) is not None:
            add = None  # opset < 7 Add has legacy broadcasting
        bias = other_input(add, mm_out) if add is not None else None
        if bias is not None and not (_bias_ok(mm_out, bias, add.outputs[0])
                                     and (bias.info.rank == 1 or bias.is_const)):
            bias = None
        if bias is None and not (self.training and transposed is not None):
            return False
        out = mm_out
        if bias is not None:
            chain.append(add)
            out = add.outputs[0]
        relu = _with_relu(out) if bias is not None else None
        if relu is not None:
            chain.append(relu)
            out = relu.outputs[0]
        if self.training and not same_placement(chain):
            return False
        inputs = [x.id, w.id]
        if bias is not None:
            inputs.append(bias.id if bias.info.rank == 1 else self._flat_bias(graph, bias))
        settings = mm.settings
        if bias is not None:
            # The Add's name and placement; the product's plan (available memory proportion,
            # serialisation) is the MatMul's.
            settings = dataclasses.replace(
                add.settings, available_memory_proportion=mm.settings.available_memory_proportion,
                serialize_matmul=mm.settings.serialize_matmul)
        fused = LinearBias(
            LinearBias.Attrs(transposed_weight=int(transposed is not None),
                             activation="relu" if relu else "none"),
            settings,
            [graph.tensors[i].info for i in inputs],
            out.info,
        )
        replace_chain(graph, chain, fused, inputs, out)
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
        if self.training and not same_placement([gemm, relu]):
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
