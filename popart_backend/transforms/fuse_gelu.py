"""Pass: the exporters' spelled-out GELU becomes one F.gelu call.

Exact form (``nn.GELU()``): 0.5 * x * (1 + erf(x / sqrt(2))), in any association of the two
products and with x / sqrt(2) written as Div or as Mul by 1/sqrt(2).

Before:  d = Div(x, 1.4142135)      After:  y = popart.fused::Gelu(x, approximate='none')
         e = Erf(d)
         a = Add(e, 1.0)
         h = Mul(0.5, a)
         y = Mul(x, h)

Tanh form (GPT-2's NewGELU, ``nn.GELU('tanh')``):
0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * Pow(x, 3)))), products in any order.

The fused Gelu has a gradient (GeluGrad, torch's gelu_backward), so the training pass list runs
this pass before autodiff (``training=True``: only chains on one IPU and pipeline stage).
"""

from __future__ import annotations

import math

from ..ops.fused import Gelu
from .fuse_common import (
    is_float,
    is_scalar,
    only_consumer,
    other_input,
    producer,
    replace_chain,
    same_placement,
    scalar_value,
)

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_TOL = 1e-5  # exporters print these constants to float32 (or fewer) digits


def _close(tensor, value) -> bool:
    return is_scalar(tensor, value, rtol=_TOL)


class FuseGelu:
    name = "fuse_gelu"

    def __init__(self, training: bool = False):
        self.training = training

    def run(self, ir) -> bool:
        graph = ir.main
        changed = False
        for op in list(graph.ops.values()):
            if op.id not in graph.ops or op.domain != "ai.onnx":
                continue
            if op.op_type == "Erf":
                changed |= self._fuse_erf(graph, op)
            elif op.op_type == "Tanh":
                changed |= self._fuse_tanh(graph, op)
        return changed

    def _fuse_erf(self, graph, erf) -> bool:
        u = erf.inputs[0]
        scaled = u.producer
        if scaled is None or scaled.domain != "ai.onnx" or only_consumer(u) is not erf:
            return False
        if scaled.op_type == "Div" and _close(scaled.inputs[1], SQRT2):
            x = scaled.inputs[0]
        elif scaled.op_type == "Mul":
            x = next((t for t in scaled.inputs if not _close(t, 1 / SQRT2)), None)
            if x is None or not _close(other_input(scaled, x), 1 / SQRT2):
                return False
        else:
            return False
        return self._finish(graph, x, [scaled, erf], erf.outputs[0], "none")

    def _fuse_tanh(self, graph, tanh) -> bool:
        # tanh(c * (x + 0.044715 * x**3))
        t = tanh.inputs[0]
        outer = producer(t, "Mul")
        if outer is None or only_consumer(t) is not tanh:
            return False
        inner_t = next((i for i in outer.inputs if not _close(i, SQRT_2_OVER_PI)), None)
        if inner_t is None or not _close(other_input(outer, inner_t), SQRT_2_OVER_PI):
            return False
        add = producer(inner_t, "Add")
        if add is None or only_consumer(inner_t) is not outer:
            return False
        for x in add.inputs:
            cubic = other_input(add, x)
            mul = producer(cubic, "Mul")
            if mul is None or only_consumer(cubic) is not add:
                continue
            pow_t = next((i for i in mul.inputs if not _close(i, 0.044715)), None)
            if pow_t is None or not _close(other_input(mul, pow_t), 0.044715):
                continue
            pw = producer(pow_t, "Pow")
            if pw is None or pw.inputs[0] is not x or scalar_value(pw.inputs[1]) != 3.0:
                continue
            if only_consumer(pow_t) is not mul:
                continue
            return self._finish(graph, x, [pw, mul, add, outer, tanh], tanh.outputs[0], "tanh")
        return False

    def _finish(self, graph, x, chain, f, approximate) -> bool:
        """Match 0.5 * x * (1 + f) after the erf/tanh output ``f``, then replace the chain."""
        if x is None or not is_float(x):
            return False
        add = only_consumer(f, "Add")
        if add is None or not _close(other_input(add, f), 1.0):
            return False
        a = add.outputs[0]
        m1 = only_consumer(a, "Mul")
        if m1 is None:
            return False
        k = other_input(m1, a)
        ops = [*chain, add, m1]
        if _close(k, 0.5):  # (0.5 * a) * x
            m2 = only_consumer(m1.outputs[0], "Mul")
            if m2 is None or other_input(m2, m1.outputs[0]) is not x:
                return False
            ops.append(m2)
        elif k is x:  # (x * a) * 0.5
            m2 = only_consumer(m1.outputs[0], "Mul")
            if m2 is None or not _close(other_input(m2, m1.outputs[0]), 0.5):
                return False
            ops.append(m2)
        else:  # (x * 0.5) * a
            half = producer(k, "Mul")
            if half is None or only_consumer(k) is not m1 or not _close(other_input(half, x), 0.5):
                return False
            ops.insert(0, half)
        out = ops[-1].outputs[0]
        if out.info != x.info or (self.training and not same_placement(ops)):
            return False
        fused = Gelu(Gelu.Attrs(approximate=approximate), ops[-1].settings, [x.info], out.info)
        replace_chain(graph, ops, fused, [x.id], out)
        return True
