"""Conv + BatchNormalization with *variable* weights, folded at run time (inference only).

When the weights are constants, ``transforms/fuse_conv_bn.py`` folds the BatchNormalization
into the Conv once, at compile time. When they are variables (``constantWeights = False``, as
the PopTorch frontend builds every session), the host may write them at any time
(``weightsFromHost``, ``writeWeights`` + ``weightsFromHost``, a frontend weight copy), so the
folded weights cannot be fixed at compile time. This op keeps the Conv and BN parameters as
inputs and computes, with s = scale / sqrt(var + eps):

    W' = W * s[:, None, ...]        B' = (B - mean) * s + beta
    Y  = act(Conv(X, W', B') [+ R])

The folded pair is computed on the first run and kept; it is recomputed whenever any of the
six parameter tensors was written since (a different tensor object, or a bumped torch version
counter: every in-place torch write, ``copy_`` included, bumps it). So the folded weights are
never stale, and a steady-state run costs one convolution with its bias, as onnxruntime's
folded graph does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ir.op import Op
from .conv import wants_channels_last_weight
from .fused import FUSED_DOMAIN, FusedOp, _check_activation
from .registry import register_op
from .weight_cache import MAX_CACHED as _MAX_CACHED
from .weight_cache import same as _same
from .weight_cache import stamp as _stamp
from .weight_cache import stamps_first


@register_op("ConvBatchNorm", versions=(1,), domain=FUSED_DOMAIN)
class ConvBatchNorm(FusedOp):
    """Y = act(Conv(X, W', B') [+ R]) with the BatchNormalization folded into W', B' at run time.

    Inputs: X, W, B (optional), scale, beta, mean, var, then R when ``residual``.

    Cost: the convolution's own (matrix units, with its bias), then the BatchNormalization's
    scale and shift (PopART runs it unfolded on the IPU), the residual add and ReLU on the
    vector units; refolding after a weight write costs a few passes over W.
    """

    uses_amp = True
    # X channels-last, as Conv's (device/layout.py); the epilogues keep the conv's layout.
    strided_inputs = True
    channels_last_inputs = (0,)

    @dataclass(frozen=True)
    class Attrs:
        epsilon: float = 1e-5
        activation: str = "none"
        residual: int = 0

    def __init__(self, attrs, settings, input_infos, out, conv: Op,
                 conv_flops: int | None = None):
        _check_activation(attrs.activation)
        super().__init__(attrs, settings, input_infos, out)
        self._conv_op = conv  # keeps its resolved window (pads, strides, groups)
        self._conv = conv.kernel
        self._relu = attrs.activation == "relu"
        self._conv_flops = conv.cost()[0] if conv_flops is None else conv_flops
        self._folded: list[tuple] = []  # (stamp, W', B'), most recent first
        self._channels_last: tuple = (None, None)  # (a kept W', it channels-last)

    def clone_with(self, settings=None):
        return type(self)(self.attrs, settings if settings is not None else self.settings,
                          self._expected_inputs, self._fused_out, self._conv_op,
                          self._conv_flops)

    def cost(self) -> tuple[int, int]:
        return self._conv_flops + self.epilogue_flops(), super().cost()[1]

    def epilogue_flops(self) -> int:
        # The device model times what PopART runs on the IPU: with variable weights it does
        # not fold the statistics, so the BatchNormalization's scale and shift (2 flops an
        # element) stays in the step even though our CPU kernel folds it into W', B'.
        return self._out.nelms * (2 + self.attrs.residual + int(self._relu))

    def folded_weights(self, w, b, scale, beta, mean, var):
        """(W', B') for these parameter values: the kept pair if none was written since."""
        stamp = _stamp((w, b, scale, beta, mean, var))
        if stamp is not None:
            for kept, w_new, b_new in self._folded:
                if _same(kept, stamp):
                    return w_new, b_new
        w_new, b_new = self._fold(w, b, scale, beta, mean, var)
        if stamp is not None:
            # Drop the entries of these same weight tensors (now stale), keep the others (other
            # replicas'). One assignment: replicas running in threads see either list.
            entries = [e for e in self._folded if not stamps_first(e[0], stamp)]
            self._folded = [(stamp, w_new, b_new)] + entries[: _MAX_CACHED - 1]
        return w_new, b_new

    def _fold(self, w, b, scale, beta, mean, var):
        # In float64, as the compile-time fold: the products then round once, to W's dtype.
        f64 = torch.float64
        s = scale.to(f64) * (var.to(f64) + self.attrs.epsilon).rsqrt()
        w_new = (w.to(f64) * s.reshape((-1,) + (1,) * (w.dim() - 1))).to(w.dtype)
        bias = b.to(f64) if b is not None else torch.zeros_like(s)
        b_new = ((bias - mean.to(f64)) * s + beta.to(f64)).to(w.dtype)
        return w_new.contiguous(), b_new

    def kernel(self, x, w, b, scale, beta, mean, var, residual=None):
        w_new, b_new = self.folded_weights(w, b, scale, beta, mean, var)
        if wants_channels_last_weight(x, w_new):
            kept, converted = self._channels_last
            if kept is not w_new:
                converted = w_new.contiguous(memory_format=torch.channels_last)
                self._channels_last = (w_new, converted)
            w_new = converted
        y = self._conv(x, w_new, b_new)
        if residual is not None:
            y.add_(residual)
        return torch.relu_(y) if self._relu else y
