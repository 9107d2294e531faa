"""Values derived from weights and kept between runs, and when they are stale.

Two kinds of ops keep a value computed from variable weights across runs: the run-time
Conv + BatchNormalization fold (``ops/fused_conv.py``) and, in inference plans, the float32
linear products that read a prepacked weight (``PackedLinear`` below: MatMul, Gemm and the
fused LinearBias). Both key what they keep on a *stamp* of the weights: each tensor's identity
and torch version counter. Every in-place torch write bumps the counter (``copy_`` included,
which is how the host writes weights), and a new tensor has a new identity, so a kept value
whose stamp still matches was computed from the current weights: it is never stale.

A view of a variable (the Transpose the exporters put between an ``nn.Linear`` weight and its
MatMul, rebuilt as a new view object every run) is stamped by its base tensor, which the view
shares its version counter with, and its geometry (offset, shape, strides).

PackedLinear: MKL's packed sgemm (``torch.ops.mkl._mkl_reorder_linear_weight`` once, then
``_mkl_linear`` per call) for a fixed number of rows M. Measured on this project's CPU with one
thread against ``addmm`` writing into its buffer: 10-30 % faster for M <= 256 rows and N >= 64
columns (the MLP's 784-512 and 512-512 layers at batch 64, BERT's pooler); within noise of it at
M >= 512 (BERT and GPT-2's products at 1024 rows), where addmm's write into the static arena
wins; slower for N < 64 (the MLP's 10-class head). ``mkldnn._linear_pointwise`` with a
reordered weight was slower than both for these shapes. So a product packs only within those
bounds, in plans without an optimizer, when its weight (or the variable it is a view of) is a
float32 variable no op of the program writes: the host's writes between runs then repack it
once, and training steps, whose weights change every step, keep the unpacked kernels.
"""

from __future__ import annotations

import torch

from ..dtypes import DataType
from ..ir.tensor import TensorKind

# Kept values per op: one per replica (each replica holds its own weight tensors).
MAX_CACHED = 16

# Packing bounds (measured, see the module docstring): rows, columns, output elements.
PACK_MAX_ROWS = 256
PACK_MIN_COLUMNS = 64
PACK_MAX_OUTPUT = 1 << 21

_MKL_PACKED = torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


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


def _packable_weight(weight):
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


class PackedLinear:
    """The packed [N, K] weight of one linear op for ``rows`` rows, kept per weight tensor
    (so per replica) and repacked when the weight was written since (``stamp``)."""

    def __init__(self, rows: int):
        self.rows = rows
        self._kept: list[tuple] = []  # (stamp, packed weight), most recent first
        self.packs = 0  # how many times a weight was packed (tests read it)

    @classmethod
    def for_op(cls, op, program, rows: int, columns: int) -> "PackedLinear | None":
        """A PackedLinear when ``op`` (inputs X, W, ...) in ``program`` gains from packing W,
        else None (the op keeps its usual kernel)."""
        if not _MKL_PACKED or not 0 < rows <= PACK_MAX_ROWS or columns < PACK_MIN_COLUMNS \
                or rows * columns > PACK_MAX_OUTPUT:
            return None
        ir = program.graph.ir
        if ir is None or ir.weight_grads or ir.optimizer_tensors is not None:
            return None  # a training plan: its weights change every step
        settings = op.settings
        if settings.half_partials or settings.stochastic_rounding or len(op.inputs) < 2:
            return None
        x, w = op.inputs[0], op.inputs[1]
        variable = _packable_weight(w)
        if x is None or variable is None or w.info.rank != 2 or x.info.rank < 2:
            return None
        if any(t.info.dtype is not DataType.FLOAT for t in (x, w, variable)):
            return None
        if variable.id in ir.sharded_variables:
            return None
        if any(_writes(reader, t) for t in (variable, w) for reader in t.consumers):
            return None  # written by the program itself, every run
        return cls(rows)

    def __deepcopy__(self, memo):
        # The packed tensors are opaque (no storage to copy): a copy starts empty.
        return PackedLinear(self.rows)

    def __getstate__(self):
        return {"rows": self.rows}

    def __setstate__(self, state):
        self.__init__(state["rows"])

    def linear(self, x, w, w_nk, bias):
        """x @ w_nk^T + bias by the packed kernel for the op's weight input ``w`` (``w_nk`` is
        it as [N, K]); None when this call cannot use it (the caller runs its usual kernel)."""
        if (x.dtype is not torch.float32 or w.dtype is not torch.float32
                or x.numel() != self.rows * x.shape[-1]):
            return None
        key = stamp((w,))
        if key is None:
            return None
        for kept, packed in self._kept:
            if same(kept, key):
                break
        else:
            packed = torch.ops.mkl._mkl_reorder_linear_weight(w_nk, self.rows)
            self.packs += 1
            entries = [e for e in self._kept if not stamps_first(e[0], key)]
            # One assignment: replicas running in threads see either list.
            self._kept = [(key, packed)] + entries[: MAX_CACHED - 1]
        return torch.ops.mkl._mkl_linear(x, packed, w_nk, bias, self.rows)
