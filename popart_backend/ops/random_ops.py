"""ONNX random ops: RandomNormal, RandomUniform, their *Like forms, Bernoulli and Multinomial.

They follow docs/training.md "Randomness": each requires the session's random seed, so the
WireRandomSeed pass (in both the inference and the training pass lists) appends the variable
``randomSeed___`` ([user seed, micro-batch counter]) as the op's last input. A kernel seeds a
fresh torch.Generator from the seed, the counter and a per-op modifier (a crc32 of the op's first
output id), so every micro-batch draws new values, two ops never share a stream, and
``setRandomSeed`` replays a run exactly.

The ONNX ``seed`` attribute, when given, replaces the session seed and the per-op modifier: the
op draws the same values in every session with that seed (still new values each micro-batch, as
onnxruntime draws new values each run), whatever ``setRandomSeed`` says.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ShapeError, popart_runtime_error
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .random import mix_seed
from .registry import register_op

_FLOATS = (DataType.FLOAT16, DataType.FLOAT, DataType.DOUBLE)


class RandomOp(Op):
    """Base: output dtype/shape rules and the seeded generator."""

    foldable = False
    requires_random_seed = True

    def generator(self, seed: torch.Tensor | None) -> torch.Generator:
        counter = 0 if seed is None else int(seed[1])
        if self.attrs.seed is not None:
            # The attribute's float bits, so 1.0 and 1.5 give different streams.
            bits = struct.unpack("<q", struct.pack("<d", float(self.attrs.seed)))[0]
            value = mix_seed(bits & ((1 << 63) - 1), counter, 0)
        elif seed is None:
            raise popart_runtime_error(
                f"{self.debug_name}: no random seed input. Random ops read the session seed "
                f"'randomSeed___', which a session's wire_random_seed pass connects; run the "
                f"model through a session or give the op a 'seed' attribute."
            )
        else:
            modifier = zlib.crc32(self.outputs[0].id.encode())
            value = mix_seed(int(seed[0]), counter, modifier)
        generator = torch.Generator()
        generator.manual_seed(value)
        return generator

    def out_dtype(self, attr: int | None, like: TensorInfo | None, allowed=_FLOATS) -> DataType:
        dtype = like.dtype if attr is None else DataType.from_onnx(attr)
        if dtype not in allowed:
            raise ShapeError(
                f"{self.debug_name}: output dtype {dtype.name} is not one of "
                f"{[d.name for d in allowed]}."
            )
        return dtype

    def grad(self, g):
        """The drawn values do not depend on the input's values: no gradient flows back."""


@dataclass(frozen=True)
class _NormalAttrs:
    dtype: int | None = None
    mean: float = 0.0
    scale: float = 1.0
    seed: float | None = None


@dataclass(frozen=True)
class _UniformAttrs:
    dtype: int | None = None
    high: float = 1.0
    low: float = 0.0
    seed: float | None = None


class _Normal(RandomOp):
    def draw(self, seed):
        values = torch.randn(self._info.shape, generator=self.generator(seed))
        return values.mul_(self.attrs.scale).add_(self.attrs.mean).to(self._info.dtype.torch)


class _Uniform(RandomOp):
    def draw(self, seed):
        low, high = self.attrs.low, self.attrs.high
        values = torch.rand(self._info.shape, generator=self.generator(seed))
        return values.mul_(high - low).add_(low).to(self._info.dtype.torch)


class _FromShape(RandomOp):
    """RandomNormal / RandomUniform: the ``shape`` attribute; dtype defaults to FLOAT."""

    def infer(self, seed=None):
        if any(d < 0 for d in self.attrs.shape):
            raise ShapeError(f"{self.debug_name}: shape {list(self.attrs.shape)} is negative.")
        dtype = self.out_dtype(1 if self.attrs.dtype is None else self.attrs.dtype, None)
        self._info = TensorInfo(dtype, tuple(self.attrs.shape))
        return self._info

    def kernel(self, seed=None):
        return self.draw(seed)


class _FromInput(RandomOp):
    """*Like: the input's shape, and its dtype unless ``dtype`` is set."""

    def infer(self, x, seed=None):
        self._info = TensorInfo(self.out_dtype(self.attrs.dtype, x), x.shape)
        return self._info

    def kernel(self, x, seed=None):
        return self.draw(seed)


@register_op("RandomNormal", versions=(1, 22))
class RandomNormal(_FromShape, _Normal):
    """Samples of N(mean, scale²)."""

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...]
        dtype: int | None = None
        mean: float = 0.0
        scale: float = 1.0
        seed: float | None = None


@register_op("RandomUniform", versions=(1, 22))
class RandomUniform(_FromShape, _Uniform):
    """Samples of U[low, high)."""

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...]
        dtype: int | None = None
        high: float = 1.0
        low: float = 0.0
        seed: float | None = None


@register_op("RandomNormalLike", versions=(1, 22))
class RandomNormalLike(_FromInput, _Normal):
    Attrs = _NormalAttrs


@register_op("RandomUniformLike", versions=(1, 22))
class RandomUniformLike(_FromInput, _Uniform):
    Attrs = _UniformAttrs


@register_op("Bernoulli", versions=(15, 22))
class Bernoulli(RandomOp):
    """1 with probability input, else 0; dtype defaults to the input's."""

    @dataclass(frozen=True)
    class Attrs:
        dtype: int | None = None
        seed: float | None = None

    def infer(self, p, seed=None):
        if p.dtype not in _FLOATS:
            raise ShapeError(f"{self.debug_name}: probabilities {p} must be floating point.")
        allowed = _FLOATS + (DataType.BOOL, DataType.INT8, DataType.INT16, DataType.INT32,
                             DataType.INT64, DataType.UINT8)
        self._info = TensorInfo(self.out_dtype(self.attrs.dtype, p, allowed), p.shape)
        return self._info

    def kernel(self, p, seed=None):
        draws = torch.rand(p.shape, generator=self.generator(seed), dtype=torch.float64)
        return (draws < p).to(self._info.dtype.torch)


@register_op("Multinomial", versions=(7, 22))
class Multinomial(RandomOp):
    """``sample_size`` class indices per row of [batch, classes] unnormalized log-probabilities,
    drawn with replacement."""

    @dataclass(frozen=True)
    class Attrs:
        dtype: int = 6  # INT32
        sample_size: int = 1
        seed: float | None = None

    def infer(self, x, seed=None):
        if x.rank != 2 or x.dtype not in _FLOATS or x.shape[1] < 1:
            raise ShapeError(f"{self.debug_name}: input {x} must be float [batch, classes].")
        if self.attrs.sample_size < 1:
            raise ShapeError(f"{self.debug_name}: sample_size {self.attrs.sample_size} must be "
                             f">= 1.")
        dtype = self.out_dtype(self.attrs.dtype, None, (DataType.INT32, DataType.INT64))
        self._info = TensorInfo(dtype, (x.shape[0], self.attrs.sample_size))
        return self._info

    def kernel(self, x, seed=None):
        probs = torch.softmax(x.double(), dim=1)
        samples = torch.multinomial(probs, self.attrs.sample_size, replacement=True,
                                    generator=self.generator(seed))
        return samples.to(self._info.dtype.torch)
