"""Resize and Upsample (spec §6.1: Resize 10, 11; Upsample 9; F82 version resolution) at every
registered ONNX since-version, compared with onnxruntime: every mode x coordinate transform x
nearest mode it accepts on 4-D inputs, up- and downsampling, scales and sizes."""

from __future__ import annotations

import numpy as np
import onnx.defs
import pytest
from onnx.reference import ReferenceEvaluator

from popart_backend.errors import ShapeError
from popart_backend.ops.registry import registered_versions
from popart_backend.ops.resize import ResizeBase
from tests.helpers import check_op, one_op_model, rand, run_onnxruntime, run_popart

TRANSFORMS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
              "asymmetric", "tf_crop_and_resize"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
UP = [1.0, 1.0, 2.0, 1.5]
DOWN = [1.0, 1.0, 0.6, 0.5]
ROI = [0.0, 0.0, 0.1, -0.2, 1.0, 1.0, 0.8, 1.3]  # partly outside the input: extrapolation
EMPTY = np.zeros(0, np.float32)


@pytest.fixture(params=["fast", "taps"])
def path(request, monkeypatch):
    """Run both the F.interpolate fast path (where it applies) and the general tap plan."""
    if request.param == "taps":
        monkeypatch.setattr(ResizeBase, "_fast_path", lambda self, x, scales, req: None)
    return request.param


def onnx_reference(model):
    """The ONNX reference implementation, for the few cases where onnxruntime departs from it."""

    def run(*inputs):
        feeds = {f"in{i}": v for i, v in enumerate(inputs) if v is not None}
        wanted = {i.name for i in model.graph.input}
        return ReferenceEvaluator(model).run(None, {k: v for k, v in feeds.items() if k in wanted})

    return run


def ort_reference(model):
    def run(*inputs):
        feeds = {f"in{i}": v for i, v in enumerate(inputs) if v is not None}
        return list(run_onnxruntime(model, feeds).values())

    return run


def resize(x, attrs, opset=19, scales=None, sizes=None, roi=None, reference="onnxruntime",
           **tolerances):
    """``reference``: onnxruntime, onnx (the ONNX reference implementation) or
    positive_axes (onnxruntime on the same model with the ``axes`` attribute normalised)."""
    roi = EMPTY if roi is None else np.array(roi, np.float32)
    inputs = [x, roi, None if scales is None else np.array(scales, np.float32),
              None if sizes is None else np.array(sizes, np.int64)]
    if opset < 13:  # roi and scales are required inputs in Resize-11 (empty when unused)
        inputs[2] = EMPTY if inputs[2] is None else inputs[2]
    ref = None
    if reference == "onnx":
        model = one_op_model("Resize", inputs, attrs, opset, const_inputs=(1, 2, 3))[0]
        ref = onnx_reference(model)
    elif reference == "positive_axes":
        positive = {**attrs, "axes": [a % x.ndim for a in attrs["axes"]]}
        model = one_op_model("Resize", inputs, positive, opset, const_inputs=(1, 2, 3))[0]
        ref = ort_reference(model)
    return check_op("Resize", inputs, attrs, opset=opset, const_inputs=(1, 2, 3), ref=ref,
                    **tolerances)


def test_every_onnx_version_is_registered():
    for name in ["Resize", "Upsample"]:
        onnx_versions = sorted(
            s.since_version for s in onnx.defs.get_all_schemas_with_history()
            if s.name == name and s.domain == "" and s.since_version <= 21
        )
        assert registered_versions(name) == onnx_versions, name


@pytest.mark.parametrize("scales", [UP, DOWN], ids=["up", "down"])
@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_nearest(transform, nearest_mode, scales, path):
    attrs = {"mode": "nearest", "coordinate_transformation_mode": transform,
             "nearest_mode": nearest_mode, "extrapolation_value": -3.0}
    # At an exact float32 tie (source coordinate 2.0 for output row 1 of 5 rows at scale 0.6)
    # onnxruntime's half_pixel_symmetric picks the pixel below; the ONNX reference and we pick 2.
    tie = (transform, nearest_mode, scales) == ("half_pixel_symmetric", "floor", DOWN)
    resize(rand(2, 3, 5, 6), attrs, scales=scales,
           roi=ROI if transform == "tf_crop_and_resize" else None,
           reference="onnx" if tie else "onnxruntime")


@pytest.mark.parametrize("scales", [UP, DOWN], ids=["up", "down"])
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_linear(transform, scales, path):
    attrs = {"mode": "linear", "coordinate_transformation_mode": transform,
             "extrapolation_value": 2.5}
    resize(rand(2, 3, 5, 6), attrs, scales=scales,
           roi=ROI if transform == "tf_crop_and_resize" else None)


@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("scales", [UP, DOWN], ids=["up", "down"])
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_cubic(transform, scales, exclude_outside, path):
    attrs = {"mode": "cubic", "coordinate_transformation_mode": transform,
             "exclude_outside": exclude_outside,
             "cubic_coeff_a": -0.5 if exclude_outside else -0.75}
    resize(rand(2, 3, 5, 6), attrs, scales=scales,
           roi=ROI if transform == "tf_crop_and_resize" else None)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("transform", ["half_pixel", "align_corners", "pytorch_half_pixel",
                                       "asymmetric"])
@pytest.mark.parametrize("sizes", [[2, 3, 9, 4], [2, 3, 1, 13], [2, 3, 3, 3]])
def test_sizes(mode, transform, sizes, path):
    resize(rand(2, 3, 5, 6), {"mode": mode, "coordinate_transformation_mode": transform},
           sizes=sizes)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", [[1, 1, 0.5, 0.4], [1, 1, 0.75, 2.0]])
@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_antialias(mode, scales, exclude_outside):
    attrs = {"mode": mode, "antialias": 1, "exclude_outside": exclude_outside}
    resize(rand(1, 2, 12, 10), attrs, scales=scales, opset=18)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("axes", [[2, 3], [3, 2], [2, -1]])
def test_axes_and_keep_aspect_ratio(policy, mode, axes):
    attrs = {"mode": mode, "axes": axes, "keep_aspect_ratio_policy": policy}
    # onnxruntime (and the ONNX reference) ignore negative axes at run time, though ONNX allows
    # them: compare with the same model written with positive axes.
    reference = "positive_axes" if min(axes) < 0 else "onnxruntime"
    resize(rand(1, 2, 6, 8), attrs, sizes=[9, 7], opset=18, reference=reference)
    resize(rand(1, 2, 6, 8), {**attrs, "keep_aspect_ratio_policy": "stretch"},
           scales=[1.5, 0.75], opset=18, reference=reference)


def test_unchanged_shape_is_a_copy():
    """onnxruntime copies when the output shape equals the input's, whatever the scale."""
    resize(rand(1, 2, 3, 4), {"mode": "linear"}, scales=[1, 1, 1.2, 1.1])


@pytest.mark.parametrize("version", [11, 13, 18, 19])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_every_version(version, mode):
    attrs = {"mode": mode, "coordinate_transformation_mode": "align_corners"}
    resize(rand(1, 2, 4, 5), attrs, opset=version, scales=[1, 1, 1.5, 0.8])
    resize(rand(1, 2, 4, 5), {"mode": mode}, opset=version, sizes=[1, 2, 7, 3])


def test_tf_half_pixel_for_nn_in_resize_11():
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}
    resize(rand(1, 2, 5, 6), attrs, opset=11, scales=[1, 1, 1.7, 0.6])


def test_nearest_resizes_any_rank_and_integer_data():
    resize(rand(3, 5, 4, dtype=np.int32, low=-9, high=9), {"mode": "nearest"},
           scales=[2.0, 0.5, 1.25])
    resize(rand(7, dtype=np.uint8, low=0, high=200), {"mode": "nearest", "nearest_mode": "ceil"},
           sizes=[11])


def test_half_and_double_precision():
    # onnxruntime has no double Resize kernel; the ONNX reference computes its coordinates from
    # the float32 scales in float32, hence float32 tolerances.
    resize(rand(1, 2, 4, 4, dtype=np.float64), {"mode": "cubic"}, scales=[1, 1, 1.5, 1.5],
           reference="onnx", rtol=1e-5, atol=1e-6)
    resize(rand(1, 2, 4, 4, dtype=np.float16), {"mode": "nearest"}, scales=[1, 1, 1.5, 1.5])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.5, 0.7]], ids=["up", "down"])
def test_resize_10(mode, scales, path):
    check_op("Resize", [rand(2, 3, 4, 6), np.array(scales, np.float32)], {"mode": mode},
             opset=10, const_inputs=(1,))


@pytest.mark.parametrize("version", [7, 9])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(version, mode, path):
    scales = [1.0, 1.0, 2.0, 3.0]
    if version == 7:
        check_op("Upsample", [rand(2, 3, 4, 5)], {"mode": mode, "scales": scales}, opset=7)
    else:
        check_op("Upsample", [rand(2, 3, 4, 5), np.array(scales, np.float32)], {"mode": mode},
                 opset=version, const_inputs=(1,))


def _upsample_reference(x, scales, mode):
    """Upsample: asymmetric coordinates x / scale, truncated (nearest) or clamped (linear)."""
    out = x.astype(np.float64)
    for axis, scale in enumerate(scales):
        n_in, n_out = out.shape[axis], int(np.floor(out.shape[axis] * scale))
        coord = np.minimum(np.arange(n_out) / np.float32(scale), n_in - 1)
        low = np.floor(coord).astype(int)
        if mode == "nearest":
            out = np.take(out, low, axis)
            continue
        high = np.minimum(low + 1, n_in - 1)
        shape = [1] * out.ndim
        shape[axis] = n_out
        frac = (coord - low).reshape(shape)
        out = np.take(out, low, axis) * (1 - frac) + np.take(out, high, axis) * frac
    return out.astype(x.dtype)


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_upsample_1(mode):
    """onnxruntime has no Upsample-1 (experimental) kernel: numpy is the reference."""
    x = rand(1, 2, 3, 4)
    check_op("Upsample", [x], {"mode": mode, "height_scale": 2.0, "width_scale": 1.5}, opset=1,
             ref=lambda x: _upsample_reference(x, [1, 1, 2.0, 1.5], mode.replace("bi", "")))


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_10_deprecated(mode):
    """Upsample-10 is the deprecated Upsample-9; onnxruntime rejects it, numpy is the reference."""
    x = rand(1, 2, 3, 4)
    scales = np.array([1, 1, 3.0, 2.5], np.float32)
    check_op("Upsample", [x, scales], {"mode": mode}, opset=10, const_inputs=(1,),
             ref=lambda x, s: _upsample_reference(x, s, mode))


def test_computed_scales_are_a_shape_error():
    scales = np.array([1, 1, 2, 2], np.float32)
    model, feeds = one_op_model("Resize", [rand(1, 1, 2, 2), EMPTY, scales], opset=13,
                                const_inputs=(1,))
    with pytest.raises(ShapeError, match="Resize"):
        run_popart(model, feeds)


def test_scales_and_sizes_together_are_rejected():
    model, feeds = one_op_model(
        "Resize", [rand(1, 1, 2, 2), EMPTY, np.array([1, 1, 2, 2], np.float32),
                   np.array([1, 1, 4, 4], np.int64)], opset=13, const_inputs=(1, 2, 3))
    with pytest.raises(Exception, match="Resize.*exactly one of scales and sizes"):
        run_popart(model, feeds)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("scales", [[1, 1, 0.6, 0.6], [1, 1, 0.8, 1.7]])
def test_align_corners_with_fractional_scaled_length(mode, scales, path):
    """F78: with scales, ONNX's align_corners divides by scale * length - 1 (unrounded), as the
    ONNX reference does; onnxruntime uses the floored output length, so it is not the reference
    here (4 * 0.6 = 2.4: the second output column samples 3 / 1.4, not 3 / 1)."""
    attrs = {"mode": mode, "coordinate_transformation_mode": "align_corners"}
    resize(rand(1, 2, 4, 4), attrs, scales=scales, reference="onnx")
