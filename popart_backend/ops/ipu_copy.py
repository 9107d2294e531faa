"""ai.graphcore ``IpuCopy``: a tensor moving from one IPU of a replica to another.

The virtual-graph and pipelining passes insert it wherever a value produced on one IPU is read
on another; models never contain it. Numerically it is the identity. It copies (rather than
aliases) so the destination IPU owns its value, as the hardware's exchange over IPU-Links does:
later writes on the source side can never change what the destination read. In a pipeline the
simulator runs the copies of a cycle after every stage's compute (the "C" fragment).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.op import Op
from .registry import AI_GRAPHCORE, register_op


@register_op("IpuCopy", versions=1, domain=AI_GRAPHCORE)
class IpuCopy(Op):
    """y = x, moved from ``source_ipu`` to ``dest_ipu``."""

    # The pipelined run loop executes these at the end of a cycle, not with the stage's compute.
    runs_between_cycles = True
    foldable = False
    public = False  # inserted by passes, not a model op

    @dataclass(frozen=True)
    class Attrs:
        source_ipu: int = 0
        dest_ipu: int = 0

    def infer(self, x):
        return x

    def kernel(self, x):
        return x.clone()

    def grad(self, g):
        back = g.op("IpuCopy", g.output_grad(0), domain=AI_GRAPHCORE,
                    source_ipu=self.attrs.dest_ipu, dest_ipu=self.attrs.source_ipu)
        g.set_input_grad(0, back)

    def cost(self) -> tuple[int, int]:
        # No arithmetic; the bytes cross the IPU-Link once.
        return 0, self.inputs[0].info.num_bytes
