"""Pooling ops (spec §6.1, F78) against onnxruntime, at every registered version."""

import numpy as np
import onnx.defs
import pytest
import torch

from popart_backend.errors import ShapeError
from popart_backend.ops.registry import registered_versions
from tests.helpers import check_op, one_op_model, rand, run_onnxruntime, run_popart

# (x shape, attrs, first version supporting the attrs)
MAX_CASES = [
    ((1, 2, 6, 6), {"kernel_shape": [2, 2]}, 1),
    ((2, 3, 7, 5), {"kernel_shape": [3, 2], "strides": [2, 1]}, 1),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, 1),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "pads": [0, 1, 2, 0]}, 1),  # asymmetric
    ((1, 2, 7, 8), {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 3]}, 1),
    ((1, 2, 7, 8), {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2]}, 1),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 2]}, 1),
    ((1, 2, 6, 6), {"kernel_shape": [2, 2], "storage_order": 1}, 8),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, 10),
    ((1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 3], "ceil_mode": 1, "pads": [1, 1, 1, 1]}, 10),
    ((1, 2, 8, 9), {"kernel_shape": [2, 2], "strides": [3, 2], "ceil_mode": 1, "pads": [1, 0, 0, 1]}, 10),
    ((1, 2, 9, 9), {"kernel_shape": [2, 3], "dilations": [2, 2]}, 10),
    ((1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 3], "pads": [1, 1, 0, 1], "storage_order": 1}, 10),
    ((2, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 2]}, 1),  # 1-D
    ((1, 2, 5, 6, 4), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2]}, 1),  # 3-D
    ((1, 2, 5, 6, 4), {"kernel_shape": [2, 2, 2], "pads": [1, 0, 0, 0, 1, 1], "storage_order": 1}, 8),
]


def _versioned(op, cases):
    """(version, shape, attrs) for every registered version the case's attributes exist in."""
    return [
        pytest.param(v, shape, attrs, id=f"v{v}-{len(shape) - 2}d-{attrs}")
        for shape, attrs, since in cases
        for v in registered_versions(op)
        if v >= since
    ]


def _distinct(*shape, seed=0):
    """Random values without ties, so the max index is unique."""
    rng = np.random.default_rng(seed)
    return rng.permutation(np.prod(shape)).reshape(shape).astype(np.float32) / 10


@pytest.mark.parametrize("version,shape,attrs", _versioned("MaxPool", MAX_CASES))
def test_max_pool_f78(version, shape, attrs):
    outputs = 1 if version < 8 else 2
    check_op("MaxPool", [_distinct(*shape)], attrs=attrs, opset=version, num_outputs=outputs)


def test_max_pool_y_only_and_indices_only():
    x = _distinct(1, 2, 7, 8)
    attrs = {"kernel_shape": [3, 3], "pads": [0, 1, 2, 0]}
    check_op("MaxPool", [x], attrs=attrs, opset=12, num_outputs=1)
    model, feeds = one_op_model("MaxPool", [x], attrs, opset=12, num_outputs=2,
                                output_names=["", "idx"])
    del model.graph.output[0]  # the absent Y is no graph output
    ours = run_popart(model, feeds, outputs=["idx"])["idx"]
    model_ref, _ = one_op_model("MaxPool", [x], attrs, opset=12, num_outputs=2)
    np.testing.assert_array_equal(ours, run_onnxruntime(model_ref, feeds)["out1"])


@pytest.mark.parametrize("dtype", [np.float16, np.int8, np.uint8])
def test_max_pool_dtypes(dtype):
    x = rand(1, 2, 6, 7, dtype=dtype, low=0 if dtype == np.uint8 else -100, high=100)
    if dtype == np.float16:
        x = _distinct(1, 2, 6, 7).astype(np.float16)
    check_op("MaxPool", [x], attrs={"kernel_shape": [2, 3], "pads": [1, 0, 0, 1]}, opset=12,
             ref=lambda x: torch.nn.functional.max_pool2d(
                 torch.nn.functional.pad(torch.from_numpy(x).float(), (0, 1, 1, 0), value=-1e9),
                 (2, 3), 1).to(torch.from_numpy(x).dtype).numpy())


AVG_CASES = [
    ((1, 2, 6, 6), {"kernel_shape": [2, 2]}, 1),
    ((2, 3, 7, 5), {"kernel_shape": [3, 2], "strides": [2, 1]}, 1),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, 1),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, 7),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "pads": [0, 1, 2, 0]}, 1),  # asymmetric
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "pads": [0, 1, 2, 0], "count_include_pad": 1}, 7),
    ((1, 2, 7, 8), {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 3]}, 1),
    ((1, 2, 7, 8), {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2],
                    "count_include_pad": 1}, 7),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 2]}, 1),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, 10),
    ((1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 3], "ceil_mode": 1, "pads": [1, 1, 1, 1],
                    "count_include_pad": 1}, 10),
    ((1, 2, 8, 9), {"kernel_shape": [2, 2], "strides": [3, 2], "ceil_mode": 1, "pads": [1, 0, 0, 1]}, 10),
    ((1, 2, 8, 9), {"kernel_shape": [3, 2], "strides": [3, 2], "ceil_mode": 1, "pads": [1, 0, 0, 1],
                    "count_include_pad": 1}, 10),
    ((1, 2, 9, 9), {"kernel_shape": [2, 3], "dilations": [2, 2]}, 19),
    ((1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 3], "pads": [1, 1, 0, 1],
                    "count_include_pad": 1}, 19),
    ((2, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 2]}, 1),  # 1-D
    ((1, 2, 5, 6, 4), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 1, 1, 1, 1, 1],
                       "count_include_pad": 1}, 7),  # 3-D
]


@pytest.mark.parametrize("version,shape,attrs", _versioned("AveragePool", AVG_CASES))
def test_average_pool_f78(version, shape, attrs):
    if version == 1:
        # onnxruntime has no AveragePool-1; it equals version 7 without count_include_pad.
        model, feeds = one_op_model("AveragePool", [rand(*shape)], attrs, opset=7)
        ref = lambda x: run_onnxruntime(model, feeds)["out0"]  # noqa: E731
        check_op("AveragePool", [feeds["in0"]], attrs=attrs, opset=1, ref=ref)
        return
    check_op("AveragePool", [rand(*shape)], attrs=attrs, opset=version)


def test_average_pool_f16():
    check_op("AveragePool", [rand(1, 2, 6, 7, dtype=np.float16)],
             attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=19)


LP_CASES = [
    ((1, 2, 6, 6), {"kernel_shape": [2, 2]}, 2),
    ((1, 2, 7, 6), {"kernel_shape": [3, 2], "p": 3, "strides": [2, 1]}, 2),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "pads": [0, 1, 2, 0], "p": 1}, 2),
    ((1, 2, 7, 8), {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 3]}, 2),
    ((2, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, 2),
    ((1, 2, 9, 9), {"kernel_shape": [2, 3], "dilations": [2, 2]}, 18),
    ((1, 2, 8, 9), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}, 18),
]


@pytest.mark.parametrize("version,shape,attrs", _versioned("LpPool", LP_CASES))
def test_lp_pool_f78(version, shape, attrs):
    x = rand(*shape)
    if version == 1:
        # onnxruntime lacks LpPool-1 (float p); compare with our LpPool-2.
        model, feeds = one_op_model("LpPool", [x], attrs, opset=2)
        expected = run_popart(model, feeds)["out0"]
        attrs = dict(attrs, p=float(attrs.get("p", 2)))
        check_op("LpPool", [x], attrs=attrs, opset=1, ref=lambda x: expected)
        return
    check_op("LpPool", [x], attrs=attrs, opset=version, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 2)])
def test_global_pools_f78(op, shape):
    check_op(op, [rand(*shape)], opset=1)


@pytest.mark.parametrize("version", registered_versions("GlobalLpPool"))
@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool_f78(version, p):
    x = rand(2, 3, 4, 5)
    ref = lambda x: (np.abs(x.astype(np.float64)) ** p).sum((2, 3), keepdims=True) ** (1 / p)  # noqa: E731
    if version == 1:
        check_op("GlobalLpPool", [x], {"p": float(p)}, opset=1,
                 ref=lambda x: ref(x).astype(np.float32))
        return
    if version == 22:  # onnxruntime has no GlobalLpPool-22 kernel; 22 only adds bfloat16
        check_op("GlobalLpPool", [x], {"p": p}, opset=22, ref=lambda x: ref(x).astype(np.float32))
        return
    check_op("GlobalLpPool", [x], {"p": p}, opset=version, rtol=1e-5, atol=1e-6)


def test_pool_errors():
    model, feeds = one_op_model("MaxPool", [rand(1, 2, 4, 4)], {"kernel_shape": [2]}, opset=12)
    with pytest.raises(ShapeError, match="MaxPool .*kernel_shape"):
        run_popart(model, feeds)
    model, feeds = one_op_model("AveragePool", [rand(1, 2, 3, 3)], {"kernel_shape": [5, 5]}, opset=11)
    with pytest.raises(ShapeError, match="AveragePool .*exceeds"):
        run_popart(model, feeds)
    model, feeds = one_op_model("MaxPool", [rand(1, 2, 4, 4)], {"kernel_shape": [2, 2],
                                "auto_pad": "SAME"}, opset=12)
    with pytest.raises(ShapeError, match="auto_pad='SAME'"):
        run_popart(model, feeds)


def _brute_pool(x, kind, kernel, strides, dilations, pads_begin, out_sizes, p=2):
    """Direct loops over every window tap; taps outside X are skipped (pads excluded)."""
    n, c = x.shape[:2]
    y = np.zeros((n, c) + tuple(out_sizes))
    for o in np.ndindex(*out_sizes):
        taps = []
        for t in np.ndindex(*kernel):
            pos = [oi * s + ti * d - b for oi, s, ti, d, b in zip(o, strides, t, dilations, pads_begin)]
            if all(0 <= q < size for q, size in zip(pos, x.shape[2:])):
                taps.append(x[(slice(None), slice(None)) + tuple(pos)].astype(np.float64))
        stack = np.stack(taps)
        if kind == "MaxPool":
            y[(slice(None), slice(None)) + o] = stack.max(0)
        elif kind == "AveragePool":
            y[(slice(None), slice(None)) + o] = stack.mean(0)
        else:
            y[(slice(None), slice(None)) + o] = (np.abs(stack) ** p).sum(0) ** (1 / p)
    return y.astype(x.dtype)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
@pytest.mark.parametrize("auto_pad,pads_begin", [("SAME_UPPER", (1, 2)), ("SAME_LOWER", (1, 2))])
def test_pool_auto_pad_with_dilation(op, auto_pad, pads_begin):
    """SAME_* with dilations: output = ceil(in / stride), pads cover the dilated window (ONNX
    spec). onnxruntime ignores the dilation when padding, so a direct loop is the reference.
    In 9 x 9 with window 2x3, dilation 2, strides (2, 1), the totals (2, 4) are even, so both
    modes split them alike."""
    x = _distinct(1, 2, 9, 9)
    attrs = {"kernel_shape": [2, 3], "dilations": [2, 2], "auto_pad": auto_pad, "strides": [2, 1]}
    check_op(op, [x], attrs, opset=19 if op != "MaxPool" else 12,
             ref=lambda x: _brute_pool(x, op, (2, 3), (2, 1), (2, 2), pads_begin, (5, 9)),
             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", [
    "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool",
])
def test_every_onnx_version_up_to_28_is_registered_f82(op):
    expected = sorted({
        s.since_version
        for s in onnx.defs.get_all_schemas_with_history()
        if s.name == op and s.domain == "" and s.since_version <= 28
    })
    assert registered_versions(op) == expected
