"""Region and detection ops (issue #7, F78): RoiAlign (10, 16, 22), MaxRoiPool (1, 22) and
NonMaxSuppression (10, 11) against onnxruntime, and the input gradients of RoiAlign and
MaxRoiPool by central differences."""

import numpy as np
import pytest

from popart_backend.errors import UnsupportedOpError
from tests.helpers import check_grad, check_op, one_op_model, rand, run_onnxruntime, run_popart

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _i64(v):
    return np.array(v, np.int64)


def _ort_at(opset: int, latest: int, op_type: str, attrs: dict):
    """None (check_op asks onnxruntime) up to the ``latest`` version onnxruntime implements;
    above it, onnxruntime's result at that version (the later version only adds bfloat16)."""
    if opset <= latest:
        return None

    def ref(*inputs):
        model, feeds = one_op_model(op_type, inputs, attrs, opset=latest)
        return run_onnxruntime(model, feeds)["out0"]

    return ref


def _rois():
    rois = np.array([[0, 0, 4, 4], [1.3, 0.7, 6.2, 5.1], [2.5, 2.5, 3.0, 2.8], [-1, 3, 9, 9]],
                    np.float32)
    return rois, np.array([0, 1, 0, 1], np.int64)


@pytest.mark.parametrize("opset,transform", [(10, None), (16, "half_pixel"),
                                             (16, "output_half_pixel"), (22, "half_pixel")])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ratio", [0, 2])
def test_roialign(opset, transform, mode, ratio):
    x = rand(2, 3, 8, 7, seed=17)
    rois, batch = _rois()
    attrs = {"mode": mode, "output_height": 3, "output_width": 2, "sampling_ratio": ratio,
             "spatial_scale": 0.9}
    if transform:
        attrs["coordinate_transformation_mode"] = transform
    check_op("RoiAlign", [x, rois, batch], attrs, opset=opset, ref=_ort_at(opset, 16, "RoiAlign", attrs),
             **TOL)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("opset", [10, 16])
def test_roialign_grad(mode, opset):
    x = rand(2, 1, 5, 4, seed=18)  # central differences: one kernel call per element and side
    rois, batch = _rois()
    attrs = {"mode": mode, "output_height": 2, "output_width": 3, "spatial_scale": 0.7}
    check_grad("RoiAlign", [x, rois, batch], attrs, opset=opset, wrt=[0], const_inputs=[1],
               rtol=1e-3, atol=1e-4)


def _pool_rois():
    return np.array([[0, 0, 0, 3, 3], [1, 1.4, 0.6, 5.5, 4.5], [0, 2, 2, 2, 2],
                     [1, -2, 4, 10, 12]], np.float32)


@pytest.mark.parametrize("opset", [1, 22])
@pytest.mark.parametrize("pooled,scale", [((2, 2), 1.0), ((3, 2), 0.5), ((1, 4), 1.25)])
def test_maxroipool(opset, pooled, scale):
    x = rand(2, 3, 7, 6, seed=19)
    attrs = {"pooled_shape": list(pooled), "spatial_scale": scale}
    check_op("MaxRoiPool", [x, _pool_rois()], attrs, opset=opset,
             ref=_ort_at(opset, 1, "MaxRoiPool", attrs))


def test_maxroipool_grad():
    x = rand(2, 2, 6, 5, seed=20)
    check_grad("MaxRoiPool", [x, _pool_rois()], {"pooled_shape": [2, 3]}, opset=22, wrt=[0],
               const_inputs=[1], rtol=1e-3, atol=1e-4)


def _nms_inputs(seed=21, batches=2, classes=3, boxes=12):
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 10, (batches, boxes, 2))
    size = rng.uniform(1, 4, (batches, boxes, 2))
    box = np.concatenate([corner, corner + size], -1).astype(np.float32)
    scores = rng.uniform(0, 1, (batches, classes, boxes)).astype(np.float32)
    return box, scores


@pytest.mark.parametrize("opset", [10, 11])
@pytest.mark.parametrize("limit,iou,score", [(3, 0.3, None), (10, 0.0, 0.4), (0, 0.5, None),
                                             (5, 0.6, 0.2)])
@pytest.mark.parametrize("center", [0, 1])
def test_nonmaxsuppression(opset, limit, iou, score, center):
    """All inputs constant: the selection folds at compile time."""
    boxes, scores = _nms_inputs()
    inputs = [boxes, scores, _i64([limit]), np.array([iou], np.float32),
              None if score is None else np.array([score], np.float32)]
    check_op("NonMaxSuppression", inputs, {"center_point_box": center}, opset=opset,
             const_inputs=[0, 1, 2, 3, 4])


def test_nonmaxsuppression_needs_constant_boxes():
    boxes, scores = _nms_inputs()
    with pytest.raises(UnsupportedOpError, match="NonMaxSuppression.*output shape depends"):
        run_popart(*one_op_model("NonMaxSuppression", [boxes, scores, _i64([2])], opset=11,
                                 const_inputs=[1, 2]))
