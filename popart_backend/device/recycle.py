"""Large anchor outputs written into the previous run's output when the host has let it go.

An anchor (a result the host reads after a run) cannot live in the static arena
(``device/arena.py``): the run hands the tensor itself over to the caller
(``stream_io.HandOver``), who may keep it as long as they like. So its op allocates it afresh
every run, and for a large output (a language model's logits: [8, 128, 50257] float32 is
196 MiB) the kernel then spends a good part of its time faulting the new pages in, and the
caller's ``del`` hands them back to the system.

``RecycledOutput`` wraps the into-kernel of such an op. After each call it remembers the
*storage* of the tensor it produced (not the tensor: the hand-over still sees the only
reference to the tensor, and torch keeps one Python object per storage, so the hand-over's
storage check counts the same holders as before). At the next call, when that storage has no
other user left (no tensor, view or numpy array of the caller refers to it: its use count is
1; nor does the caller hold that one storage object itself, from ``untyped_storage()`` or
``storage()``: its Python reference count is ours alone) and is still resizable
(``Tensor.numpy()`` pins it), the kernel writes into it; otherwise it allocates as before.
Nobody can observe the reuse: the bytes belong to nobody else.
"""

from __future__ import annotations

import math
import sys

import torch

from ..ir.op import Op
from ..ir.tensor import TensorKind
from .arena import eligible_output

__all__ = ["MIN_BYTES", "RecycledOutput", "enabled", "recyclable"]

# Testing switch: False leaves every kept output allocated afresh each run.
enabled = True

# Below this, the allocator reuses freed memory without faulting pages in (glibc serves
# blocks under its mmap threshold, 128 KiB to 32 MiB, from its heap).
MIN_BYTES = 1 << 20


def recyclable(op: Op, ins: tuple, outs: tuple, keep: set[int]) -> bool:
    """True for an op whose one output is a kept (host-read) slot of at least ``MIN_BYTES``
    that the arena would place if it were not kept: its into-kernel may write it."""
    if len(outs) != 1 or outs[0] not in keep or op.outputs[0].kind is not TensorKind.ACT_GRAD:
        return False
    if not eligible_output(op, ins, outs):
        return False
    info = op.outputs[0].info
    return math.prod(info.shape) * info.dtype.torch.itemsize >= MIN_BYTES


class RecycledOutput:
    """The step kernel of a recyclable op (see the module doc): ``op.kernel_into`` over the
    previous output's storage when nothing else uses it, else over a new tensor."""

    __slots__ = ("dtype", "into", "shape", "storage")

    def __init__(self, op: Op):
        info = op.outputs[0].info
        self.into = op.kernel_into
        self.shape, self.dtype = tuple(info.shape), info.dtype.torch
        self.storage: torch.UntypedStorage | None = None

    def __call__(self, *inputs):
        storage, self.storage = self.storage, None
        # Python references: the local name and getrefcount's argument; any more is a caller
        # holding the storage object (the use count sees that object once, as ours).
        if (storage is not None and torch._C._storage_Use_Count(storage._cdata) == 1
                and sys.getrefcount(storage) == 2 and storage.resizable()):
            out = torch.empty((0,), dtype=self.dtype).set_(storage, 0, self.shape)
        else:
            out = torch.empty(self.shape, dtype=self.dtype)
        del storage
        result = self.into(out, *inputs)
        if result is out:
            self.storage = out.untyped_storage()
        return result
