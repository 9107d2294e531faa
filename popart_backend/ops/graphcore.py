"""ai.graphcore ops a user can add with ``builder.aiGraphcore``, with their gradients.

The losses (IdentityLoss, L1, Nll) live in ``loss.py``, LSTM in ``graphcore_lstm.py``, MultiConv
in ``multiconv.py``, PackedDataBlock in ``packed_data_block.py``, the dynamic slices in
``dynamic_slice.py``, CTC in ``ctc.py`` and ShapedDropout in ``random.py``; the rest of the
builder's ai.graphcore methods resolve here. Semantics follow PopART's op definitions;
where the simulated IPU has to pick a behaviour PopART leaves to the hardware (out-of-range
dynamic offsets, uninitialised ``Init`` memory) the op says which. The builder's
``replicatedallreduce`` resolves to ``collectives.ReplicatedAllReduce``.

PopART enums arrive as ints: ``InitType`` NoInit 0, Zero 1; ``ReductionType`` Sum 0, Mean 1,
NoReduction 2. ``ScatterReduction`` arrives as the lower-case name the builder writes.

The ops are split by family: elementwise in ``graphcore_elementwise.py``, pass-through and
buffer ops in ``graphcore_identity.py``, shape ops in ``graphcore_shape.py``, reductions and
scatter in ``graphcore_reduce.py``, Slice, the grouped gather / scatter, Bucketize and Sort in
``graphcore_indexing.py``, NearbyInt, IncrementMod, TensorRemap, NormalizeImage and ai.graphcore
BatchNormalization in ``graphcore_misc.py``, the spline ops in ``graphcore_spline.py``, the shared
checks in ``graphcore_common.py``; GroupNormalization stays here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import ShapeError
from ..ir.op import Op
from ..ir.signature import FLOAT, INT, REQUIRED, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from .graphcore_common import (
    GC,
    _require_float,
)
from .registry import register_op

# --- normalisation ----------------------------------------------------------------------------


@register_op("GroupNormalization", versions=1, domain=GC)
class GroupNormalization(Op):
    """PopART's group norm: X [N, C, ...], scale and bias per channel [C]; outputs Y, Mean and
    InvStdDev, the last two [N·num_groups]."""

    builder_method = BuilderMethod(
        "groupnormalization",
        3,
        3,
        (AttrSpec("num_groups", INT, REQUIRED), AttrSpec("epsilon", FLOAT, 1e-5)),
    )

    is_normalization = True

    @dataclass(frozen=True)
    class Attrs:
        num_groups: int
        epsilon: float = 1e-5

    def infer(self, x, scale, bias):
        groups = self.attrs.num_groups
        if x.rank < 2 or groups < 1 or x.shape[1] % groups:
            raise ShapeError(f"{self.debug_name}: X {x} must be [N, C, ...] with C divisible by "
                             f"num_groups={groups}.")
        n, c = x.shape[:2]
        for name, info in (("scale", scale), ("bias", bias)):
            if info.shape != (c,):
                raise ShapeError(f"{self.debug_name}: {name} {info} must be [{c}] (per channel).")
        _require_float(self, x)
        self._dims = (n, c, math.prod(x.shape[2:]))
        stats = TensorInfo(x.dtype, (n * groups,))
        return [x, stats, stats]

    def kernel(self, x, scale, bias):
        n, c, hw = self._dims
        y, mean, rstd = torch.ops.aten.native_group_norm(
            x.contiguous(), scale, bias, n, c, hw, self.attrs.num_groups, self.attrs.epsilon)
        return y, mean.reshape(-1), rstd.reshape(-1)

    def grad(self, g):
        wrt = tuple(i for i in (0, 1, 2) if g.needs_input_grad(i))
        if not wrt:
            return
        grads = g.op("GroupNormalizationGrad", g.output_grad(0), g.input(0), g.input(1),
                     g.input(2), num_outputs=len(wrt), wrt=wrt, domain=GC,
                     num_groups=self.attrs.num_groups, epsilon=self.attrs.epsilon)
        for i, grad in zip(wrt, grads if isinstance(grads, list) else [grads]):
            g.set_input_grad(i, grad)
