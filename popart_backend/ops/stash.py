"""ai.graphcore ``Stash`` and ``Restore``: the ring buffers of a pipeline.

An activation produced on pipeline stage s and read on a later stage of the same IPU must
survive while the micro-batches in between run. The pipelining pass gives it a ring buffer, a
device variable ``StashBuffer___<id>`` of shape ``[N, *S]`` with ``N = maxRestoreStage - s + 1``:

- ``Stashed___<id> = Stash(buffer, stash_index, x)`` writes x into entry ``stash_index % N``
  and advances the index; its output aliases the buffer (it is the stash, in the IR).
- ``Restored___<id> = Restore(Stashed___<id>, restore_index)`` reads entry
  ``restore_index % N`` and advances its own index.

Stash and restore of one micro-batch advance their indices in the same micro-batch order, so a
restore returns exactly the entry its micro-batch stashed (entries leave in the order they came
in). The indices are device variables too (role STASH), so the pairing survives across runs.
"""

from __future__ import annotations

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .registry import AI_GRAPHCORE, register_op


def _check_index(op: Op, index: TensorInfo) -> None:
    if index.rank != 0 or index.dtype is not DataType.INT64:
        raise ShapeError(f"{op.debug_name}: the ring index must be an int64 scalar, got {index}.")


@register_op("Stash", versions=1, domain=AI_GRAPHCORE)
class Stash(Op):
    """buffer[index % N] = x; index += 1. Returns the buffer (an alias of input 0)."""

    modifies_inputs = (0, 1)
    foldable = False
    public = False  # inserted by the pipelining pass, not a model op
    # The output aliases a device variable: the plan must keep its slot across cycles.
    output_persists = True

    def infer(self, buffer, index, x):
        _check_index(self, index)
        if buffer.rank < 1 or buffer.shape[1:] != x.shape or buffer.dtype != x.dtype:
            raise ShapeError(
                f"{self.debug_name}: the ring buffer {buffer} must be [N, *S] of the stashed "
                f"tensor {x}."
            )
        return buffer

    def kernel(self, buffer, index, x):
        buffer[int(index) % buffer.shape[0]].copy_(x)
        index.add_(1)
        return buffer

    def cost(self) -> tuple[int, int]:
        return 0, 2 * self.inputs[2].info.num_bytes


@register_op("Restore", versions=1, domain=AI_GRAPHCORE)
class Restore(Op):
    """y = stashed[index % N]; index += 1."""

    modifies_inputs = (1,)
    foldable = False
    public = False

    def infer(self, stashed, index):
        _check_index(self, index)
        if stashed.rank < 1:
            raise ShapeError(f"{self.debug_name}: the stash {stashed} must be [N, *S].")
        return stashed.with_shape(stashed.shape[1:])

    def kernel(self, stashed, index):
        value = stashed[int(index) % stashed.shape[0]].clone()
        index.add_(1)
        return value

    def cost(self) -> tuple[int, int]:
        return 0, 2 * self.outputs[0].info.num_bytes
