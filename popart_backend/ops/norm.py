"""Normalizations: BatchNormalization (inference form), LayerNormalization,
InstanceNormalization, GroupNormalization, LRN and MeanVarianceNormalization.

BatchNormalization here is the inference computation with the running statistics. In a
TrainingSession the training issue replaces it with batch statistics (DESIGN decision 5); in an
inference graph its running-mean/var outputs return the input statistics unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import normalize_axis
from .registry import register_op


_STASH_TYPES = {
    DataType.FLOAT.onnx: DataType.FLOAT,
    DataType.FLOAT16.onnx: DataType.FLOAT16,
    DataType.DOUBLE.onnx: DataType.DOUBLE,
    DataType.BFLOAT16.onnx: DataType.BFLOAT16,
}


def _stash_dtype(op: Op, stash_type: int) -> torch.dtype:
    """The torch dtype of a ``stash_type`` attribute (an ONNX floating-point type code)."""
    if stash_type not in _STASH_TYPES:
        raise ShapeError(
            f"{op.debug_name}: stash_type={stash_type} is not a floating-point ONNX type code "
            f"(1 = float32, 10 = float16, 11 = float64, 16 = bfloat16)."
        )
    return _STASH_TYPES[stash_type].torch


@register_op("BatchNormalization", versions=(1, 6, 7, 9, 14, 15))
class BatchNormalization(Op):
    """Y = (X - mean) / sqrt(var + epsilon) * scale + B with the given (running) statistics."""

    @dataclass(frozen=True)
    class Attrs:
        """Versions 14 and 15."""

        epsilon: float = 1e-5
        momentum: float = 0.9
        training_mode: int = 0

    @dataclass(frozen=True)
    class V9Attrs:
        epsilon: float = 1e-5
        momentum: float = 0.9

    @dataclass(frozen=True)
    class V7Attrs(V9Attrs):
        spatial: int = 1

    @dataclass(frozen=True)
    class V6Attrs(V7Attrs):
        is_test: int = 0

    @dataclass(frozen=True)
    class V1Attrs(V6Attrs):
        consumed_inputs: tuple[int, ...] = ()

    @classmethod
    def attrs_type(cls, version: int):
        for since, attrs in ((14, cls.Attrs), (9, cls.V9Attrs), (7, cls.V7Attrs), (6, cls.V6Attrs)):
            if version >= since:
                return attrs
        return cls.V1Attrs

    def infer(self, x, scale, b, mean, var):
        if x.rank < 2:
            raise ShapeError(f"{self.debug_name}: X {x} must be [N, C, ...].")
        spatial = getattr(self.attrs, "spatial", 1)  # versions >= 9 are always spatial
        # Non-spatial statistics (spatial=0) hold one value per activation (C x D1 x ...).
        param_shape = (x.shape[1],) if spatial else x.shape[1:]
        for name, info in (("scale", scale), ("B", b), ("mean", mean), ("var", var)):
            if info.shape != param_shape:
                raise ShapeError(
                    f"{self.debug_name}: {name} {info} must have shape {list(param_shape)} for "
                    f"X {x}{'' if spatial else ' (spatial=0)'}."
                )
        if self.version < 15 and {scale.dtype, b.dtype, mean.dtype, var.dtype} != {x.dtype}:
            raise ShapeError(
                f"{self.debug_name}: X {x}, scale {scale}, B {b}, mean {mean}, var {var} must "
                f"share one dtype before opset 15."
            )
        self._flat = None if spatial else (x.shape[0], math.prod(param_shape))
        self._x_shape = x.shape
        dtype = x.dtype.torch
        self._cast = {
            i: dtype for i, info in enumerate((scale, b, mean, var)) if info.dtype.torch != dtype
        }
        # Y, then the running mean and var (versions < 14 list two more training-only outputs,
        # saved_mean and saved_var, which an inference graph does not have: asking for them
        # fails at import with the output count).
        return [x, mean, var]

    def kernel(self, x, scale, b, mean, var):
        if self._cast or self._flat is not None:
            params = [scale, b, mean, var]
            for i, dtype in self._cast.items():
                params[i] = params[i].to(dtype)
            if self._flat is not None:
                params = [p.reshape(-1) for p in params]
            y = F.batch_norm(
                x if self._flat is None else x.reshape(self._flat),
                params[2], params[3], params[0], params[1], False, 0.0, self.attrs.epsilon,
            )
        else:
            y = F.batch_norm(x, mean, var, scale, b, False, 0.0, self.attrs.epsilon)
        if self._flat is not None:
            y = y.reshape(self._x_shape)
        if len(self.outputs) == 1:
            return y
        # Inference leaves the running statistics as they were.
        return y, mean.clone(), var.clone()


@register_op("LayerNormalization", versions=(17,))
class LayerNormalization(Op):
    """Normalize over dims [axis, rank), then scale and shift; optional Mean and InvStdDev."""

    @dataclass(frozen=True)
    class Attrs:
        axis: int = -1
        epsilon: float = 1e-5
        stash_type: int = 1

    def infer(self, x, scale, b=None):
        axis = normalize_axis(self, self.attrs.axis, x.rank)
        norm_shape = x.shape[axis:]
        for name, info in (("Scale", scale), ("B", b)):
            if info is None:
                continue
            if len(info.shape) > len(norm_shape) or any(
                d not in (1, n) for d, n in zip(reversed(info.shape), reversed(norm_shape))
            ):
                raise ShapeError(
                    f"{self.debug_name}: {name} {info} does not broadcast to the normalized "
                    f"shape {list(norm_shape)} (X {x}, axis {self.attrs.axis})."
                )
            if info.dtype != x.dtype:
                raise ShapeError(f"{self.debug_name}: {name} {info} and X {x} dtypes differ.")
        self._norm_shape = list(norm_shape)
        stash = _stash_dtype(self, self.attrs.stash_type)
        # ONNX normalizes in the stash type, casts back to X's type, then scales and shifts.
        self._stash = None if stash == x.dtype.torch else stash
        self._expand = [
            info is not None and info.shape != norm_shape for info in (scale, b)
        ]
        stats = TensorInfo(DataType.from_torch(stash), x.shape[:axis] + (1,) * len(norm_shape))
        return [x, stats, stats]

    def kernel(self, x, scale, b=None):
        shape, eps = self._norm_shape, self.attrs.epsilon
        if self._expand[0]:
            scale = scale.expand(shape)
        if self._expand[1]:
            b = b.expand(shape)
        if self._stash is None:
            if len(self.outputs) == 1:
                return F.layer_norm(x, shape, scale, b, eps)
            return torch.native_layer_norm(x, shape, scale, b, eps)
        normed, mean, rstd = torch.native_layer_norm(x.to(self._stash), shape, None, None, eps)
        y = normed.to(x.dtype).mul_(scale)
        if b is not None:
            y = y.add_(b)
        return y if len(self.outputs) == 1 else (y, mean, rstd)


def _check_channel_params(op: Op, x: TensorInfo, size: int, *params) -> None:
    for name, info in params:
        if info.shape != (size,):
            raise ShapeError(
                f"{op.debug_name}: {name} {info} must have shape [{size}] for X {x}."
            )
        if info.dtype != x.dtype:
            raise ShapeError(f"{op.debug_name}: {name} {info} and X {x} dtypes differ.")


@register_op("InstanceNormalization", versions=(1, 6))
class InstanceNormalization(Op):
    """Normalize each (n, c) plane over its spatial dims, then scale and shift per channel."""

    @dataclass(frozen=True)
    class Attrs:
        epsilon: float = 1e-5

    @dataclass(frozen=True)
    class V1Attrs(Attrs):
        consumed_inputs: tuple[int, ...] = ()

    @classmethod
    def attrs_type(cls, version: int):
        return cls.V1Attrs if version < 6 else cls.Attrs

    def infer(self, x, scale, b):
        if x.rank < 3:
            raise ShapeError(f"{self.debug_name}: X {x} must be [N, C, D1..Dn] with n >= 1.")
        _check_channel_params(self, x, x.shape[1], ("scale", scale), ("B", b))
        self._channels = x.shape[1]
        return x

    def kernel(self, x, scale, b):
        # Group norm with one channel per group is instance norm, via torch's fused kernel.
        return F.group_norm(x, self._channels, scale, b, self.attrs.epsilon)


@register_op("GroupNormalization", versions=(18, 21))
class GroupNormalization(Op):
    """Normalize over groups of channels. Version 18 scales per group, 21 per channel."""

    @dataclass(frozen=True)
    class Attrs:
        num_groups: int
        epsilon: float = 1e-5
        stash_type: int = 1

    @dataclass(frozen=True)
    class V18Attrs:
        num_groups: int
        epsilon: float = 1e-5

    @classmethod
    def attrs_type(cls, version: int):
        return cls.V18Attrs if version < 21 else cls.Attrs

    def infer(self, x, scale, b):
        groups = self.attrs.num_groups
        if x.rank < 2:
            raise ShapeError(f"{self.debug_name}: X {x} must be [N, C, ...].")
        channels = x.shape[1]
        if groups < 1 or channels % groups:
            raise ShapeError(
                f"{self.debug_name}: num_groups={groups} must divide the {channels} channels of "
                f"X {x}."
            )
        per_group = self.version < 21
        _check_channel_params(
            self, x, groups if per_group else channels, ("scale", scale), ("bias", b)
        )
        self._repeat = channels // groups if per_group else 1
        stash = _stash_dtype(self, getattr(self.attrs, "stash_type", 1))  # 18: input type
        self._stash = None if per_group or stash == x.dtype.torch else stash
        self._affine_shape = (1, channels) + (1,) * (x.rank - 2)
        return x

    def kernel(self, x, scale, b):
        groups, eps = self.attrs.num_groups, self.attrs.epsilon
        if self._repeat > 1:
            scale = scale.repeat_interleave(self._repeat)
            b = b.repeat_interleave(self._repeat)
        if self._stash is None:
            return F.group_norm(x, groups, scale, b, eps)
        normed = F.group_norm(x.to(self._stash), groups, None, None, eps).to(x.dtype)
        return normed.mul_(scale.view(self._affine_shape)).add_(b.view(self._affine_shape))


@register_op("LRN", versions=(1, 13))
class LRN(Op):
    """Y = X / (bias + alpha / size * sum of X^2 over nearby channels) ^ beta."""

    @dataclass(frozen=True)
    class Attrs:
        size: int
        alpha: float = 1e-4
        beta: float = 0.75
        bias: float = 1.0

    def infer(self, x):
        if x.rank < 3:
            raise ShapeError(f"{self.debug_name}: X {x} must be [N, C, D1..Dn] with n >= 1.")
        size = self.attrs.size
        if size < 1:
            raise ShapeError(f"{self.debug_name}: size={size} must be >= 1.")
        # ONNX's channel window is [c - floor((size-1)/2), c + ceil((size-1)/2)]; torch's
        # local_response_norm centres even sizes the other way, so the sum is built here.
        self._pad = (0, 0, (size - 1) // 2, size - 1 - (size - 1) // 2)
        self._planes = (x.shape[0], 1, x.shape[1], math.prod(x.shape[2:]))
        return x

    def kernel(self, x):
        at = self.attrs
        sq = F.pad((x * x).reshape(self._planes), self._pad)
        mean = F.avg_pool2d(sq, (at.size, 1), stride=1).reshape(x.shape)
        return x / mean.mul_(at.alpha).add_(at.bias).pow_(at.beta)


@register_op("MeanVarianceNormalization", versions=(9, 13))
class MeanVarianceNormalization(Op):
    """Y = (X - mean) / (sqrt(variance) + 1e-9) over ``axes`` (ONNX's function body)."""

    @dataclass(frozen=True)
    class Attrs:
        axes: tuple[int, ...] = (0, 2, 3)

    def infer(self, x):
        self._axes = tuple(sorted({normalize_axis(self, a, x.rank) for a in self.attrs.axes}))
        return x

    def kernel(self, x):
        var, mean = torch.var_mean(x, self._axes, correction=0, keepdim=True)
        return (x - mean).div_(var.sqrt_().add_(1e-9))

