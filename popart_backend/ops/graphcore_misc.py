"""More ai.graphcore ops of the Builder: NearbyInt, IncrementMod, TensorRemap,
NormalizeImage and ai.graphcore BatchNormalization, with their gradients where they have one.

``TensorRemapType`` arrives as an int (FwdBwdReverse 0, FwdBwd 1, Fwd 2), an enum member or its
name.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ShapeError, popart_exception
from ..ir.op import Op
from ..ir.signature import FLOAT, INT, REQUIRED, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from .base import ElementwiseUnary
from .graphcore_common import _INT_DTYPES, GC, _require_float
from .norm import BatchNormalization as OnnxBatchNormalization
from .registry import register_op


@register_op("NearbyInt", versions=1, domain=GC)
class NearbyInt(ElementwiseUnary):
    """Round to the nearest integer, halves to even (C's nearbyint in the default rounding
    mode), unlike ai.graphcore Round, which rounds halves away from zero."""

    builder_method = BuilderMethod("nearbyint", 1)

    def infer(self, x):
        _require_float(self, x)
        return x

    def kernel(self, x):
        return torch.round(x)

    def grad(self, g):
        """Piecewise constant: zero gradient."""


@register_op("IncrementMod", versions=1, domain=GC)
class IncrementMod(ElementwiseUnary):
    """(x + increment) mod modulus, the remainder taking the sign of x + increment (C's fmod
    and integer %), in x's dtype. Integer inputs need integral increment and modulus."""

    builder_method = BuilderMethod(
        "incrementmod",
        1,
        1,
        (AttrSpec("increment", FLOAT, REQUIRED), AttrSpec("modulus", FLOAT, REQUIRED)),
    )

    @dataclass(frozen=True)
    class Attrs:
        increment: float
        modulus: float

    def infer(self, x):
        inc, mod = self.attrs.increment, self.attrs.modulus
        if mod == 0:
            raise ShapeError(f"{self.debug_name}: modulus must not be 0.")
        if x.dtype in _INT_DTYPES or x.dtype is DataType.UINT32:
            if inc != int(inc) or mod != int(mod):
                raise ShapeError(
                    f"{self.debug_name}: input {x} is an integer tensor, so increment={inc} and "
                    f"modulus={mod} must be whole numbers."
                )
            self._operands = (int(inc), int(mod))
        elif x.dtype.is_float:
            self._operands = (inc, mod)
        else:
            raise ShapeError(f"{self.debug_name}: input {x} must be a number tensor.")
        return x

    def kernel(self, x):
        inc, mod = self._operands
        return torch.fmod(x + inc, mod).to(x.dtype)

    def grad(self, g):
        # d/dx is 1 wherever the result is continuous.
        g.set_input_grad(0, g.output_grad(0))


class TensorRemapType(enum.Enum):
    """How TensorRemap lays out tensors: the forward tensor and its gradient in reverse order
    (FwdBwdReverse), both (FwdBwd), or the forward tensor only (Fwd)."""

    FwdBwdReverse = 0
    FwdBwd = 1
    Fwd = 2


def tensor_remap_type(value) -> int:
    """A TensorRemapType (any enum member of that name, its name or its int) as the int the
    node stores."""
    if isinstance(value, enum.Enum):
        value = value.name
    if isinstance(value, str):
        if value not in TensorRemapType.__members__:
            raise popart_exception(f"Unknown TensorRemapType '{value}'; use one of "
                                   f"{list(TensorRemapType.__members__)}.")
        return TensorRemapType[value].value
    return value


@register_op("TensorRemap", versions=1, domain=GC)
class TensorRemap(Op):
    """Copies the tensor into the tile layout its consumers prefer. Values do not change; the
    simulated IPU counts the copy (bytes and cycles). The gradient is remapped too unless
    ``remap_type`` is Fwd."""

    builder_method = BuilderMethod(
        "tensorremap", 1, 1, (AttrSpec("remap_type", INT, 0, convert=tensor_remap_type),)
    )

    @dataclass(frozen=True)
    class Attrs:
        remap_type: int = 0

    def infer(self, x):
        if self.attrs.remap_type not in [t.value for t in TensorRemapType]:
            raise ShapeError(f"{self.debug_name}: remap_type={self.attrs.remap_type} is not a "
                             f"TensorRemapType (FwdBwdReverse 0, FwdBwd 1, Fwd 2).")
        return x

    def kernel(self, x):
        return x.clone()

    def grad(self, g):
        dy = g.output_grad(0)
        if self.attrs.remap_type != TensorRemapType.Fwd.value:
            dy = g.op("TensorRemap", dy, domain=GC, remap_type=self.attrs.remap_type)
        g.set_input_grad(0, dy)


@register_op("NormalizeImage", versions=1, domain=GC)
class NormalizeImage(Op):
    """Image preprocessing: inputs image [..., 3] (uint8, float16 or float32), offsets [3] and
    scales [3]; out[..., c] = (image[..., c] · scale - offsets[c]) · scales[c] for the three
    channels, padded with a zero fourth channel: [..., 4] in the offsets' dtype. A uint8 image
    takes float16 offsets and scales, a float image ones of its own dtype."""

    builder_method = BuilderMethod("normalize_image", 3, 1, (AttrSpec("scale", FLOAT, 1.0),))

    @dataclass(frozen=True)
    class Attrs:
        scale: float = 1.0

    def infer(self, image, offsets, scales):
        if image.rank < 1 or image.shape[-1] != 3:
            raise ShapeError(f"{self.debug_name}: image {image} must have 3 channels in its "
                             f"last axis.")
        for name, info in (("offsets", offsets), ("scales", scales)):
            if info.shape != (3,):
                raise ShapeError(f"{self.debug_name}: {name} {info} must have shape [3].")
        if offsets.dtype != scales.dtype:
            raise ShapeError(f"{self.debug_name}: offsets {offsets} and scales {scales} must "
                             f"share one dtype.")
        expected = DataType.FLOAT16 if image.dtype is DataType.UINT8 else image.dtype
        if image.dtype not in (DataType.UINT8, DataType.FLOAT16, DataType.FLOAT) or (
                offsets.dtype != expected):
            raise ShapeError(
                f"{self.debug_name}: image {image} with offsets {offsets}: the image must be "
                f"uint8 (with float16 offsets and scales), float16 or float32 (with offsets and "
                f"scales of its dtype)."
            )
        return TensorInfo(offsets.dtype, (*image.shape[:-1], 4))

    def kernel(self, image, offsets, scales):
        normed = (image.to(offsets.dtype) * self.attrs.scale - offsets) * scales
        return torch.nn.functional.pad(normed, (0, 1)).to(offsets.dtype)

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        return 3 * math.prod(self.inputs[0].info.shape), moved


@register_op("BatchNormalization", versions=1, domain=GC)
class BatchNormalization(OnnxBatchNormalization):
    """ai.onnx BatchNormalization-9 (epsilon, momentum; statistics per channel) under the
    ai.graphcore domain: Y with the running statistics, or in a TrainingSession with the batch's;
    num_outputs 1, 3 or 5 (Y, mean, var, saved_mean, saved_var)."""

    builder_method = BuilderMethod(
        "batchnormalization",
        5,
        (1, 5),
        (AttrSpec("epsilon", FLOAT, 1e-5), AttrSpec("momentum", FLOAT, 0.9)),
    )

    @classmethod
    def attrs_type(cls, version: int):
        return cls.V9Attrs
