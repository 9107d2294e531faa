"""Signal ops (issue #7, F78): DFT (opsets 17 and 20), STFT, the Hann / Hamming / Blackman
windows and MelWeightMatrix against onnxruntime, and the gradients of DFT and STFT against
torch.autograd."""

import numpy as np
import pytest
import torch

from popart_backend.errors import ShapeError
from tests.helpers import check_grad, check_op, one_op_model, rand, run_popart

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _i64(v):
    return np.array(v, np.int64)


def torch_dft(x, axis, n, inverse, onesided):
    """The DFT in torch on the ONNX layout (last dim 1: real, 2: real and imaginary)."""
    z = x[..., 0] if x.shape[-1] == 1 else torch.complex(x[..., 0], x[..., 1])
    if inverse and onesided:
        if not z.is_complex():
            z = torch.complex(z, torch.zeros_like(z))
        return torch.fft.irfft(z, n=n, dim=axis).unsqueeze(-1)
    y = torch.fft.ifft(z, n=n, dim=axis) if inverse else torch.fft.fft(z, n=n, dim=axis)
    if onesided:
        y = y.narrow(axis, 0, n // 2 + 1)
    return torch.view_as_real(y)


# (input shape, axis, dft_length, inverse, onesided)
DFT_CASES = [
    ((2, 8, 3, 1), 1, None, 0, 0),
    ((2, 8, 3, 2), 1, None, 0, 0),
    ((2, 8, 3, 2), 2, None, 1, 0),
    ((2, 8, 3, 1), 1, None, 0, 1),
    ((2, 7, 3, 1), 1, None, 0, 1),
    ((2, 5, 3, 2), 1, None, 1, 1),
    ((2, 5, 3, 2), 1, 9, 1, 1),
    ((2, 8, 3, 1), 1, 12, 0, 0),
    ((2, 8, 3, 2), 1, 5, 0, 0),
    ((3, 6, 2), 1, 4, 1, 0),
]


@pytest.mark.parametrize("shape,axis,length,inverse,onesided", DFT_CASES)
@pytest.mark.parametrize("opset", [17, 20])
def test_dft_forward(shape, axis, length, inverse, onesided, opset):
    """Every transform kind, with dft_length padding and truncating, vs onnxruntime."""
    x = rand(*shape, seed=3)
    attrs = {"inverse": inverse, "onesided": onesided}
    length_in = None if length is None else _i64(length)
    if opset == 17:
        attrs["axis"] = axis
        check_op("DFT", [x, length_in], attrs, opset=17, const_inputs=[1], **TOL)
    else:
        axis_in = _i64(axis - len(shape))  # negative axes count from the back
        check_op("DFT", [x, length_in, axis_in], attrs, opset=20, const_inputs=[1, 2], **TOL)


def test_dft20_default_axis_and_double():
    """Opset 20 without the axis input transforms the last signal axis; float64 stays float64."""
    x = rand(2, 3, 6, 2, dtype=np.float64, seed=4)
    check_op("DFT", [x], {}, opset=20)


def test_dft_float16():
    x = rand(2, 8, 1, dtype=np.float16, seed=5)
    ref = torch_dft(torch.from_numpy(x).float(), 1, 8, False, False).half().numpy()
    check_op("DFT", [x], {"axis": 1}, opset=17, ref=lambda x: ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("shape,axis,length,inverse,onesided", DFT_CASES)
def test_dft_grad(shape, axis, length, inverse, onesided):
    x = rand(*shape, seed=6)
    n = length or (2 * (shape[axis] - 1) if inverse and onesided else shape[axis])
    check_grad("DFT", [x, None if length is None else _i64(length)],
               {"axis": axis, "inverse": inverse, "onesided": onesided}, opset=17,
               const_inputs=[1], ref=lambda x, _=None: torch_dft(x, axis, n, inverse, onesided),
               **TOL)


def test_dft_errors():
    with pytest.raises(ShapeError, match="DFT.*axis 3"):
        run_popart(*one_op_model("DFT", [rand(2, 4, 3, 2)], {"axis": 3}, opset=17))
    with pytest.raises(ShapeError, match="DFT.*real, imaginary"):
        run_popart(*one_op_model("DFT", [rand(2, 4, 3)], {"axis": 1}, opset=17))


def torch_stft(signal, step, window, length, onesided):
    z = signal[..., 0] if signal.shape[-1] == 1 else torch.complex(signal[..., 0], signal[..., 1])
    frames = z.unfold(1, length, step)
    if window is not None:
        frames = frames * window
    y = torch.fft.fft(frames, dim=-1)
    if onesided:
        y = y[..., : length // 2 + 1]
    return torch.view_as_real(y)


# (signal shape, frame_step, window length or None, frame_length or None, onesided)
STFT_CASES = [
    ((2, 32, 1), 4, 8, 8, 1),
    ((2, 30, 1), 5, 9, None, 1),
    ((1, 20, 1), 3, None, 6, 1),
    ((2, 24, 2), 4, 8, None, 0),
    ((1, 16, 1), 16, None, None, 0),
]


@pytest.mark.parametrize("shape,step,window,length,onesided", STFT_CASES)
def test_stft_forward(shape, step, window, length, onesided):
    signal = rand(*shape, seed=7)
    inputs = [signal, _i64(step), None if window is None else rand(window, seed=8),
              None if length is None else _i64(length)]
    ref = None
    if window is None and length is None:
        # onnxruntime cannot take the frame length from the signal; torch is the reference.
        def ref(s, *_):
            return torch_stft(torch.from_numpy(s), step, None, shape[1], onesided).numpy()
    check_op("STFT", inputs, {"onesided": onesided}, opset=17, const_inputs=[1, 3], ref=ref,
             **TOL)


@pytest.mark.parametrize("shape,step,window,length,onesided", STFT_CASES)
def test_stft_grad(shape, step, window, length, onesided):
    """Gradients of the signal and (when given) the window."""
    signal = rand(*shape, seed=9)
    w = None if window is None else rand(window, seed=10)
    frame = length or window or shape[1]
    inputs = [signal, _i64(step), w, None if length is None else _i64(length)]
    check_grad("STFT", inputs, {"onesided": onesided}, opset=17, const_inputs=[1, 3],
               ref=lambda s, _, w=None, __=None: torch_stft(s, step, w, frame, onesided), **TOL)


def test_stft_errors():
    with pytest.raises(ShapeError, match="STFT.*onesided=1 needs a real signal"):
        run_popart(*one_op_model("STFT", [rand(1, 16, 2), _i64(4), rand(8)], opset=17,
                                 const_inputs=[1]))
    with pytest.raises(ShapeError, match="STFT.*differs from the window length"):
        run_popart(*one_op_model("STFT", [rand(1, 16, 1), _i64(4), rand(8), _i64(6)],
                                 opset=17, const_inputs=[1, 3]))


@pytest.mark.parametrize("op,torch_fn", [("HannWindow", torch.hann_window),
                                         ("HammingWindow", None),
                                         ("BlackmanWindow", torch.blackman_window)])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("size", [1, 2, 10])
def test_windows(op, torch_fn, periodic, size):
    """vs onnxruntime (NaN for one symmetric sample, as ONNX's formula divides 0 by 0) and,
    where the formula agrees, torch's window functions."""
    out = check_op(op, [_i64(size)], {"periodic": periodic}, opset=17, const_inputs=[0])[0]
    if torch_fn is not None and size > 1:  # torch special-cases one sample as [1]
        expected = torch_fn(size, periodic=bool(periodic), dtype=torch.float64).float().numpy()
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("datatype,dtype", [(11, np.float64), (10, np.float16), (6, np.int32),
                                            (2, np.uint8)])
def test_window_output_datatype(datatype, dtype):
    out = check_op("HammingWindow", [np.array(9, np.int32)], {"output_datatype": datatype},
                   opset=17, const_inputs=[0], rtol=1e-3, atol=1e-6)[0]
    assert out.dtype == dtype


def test_window_size_must_be_constant():
    with pytest.raises(ShapeError, match="HannWindow.*must be a constant"):
        run_popart(*one_op_model("HannWindow", [_i64(8)], opset=17))


@pytest.mark.parametrize("bins,length,rate,low,high", [(8, 64, 16000, 0.0, 8000.0),
                                                        (10, 256, 22050, 100.0, 4000.0),
                                                        (4, 31, 8000, 20.0, 3000.0)])
@pytest.mark.parametrize("datatype", [1, 11])
def test_melweightmatrix(bins, length, rate, low, high, datatype):
    inputs = [_i64(bins), _i64(length), _i64(rate), np.array(low, np.float32),
              np.array(high, np.float32)]
    check_op("MelWeightMatrix", inputs, {"output_datatype": datatype}, opset=17,
             const_inputs=[0, 1, 2, 3, 4])


def test_melweightmatrix_rejects_band_beyond_nyquist():
    inputs = [_i64(4), _i64(16), _i64(8000), np.array(0, np.float32),
              np.array(8000, np.float32)]
    with pytest.raises(ShapeError, match="MelWeightMatrix.*sample_rate / 2"):
        run_popart(*one_op_model("MelWeightMatrix", inputs, opset=17,
                                 const_inputs=[0, 1, 2, 3, 4]))
