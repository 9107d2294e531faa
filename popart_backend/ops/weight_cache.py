"""Values derived from weights and kept between runs, and when they are stale.

Two kinds of ops keep a value computed from variable weights across runs: the run-time
Conv + BatchNormalization fold (``ops/fused_conv.py``) and, in inference plans, the float32
linear products that read their weight transposed (``KeptWeight`` below: MatMul, Gemm and the
fused LinearBias). Both key what they keep on a *stamp* of the weights: each tensor's identity
and torch version counter. Every in-place torch write bumps the counter (``copy_`` included,
which is how the host writes weights), and a new tensor has a new identity, so a kept value
whose stamp still matches was computed from the current weights: it is never stale.

A view of a variable (the Transpose the exporters put between an ``nn.Linear`` weight and its
MatMul, rebuilt as a new view object every run) is stamped by its base tensor, which the view
shares its version counter with, and its geometry (offset, shape, strides).

KeptWeight: an ``nn.Linear`` weight is stored [N, K], so its product X @ W^T reads the [K, N]
operand as a transposed view. Measured on this project's CPU with one thread, ``addmm`` into the
output buffer with a contiguous [K, N] copy instead of the view is 20-35 % faster for M <= 256
rows (the MLP's 784-512, 512-512 and 512-10 layers at batch 64: 1.04 / 0.63 / 0.030 ms against
1.35 / 0.81 / 0.038 ms), and 10-15 % faster than MKL's packed sgemm
(``_mkl_reorder_linear_weight`` + ``_mkl_linear``), which also has no ``out=`` form; at 1024 rows
(BERT and GPT-2's products, the LM head) the three are within 2-3 %, not worth a second copy
of the weight. So in plans without an optimizer, a product with at most ``KEEP_MAX_ROWS`` rows
whose weight (or the variable it is a view of) is a float32 variable no op of the program
writes reads a kept contiguous copy; the host's writes between runs make it copy again once,
and training steps, whose weights change every step, keep the views.
"""

from __future__ import annotations

import torch

from ..dtypes import DataType
from ..ir.tensor import TensorKind

# Kept values per op: one per replica (each replica holds its own weight tensors).
MAX_CACHED = 16

# Products with at most this many rows keep a contiguous weight (measured, see above).
KEEP_MAX_ROWS = 256


def stamp(tensors) -> tuple | None:
    """(tensor, version, geometry) per entry of ``tensors`` identifying their current values;
    a view is named by its base. None when a tensor has no version counter (an inference-mode
    tensor), which disables keeping anything."""
    entries = []
    for t in tensors:
        if t is None:
            entries.append((None, 0, None))
            continue
        if t.is_inference():
            return None
        base = t._base
        if base is None:
            entries.append((t, t._version, None))
        else:
            entries.append((base, t._version, (t.storage_offset(), t.shape, t.stride())))
    return tuple(entries)


def same(a: tuple, b: tuple) -> bool:
    """Whether two stamps name the same values. Identity: the keeper holds the tensors, so an
    id cannot be reused meanwhile."""
    return all(x is y and vx == vy and gx == gy
               for (x, vx, gx), (y, vy, gy) in zip(a, b))


def stamps_first(kept: tuple, new: tuple) -> bool:
    """Whether ``kept`` stamps the same first tensor as ``new`` (any version): a kept value of
    the same weight, now stale."""
    return kept[0][0] is new[0][0]


def _writes(op, tensor) -> bool:
    return any(i < len(op.inputs) and op.inputs[i] is tensor for i in op.modifies_inputs)


def _variable_behind(weight):
    """The variable behind ``weight`` (itself, or the variable a view op reads), or None."""
    if weight is None:
        return None
    if weight.kind is TensorKind.VARIABLE:
        return weight
    producer = weight.producer
    if producer is not None and producer.aliases_inputs and producer.inputs \
            and producer.inputs[0] is not None and producer.inputs[0].kind is TensorKind.VARIABLE:
        return producer.inputs[0]
    return None


class KeptWeight:
    """The contiguous [K, N] operand of one linear op, kept per weight tensor (so per replica)
    and copied again when the weight was written since (``stamp``)."""

    def __init__(self):
        self._kept: list[tuple] = []  # (stamp, contiguous operand), most recent first
        self._last: tuple | None = None  # (weight tensor, its version, operand): the fast path
        self.copies = 0  # how many times a weight was copied (tests read it)

    @classmethod
    def for_op(cls, op, program, rows: int) -> "KeptWeight | None":
        """A KeptWeight when ``op`` (inputs X, W, ...) in ``program`` gains from a contiguous
        copy of W, else None (the op reads W as it comes)."""
        if not 0 < rows <= KEEP_MAX_ROWS:
            return None
        ir = program.graph.ir
        if ir is None or ir.weight_grads or ir.optimizer_tensors is not None:
            return None  # a training plan: its weights change every step
        settings = op.settings
        if settings.half_partials or settings.stochastic_rounding or len(op.inputs) < 2:
            return None
        x, w = op.inputs[0], op.inputs[1]
        variable = _variable_behind(w)
        if x is None or variable is None or w.info.rank != 2 or x.info.rank < 2:
            return None
        if any(t.info.dtype is not DataType.FLOAT for t in (x, w, variable)):
            return None
        if variable.id in ir.sharded_variables:
            return None
        if any(_writes(reader, t) for t in (variable, w) for reader in t.consumers):
            return None  # written by the program itself, every run
        return cls()

    def __deepcopy__(self, memo):
        # A copy starts empty: the kept operands belong to the original's weight tensors.
        return KeptWeight()

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def operand(self, w, transpose: bool):
        """The [K, N] operand the op computes from its weight input ``w`` (``w`` itself, or
        ``w.t()`` when ``transpose``) as a contiguous tensor: itself when it is one, else the
        copy kept for ``w``'s current values."""
        last = self._last
        if last is not None and last[0] is w and last[1] == w._version:
            return last[2]  # the same weight tensor, not written since
        kn = w.t() if transpose else w
        if kn.is_contiguous() or kn.dtype is not torch.float32:
            return kn
        key = stamp((w,))
        if key is None:
            return kn
        for kept, operand in self._kept:
            if same(kept, key):
                break
        else:
            operand = kn.contiguous()
            self.copies += 1
            entries = [e for e in self._kept if not stamps_first(e[0], key)]
            # One assignment: replicas running in threads see either list.
            self._kept = [(key, operand)] + entries[: MAX_CACHED - 1]
        self._last = (w, w._version, operand)
        return operand
