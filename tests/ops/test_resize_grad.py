"""Gradients of Resize and Upsample (ops/resize.py; issue #3 item 2) through ResizeGrad.

Where ONNX's resize equals torch.nn.functional.interpolate (linear half_pixel/align_corners,
cubic a=-0.75, nearest asymmetric floor) the reference is torch.autograd of interpolate, at up
and down scales. The other modes (nearest rounding modes, cubic with another coefficient or
exclude_outside, antialias, tf_crop_and_resize extrapolation, Upsample) are checked with central
differences of the op's own kernel on float64 inputs, which it resamples in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch.nn.functional as F

from tests.helpers import check_grad, rand

EMPTY = np.zeros(0, np.float32)


def f32(*values):
    return np.array(values, np.float32)


def image(*shape, dtype=np.float32):
    return rand(*shape, seed=5).astype(dtype)


@pytest.mark.parametrize("scales", [(2.0, 1.5), (0.5, 0.5), (1.5, 0.75)],
                         ids=["up", "down", "mixed"])
@pytest.mark.parametrize("mode, transform, nearest", [
    ("linear", "half_pixel", None),
    ("linear", "align_corners", None),
    ("cubic", "half_pixel", None),
    ("nearest", "asymmetric", "floor"),
])
def test_resize_against_interpolate(scales, mode, transform, nearest):
    x = image(1, 2, 4, 6)
    size = [int(np.floor(s * n)) for s, n in zip(scales, x.shape[2:])]
    attrs = {"mode": mode, "coordinate_transformation_mode": transform}
    if nearest:
        attrs["nearest_mode"] = nearest
    torch_mode = {"linear": "bilinear", "cubic": "bicubic", "nearest": "nearest"}[mode]
    kwargs = {} if mode == "nearest" else {"align_corners": transform == "align_corners"}
    check_grad("Resize", [x, None, None, np.array([1, 2, *size], np.int64)], attrs, opset=13,
               const_inputs=[3], ref=lambda a, *_: F.interpolate(a, size=size, mode=torch_mode,
                                                                 **kwargs))


@pytest.mark.parametrize("attrs, scales, opset", [
    ({"mode": "nearest"}, (1, 1, 2.0, 0.5), 13),
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil",
      "coordinate_transformation_mode": "align_corners"}, (1, 1, 0.6, 1.7), 13),
    ({"mode": "nearest", "nearest_mode": "ceil",
      "coordinate_transformation_mode": "tf_half_pixel_for_nn"}, (1, 1, 1.5, 0.5), 11),
    ({"mode": "cubic", "cubic_coeff_a": -0.5, "coordinate_transformation_mode": "asymmetric"},
     (1, 1, 1.5, 0.5), 13),
    ({"mode": "cubic", "exclude_outside": 1}, (1, 1, 2.0, 0.6), 13),
    ({"mode": "linear", "antialias": 1}, (1, 1, 0.5, 0.4), 18),
    ({"mode": "cubic", "antialias": 1, "coordinate_transformation_mode": "pytorch_half_pixel"},
     (1, 1, 0.6, 1.0), 18),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"},
     (1, 1, 1.7, 0.6), 19),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
     (1, 2, 1.0, 0.25), 13),  # channels resized too; an axis of output size 1
])
def test_resize_modes(attrs, scales, opset):
    check_grad("Resize", [image(1, 2, 5, 4, dtype=np.float64), None, f32(*scales)], attrs,
               opset=opset, const_inputs=[2])


def test_resize_crop_and_resize_extrapolates_with_zero_gradient():
    roi = f32(0, 0, 0.1, -0.2, 1, 1, 0.8, 1.3)  # partly outside: extrapolated pixels
    attrs = {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
             "extrapolation_value": 3.0}
    check_grad("Resize", [image(1, 1, 4, 5, dtype=np.float64), roi, None,
                          np.array([1, 1, 6, 7], np.int64)], attrs, opset=13,
               const_inputs=[1, 3])


def test_resize_keep_aspect_ratio_sizes():
    attrs = {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}
    check_grad("Resize", [image(1, 1, 4, 6, dtype=np.float64), None, None,
                          np.array([6, 6], np.int64)], attrs, opset=18, const_inputs=[3])


def test_resize_3d_linear():
    """A 3-D float32 input, against torch's 1-D linear interpolation."""
    x = image(2, 3, 5)
    check_grad("Resize", [x, None, None, np.array([2, 3, 8], np.int64)],
               {"mode": "linear"}, opset=13, const_inputs=[3],
               ref=lambda a, *_: F.interpolate(a, size=[8], mode="linear", align_corners=False))


@pytest.mark.parametrize("opset, mode, scales", [
    (9, "nearest", (1, 1, 2, 3)),
    (9, "linear", (1, 1, 2, 1.5)),
    (7, "linear", (1, 2, 1.5, 1)),
])
def test_upsample(opset, mode, scales):
    x = image(1, 2, 3, 4, dtype=np.float64)
    if opset == 7:
        check_grad("Upsample", [x], {"mode": mode, "scales": list(scales)}, opset=opset)
    else:
        check_grad("Upsample", [x, f32(*scales)], {"mode": mode}, opset=opset, const_inputs=[1])


def test_upsample_nearest_integer_scales_match_interpolate():
    x = image(1, 2, 3, 4)
    check_grad("Upsample", [x, f32(1, 1, 2, 3)], {"mode": "nearest"}, opset=9, const_inputs=[1],
               ref=lambda a, s: F.interpolate(a, scale_factor=(2, 3), mode="nearest"))
