"""Normalization ops (spec §6.1, F78) against onnxruntime or torch, at every registered version."""

import numpy as np
import onnx.defs
import pytest
import torch
import torch.nn.functional as F

from popart_backend.errors import ShapeError
from popart_backend.ops.registry import registered_versions
from tests.helpers import assert_close, check_op, one_op_model, rand, run_popart


def _bn_inputs(x_shape, param_shape, dtype=np.float32):
    return [rand(*x_shape, dtype=dtype), rand(*param_shape, dtype=dtype), rand(*param_shape, dtype=dtype),
            rand(*param_shape, dtype=dtype), rand(*param_shape, dtype=dtype, low=0.5, high=2.0)]


def _bn_ref(eps=1e-5):
    def ref(x, scale, b, mean, var):
        t = [torch.from_numpy(v).double() for v in (x, scale, b, mean, var)]
        shape = (1, -1) + (1,) * (x.ndim - 2)
        y = (t[0] - t[3].view(shape)) / torch.sqrt(t[4].view(shape) + eps) * t[1].view(shape) + t[2].view(shape)
        return y.numpy().astype(x.dtype)

    return ref


@pytest.mark.parametrize("version", registered_versions("BatchNormalization"))
@pytest.mark.parametrize("x_shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5), (1, 3, 2, 3, 4)])
def test_batch_norm_f78(version, x_shape):
    attrs = {"epsilon": 1e-3}
    if version == 1:
        attrs["consumed_inputs"] = [0, 0, 0, 1, 1]
    ref = _bn_ref(1e-3) if version < 7 else None  # onnxruntime starts at version 7
    check_op("BatchNormalization", _bn_inputs(x_shape, (3,)), attrs, opset=version, ref=ref,
             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("version", [v for v in registered_versions("BatchNormalization") if v < 9])
def test_batch_norm_non_spatial(version):
    """spatial=0: one statistic per activation (C x D1 x ...), broadcast over N."""
    inputs = _bn_inputs((2, 3, 4), (3, 4))
    attrs = {"spatial": 0}
    if version == 1:
        attrs["consumed_inputs"] = [0, 0, 0, 1, 1]

    def ref(x, scale, b, mean, var):
        return ((x - mean) / np.sqrt(var + 1e-5) * scale + b).astype(np.float32)

    check_op("BatchNormalization", inputs, attrs, opset=version, ref=ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("version", [14, 15])
def test_batch_norm_running_stats_outputs_unchanged(version):
    """An inference graph returns the running mean/var unchanged, even with training_mode=1
    (the session decides training semantics, DESIGN decision 5)."""
    inputs = _bn_inputs((2, 3, 4, 4), (3,))
    outs = check_op("BatchNormalization", inputs, {"training_mode": 1}, opset=version, num_outputs=3,
                    ref=lambda *xs: [_bn_ref()(*xs), xs[3], xs[4]], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(outs[1], inputs[3])


def test_batch_norm_saved_stats_in_inference():
    """PopART's num_outputs=5: in inference Y still uses the running statistics; saved_mean and
    saved_var are the batch's mean and biased variance."""
    inputs = _bn_inputs((2, 3, 4), (3,))
    model, feeds = one_op_model("BatchNormalization", inputs, opset=9, num_outputs=5)
    outs = run_popart(model, feeds)
    x = inputs[0]
    assert_close(outs["out0"], _bn_ref()(*inputs), rtol=1e-5, atol=1e-5)
    assert_close(outs["out3"], x.mean(axis=(0, 2)), rtol=1e-5, atol=1e-6)
    assert_close(outs["out4"], x.var(axis=(0, 2)), rtol=1e-5, atol=1e-6)


def test_batch_norm_mixed_dtypes_v15():
    x = rand(2, 3, 4, dtype=np.float16)
    params = [rand(3), rand(3), rand(3), rand(3, low=0.5, high=2.0)]
    check_op("BatchNormalization", [x] + params, opset=15, ref=_bn_ref(), rtol=2e-3, atol=2e-3)


def test_batch_norm_f16():
    check_op("BatchNormalization", _bn_inputs((2, 3, 4, 4), (3,), np.float16), opset=15,
             rtol=2e-3, atol=2e-3)


def test_batch_norm_param_shape_error():
    model, feeds = one_op_model("BatchNormalization", _bn_inputs((2, 3, 4), (4,)), opset=15)
    with pytest.raises(ShapeError, match=r"BatchNormalization .*scale f32\[4\]"):
        run_popart(model, feeds)


LN_CASES = [
    ((2, 3, 8), -1, (8,), True),
    ((2, 3, 8), 1, (3, 8), True),
    ((2, 3, 4, 5), 2, (4, 5), False),
    ((2, 3, 4, 5), -2, (1, 5), True),  # Scale broadcasts to the normalized shape
    ((4, 6), 0, (4, 6), True),
]


@pytest.mark.parametrize("x_shape,axis,scale_shape,bias", LN_CASES, ids=str)
@pytest.mark.parametrize("num_outputs", [1, 3])
def test_layer_norm_f78(x_shape, axis, scale_shape, bias, num_outputs):
    inputs = [rand(*x_shape), rand(*scale_shape)] + ([rand(*scale_shape)] if bias else [])
    check_op("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, opset=17,
             num_outputs=num_outputs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_outputs", [1, 3])
def test_layer_norm_f16(num_outputs):
    inputs = [rand(2, 3, 8, dtype=np.float16), rand(8, dtype=np.float16), rand(8, dtype=np.float16)]
    check_op("LayerNormalization", inputs, opset=17, num_outputs=num_outputs, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("version", registered_versions("InstanceNormalization"))
@pytest.mark.parametrize("x_shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 2)])
def test_instance_norm_f78(version, x_shape):
    c = x_shape[1]
    inputs = [rand(*x_shape), rand(c), rand(c)]
    attrs = {"epsilon": 1e-3}
    ref = None
    if version == 1:
        attrs["consumed_inputs"] = [0, 0, 0]
        ref = lambda x, s, b: F.instance_norm(  # noqa: E731
            *(torch.from_numpy(v).double() for v in (x,)), weight=torch.from_numpy(s).double(),
            bias=torch.from_numpy(b).double(), eps=1e-3).numpy().astype(np.float32)
    check_op("InstanceNormalization", inputs, attrs, opset=version, ref=ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x_shape,groups", [((2, 4, 5), 2), ((2, 6, 3, 3), 3), ((1, 4, 2, 3, 2), 4),
                                            ((2, 4, 3), 1)])
def test_group_norm_v18_scale_per_group(x_shape, groups):
    inputs = [rand(*x_shape), rand(groups), rand(groups)]
    check_op("GroupNormalization", inputs, {"num_groups": groups, "epsilon": 1e-3}, opset=18,
             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x_shape,groups", [((2, 4, 5), 2), ((2, 6, 3, 3), 3), ((2, 4, 3), 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_group_norm_v21_scale_per_channel(x_shape, groups, dtype):
    """Version 21 scales per channel and normalizes in the stash type (float32); onnxruntime
    does not have it, torch's group_norm is the reference."""
    c = x_shape[1]
    inputs = [rand(*x_shape, dtype=dtype), rand(c, dtype=dtype), rand(c, dtype=dtype)]

    def ref(x, s, b):
        normed = F.group_norm(torch.from_numpy(x).double(), groups, eps=1e-3).to(torch.from_numpy(x).dtype)
        shape = (1, c) + (1,) * (x.ndim - 2)
        return (normed * torch.from_numpy(s).view(shape) + torch.from_numpy(b).view(shape)).numpy()

    tol = 1e-5 if dtype == np.float32 else 3e-3
    check_op("GroupNormalization", inputs, {"num_groups": groups, "epsilon": 1e-3}, opset=21,
             ref=ref, rtol=tol, atol=tol)


def test_group_norm_errors():
    model, feeds = one_op_model("GroupNormalization", [rand(2, 6, 3), rand(6), rand(6)],
                                {"num_groups": 4}, opset=21)
    with pytest.raises(ShapeError, match="GroupNormalization .*num_groups=4"):
        run_popart(model, feeds)
    model, feeds = one_op_model("GroupNormalization", [rand(2, 6, 3), rand(6), rand(6)],
                                {"num_groups": 3}, opset=18)
    with pytest.raises(ShapeError, match=r"GroupNormalization .*scale f32\[6\] must have shape \[3\]"):
        run_popart(model, feeds)


def _lrn_ref(size, alpha=1e-4, beta=0.75, bias=1.0):
    """The ONNX formula, channel window [c - floor((size-1)/2), c + ceil((size-1)/2)]."""

    def ref(x):
        x64 = x.astype(np.float64)
        sq = np.zeros_like(x64)
        channels = x.shape[1]
        for c in range(channels):
            lo, hi = max(0, c - (size - 1) // 2), min(channels - 1, c + -(-(size - 1) // 2))
            sq[:, c] = (x64[:, lo:hi + 1] ** 2).sum(1)
        return (x64 / (bias + alpha / size * sq) ** beta).astype(x.dtype)

    return ref


@pytest.mark.parametrize("version", registered_versions("LRN"))
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_lrn_f78(version, size):
    attrs = {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 1.5}
    # onnxruntime supports only odd sizes; even sizes follow the ONNX formula.
    ref = None if size % 2 else _lrn_ref(**attrs)
    check_op("LRN", [rand(2, 6, 3, 3)], attrs, opset=version, ref=ref, rtol=1e-5, atol=1e-6)


def test_lrn_3d_spatial():
    check_op("LRN", [rand(1, 5, 2, 3, 2)], {"size": 3}, opset=13, ref=_lrn_ref(3))


@pytest.mark.parametrize("version", registered_versions("MeanVarianceNormalization"))
@pytest.mark.parametrize("axes", [None, (0, 2, 3), (2, 3), (1,), (-1, 0)])
def test_mean_variance_norm_f78(version, axes):
    attrs = {} if axes is None else {"axes": list(axes)}
    check_op("MeanVarianceNormalization", [rand(2, 3, 4, 5)], attrs, opset=version,
             rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", [
    "BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization",
    "LRN", "MeanVarianceNormalization",
])
def test_every_onnx_version_up_to_28_is_registered_f82(op):
    expected = sorted({
        s.since_version
        for s in onnx.defs.get_all_schemas_with_history()
        if s.name == op and s.domain == "" and s.since_version <= 28
    })
    assert registered_versions(op) == expected
