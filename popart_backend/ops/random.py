"""Random ops: Dropout, in its inference form, and DropoutTraining, its active form; the same pair
for ai.graphcore ShapedDropout (one mask of ``shape`` broadcast against the data).

Whether dropout is active is decided by the session, as in PopART (DESIGN decision 5): in an
inference graph Dropout is the identity and its mask is all ones, even when the model sets
is_test=0 (versions 1, 6) or feeds training_mode=True (versions 12, 13). In a TrainingSession
the TrainingSemantics pass replaces it by DropoutTraining, which draws its mask from a
torch.Generator seeded by the ``randomSeed___`` tensor ([seed, micro-batch counter]) mixed with
the op's ``seed_modifier``, so masks change every micro-batch and replay exactly for the same
seed and counter (docs/training.md, "Randomness"). The mask is an output; the gradient reuses it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op, TrainingForm
from ..ir.signature import FLOAT, INTS, REQUIRED, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from .base import broadcast_shapes
from .registry import AI_GRAPHCORE, create_op, register_op


@register_op("Dropout", versions=(1, 6, 7, 10, 12, 13, 22))
class Dropout(Op):
    """output = data; mask = all ones (BOOL from version 10, the data type before)."""

    aliases_inputs = True  # inference Dropout returns its input

    # Dropout must not be folded: in a TrainingSession its output is random.
    foldable = False
    # The ratio (versions >= 12) stays a constant even when initializers become weights: the
    # training form needs its value when the graph is built.
    const_inputs = (1,)

    @dataclass(frozen=True)
    class Attrs:
        """Versions 12 and 13 (ratio and training_mode are inputs)."""

        seed: int | None = None

    @dataclass(frozen=True)
    class V7Attrs:
        ratio: float = 0.5

    @dataclass(frozen=True)
    class V6Attrs(V7Attrs):
        is_test: int = 0

    @dataclass(frozen=True)
    class V1Attrs(V6Attrs):
        consumed_inputs: tuple[int, ...] = ()

    @classmethod
    def attrs_type(cls, version: int):
        if version >= 12:
            return cls.Attrs
        return cls.V7Attrs if version >= 7 else cls.V6Attrs if version >= 6 else cls.V1Attrs

    def infer(self, data, ratio=None, training_mode=None):
        if ratio is not None and ratio.rank != 0:
            raise ShapeError(f"{self.debug_name}: ratio {ratio} must be a scalar.")
        if training_mode is not None and (training_mode.rank != 0 or training_mode.dtype != DataType.BOOL):
            raise ShapeError(
                f"{self.debug_name}: training_mode {training_mode} must be a BOOL scalar."
            )
        mask_dtype = DataType.BOOL if self.version >= 10 else data.dtype
        self._mask_dtype = mask_dtype.torch
        return [data, TensorInfo(mask_dtype, data.shape)]

    def kernel(self, data, ratio=None, training_mode=None):
        if len(self.outputs) < 2 or self.outputs[1] is None:
            return data if len(self.outputs) < 2 else (data, None)
        return data, torch.ones(data.shape, dtype=self._mask_dtype)

    def grad(self, g):
        """Inert dropout is the identity."""
        g.set_input_grad(0, g.output_grad(0))

    def training_form(self, random_seed):
        """DropoutTraining: an active mask from the seed tensor, the op's own stream of it
        (``seed_modifier``, a stable hash of its output id); the mask becomes an output."""
        if self.version >= 12:
            ratio = self.const_input(1)
            ratio = 0.5 if ratio is None else float(np.asarray(ratio))
        else:
            ratio = self.attrs.ratio
        out = self.outputs[0]
        new = create_op(
            "DropoutTraining",
            {"ratio": ratio, "seed_modifier": zlib.crc32(out.id.encode()),
             "bool_mask": int(self.version >= 10)},
            self.settings, domain=AI_GRAPHCORE, where=self.debug_name,
        )
        outputs = list(self.outputs) + [None] * (2 - len(self.outputs))
        if outputs[1] is None:
            outputs[1] = self.graph.unique_id(f"{out.id}/mask")
        return TrainingForm(new, [self.inputs[0].id, random_seed()], outputs)


_MASK64 = (1 << 64) - 1


def mix_seed(seed: int, counter: int, modifier: int) -> int:
    """A 63-bit generator seed from the user seed, micro-batch counter and per-op modifier
    (splitmix64 finalizer over the combination, so nearby inputs give unrelated streams)."""
    z = (seed * 0x9E3779B97F4A7C15 + counter * 0xBF58476D1CE4E5B9 + modifier) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


@register_op("DropoutTraining", versions=1, domain=AI_GRAPHCORE)
class DropoutTraining(Op):
    """output = data * mask / (1 - ratio), mask ~ Bernoulli(1 - ratio); inputs (data, seed)."""

    public = False  # only the TrainingSemantics pass creates it
    foldable = False
    requires_random_seed = True

    @dataclass(frozen=True)
    class Attrs:
        ratio: float = 0.5
        seed_modifier: int = 0
        # Mask dtype: BOOL (Dropout >= 10) or the data type (older versions).
        bool_mask: int = 1

    def infer(self, data, seed):
        ratio = self.attrs.ratio
        if not 0.0 <= ratio < 1.0:
            raise ShapeError(
                f"{self.debug_name}: ratio={ratio} must be in [0, 1): a dropout that drops "
                f"everything has no gradient to train with."
            )
        if seed.shape != (2,) or seed.dtype != DataType.INT64:
            raise ShapeError(f"{self.debug_name}: the seed input {seed} must be INT64 [2].")
        if not data.dtype.is_float:
            raise ShapeError(f"{self.debug_name}: data {data} must be floating point.")
        self._scale = 1.0 / (1.0 - ratio)
        self._shape = data.shape
        mask_dtype = DataType.BOOL if self.attrs.bool_mask else data.dtype
        self._mask_dtype = mask_dtype.torch
        return [data, TensorInfo(mask_dtype, data.shape)]

    def kernel(self, data, seed):
        user_seed, counter = seed.tolist()
        generator = torch.Generator()
        generator.manual_seed(mix_seed(user_seed, counter, self.attrs.seed_modifier))
        keep = torch.rand(self._shape, generator=generator) >= self.attrs.ratio
        out = data * keep
        if self._scale != 1.0:
            out.mul_(self._scale)
        return out, keep if self._mask_dtype == torch.bool else keep.to(self._mask_dtype)

    def grad(self, g):
        g.set_input_grad(0, g.op("DropoutGrad", g.output_grad(0), g.output(1),
                                 domain=AI_GRAPHCORE, ratio=self.attrs.ratio))


@register_op("DropoutGrad", versions=1, domain=AI_GRAPHCORE)
class DropoutGrad(Op):
    """d data = d output * mask / (1 - ratio), with the forward's mask."""

    @dataclass(frozen=True)
    class Attrs:
        ratio: float = 0.5

    def infer(self, dy, mask):
        self._scale = 1.0 / (1.0 - self.attrs.ratio)
        return dy

    def kernel(self, dy, mask):
        out = dy * mask
        return out.mul_(self._scale) if self._scale != 1.0 else out


# --- ai.graphcore ShapedDropout ----------------------------------------------------------------


@register_op("ShapedDropout", versions=1, domain=AI_GRAPHCORE)
class ShapedDropout(Op):
    """Dropout whose mask has ``shape`` (broadcast against the input), so whole rows or channels
    drop together. Inert (the identity) in inference, like Dropout; in a TrainingSession the
    TrainingSemantics pass replaces it by ShapedDropoutTraining.
    """

    builder_method = BuilderMethod(
        "shapeddropout", 1, 1, (AttrSpec("shape", INTS, REQUIRED), AttrSpec("ratio", FLOAT, 0.5))
    )

    aliases_inputs = True  # inference ShapedDropout returns its input

    foldable = False

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...]
        ratio: float = 0.5

    def infer(self, x):
        if broadcast_shapes(self, x.shape, self.attrs.shape) != x.shape:
            raise ShapeError(f"{self.debug_name}: the mask shape {list(self.attrs.shape)} does "
                             f"not broadcast to the input {x}.")
        if not 0.0 <= self.attrs.ratio < 1.0:
            raise ShapeError(f"{self.debug_name}: ratio {self.attrs.ratio} must be in [0, 1).")
        return x

    def kernel(self, x):
        return x

    def grad(self, g):
        g.set_input_grad(0, g.output_grad(0))

    def training_form(self, random_seed):
        """ShapedDropoutTraining, as Dropout's (its mask has the op's ``shape``)."""
        out = self.outputs[0]
        new = create_op(
            "ShapedDropoutTraining",
            {"shape": self.attrs.shape, "ratio": self.attrs.ratio,
             "seed_modifier": zlib.crc32(out.id.encode())},
            self.settings, domain=AI_GRAPHCORE, where=self.debug_name,
        )
        return TrainingForm(new, [self.inputs[0].id, random_seed()],
                            [out, self.graph.unique_id(f"{out.id}/mask")])


@register_op("ShapedDropoutTraining", versions=1, domain=AI_GRAPHCORE)
class ShapedDropoutTraining(Op):
    """ShapedDropout of a TrainingSession: output = data * mask / (1 - ratio) with one
    Bernoulli(1 - ratio) mask of ``shape``, broadcast against the data (so it is shared along
    the dims where ``shape`` is 1); inputs (data, seed), outputs (output, mask). The mask is
    drawn like DropoutTraining's and reused by the gradient."""

    public = False  # only the TrainingSemantics pass creates it
    foldable = False
    requires_random_seed = True

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...]
        ratio: float = 0.5
        seed_modifier: int = 0

    def infer(self, x, seed):
        ShapedDropout.infer(self, x)
        if seed.shape != (2,) or seed.dtype != DataType.INT64:
            raise ShapeError(f"{self.debug_name}: the seed input {seed} must be INT64 [2].")
        self._scale = 1.0 / (1.0 - self.attrs.ratio)
        return [x, TensorInfo(DataType.BOOL, tuple(self.attrs.shape))]

    def kernel(self, x, seed):
        user_seed, counter = seed.tolist()
        generator = torch.Generator()
        generator.manual_seed(mix_seed(user_seed, counter, self.attrs.seed_modifier))
        keep = torch.rand(self.attrs.shape, generator=generator) >= self.attrs.ratio
        out = x * keep
        if self._scale != 1.0:
            out.mul_(self._scale)
        return out, keep

    def grad(self, g):
        # DropoutGrad's dY * mask broadcasts the shaped mask like the forward did.
        g.set_input_grad(0, g.op("DropoutGrad", g.output_grad(0), g.output(1), domain=AI_GRAPHCORE,
                                 ratio=self.attrs.ratio))
