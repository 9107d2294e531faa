"""Image ops (issue #7, F78): GridSample (16, 20, 22), AffineGrid, DeformConv (19, 22) and
ImageDecoder against onnxruntime (Pillow-encoded lossless images for ImageDecoder, which
onnxruntime lacks), and the gradients of GridSample, AffineGrid and DeformConv against
torch.autograd or central differences."""

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx.reference import ReferenceEvaluator

from popart_backend.errors import ShapeError, UnsupportedOpError
from tests.helpers import check_grad, check_op, one_op_model, rand, run_popart

TOL = {"rtol": 1e-4, "atol": 1e-5}
TORCH_MODES = {"bilinear": "bilinear", "linear": "bilinear", "nearest": "nearest",
               "bicubic": "bicubic", "cubic": "bicubic"}


def _i64(v):
    return np.array(v, np.int64)


@pytest.mark.parametrize("opset,mode", [(16, "bilinear"), (16, "nearest"), (16, "bicubic"),
                                        (20, "linear"), (20, "cubic"), (22, "nearest")])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_gridsample_4d(opset, mode, padding, align):
    x, grid = rand(2, 3, 5, 6, seed=1), rand(2, 4, 7, 2, low=-1.3, high=1.3, seed=2)
    check_op("GridSample", [x, grid], {"mode": mode, "padding_mode": padding,
                                       "align_corners": align}, opset=opset, **TOL)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_gridsample_5d(mode, padding):
    x, grid = rand(1, 2, 3, 4, 5, seed=3), rand(1, 2, 3, 4, 3, low=-1.2, high=1.2, seed=4)
    check_op("GridSample", [x, grid], {"mode": mode, "padding_mode": padding}, opset=20, **TOL)


def test_gridsample_errors():
    with pytest.raises(ShapeError, match="GridSample.*mode 'linear'"):
        run_popart(*one_op_model("GridSample", [rand(1, 1, 3, 3), rand(1, 2, 2, 2)],
                                 {"mode": "linear"}, opset=16))
    with pytest.raises(UnsupportedOpError, match="GridSample.*cubic interpolation of 5-D"):
        run_popart(*one_op_model("GridSample", [rand(1, 1, 3, 3, 3), rand(1, 2, 2, 2, 3)],
                                 {"mode": "cubic"}, opset=20))


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_gridsample_grad(mode, padding):
    x, grid = rand(2, 2, 4, 5, seed=5), rand(2, 3, 4, 2, low=-1.2, high=1.2, seed=6)
    ref = lambda x, g: F.grid_sample(x, g, TORCH_MODES[mode], padding,
                                     align_corners=False)
    check_grad("GridSample", [x, grid], {"mode": mode, "padding_mode": padding}, opset=20,
               ref=ref, **TOL)


def test_gridsample_grad_5d():
    x, grid = rand(1, 2, 3, 4, 3, seed=7), rand(1, 2, 2, 3, 3, low=-1.1, high=1.1, seed=8)
    ref = lambda x, g: F.grid_sample(x, g, "bilinear", "border", align_corners=True)
    check_grad("GridSample", [x, grid], {"padding_mode": "border", "align_corners": 1},
               opset=20, ref=ref, **TOL)


@pytest.mark.parametrize("size", [(2, 3, 4, 5), (2, 1, 1, 3), (1, 2, 3, 4, 2)])
@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid(size, align):
    spatial = len(size) - 2
    theta = rand(size[0], spatial, spatial + 1, seed=9)
    ref = None
    if align and 1 in size[2:]:
        # A single aligned pixel: the ONNX reference puts it at -1, onnxruntime at +1.
        def ref(theta, size):
            model, feeds = one_op_model("AffineGrid", [theta, size], {"align_corners": align},
                                        opset=20, const_inputs=[1])
            with np.errstate(divide="ignore"):  # the reference divides 2 by size - 1 = 0
                return ReferenceEvaluator(model).run(None, feeds)[0]
    check_op("AffineGrid", [theta, _i64(size)], {"align_corners": align}, opset=20,
             const_inputs=[1], ref=ref, **TOL)


@pytest.mark.parametrize("size", [(2, 3, 4, 5), (1, 2, 3, 4, 2)])
@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid_grad(size, align):
    spatial = len(size) - 2
    theta = rand(size[0], spatial, spatial + 1, seed=10)
    ref = lambda t, _: F.affine_grid(t, list(size), align_corners=bool(align))
    check_grad("AffineGrid", [theta, _i64(size)], {"align_corners": align}, opset=20,
               const_inputs=[1], ref=ref, **TOL)


def _deform_inputs(n=1, c=4, size=(5, 6), k=(2, 3), oc=4, groups=1, offset_groups=1,
                   strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), seed=11):
    out = tuple((d + pads[i] + pads[i + len(size)] - (kk - 1) * dl - 1) // s + 1
                for i, (d, kk, s, dl) in enumerate(zip(size, k, strides, dilations)))
    taps = int(np.prod(k))
    x = rand(n, c, *size, seed=seed)
    w = rand(oc, c // groups, *k, seed=seed + 1)
    offset = rand(n, offset_groups * taps * len(size), *out, low=-1.5, high=1.5, seed=seed + 2)
    bias = rand(oc, seed=seed + 3)
    mask = rand(n, offset_groups * taps, *out, low=0.0, high=1.0, seed=seed + 4)
    attrs = {"group": groups, "offset_group": offset_groups, "strides": list(strides),
             "pads": list(pads), "dilations": list(dilations), "kernel_shape": list(k)}
    return [x, w, offset, bias, mask], attrs


@pytest.mark.parametrize("opset", [19, 22])
@pytest.mark.parametrize("kwargs", [
    {},
    {"groups": 2, "offset_groups": 2},
    {"strides": (2, 1), "pads": (1, 0, 1, 2), "dilations": (1, 2)},
    {"n": 2, "offset_groups": 4, "oc": 2},
])
def test_deform_conv(opset, kwargs):
    inputs, attrs = _deform_inputs(**kwargs)
    check_op("DeformConv", inputs, attrs, opset=opset, **TOL)
    check_op("DeformConv", inputs[:3], attrs, opset=opset, **TOL)


def test_deform_conv_zero_offsets_is_conv():
    """With zero offsets and no mask DeformConv is Conv (also checks the 3-D case)."""
    x, w = rand(1, 2, 4, 5, 3, seed=12), rand(3, 2, 2, 2, 2, seed=13)
    offset = np.zeros((1, 8 * 3, 3, 4, 2), np.float32)
    check_op("DeformConv", [x, w, offset], {}, opset=19,
             ref=lambda x, w, o: F.conv3d(torch.from_numpy(x), torch.from_numpy(w)).numpy(),
             **TOL)


@pytest.mark.parametrize("kwargs", [{"c": 2, "oc": 2, "size": (4, 4), "k": (2, 2)},
                                    {"c": 2, "oc": 2, "size": (4, 5), "k": (2, 2), "groups": 2,
                                     "offset_groups": 2, "pads": (1, 0, 0, 1)}])
def test_deform_conv_grad(kwargs):
    """dX, dW, d offset, dB and d mask by central differences of the kernel in float64."""
    inputs, attrs = _deform_inputs(**kwargs)
    check_grad("DeformConv", inputs, attrs, opset=19, rtol=1e-3, atol=1e-4)


def test_deform_conv_grad_3d():
    x, w = rand(1, 2, 3, 3, 3, seed=14), rand(2, 2, 2, 1, 2, seed=15)
    offset = rand(1, 4 * 3, 2, 3, 2, low=-0.8, high=0.8, seed=16)
    check_grad("DeformConv", [x, w, offset], {}, opset=22, rtol=1e-3, atol=1e-4)


def _encode(pixels: np.ndarray, fmt: str) -> np.ndarray:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return np.frombuffer(buffer.getvalue(), np.uint8)


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF"])
@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale"])
def test_image_decoder(fmt, pixel_format):
    """Lossless formats decode to the encoded pixels (onnxruntime has no ImageDecoder)."""
    pixels = np.random.default_rng(22).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    encoded = _encode(pixels, fmt)
    if pixel_format == "RGB":
        expected = pixels
    elif pixel_format == "BGR":
        expected = pixels[:, :, ::-1]
    else:
        from PIL import Image

        expected = np.asarray(Image.fromarray(pixels).convert("L"))[:, :, None]
    check_op("ImageDecoder", [encoded], {"pixel_format": pixel_format}, opset=20,
             const_inputs=[0], ref=lambda _: expected)


def test_image_decoder_errors():
    with pytest.raises(ShapeError, match="ImageDecoder.*not an image"):
        run_popart(*one_op_model("ImageDecoder", [np.arange(20, dtype=np.uint8)], opset=20,
                                 const_inputs=[0]))
    with pytest.raises(UnsupportedOpError, match="ImageDecoder.*output shape depends"):
        run_popart(*one_op_model("ImageDecoder", [_encode(np.zeros((2, 2, 3), np.uint8),
                                                          "PNG")], opset=20))
