"""Pass: a layer norm spelled out in reductions (TorchScript exports before opset 17) becomes
one F.layer_norm call.

Before:  m = ReduceMean(x, axes=[-1])        After:  y = popart.fused::LayerNorm(x, g, b,
         d = Sub(x, m)                                    epsilon=1e-5, num_axes=1)
         p = Pow(d, 2.0)
         v = ReduceMean(p, axes=[-1])
         e = Add(v, 1e-5)
         s = Sqrt(e)
         n = Div(d, s)
         t = Mul(n, g)                        # g, b of shape [H]
         y = Add(t, b)

With ``training=True`` (the training pass list, before autodiff) the fused op also outputs the
mean and 1/std (``save_stats=1``, tensors ``<y>/mean`` and ``<y>/rstd``) for its gradient,
torch's native layer-norm backward; training fuses only a norm with both scale and bias whose
chain sits on one IPU and pipeline stage.
"""

from __future__ import annotations

from ..ops.fused import LayerNorm
from .fuse_common import (
    is_float,
    is_observed,
    only_consumer,
    other_input,
    replace_chain,
    same_placement,
    scalar_value,
)


def _reduced_axes(op, rank: int) -> tuple[int, ...] | None:
    """The normalized axes of a keepdims ReduceMean, from its attribute or constant input."""
    if not getattr(op.attrs, "keepdims", 1):
        return None
    axes = getattr(op.attrs, "axes", None)
    if not axes and len(op.inputs) > 1 and op.inputs[1] is not None:
        if not op.inputs[1].is_const:
            return None
        axes = tuple(int(a) for a in op.inputs[1].data.reshape(-1))
    if not axes:
        return None
    return tuple(sorted(a % rank for a in axes))


class FuseLayerNorm:
    name = "fuse_layer_norm"

    def __init__(self, training: bool = False):
        self.training = training

    def run(self, ir) -> bool:
        graph = ir.main
        changed = False
        for op in list(graph.ops.values()):
            if op.id in graph.ops and op.op_type == "ReduceMean" and op.domain == "ai.onnx":
                changed |= self._fuse(graph, op)
        return changed

    def _fuse(self, graph, mean) -> bool:
        x = mean.inputs[0]
        rank = x.info.rank
        axes = _reduced_axes(mean, rank)
        if axes is None or not is_float(x) or axes != tuple(range(rank - len(axes), rank)):
            return False
        m = mean.outputs[0]
        sub = only_consumer(m, "Sub")
        if sub is None or sub.inputs[0] is not x or sub.inputs[1] is not m:
            return False
        d = sub.outputs[0]
        users = {op.op_type: op for op in d.consumers}
        if len(d.consumers) != 2 or set(users) != {"Pow", "Div"} or is_observed(d):
            return False
        pw, div = users["Pow"], users["Div"]
        if pw.inputs[0] is not d or scalar_value(pw.inputs[1]) != 2.0 or div.inputs[0] is not d:
            return False
        var = only_consumer(pw.outputs[0], "ReduceMean")
        if var is None or _reduced_axes(var, rank) != axes:
            return False
        add_eps = only_consumer(var.outputs[0], "Add")
        if add_eps is None:
            return False
        eps = scalar_value(other_input(add_eps, var.outputs[0]))
        sqrt = only_consumer(add_eps.outputs[0], "Sqrt")
        if eps is None or sqrt is None or only_consumer(sqrt.outputs[0]) is not div:
            return False
        if div.inputs[1] is not sqrt.outputs[0]:
            return False
        chain = [mean, sub, pw, var, add_eps, sqrt, div]
        norm_shape = x.info.shape[rank - len(axes):]
        out = div.outputs[0]
        scale = bias = None
        mul = only_consumer(out, "Mul")
        if mul is not None and _param(other_input(mul, out), norm_shape, x):
            scale = other_input(mul, out)
            chain.append(mul)
            out = mul.outputs[0]
            add = only_consumer(out, "Add")
            if add is not None and _param(other_input(add, out), norm_shape, x):
                bias = other_input(add, out)
                chain.append(add)
                out = add.outputs[0]
        if out.info != x.info:
            return False
        inputs = [x] + ([scale] if scale is not None else []) + ([bias] if bias is not None else [])
        if bias is not None and scale is None:
            return False
        if self.training and (bias is None or not same_placement(chain)):
            return False
        fused = LayerNorm(
            LayerNorm.Attrs(epsilon=eps, num_axes=len(axes), save_stats=int(self.training)),
            chain[-1].settings, [t.info for t in inputs], out.info,
        )
        extra = ([graph.unique_id(f"{out.id}/mean"), graph.unique_id(f"{out.id}/rstd")]
                 if self.training else [])
        replace_chain(graph, chain, fused, [t.id for t in inputs], out, extra)
        return True


def _param(t, norm_shape, x) -> bool:
    """An affine parameter F.layer_norm accepts: exactly the normalized shape, same dtype."""
    return t is not None and t.info.shape == tuple(norm_shape) and t.info.dtype == x.info.dtype
