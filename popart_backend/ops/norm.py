"""Normalizations: BatchNormalization, LayerNormalization, InstanceNormalization and
GroupNormalization, with their gradients (LRN and MeanVarianceNormalization are in
``norm_local.py``).

BatchNormalization is the inference computation with the running statistics; in an inference
graph its running-mean/var outputs return the input statistics unchanged. In a TrainingSession
the TrainingSemantics pass replaces it by BatchNormalizationTraining (DESIGN decision 5), which
normalizes with the batch statistics and updates the running mean/var variables in place.

The gradient kernels are torch's own backward functions (native_batch_norm_backward,
native_layer_norm_backward, native_group_norm_backward), fed the statistics the forward saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..dtypes import DataType
from ..errors import ShapeError, popart_exception
from ..ir.op import Op, TrainingForm
from ..ir.tensor import TensorInfo, TensorKind, TensorRole
from .base import LegacyConsumedInputs, normalize_axis
from .multi_grad import add_multi_grad_op, pick_grads, wanted_grads
from .registry import AI_GRAPHCORE, create_op, register_op


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


class _Normalization(Op):
    """Cost of a normalization: a fixed FLOP count per element of input 0 (X, or dY for the
    grads). Statistics take a sum and a sum of squares, normalizing a subtract and a multiply,
    the affine part a multiply-add; a gradient adds the two reductions of dY."""

    flops_per_element: ClassVar[int] = 7

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        return self.flops_per_element * self.inputs[0].info.nelms, moved


@register_op("BatchNormalization", versions=(1, 6, 7, 9, 14, 15))
class BatchNormalization(_Normalization):
    """Y = (X - mean) / sqrt(var + epsilon) * scale + B with the given (running) statistics."""

    is_normalization = True
    flops_per_element = 2  # statistics are given: scale and shift only
    strided_inputs = True  # channels-last X in, Y out in X's layout (device/layout.py)

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
        # Y, then the running mean and var; versions < 14 list two more training outputs,
        # saved_mean and saved_var (PopART's num_outputs=5), the batch's statistics. An
        # inference graph still normalizes with the running statistics (DESIGN decision 5).
        if (self.num_outputs or 0) <= 3 or self.version >= 14:
            return [x, mean, var]
        self._batch_axes = (0,) if not spatial else (0, *range(2, x.rank))
        saved = TensorInfo(x.dtype, (math.prod(param_shape),))
        return [x, mean, var, saved, saved]

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
        if len(self.outputs) <= 3:
            return y, mean.clone(), var.clone()
        batch_var, batch_mean = torch.var_mean(x, self._batch_axes, correction=0)
        return y, mean.clone(), var.clone(), batch_mean.reshape(-1), batch_var.reshape(-1)

    def grad(self, g):
        _batch_norm_grads(self, g, g.input(3), g.input(4), training=0)

    def training_form(self, random_seed):
        """BatchNormalizationTraining: batch statistics, running mean and var updated in place
        (role RUNNING_STAT: the optimizer leaves them alone), batch mean and inverse std out."""
        for index, what in ((3, "mean"), (4, "var")):
            stat = self.inputs[index]
            if stat.kind is TensorKind.CONST:
                # Training updates it, so it is state from now on (never shared with the host's
                # constant data: the plan copies variables).
                stat.kind = TensorKind.VARIABLE
            if stat.kind is not TensorKind.VARIABLE:
                raise popart_exception(
                    f"{self.debug_name}: the running {what} '{stat.id}' is computed "
                    f"({stat.kind.value}), but training updates it in place. Make it an "
                    f"initializer."
                )
            stat.role = TensorRole.RUNNING_STAT
        attrs = self.attrs
        saved = len(self.outputs) > 3  # the node's own saved_mean and saved_var outputs
        new = create_op(
            "BatchNormalizationTraining",
            {"epsilon": attrs.epsilon, "momentum": attrs.momentum,
             "spatial": getattr(attrs, "spatial", 1), "saved_var": int(saved)},
            self.settings, domain=AI_GRAPHCORE, where=self.debug_name,
        )
        base, graph = self.outputs[0].id, self.graph
        outputs = list(self.outputs) if saved else list(self.outputs) + [None] * (
            3 - len(self.outputs)) + [graph.unique_id(f"{base}/batch_mean"),
                                      graph.unique_id(f"{base}/batch_invstd")]
        return TrainingForm(new, [t.id for t in self.inputs], outputs)


def _batch_norm_grads(op: Op, g, stat0: str, stat1: str, training: int) -> None:
    wrt = wanted_grads(g)
    if wrt:
        add_multi_grad_op(g, "BatchNormalizationGrad", g.output_grad(0), g.input(0), g.input(1),
                          g.input(2), stat0, stat1, wrt=wrt, epsilon=op.attrs.epsilon,
                          spatial=getattr(op.attrs, "spatial", 1), training=training)


@register_op("BatchNormalizationTraining", versions=1, domain=AI_GRAPHCORE)
class BatchNormalizationTraining(_Normalization):
    """BatchNormalization of a TrainingSession (made by the TrainingSemantics pass).

    Y normalizes with the batch mean and (biased) variance. The running statistics (inputs 3, 4,
    variables) are updated in place, as torch's BatchNorm does in train mode:
    ``running = momentum * running + (1 - momentum) * batch`` with ONNX's ``momentum`` (torch's
    momentum is 1 - ONNX's), where the running variance takes the unbiased batch variance
    (torch's rule; ONNX's reference uses the biased one). Outputs: Y, the updated running mean
    and var (aliases of inputs 3, 4), and the batch mean and 1/sqrt(var + epsilon) that the
    gradient reuses; with ``saved_var`` (the node's saved_mean / saved_var outputs) the last
    is the biased batch variance instead.
    """

    is_normalization = True
    public = False  # only the TrainingSemantics pass creates it
    strided_inputs = True  # channels-last X in, Y out in X's layout (device/layout.py)

    modifies_inputs = (3, 4)

    @dataclass(frozen=True)
    class Attrs:
        epsilon: float = 1e-5
        momentum: float = 0.9
        spatial: int = 1
        saved_var: int = 0

    def infer(self, x, scale, b, mean, var):
        param_shape = (x.shape[1],) if self.attrs.spatial else x.shape[1:]
        for name, info in (("scale", scale), ("B", b), ("mean", mean), ("var", var)):
            if info.shape != param_shape:
                raise ShapeError(
                    f"{self.debug_name}: {name} {info} must have shape {list(param_shape)} for "
                    f"X {x}."
                )
        per_channel = math.prod(x.shape) // math.prod(param_shape)
        if per_channel < 2:
            raise ShapeError(
                f"{self.debug_name}: batch statistics need more than one value per channel, but "
                f"X {x} has {per_channel}. Use a larger batch (or replicated batch) size."
            )
        self._flat = None if self.attrs.spatial else (x.shape[0], math.prod(param_shape))
        dtype = x.dtype.torch
        self._cast = any(i.dtype.torch != dtype for i in (scale, b, mean, var))
        self._dtype = dtype
        self._torch_momentum = 1.0 - self.attrs.momentum
        saved = TensorInfo(x.dtype, (math.prod(param_shape),))
        return [x, mean, var, saved, saved]

    def kernel(self, x, scale, b, mean, var):
        running_mean, running_var = mean, var
        if self._cast:
            scale, b = scale.to(self._dtype), b.to(self._dtype)
            running_mean, running_var = mean.to(self._dtype), var.to(self._dtype)
        flat_x = x if self._flat is None else x.reshape(self._flat)
        if self._flat is not None:
            # Views of the variables, so the in-place update reaches them.
            scale, b = scale.reshape(-1), b.reshape(-1)
            running_mean, running_var = running_mean.view(-1), running_var.view(-1)
        y, saved_mean, saved_invstd = torch.native_batch_norm(
            flat_x, scale, b, running_mean, running_var, True, self._torch_momentum,
            self.attrs.epsilon,
        )
        if self._cast:
            mean.copy_(running_mean.view(mean.shape))
            var.copy_(running_var.view(var.shape))
        if self.attrs.saved_var:
            saved_invstd = saved_invstd.pow(-2).sub_(self.attrs.epsilon)
        if self._flat is not None:
            y = y.view(x.shape)
        if saved_mean.dtype != self._dtype:  # float32 statistics of a float16 X
            saved_mean, saved_invstd = saved_mean.to(self._dtype), saved_invstd.to(self._dtype)
        return y, mean, var, saved_mean, saved_invstd

    def grad(self, g):
        _batch_norm_grads(self, g, g.output(3), g.output(4), training=1 + self.attrs.saved_var)


@register_op("BatchNormalizationGrad", versions=1, domain=AI_GRAPHCORE)
class BatchNormalizationGrad(_Normalization):
    """dX, dScale, dB (those in ``wrt``) of batch normalization, by torch's backward kernel.

    Inputs: dY, X, scale, B (for its dtype), then the statistics: with ``training`` the batch
    mean and inverse std the forward saved (``training=2``: the batch variance instead of the
    inverse std), else the running mean and variance.
    """

    flops_per_element = 8
    strided_inputs = True  # channels-last dY, X in, dX out in their layout (device/layout.py)

    @dataclass(frozen=True)
    class Attrs:
        wrt: tuple[int, ...]
        epsilon: float = 1e-5
        spatial: int = 1
        training: int = 0

    def infer(self, dy, x, scale, b, stat0, stat1):
        self._flat = None if self.attrs.spatial else (x.shape[0], math.prod(x.shape[1:]))
        self._dtype = x.dtype.torch
        self._mask = [i in self.attrs.wrt for i in range(3)]
        self._param_dtypes = (scale.dtype.torch, b.dtype.torch)
        # Casts and reshapes a kernel call needs (none for a spatial float32 BN: the step's
        # fixed cost is then the backward kernel alone).
        self._cast = {scale.dtype, b.dtype, stat0.dtype, stat1.dtype} != {x.dtype}
        return [(x, scale, b)[i] for i in self.attrs.wrt]

    def kernel(self, dy, x, scale, b, stat0, stat1):
        if self._cast:
            dtype = self._dtype
            scale, stat0, stat1 = scale.to(dtype), stat0.to(dtype), stat1.to(dtype)
        if self._flat is not None:
            dy, x = dy.reshape(self._flat), x.reshape(self._flat)
            scale, stat0, stat1 = scale.reshape(-1), stat0.reshape(-1), stat1.reshape(-1)
        if self.attrs.training == 2:
            stat1 = (stat1 + self.attrs.epsilon).rsqrt()
        if self.attrs.training:
            args = (None, None, stat0, stat1, True)
        else:
            args = (stat0, stat1, None, None, False)
        dx, dscale, db = torch.ops.aten.native_batch_norm_backward(
            dy, x, scale, *args, self.attrs.epsilon, self._mask
        )
        if self._flat is None and not self._cast:
            return pick_grads((dx, dscale, db), self.attrs.wrt)
        if dx is not None:
            dx = dx.view(self.inputs[1].info.shape)
        if dscale is not None:
            dscale = dscale.view(self.inputs[2].info.shape).to(self._param_dtypes[0])
        if db is not None:
            db = db.view(self.inputs[3].info.shape).to(self._param_dtypes[1])
        return pick_grads((dx, dscale, db), self.attrs.wrt)


@register_op("LayerNormalization", versions=(17,))
class LayerNormalization(_Normalization):
    """Normalize over dims [axis, rank), then scale and shift; optional Mean and InvStdDev."""

    is_normalization = True

    @dataclass(frozen=True)
    class Attrs:
        axis: int = -1
        epsilon: float = 1e-5
        stash_type: int = 1

    def training_form(self, random_seed):
        """The same op with its Mean and InvStdDev outputs, so the backward reuses them instead
        of recomputing; None when it has them already."""
        outputs = list(self.outputs) + [None] * (3 - len(self.outputs))
        if all(t is not None for t in outputs[1:3]):
            return None
        base = outputs[0].id
        for i, name in ((1, "mean"), (2, "invstddev")):
            if outputs[i] is None:
                outputs[i] = self.graph.unique_id(f"{base}/{name}")
        new = self.clone_with()
        return TrainingForm(new, [t.id if t is not None else "" for t in self.inputs], outputs)

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

    def grad(self, g):
        wrt = wanted_grads(g)
        if not wrt:
            return
        saved = len(self.outputs) == 3 and all(t is not None for t in self.outputs[1:])
        stats = (g.output(1), g.output(2)) if saved else (None, None)
        b = g.input(2) if g.has_input(2) else None
        a = self.attrs
        add_multi_grad_op(g, "LayerNormalizationGrad", g.output_grad(0), g.input(0), g.input(1), b,
                          *stats, wrt=wrt, axis=a.axis, epsilon=a.epsilon,
                          stash_type=a.stash_type)


def _sum_to(t: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor | None:
    """Sum a gradient of a broadcast operand back to the operand's ``shape`` (None: not
    wanted)."""
    if t is None or tuple(t.shape) == shape:
        return t
    lead = t.dim() - len(shape)
    dims = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and t.shape[lead + i] != 1
    )
    return t.sum(dims, keepdim=True).reshape(shape)


@register_op("LayerNormalizationGrad", versions=1, domain=AI_GRAPHCORE)
class LayerNormalizationGrad(LayerNormalization):
    """dX, dScale, dB (those in ``wrt``) of LayerNormalization by native_layer_norm_backward.

    Inputs: dY, X, Scale, B (optional, for its shape), then Mean and InvStdDev as the forward
    output them (the TrainingSemantics pass makes sure it does); when absent they are
    recomputed here.
    """

    is_normalization = False  # a grad op, not the forward it inherits from

    def training_form(self, random_seed):
        return None  # a grad op: no training form

    flops_per_element = 8

    @dataclass(frozen=True)
    class Attrs:
        wrt: tuple[int, ...]
        axis: int = -1
        epsilon: float = 1e-5
        stash_type: int = 1

    def infer(self, dy, x, scale, b=None, mean=None, rstd=None):
        LayerNormalization.infer(self, x, scale, b)
        self._mask = [i in self.attrs.wrt for i in range(3)]
        self._shapes = (x.shape, scale.shape, b.shape if b is not None else tuple(self._norm_shape))
        self._compute = self._stash or x.dtype.torch
        bias_info = b if b is not None else scale.with_shape(self._norm_shape)
        return [(x, scale, bias_info)[i] for i in self.attrs.wrt]

    def kernel(self, dy, x, scale, b=None, mean=None, rstd=None):
        shape, dtype = self._norm_shape, self._compute
        weight = scale.to(dtype).expand(shape) if self._expand[0] else scale.to(dtype)
        if self._stash is not None:
            dy, x = dy.to(dtype), x.to(dtype)
        if mean is None:
            _, mean, rstd = torch.native_layer_norm(x, shape, None, None, self.attrs.epsilon)
        # The bias argument only tells torch that dB is wanted; any tensor of its shape does.
        dx, dscale, db = torch.ops.aten.native_layer_norm_backward(
            dy, x, shape, mean, rstd, weight, weight if self._mask[2] else None, self._mask
        )
        grads = (dx, _sum_to(dscale, self._shapes[1]), _sum_to(db, self._shapes[2]))
        return pick_grads(_cast_grads(grads, (self.inputs[1].info.dtype.torch,) * 3),
                          self.attrs.wrt)


def _cast_grads(grads, dtypes) -> tuple:
    """Each wanted gradient (None: not wanted) in its dtype: the backward kernels compute in the
    stash type, the gradients take their inputs' types."""
    return tuple(None if t is None else t.to(dtype) for t, dtype in zip(grads, dtypes))


def _check_channel_params(op: Op, x: TensorInfo, size: int, *params) -> None:
    for name, info in params:
        if info.shape != (size,):
            raise ShapeError(
                f"{op.debug_name}: {name} {info} must have shape [{size}] for X {x}."
            )
        if info.dtype != x.dtype:
            raise ShapeError(f"{op.debug_name}: {name} {info} and X {x} dtypes differ.")


@register_op("InstanceNormalization", versions=(1, 6, 22))
class InstanceNormalization(LegacyConsumedInputs, _Normalization):
    """Normalize each (n, c) plane over its spatial dims, then scale and shift per channel."""

    is_normalization = True

    @dataclass(frozen=True)
    class Attrs:
        epsilon: float = 1e-5

    def infer(self, x, scale, b):
        if x.rank < 3:
            raise ShapeError(f"{self.debug_name}: X {x} must be [N, C, D1..Dn] with n >= 1.")
        _check_channel_params(self, x, x.shape[1], ("scale", scale), ("B", b))
        self._channels = x.shape[1]
        return x

    def kernel(self, x, scale, b):
        # Group norm with one channel per group is instance norm, via torch's fused kernel.
        return F.group_norm(x, self._channels, scale, b, self.attrs.epsilon)

    def grad(self, g):
        _group_norm_grads(self, g, self._channels, per_group_scale=0, stash=None)


@register_op("GroupNormalization", versions=(18, 21))
class GroupNormalization(_Normalization):
    """Normalize over groups of channels. Version 18 scales per group, 21 per channel."""

    is_normalization = True

    @dataclass(frozen=True)
    class V18Attrs:
        num_groups: int
        epsilon: float = 1e-5

    @dataclass(frozen=True)
    class Attrs(V18Attrs):
        stash_type: int = 1

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

    def grad(self, g):
        stash = getattr(self.attrs, "stash_type", None) if self._stash is not None else None
        _group_norm_grads(self, g, self.attrs.num_groups, int(self._repeat > 1), stash)


def _group_norm_grads(op: Op, g, groups: int, per_group_scale: int, stash: int | None) -> None:
    wrt = wanted_grads(g)
    if wrt:
        add_multi_grad_op(g, "GroupNormalizationGrad", g.output_grad(0), g.input(0), g.input(1),
                          g.input(2), wrt=wrt, num_groups=groups, epsilon=op.attrs.epsilon,
                          per_group_scale=per_group_scale, stash_type=stash)


@register_op("GroupNormalizationGrad", versions=1, domain=AI_GRAPHCORE)
class GroupNormalizationGrad(_Normalization):
    """dX, dScale, dB (those in ``wrt``) of group (and instance) normalization.

    Inputs dY, X, scale, B (B for its dtype). The group statistics are recomputed from X (one
    pass), then torch's native_group_norm_backward does the rest. ``per_group_scale``: scale and
    B hold one value per group (GroupNormalization-18), so their gradients are summed per group.
    ``stash_type`` (when set) is the dtype the forward normalized in.
    """

    flops_per_element = 8

    @dataclass(frozen=True)
    class Attrs:
        wrt: tuple[int, ...]
        num_groups: int
        epsilon: float = 1e-5
        per_group_scale: int = 0
        stash_type: int | None = None

    def infer(self, dy, x, scale, b):
        n, c = x.shape[:2]
        groups = self.attrs.num_groups
        self._dims = (n, c, math.prod(x.shape[2:]), groups)
        self._repeat = c // groups if self.attrs.per_group_scale else 1
        self._compute = (
            _stash_dtype(self, self.attrs.stash_type) if self.attrs.stash_type is not None
            else x.dtype.torch
        )
        self._mask = [i in self.attrs.wrt for i in range(3)]
        return [(x, scale, b)[i] for i in self.attrs.wrt]

    def kernel(self, dy, x, scale, b):
        n, c, hw, groups = self._dims
        dtype = self._compute
        x_c, dy_c = x.to(dtype).contiguous(), dy.to(dtype).contiguous()
        var, mean = torch.var_mean(x_c.reshape(n, groups, -1), -1, correction=0)
        rstd = var.add_(self.attrs.epsilon).rsqrt_()
        weight = scale.to(dtype)
        if self._repeat > 1:
            weight = weight.repeat_interleave(self._repeat)
        dx, dscale, db = torch.ops.aten.native_group_norm_backward(
            dy_c, x_c, mean, rstd, weight, n, c, hw, groups, self._mask
        )
        if self._repeat > 1:
            dscale = None if dscale is None else dscale.view(groups, -1).sum(1)
            db = None if db is None else db.view(groups, -1).sum(1)
        grads = _cast_grads((dx, dscale, db), (x.dtype, scale.dtype, b.dtype))
        return pick_grads(grads, self.attrs.wrt)
