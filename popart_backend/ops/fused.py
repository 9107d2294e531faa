"""Fused ops made by the compile-time fusion passes (``transforms/fuse_*.py``), never by users.

They live in the internal domain ``popart.fused``, which the ONNX importer refuses, so a model
cannot name them: only a pass that has checked the pattern's preconditions creates them. Each
one replaces a chain of ONNX ops by one torch call (or one call plus in-place epilogues), which
saves kernel launches, temporaries and the Python overhead of each step.

Shape inference of a fused op is the shape of the chain it replaced: the pass passes it in, and
``infer()`` re-checks that the inputs are still the ones the pass saw.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .registry import register_op

FUSED_DOMAIN = "popart.fused"

ACTIVATIONS = ("none", "relu")


class FusedOp(Op):
    """An op whose output info was fixed by the fusion pass that created it."""

    def __init__(self, attrs, settings, input_infos: list[TensorInfo | None], out: TensorInfo):
        super().__init__(attrs, settings, version=1)
        self._expected_inputs = list(input_infos)
        self._out = out

    def infer(self, *inputs):
        if list(inputs) != self._expected_inputs:
            got = ", ".join(str(i) for i in inputs)
            want = ", ".join(str(i) for i in self._expected_inputs)
            raise ShapeError(
                f"{self.debug_name}: inputs changed since fusion: got ({got}), fused for "
                f"({want}). Run the fusion passes after the passes that change shapes."
            )
        return self._out


def _check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ShapeError(f"fused activation {activation!r} is not one of {ACTIVATIONS}.")


@register_op("LinearBias", versions=(1,), domain=FUSED_DOMAIN)
class LinearBias(FusedOp):
    """Y = act(X @ W + B) for W [K, N] and B broadcast over the last dim: one addmm.

    Replaces MatMul + Add (+ Relu), and Gemm + Relu (with ``transposed_weight`` when the Gemm
    had transB=1, i.e. W is [N, K]).
    """

    @dataclass(frozen=True)
    class Attrs:
        transposed_weight: int = 0
        activation: str = "none"

    def __init__(self, attrs, settings, input_infos, out):
        _check_activation(attrs.activation)
        super().__init__(attrs, settings, input_infos, out)
        self._relu = attrs.activation == "relu"
        self._transposed = bool(attrs.transposed_weight)

    def kernel(self, x, w, b=None):
        # F.linear wants W as [N, K]; the transposed view of a [K, N] weight costs nothing and
        # addmm reads it in its natural layout.
        y = F.linear(x, w if self._transposed else w.t(), b)
        return torch.relu_(y) if self._relu else y


@register_op("ConvBiasAct", versions=(1,), domain=FUSED_DOMAIN)
class ConvBiasAct(FusedOp):
    """Y = act(Conv(X, W, B) [+ R]): the residual add and ReLU run in place on the conv output."""

    @dataclass(frozen=True)
    class Attrs:
        activation: str = "none"
        residual: int = 0

    def __init__(self, attrs, settings, input_infos, out, conv: Op):
        _check_activation(attrs.activation)
        super().__init__(attrs, settings, input_infos, out)
        # The original Conv op keeps its resolved window (pads, strides, groups): its kernel is
        # the one definition of the convolution.
        self._conv = conv.kernel
        self._relu = attrs.activation == "relu"

    def kernel(self, x, w, b=None, residual=None):
        y = self._conv(x, w, b)
        if residual is not None:
            y.add_(residual)
        return torch.relu_(y) if self._relu else y


@register_op("Gelu", versions=(1,), domain=FUSED_DOMAIN)
class Gelu(FusedOp):
    """Y = x * Phi(x), exact (erf) or the tanh approximation, in one F.gelu call."""

    @dataclass(frozen=True)
    class Attrs:
        approximate: str = "none"

    def kernel(self, x):
        return F.gelu(x, approximate=self.attrs.approximate)


@register_op("LayerNorm", versions=(1,), domain=FUSED_DOMAIN)
class LayerNorm(FusedOp):
    """Y = (X - mean) / sqrt(var + eps) * scale + bias over the trailing ``num_axes`` dims."""

    @dataclass(frozen=True)
    class Attrs:
        epsilon: float = 1e-5
        num_axes: int = 1

    def __init__(self, attrs, settings, input_infos, out):
        super().__init__(attrs, settings, input_infos, out)
        self._shape = out.shape[len(out.shape) - attrs.num_axes :]

    def kernel(self, x, scale=None, bias=None):
        return F.layer_norm(x, self._shape, scale, bias, self.attrs.epsilon)


@register_op("Attention", versions=(1,), domain=FUSED_DOMAIN)
class Attention(FusedOp):
    """Y = softmax(scale * Q @ K^T + mask) @ V in one F.scaled_dot_product_attention call.

    With ``key_transposed`` the key input is K^T ([..., E, S], as the exporters feed MatMul);
    a transposed view hands it to torch. Rows whose scores are all -inf give zeros, as the
    exporters' ``Where(IsNaN(p), 0, p)`` guard does (the pass requires that guard or a finite
    constant mask).
    """

    @dataclass(frozen=True)
    class Attrs:
        scale: float = 1.0
        key_transposed: int = 1

    def kernel(self, q, k, v, mask=None):
        if self.attrs.key_transposed:
            k = k.transpose(-1, -2)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.attrs.scale)
