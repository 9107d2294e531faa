"""Signal processing ops: DFT, STFT, the Hann / Hamming / Blackman windows and MelWeightMatrix.

ONNX holds complex numbers as real tensors whose last dim is 2 (real, imaginary); a last dim
of 1 is a real signal. Kernels view such tensors as torch complex tensors and call
``torch.fft``; half-precision data is transformed in float32 (torch has no complex-half FFT on
CPU) and rounded back.

DFT and STFT are linear in their float inputs, so their gradients are the adjoint maps with
respect to the real inner product: an unnormalised forward transform goes back through
``n · ifft``, an inverse one through ``fft / n``, a one-sided (real-to-complex) output pads the
gradient with zeros first, and an inverse one-sided (complex-to-real) transform counts each
interior frequency bin twice, since it stands for a conjugate pair.

The windows and MelWeightMatrix have sizes from constant inputs and no float input: they are
computed once at compile time (the ops fold) and carry no gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import check_dtypes
from .multi_grad import add_multi_grad_op, pick_grads, wanted_grads
from .registry import AI_GRAPHCORE, register_op
from .shape import const_scalar

_HALF = (DataType.FLOAT16, DataType.BFLOAT16)


def _real_dtype(dtype: DataType) -> torch.dtype:
    """The real dtype the transform runs in (half types widen to float32)."""
    return torch.float32 if dtype in _HALF else dtype.torch


def _as_complex(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., 1] real or [..., 2] (re, im) as a real or complex tensor without the last dim."""
    x = x.to(dtype)
    if x.shape[-1] == 1:
        return x.squeeze(-1)
    return torch.view_as_complex(x.contiguous())


def _from_complex(z: torch.Tensor, complex_out: bool, dtype: torch.dtype) -> torch.Tensor:
    """The ONNX layout of ``z``: (re, im) pairs, or the real part in a last dim of 1."""
    out = torch.view_as_real(z) if complex_out else z.real.unsqueeze(-1)
    return out.to(dtype).contiguous()


def _fit(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``t`` truncated or zero-padded along ``dim`` to ``size`` (what ``dft_length`` does)."""
    current = t.shape[dim]
    if current > size:
        return t.narrow(dim, 0, size)
    if current < size:
        shape = list(t.shape)
        shape[dim] = size - current
        return torch.cat([t, t.new_zeros(shape)], dim)
    return t


def _check_signal(op: Op, x: TensorInfo, what: str) -> None:
    if x.rank < 2 or x.shape[-1] not in (1, 2):
        raise ShapeError(
            f"{op.debug_name}: {what} {x} must end in a dim of 1 (real) or 2 (real, imaginary)."
        )


@register_op("DFT", versions=(17, 20))
class DFT(Op):
    """Discrete Fourier transform along one axis: complex (fft / ifft), real-to-complex
    one-sided (rfft) or complex-to-real one-sided inverse (irfft)."""

    # dft_length sets the output size; from opset 20 the axis is an input too.
    const_inputs = (1, 2)

    @dataclass(frozen=True)
    class Attrs:
        inverse: int = 0
        onesided: int = 0

    @dataclass(frozen=True)
    class Attrs17(Attrs):
        axis: int = 1

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return cls.Attrs17 if version < 20 else cls.Attrs

    def infer(self, x, dft_length=None, axis=None):
        check_dtypes(self, x, dft_length, axis)
        _check_signal(self, x, "input")
        if self.version < 20:
            axis_value = self.attrs.axis
        else:
            value = const_scalar(self, 2, "axis")
            axis_value = -2 if value is None else int(value)
        rank = x.rank
        if not -rank <= axis_value < rank or axis_value % rank == rank - 1:
            raise ShapeError(
                f"{self.debug_name}: axis {axis_value} must be a signal axis of input {x}: in "
                f"[{-rank}, -2] or [0, {rank - 2}] (the last dim holds real / imaginary parts)."
            )
        self._axis = axis_value % rank
        self._inverse, self._onesided = bool(self.attrs.inverse), bool(self.attrs.onesided)
        length = x.shape[self._axis]
        value = const_scalar(self, 1, "dft_length")
        if value is not None:
            n = int(value)
        elif self._inverse and self._onesided:
            n = 2 * (length - 1)  # irfft of a one-sided spectrum of an even-length signal
        else:
            n = length
        if n < 1:
            raise ShapeError(
                f"{self.debug_name}: the transform length is {n} (dft_length {value}, input "
                f"{x}); it must be >= 1."
            )
        self._n = n
        self._complex_out = not (self._inverse and self._onesided)
        self._dtype = _real_dtype(x.dtype)
        shape = list(x.shape)
        shape[self._axis] = n // 2 + 1 if self._onesided and not self._inverse else n
        shape[-1] = 2 if self._complex_out else 1
        return x.with_shape(tuple(shape))

    def kernel(self, x, dft_length=None, axis=None):
        z = _as_complex(x, self._dtype)
        n, dim = self._n, self._axis
        if self._inverse and self._onesided:
            if not z.is_complex():
                z = torch.complex(z, torch.zeros_like(z))
            y = torch.fft.irfft(z, n=n, dim=dim)
        elif self._inverse:
            y = torch.fft.ifft(z, n=n, dim=dim)
        elif self._onesided and not z.is_complex():
            y = torch.fft.rfft(z, n=n, dim=dim)
        else:
            y = torch.fft.fft(z, n=n, dim=dim)
            if self._onesided:
                y = y.narrow(dim, 0, n // 2 + 1)
        return _from_complex(y, self._complex_out, x.dtype)

    def grad(self, g):
        g.set_input_grad(0, g.op(
            "DFTGrad", g.output_grad(0), domain=AI_GRAPHCORE, axis=self._axis, dft_length=self._n,
            inverse=int(self._inverse), onesided=int(self._onesided),
            input_shape=g.input_info(0).shape))

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        out = self.outputs[0].info
        return int(5 * out.nelms * max(math.log2(self._n), 1)), moved


@register_op("DFTGrad", versions=1, domain=AI_GRAPHCORE)
class DFTGrad(Op):
    """dX of DFT from dY: the adjoint transform, fitted back to the input's length and layout."""

    @dataclass(frozen=True)
    class Attrs:
        axis: int
        dft_length: int
        inverse: int
        onesided: int
        input_shape: tuple[int, ...]

    def infer(self, dy):
        at = self.attrs
        self._dtype = _real_dtype(dy.dtype)
        self._rfft_scale = None
        if at.inverse and at.onesided:
            # Bins 1 .. ceil(n/2)-1 stand for a conjugate pair of the full spectrum.
            n = at.dft_length
            scale = torch.full((n // 2 + 1,), 2.0, dtype=self._dtype)
            scale[0] = 1.0
            if n % 2 == 0:
                scale[-1] = 1.0
            shape = [1] * (len(at.input_shape) - 1)
            shape[at.axis] = n // 2 + 1
            self._rfft_scale = scale.reshape(shape)
        return TensorInfo(dy.dtype, tuple(at.input_shape))

    def kernel(self, dy):
        at = self.attrs
        n, dim = at.dft_length, at.axis
        g = _as_complex(dy, self._dtype)
        if self._rfft_scale is not None:
            dz = torch.fft.rfft(g, n=n, dim=dim) * (self._rfft_scale / n)
        elif at.inverse:
            dz = torch.fft.fft(g, n=n, dim=dim) / n
        else:
            dz = torch.fft.ifft(g, n=n, dim=dim) * n
        dz = _fit(dz, dim, at.input_shape[dim])
        return _from_complex(dz, at.input_shape[-1] == 2, dy.dtype)


@register_op("STFT", versions=17)
class STFT(Op):
    """Short-time Fourier transform of [batch, length, 1|2] signals: frames of ``frame_length``
    every ``frame_step`` samples, times the window, each DFT'd -> [batch, frames, bins, 2]."""

    const_inputs = (1, 3)

    @dataclass(frozen=True)
    class Attrs:
        onesided: int = 1

    def infer(self, signal, frame_step, window=None, frame_length=None):
        check_dtypes(self, signal, frame_step, window, frame_length)
        _check_signal(self, signal, "signal")
        if signal.rank != 3:
            raise ShapeError(f"{self.debug_name}: signal {signal} must be [batch, length, 1|2].")
        step = const_scalar(self, 1, "frame_step")
        length_value = const_scalar(self, 3, "frame_length")
        batch, length, parts = signal.shape
        if window is not None:
            if window.rank != 1:
                raise ShapeError(f"{self.debug_name}: window {window} must be 1-D.")
            if length_value is not None and int(length_value) != window.shape[0]:
                raise ShapeError(
                    f"{self.debug_name}: frame_length {int(length_value)} differs from the "
                    f"window length {window.shape[0]}."
                )
        if length_value is not None:
            frame_length = int(length_value)
        elif window is not None:
            frame_length = window.shape[0]
        else:
            frame_length = length
        step = int(step)
        if step < 1 or not 1 <= frame_length <= length:
            raise ShapeError(
                f"{self.debug_name}: frame_step {step} must be >= 1 and frame_length "
                f"{frame_length} in [1, {length}] (signal {signal})."
            )
        if self.attrs.onesided and parts == 2:
            raise ShapeError(
                f"{self.debug_name}: onesided=1 needs a real signal, {signal} is complex (the "
                f"spectrum of a complex signal has no conjugate symmetry). Set onesided=0."
            )
        self._step, self._frame_length = step, frame_length
        self._frames = (length - frame_length) // step + 1
        self._dtype = _real_dtype(signal.dtype)
        # Signal position of each (frame, tap), for the overlap-add of the gradient.
        starts = torch.arange(self._frames) * step
        self._positions = (starts.unsqueeze(1) + torch.arange(frame_length)).reshape(-1)
        bins = frame_length // 2 + 1 if self.attrs.onesided else frame_length
        return signal.with_shape((batch, self._frames, bins, 2))

    def frames(self, signal: torch.Tensor) -> torch.Tensor:
        """[batch, frames, frame_length] (complex for a complex signal)."""
        return _as_complex(signal, self._dtype).unfold(1, self._frame_length, self._step)

    def kernel(self, signal, frame_step, window=None, frame_length=None):
        frames = self.frames(signal)
        if window is not None:
            frames = frames * window.to(self._dtype)
        if self.attrs.onesided:
            spectrum = torch.fft.rfft(frames, dim=-1)
        else:
            spectrum = torch.fft.fft(frames, dim=-1)
        return _from_complex(spectrum, True, signal.dtype)

    def grad(self, g):
        wrt = wanted_grads(g, (0, 2))
        if wrt:
            window = g.input(2) if g.has_input(2) else None
            add_multi_grad_op(g, "STFTGrad", g.output_grad(0), g.input(0), window, wrt=wrt,
                              frame_step=self._step, frame_length=self._frame_length,
                              onesided=self.attrs.onesided)


@register_op("STFTGrad", versions=1, domain=AI_GRAPHCORE)
class STFTGrad(STFT):
    """d signal and d window of STFT (those in ``wrt``: 0, 2) from dY, the signal and window."""

    const_inputs = ()

    @dataclass(frozen=True)
    class Attrs:
        frame_step: int
        frame_length: int
        onesided: int = 1
        wrt: tuple[int, ...] = (0, 2)

    def infer(self, dy, signal, window=None):
        self._step, self._frame_length = self.attrs.frame_step, self.attrs.frame_length
        self._frames = dy.shape[1]
        self._dtype = _real_dtype(signal.dtype)
        starts = torch.arange(self._frames) * self._step
        self._positions = (starts.unsqueeze(1) + torch.arange(self._frame_length)).reshape(-1)
        infos = {0: signal, 2: window}
        return [infos[i] for i in self.attrs.wrt]

    def kernel(self, dy, signal, window=None):
        g = _as_complex(dy, self._dtype)
        # Adjoint of the (one-sided) DFT of each frame; ifft zero-pads the missing bins.
        h = torch.fft.ifft(g, n=self._frame_length, dim=-1) * self._frame_length
        grads = {}
        if 0 in self.attrs.wrt:
            taps = h if window is None else h * window.to(self._dtype)
            batch, length = signal.shape[0], signal.shape[1]
            total = h.new_zeros((batch, length)).index_add_(
                1, self._positions, taps.reshape(batch, -1))
            grads[0] = _from_complex(total, signal.shape[-1] == 2, signal.dtype)
        if 2 in self.attrs.wrt:
            frames = self.frames(signal)
            grads[2] = (h.conj() * frames).real.sum((0, 1)).to(window.dtype)
        return pick_grads(grads, self.attrs.wrt)

    grad = Op.grad


class _Window(Op):
    """w[k] = a0 - a1·cos(2πk/N) + a2·cos(4πk/N), k < size, with N = size (periodic) or
    size - 1 (symmetric). Computed at compile time; no gradient (the input is an integer)."""

    const_inputs = (0,)
    coefficients: ClassVar[tuple[float, float, float]]

    @dataclass(frozen=True)
    class Attrs:
        output_datatype: int = 1
        periodic: int = 1

    def infer(self, size):
        check_dtypes(self, size)
        count = int(const_scalar(self, 0, "size"))
        if count < 0:
            raise ShapeError(f"{self.debug_name}: size {count} must not be negative.")
        dtype = _output_dtype(self, self.attrs.output_datatype)
        period = count if self.attrs.periodic else count - 1
        k = torch.arange(count, dtype=torch.float64)
        a0, a1, a2 = self.coefficients
        # A symmetric window of one sample divides 0 by 0: NaN, as onnxruntime and the ONNX
        # reference give (torch and scipy would return 1 there).
        phase = 2 * math.pi * k / period if period else k * float("nan")
        values = a0 - a1 * torch.cos(phase) + a2 * torch.cos(2 * phase)
        self._value = values.to(dtype.torch)
        return TensorInfo(dtype, (count,))

    def kernel(self, size):
        return self._value.clone()


def _output_dtype(op: Op, code: int) -> DataType:
    """The output_datatype attribute as a DataType, checked against the schema's list."""
    dtype = next((d for d in DataType if d.value == code), None)
    if dtype not in _NUMBERS:
        names = ", ".join(sorted(d.name.lower() for d in _NUMBERS))
        raise ShapeError(
            f"{op.debug_name}: output_datatype={code} is not one of the types "
            f"{op.op_type} produces ({names})."
        )
    return dtype


_FLOATS = frozenset({DataType.FLOAT, DataType.FLOAT16, DataType.DOUBLE, DataType.BFLOAT16})
_NUMBERS = _FLOATS | frozenset({DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64,
                                DataType.UINT8, DataType.UINT16, DataType.UINT32,
                                DataType.UINT64})


@register_op("HannWindow", versions=17)
class HannWindow(_Window):
    """Hann window: 0.5 - 0.5·cos(2πk/N)."""

    coefficients = (0.5, 0.5, 0.0)


@register_op("HammingWindow", versions=17)
class HammingWindow(_Window):
    """Hamming window with ONNX's exact coefficients 25/46 and 21/46 (≈ 0.54, 0.46)."""

    coefficients = (25 / 46, 21 / 46, 0.0)


@register_op("BlackmanWindow", versions=17)
class BlackmanWindow(_Window):
    """Blackman window: 0.42 - 0.5·cos(2πk/N) + 0.08·cos(4πk/N)."""

    coefficients = (0.42, 0.5, 0.08)


@register_op("MelWeightMatrix", versions=17)
class MelWeightMatrix(Op):
    """[dft_length // 2 + 1, num_mel_bins] triangular filters mapping a one-sided spectrum to
    mel bands. Every input is a constant: the matrix is built at compile time (the op folds)
    and carries no gradient.

    The num_mel_bins + 2 band edges are spread evenly on the mel scale
    (mel = 2595·log10(1 + hz/700)) from lower_edge_hertz, one step of (upper - lower) /
    (num_mel_bins + 2) apart, and snapped down to DFT bins (bin = floor((dft_length + 1)·hz /
    sample_rate)), as ONNX defines it. Band i rises from edge i to edge i+1 and falls to edge
    i+2; a band whose rising edge has zero width is 1 at its centre.
    """

    const_inputs = (0, 1, 2, 3, 4)

    @dataclass(frozen=True)
    class Attrs:
        output_datatype: int = 1

    def infer(self, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz):
        check_dtypes(self, num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
                     upper_edge_hertz)
        dtype = _output_dtype(self, self.attrs.output_datatype)
        bands = int(const_scalar(self, 0, "num_mel_bins"))
        length = int(const_scalar(self, 1, "dft_length"))
        rate = float(const_scalar(self, 2, "sample_rate"))
        low = float(const_scalar(self, 3, "lower_edge_hertz"))
        high = float(const_scalar(self, 4, "upper_edge_hertz"))
        if bands < 1 or length < 1 or rate <= 0 or not 0 <= low < high:
            raise ShapeError(
                f"{self.debug_name}: needs num_mel_bins >= 1 (got {bands}), dft_length >= 1 "
                f"({length}), sample_rate > 0 ({rate}) and 0 <= lower_edge_hertz < "
                f"upper_edge_hertz ({low}, {high})."
            )
        spectrum_bins = length // 2 + 1
        low_mel = 2595 * math.log10(1 + low / 700)
        high_mel = 2595 * math.log10(1 + high / 700)
        step = (high_mel - low_mel) / (bands + 2)
        mels = torch.arange(bands + 2, dtype=torch.float64) * step + low_mel
        hertz = 700 * torch.expm1(mels / 2595 * math.log(10))
        edges = torch.floor((length + 1) * hertz / rate).long()
        if int(edges.max()) >= spectrum_bins or int(edges.min()) < 0:
            raise ShapeError(
                f"{self.debug_name}: upper_edge_hertz {high} maps to DFT bin {int(edges.max())},"
                f" beyond the {spectrum_bins} bins of dft_length {length} at sample_rate {rate}."
                f" Keep it at or below sample_rate / 2."
            )
        k = torch.arange(spectrum_bins, dtype=torch.float64).unsqueeze(1)
        left, centre, right = edges[:-2], edges[1:-1], edges[2:]
        rise_width = (centre - left).double()
        fall_width = (right - centre).double()
        rising = torch.where(rise_width > 0, (k - left) / rise_width.clamp(min=1),
                             (k == centre).double())
        rising = torch.where((k >= left) & (k <= centre), rising, 0.0)
        falling = torch.where((k >= centre) & (k < right),
                              (right - k) / fall_width.clamp(min=1), 0.0)
        # On the centre bin both sides meet; the falling side (1 there) is written last.
        values = torch.where(fall_width > 0, torch.where(k >= centre, falling, rising), rising)
        self._value = values.to(dtype.torch)
        return TensorInfo(dtype, (spectrum_bins, bands))

    def kernel(self, *inputs):
        return self._value.clone()
