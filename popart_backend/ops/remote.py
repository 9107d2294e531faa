"""ai.graphcore ``RemoteLoad`` and ``RemoteStore``: tensors moving between an IPU and its
off-chip streaming memory.

The execution-phase pass (transforms/execution_phases.py) inserts them; models never contain
them. ``RemoteLoad`` copies a tensor held in streaming memory into a fresh on-chip tensor;
``RemoteStore`` writes an on-chip value into a streaming-memory buffer in place (a weight, or
the buffer an ``Init`` made for an activation). Numerically both are copies. Their transfer
time is not part of ``cost()``: the cycle model charges it once per transfer from the
tensor's bytes and the streaming-memory link (device/cost.py, ``CycleResult.remote``).

    w_p0   = RemoteLoad(w)            # before the phase that reads w
    y      = MatMul(x, w_p0)
    w'     = SGDUpdate(w_p2, g)       # on the copy loaded for the backward phase
    w_st   = RemoteStore(w, w')       # after the phase that updated it
"""

from __future__ import annotations

from ..errors import ShapeError
from ..ir.op import Op
from .graphcore_common import GC
from .registry import register_op


@register_op("RemoteLoad", versions=1, domain=GC)
class RemoteLoad(Op):
    """y = copy of ``buffer``, loaded from streaming memory onto the IPU."""

    foldable = False
    public = False  # inserted by the execution-phase pass
    remote_transfer = True

    def infer(self, buffer):
        return buffer

    def kernel(self, buffer):
        return buffer.clone()

    def cost(self) -> tuple[int, int]:
        return 0, 0  # the transfer is charged by the cycle model's remote records


@register_op("RemoteStore", versions=1, domain=GC)
class RemoteStore(Op):
    """buffer := value, in streaming memory; the output aliases ``buffer``."""

    foldable = False
    public = False  # inserted by the execution-phase pass
    remote_transfer = True
    modifies_inputs = (0,)

    def infer(self, buffer, value):
        if buffer != value:
            raise ShapeError(f"{self.debug_name}: buffer {buffer} and value {value} must match.")
        return buffer

    def kernel(self, buffer, value):
        return buffer.copy_(value)

    def cost(self) -> tuple[int, int]:
        return 0, 0  # the transfer is charged by the cycle model's remote records
