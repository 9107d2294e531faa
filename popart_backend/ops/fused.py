"""Fused ops made by the compile-time fusion passes (``transforms/fuse_*.py``), never by users.

They live in the internal domain ``popart.fused``, which the ONNX importer refuses, so a model
cannot name them: only a pass that has checked the pattern's preconditions creates them. Each
one replaces a chain of ONNX ops by one torch call (or one call plus in-place epilogues), which
saves kernel launches, temporaries and the Python overhead of each step.

Shape inference of a fused op is the shape of the chain it replaced: the pass passes it in, and
``infer()`` re-checks that the inputs are still the ones the pass saw.

LinearBias, Gelu, LayerNorm and Attention have gradients, so the training pass list runs their
fusions before autodiff. Their grad ops live in the same internal domain, right below their
forward op, and compute what torch's own backward of the fused call computes (``addmm``'s,
``gelu_backward``, the native layer-norm backward, the CPU flash-attention backward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..dtypes import DataType
from ..errors import ShapeError, popart_exception
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .registry import AI_GRAPHCORE, register_op
from .weight_cache import KeptWeight

FUSED_DOMAIN = "popart.fused"

ACTIVATIONS = ("none", "relu")


class FusedOp(Op):
    """An op whose output info was fixed by the fusion pass that created it."""

    def __init__(self, attrs, settings, input_infos: list[TensorInfo | None], out: TensorInfo):
        super().__init__(attrs, settings, version=1)
        self._expected_inputs = list(input_infos)
        self._out = out
        self._fused_out = out  # as the pass gave it (subclasses may extend ``_out``)

    def clone_with(self, settings=None):
        # The constructor also takes the infos the pass fused for.
        return type(self)(self.attrs, settings if settings is not None else self.settings,
                          self._expected_inputs, self._fused_out)

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

    In an inference plan whose weight is a variable the program never writes, a product with
    few rows reads a kept contiguous copy of a transposed weight (``ops/weight_cache.KeptWeight``),
    copied again after each host write of the weight.

    Cost: the product on the matrix units, then the bias add and ReLU on the vector units.
    """

    uses_amp = True

    @dataclass(frozen=True)
    class Attrs:
        transposed_weight: int = 0
        activation: str = "none"

    def __init__(self, attrs, settings, input_infos, out):
        _check_activation(attrs.activation)
        super().__init__(attrs, settings, input_infos, out)
        self._relu = attrs.activation == "relu"
        self._transposed = bool(attrs.transposed_weight)
        self._kept: KeptWeight | None = None  # bind_program

    def bind_program(self, program) -> None:
        x = self._expected_inputs[0]
        rows = x.nelms // x.shape[-1] if x.rank >= 2 and x.shape[-1] else 0
        self._kept = KeptWeight.for_op(self, program, rows)

    def kernel(self, x, w, b=None):
        if self._kept is not None and x.dim() >= 2 and x.is_contiguous():
            return self.kernel_into(x.new_empty(self._fused_out.shape), x, w, b)
        # F.linear wants W as [N, K]; the transposed view of a [K, N] weight costs nothing and
        # addmm reads it in its natural layout.
        y = F.linear(x, w if self._transposed else w.t(), b)
        return torch.relu_(y) if self._relu else y

    writes_into = True

    def kernel_into(self, out, x, w, b=None):
        # F.linear folds contiguous batch dims into the rows of one mm / addmm.
        if x.dim() == 2:
            rows, flat = x, out
        elif x.dim() == 1 or not x.is_contiguous():
            return self.kernel(x, w, b)
        else:
            rows, flat = x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1])
        kept = self._kept
        kn = (kept.operand(w, self._transposed) if kept is not None
              else w.t() if self._transposed else w)
        if b is None:
            torch.mm(rows, kn, out=flat)
        else:
            torch.addmm(b, rows, kn, out=flat)
        return torch.relu_(out) if self._relu else out

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        product = 2 * self._out.nelms * self._expected_inputs[0].shape[-1]
        return product + self.epilogue_flops(), moved

    def epilogue_flops(self) -> int:
        # One add per output element for the bias, one max for the ReLU.
        bias = len(self._expected_inputs) > 2 and self._expected_inputs[2] is not None
        return self._out.nelms * (int(bias) + int(self._relu))

    def grad(self, g):
        dy = g.output_grad(0)
        if self._relu:
            # The output is ReLU's: positive exactly where the pre-activation was.
            dy = g.op("ReluGrad", dy, g.output(0), domain=AI_GRAPHCORE)
        t = self.attrs.transposed_weight
        if g.needs_input_grad(0):
            g.set_input_grad(0, g.op("LinearBiasInputGrad", dy, g.input(1), domain=FUSED_DOMAIN,
                                     transposed_weight=t))
        if g.needs_input_grad(1):
            g.set_input_grad(1, g.op("LinearBiasWeightGrad", dy, g.input(0),
                                     domain=FUSED_DOMAIN, transposed_weight=t))
        if g.has_input(2) and g.needs_input_grad(2):
            g.set_input_grad(2, g.op("LinearBiasBiasGrad", dy, domain=FUSED_DOMAIN))


class _LinearGrad(Op):
    """Shared by LinearBias's grads: dY [..., N] folded to rows [M, N] (a view when contiguous).
    The input and weight gradients are products (matrix units); the bias gradient is a row
    sum (vector units)."""

    @dataclass(frozen=True)
    class Attrs:
        transposed_weight: int = 0

    def rows(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1, t.shape[-1])


@register_op("LinearBiasInputGrad", versions=(1,), domain=FUSED_DOMAIN)
class LinearBiasInputGrad(_LinearGrad):
    """dX = dY @ W^T for W [K, N] (dY @ W for a transposed [N, K] weight): one mm."""

    uses_amp = True

    def infer(self, dy, w):
        k = w.shape[1] if self.attrs.transposed_weight else w.shape[0]
        self._shape = dy.shape[:-1] + (k,)
        self._flops = 2 * dy.nelms * k
        return TensorInfo(dy.dtype, self._shape)

    def kernel(self, dy, w):
        return torch.mm(self.rows(dy), w if self.attrs.transposed_weight else w.t()).reshape(
            self._shape)

    writes_into = True

    def kernel_into(self, out, dy, w):
        torch.mm(self.rows(dy), w if self.attrs.transposed_weight else w.t(),
                 out=out.view(-1, out.shape[-1]))
        return out

    def cost(self) -> tuple[int, int]:
        return self._flops, super().cost()[1]


@register_op("LinearBiasWeightGrad", versions=(1,), domain=FUSED_DOMAIN)
class LinearBiasWeightGrad(_LinearGrad):
    """dW = X^T @ dY as [K, N] (dY^T @ X as [N, K] for a transposed weight), the batch dims
    folded into the rows: one mm, written in the weight's own layout."""

    uses_amp = True

    def infer(self, dy, x):
        k, n = x.shape[-1], dy.shape[-1]
        self._flops = 2 * dy.nelms * k
        return TensorInfo(dy.dtype, (n, k) if self.attrs.transposed_weight else (k, n))

    def kernel(self, dy, x):
        dy, x = self.rows(dy), self.rows(x)
        return torch.mm(dy.t(), x) if self.attrs.transposed_weight else torch.mm(x.t(), dy)

    writes_into = True

    def kernel_into(self, out, dy, x):
        dy, x = self.rows(dy), self.rows(x)
        return (torch.mm(dy.t(), x, out=out) if self.attrs.transposed_weight
                else torch.mm(x.t(), dy, out=out))

    def cost(self) -> tuple[int, int]:
        return self._flops, super().cost()[1]


@register_op("LinearBiasBiasGrad", versions=(1,), domain=FUSED_DOMAIN)
class LinearBiasBiasGrad(_LinearGrad):
    """dB = dY summed over every dim but the last."""

    def infer(self, dy):
        return TensorInfo(dy.dtype, dy.shape[-1:])

    def kernel(self, dy):
        return self.rows(dy).sum(0)

    writes_into = True

    def kernel_into(self, out, dy):
        return torch.sum(self.rows(dy), 0, out=out)


@register_op("ConvBiasAct", versions=(1,), domain=FUSED_DOMAIN)
class ConvBiasAct(FusedOp):
    """Y = act(Conv(X, W, B) [+ R]): the residual add and ReLU run in place on the conv output.

    Cost: the convolution's own (matrix units, with its bias), then the residual add and ReLU
    on the vector units."""

    uses_amp = True
    # X channels-last, as Conv's (device/layout.py); the epilogues keep the conv's layout.
    strided_inputs = True
    channels_last_inputs = (0,)

    @dataclass(frozen=True)
    class Attrs:
        activation: str = "none"
        residual: int = 0

    def __init__(self, attrs, settings, input_infos, out, conv: Op,
                 conv_flops: int | None = None):
        _check_activation(attrs.activation)
        super().__init__(attrs, settings, input_infos, out)
        # The original Conv op keeps its resolved window (pads, strides, groups): its kernel is
        # the one definition of the convolution.
        self._conv_op = conv
        self._conv = conv.kernel
        self._relu = attrs.activation == "relu"
        # The convolution's FLOPs, read from it while it is still in the graph (the pass
        # builds this op before removing the chain); clones are handed the figure.
        self._conv_flops = conv.cost()[0] if conv_flops is None else conv_flops

    def clone_with(self, settings=None):
        return type(self)(self.attrs, settings if settings is not None else self.settings,
                          self._expected_inputs, self._fused_out, self._conv_op,
                          self._conv_flops)

    def cost(self) -> tuple[int, int]:
        return self._conv_flops + self.epilogue_flops(), super().cost()[1]

    def epilogue_flops(self) -> int:
        return self._out.nelms * (self.attrs.residual + int(self._relu))

    def kernel(self, x, w, b=None, residual=None):
        y = self._conv(x, w, b)
        if residual is not None:
            y.add_(residual)
        return torch.relu_(y) if self._relu else y


@register_op("Gelu", versions=(1,), domain=FUSED_DOMAIN)
class Gelu(FusedOp):
    """Y = x * Phi(x), exact (erf) or the tanh approximation, in one F.gelu call."""

    is_nonlinearity = True

    @dataclass(frozen=True)
    class Attrs:
        approximate: str = "none"

    def kernel(self, x):
        return F.gelu(x, approximate=self.attrs.approximate)

    writes_into = True

    def kernel_into(self, out, x):
        return torch._C._nn.gelu(x, approximate=self.attrs.approximate, out=out)

    def grad(self, g):
        g.set_input_grad(0, g.op("GeluGrad", g.output_grad(0), g.input(0), domain=FUSED_DOMAIN,
                                 approximate=self.attrs.approximate))


@register_op("GeluGrad", versions=(1,), domain=FUSED_DOMAIN)
class GeluGrad(Op):
    """dX = dY * d gelu(x)/dx, by torch's own formula (exact or tanh)."""

    Attrs = Gelu.Attrs

    def infer(self, dy, x):
        return dy

    def kernel(self, dy, x):
        return torch.ops.aten.gelu_backward(dy, x, approximate=self.attrs.approximate)

    writes_into = True

    def kernel_into(self, out, dy, x):
        return torch.ops.aten.gelu_backward.grad_input(
            dy, x, approximate=self.attrs.approximate, grad_input=out)


@register_op("LayerNorm", versions=(1,), domain=FUSED_DOMAIN)
class LayerNorm(FusedOp):
    """Y = (X - mean) / sqrt(var + eps) * scale + bias over the trailing ``num_axes`` dims.

    With ``save_stats`` (made by the training fusion) the op also outputs the mean and the
    reciprocal standard deviation (shape of X with the normalized dims kept as 1) for
    LayerNormGrad, torch's native layer-norm backward.
    """

    is_normalization = True

    @dataclass(frozen=True)
    class Attrs:
        epsilon: float = 1e-5
        num_axes: int = 1
        save_stats: int = 0

    def __init__(self, attrs, settings, input_infos, out):
        super().__init__(attrs, settings, input_infos, out)
        self._shape = out.shape[len(out.shape) - attrs.num_axes :]
        if attrs.save_stats:
            stats = out.with_shape(out.shape[: len(out.shape) - attrs.num_axes]
                                   + (1,) * attrs.num_axes)
            self._out = [out, stats, stats]

    def kernel(self, x, scale=None, bias=None):
        if self.attrs.save_stats:
            return torch.native_layer_norm(x, self._shape, scale, bias, self.attrs.epsilon)
        return F.layer_norm(x, self._shape, scale, bias, self.attrs.epsilon)

    # No ``kernel_into``: torch's native_layer_norm.out computes into a fresh tensor and copies
    # it into ``out`` (measured twice as slow as F.layer_norm for [8, 128, 768]).

    def grad(self, g):
        if not self.attrs.save_stats:
            raise popart_exception(
                f"{self.debug_name}: this layer norm was fused for inference (no saved "
                f"statistics); the training fusion sets save_stats=1.")
        grads = g.op("LayerNormGrad", g.output_grad(0), g.input(0), g.input(1), g.input(2),
                     g.output(1), g.output(2), domain=FUSED_DOMAIN, num_outputs=3,
                     num_axes=self.attrs.num_axes)
        for index, grad in enumerate(grads):
            g.set_input_grad(index, grad)


@register_op("LayerNormGrad", versions=(1,), domain=FUSED_DOMAIN)
class LayerNormGrad(Op):
    """(dX, dScale, dBias) of LayerNorm from dY, its inputs and the saved mean and 1/std."""

    @dataclass(frozen=True)
    class Attrs:
        num_axes: int = 1

    def infer(self, dy, x, scale, bias, mean, rstd):
        if scale is None or bias is None:
            raise ShapeError(
                f"{self.debug_name}: needs the scale and bias inputs; the training fusion "
                f"fuses only layer norms that have both.")
        self._shape = x.shape[len(x.shape) - self.attrs.num_axes :]
        return [x, scale, bias]

    def kernel(self, dy, x, scale, bias, mean, rstd):
        return torch.ops.aten.native_layer_norm_backward(
            dy, x, self._shape, mean, rstd, scale, bias, [True, True, True])


@register_op("Attention", versions=(1,), domain=FUSED_DOMAIN)
class Attention(FusedOp):
    """Y = softmax(scale * Q @ K^T + mask) @ V in one F.scaled_dot_product_attention call.

    With ``key_transposed`` the key input is K^T ([..., E, S], as the exporters feed MatMul);
    a transposed view hands it to torch. Rows whose scores are all -inf give zeros, as the
    exporters' ``Where(IsNaN(p), 0, p)`` guard does. Without that guard the pass needs a finite
    constant mask, or sets ``nan_masked_rows``: rows whose mask is all -inf then give NaN, as
    the unguarded ONNX Softmax does.

    With ``save_stats`` (made by the training fusion) the op also outputs the row-wise
    log-sum-exp of the scores, f32 [B, H, L], computed by torch's CPU flash-attention kernel;
    AttentionGrad reads it instead of recomputing the softmax. With ``nan_masked_rows`` too,
    AttentionGrad gives the NaN gradients the unguarded softmax gives for such rows.
    """

    aliases_inputs = True  # present key/value without a past are the inputs

    uses_amp = True

    @dataclass(frozen=True)
    class Attrs:
        scale: float = 1.0
        key_transposed: int = 1
        save_stats: int = 0
        nan_masked_rows: int = 0

    def __init__(self, attrs, settings, input_infos, out):
        super().__init__(attrs, settings, input_infos, out)
        if attrs.save_stats:
            self._out = [out, TensorInfo(out.dtype, out.shape[:-1])]

    def kernel(self, q, k, v, mask=None):
        return self._attend(None, q, k, v, mask)

    def scratch_infos(self):
        """The dead-row mask check's temporaries (device/arena.py): -inf mask, dead rows,
        whether any row is dead."""
        return _dead_row_scratch(self, 3)

    def kernel_scratch(self, out, neginf, full, any_full, q, k, v, mask=None):
        return self._attend((neginf, full, any_full), q, k, v, mask)

    def _attend(self, scratch, q, k, v, mask):
        if self.attrs.key_transposed:
            k = k.transpose(-1, -2)
        full = _fully_masked(mask, scratch) if self.attrs.nan_masked_rows else None
        if not self.attrs.save_stats:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.attrs.scale)
            # A row masked everywhere: NaN, as softmax over all -inf (torch gives zeros).
            return y if full is None else y.masked_fill(full, float("nan"))
        q, k, v, mask = _unit_stride(q, k, v, mask)
        y, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=self.attrs.scale)
        return (y if full is None else y.masked_fill_(full, float("nan"))), lse

    def cost(self) -> tuple[int, int]:
        # Two products of 2·L·S·E each (scores, then the weighted sum of V).
        q, v = self._expected_inputs[0], self._expected_inputs[2]
        _, moved = super().cost()
        return 4 * q.nelms * v.shape[-2], moved

    def grad(self, g):
        if len(self.inputs) > 3 and g.needs_input_grad(3):
            raise popart_exception(
                f"{self.debug_name}: the attention mask '{g.input(3)}' needs a gradient, which "
                f"the fused op does not compute. Run the training passes without fusing this "
                f"attention (a mask computed from weights is not fused).")
        if not self.attrs.save_stats:
            raise popart_exception(
                f"{self.debug_name}: this attention was fused for inference (no saved "
                f"log-sum-exp); the training fusion sets save_stats=1.")
        mask = g.input(3) if g.has_input(3) else None
        grads = g.op("AttentionGrad", g.output_grad(0), g.input(0), g.input(1), g.input(2),
                     g.output(0), g.output(1), mask, domain=FUSED_DOMAIN, num_outputs=3,
                     scale=self.attrs.scale, key_transposed=self.attrs.key_transposed,
                     nan_masked_rows=self.attrs.nan_masked_rows)
        for index, grad in enumerate(grads):
            g.set_input_grad(index, grad)


def _fully_masked(mask, scratch=None):
    """Where a row of ``mask`` is -inf everywhere ([..., L, 1], broadcastable to the output),
    or None when no row is (or there is no mask). ``scratch``: the three buffers of
    ``_dead_row_scratch`` to compute it in (the result is then a scratch buffer, read
    during the step only), or None to allocate them."""
    if mask is None:
        return None
    if scratch is None:
        full = torch.isneginf(mask).all(-1, keepdim=True)
        return full if full.any() else None
    neginf, full, any_full = scratch
    torch.all(torch.isneginf(mask, out=neginf), -1, keepdim=True, out=full)
    return full if torch.any(full, out=any_full).item() else None


def _dead_row_scratch(op, position: int) -> tuple:
    """Scratch infos of the dead-row check of an Attention or AttentionGrad with a mask (its
    input ``position``) and ``nan_masked_rows`` (else none): the mask's -inf test, its rows
    all -inf, any of them."""
    mask = op.inputs[position] if len(op.inputs) > position else None
    if not op.attrs.nan_masked_rows or mask is None or mask.info.rank == 0:
        return ()
    shape = mask.info.shape
    return (TensorInfo(DataType.BOOL, shape), TensorInfo(DataType.BOOL, shape[:-1] + (1,)),
            TensorInfo(DataType.BOOL, ()))


def _unit_stride(*tensors):
    """The flash kernels read the last dim as contiguous: copy any view that is not."""
    return [t if t is None or t.stride(-1) == 1 else t.contiguous() for t in tensors]


@register_op("AttentionGrad", versions=(1,), domain=FUSED_DOMAIN)
class AttentionGrad(Op):
    """(dQ, dK, dV) of Attention by torch's CPU flash-attention backward, from dY, the inputs,
    the output and the saved log-sum-exp; dK is handed back as K^T when the key came
    transposed."""

    uses_amp = True

    @dataclass(frozen=True)
    class Attrs:
        scale: float = 1.0
        key_transposed: int = 1
        nan_masked_rows: int = 0

    def infer(self, dy, q, k, v, y, lse, mask=None):
        self._flops = 8 * q.nelms * v.shape[-2]
        return [q, k, v]

    def kernel(self, dy, q, k, v, y, lse, mask=None):
        return self._backward(None, dy, q, k, v, y, lse, mask)

    def scratch_infos(self):
        """The dead-row mask check's temporaries (device/arena.py), as Attention's."""
        return _dead_row_scratch(self, 6)

    def kernel_scratch(self, out, neginf, full, any_full, dy, q, k, v, y, lse, mask=None):
        return self._backward((neginf, full, any_full), dy, q, k, v, y, lse, mask)

    def _backward(self, scratch, dy, q, k, v, y, lse, mask):
        if self.attrs.key_transposed:
            k = k.transpose(-1, -2)
        dy, q, k, v, mask = _unit_stride(dy, q, k, v, mask)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dy, q, k, v, y, lse, 0.0, False, attn_mask=mask, scale=self.attrs.scale)
        full = _fully_masked(mask, scratch) if self.attrs.nan_masked_rows else None
        if full is not None:
            # As the unguarded softmax: a fully masked row's probabilities are NaN, so is that
            # row of dQ, and every dK and dV entry of its (batch, head) (they sum over rows).
            dq = dq.masked_fill(full, float("nan"))
            slices = full.any(-2, keepdim=True)
            dk = dk.masked_fill(slices, float("nan"))
            dv = dv.masked_fill(slices, float("nan"))
        if self.attrs.key_transposed:
            dk = dk.transpose(-1, -2)
        return dq, dk, dv

    def cost(self) -> tuple[int, int]:
        return self._flops, super().cost()[1]
