"""Quantization ops (issue #7, spec F78): QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv against onnxruntime, and against
numpy / ml_dtypes formulas where onnxruntime cannot take the types (float8, int4, int2, float4
through its Python API) or the layout (per-row zero points)."""

import ml_dtypes
import numpy as np
import pytest

from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.dtypes import to_host
from popart_backend.errors import ModelError, ShapeError, popart_exception
from popart_backend.importer.onnx_model import import_model
from popart_backend.transforms.autodiff import Autodiff
from tests.helpers import assert_close, check_op, one_op_model, rand, run_onnxruntime

RNG = np.random.default_rng(7)


def run_host(op_type, inputs, attrs=None, opset=21, const_inputs=(), num_outputs=1):
    """Run a one-op model and return the outputs as host arrays (ml_dtypes for narrow types)."""
    model, feeds = one_op_model(op_type, inputs, attrs, opset, num_outputs,
                                const_inputs=const_inputs)
    graph = import_model(model).main
    plan = ExecutionPlan(graph, keep=list(graph.outputs))
    for name in plan.stream_ids:
        plan.set_value(name, to_torch(np.asarray(feeds[name])))
    plan.execute()
    result = []
    for name in graph.outputs:
        info = graph.tensors[name].info
        value = plan.get_value(name)
        array = to_host(value, info.dtype) if value is not None else np.asarray(
            graph.tensors[name].data)
        assert array.shape == info.shape and array.dtype == info.dtype.numpy
        result.append(array)
    return result


def check_host(op_type, inputs, attrs=None, opset=21):
    """check_op for types the simulator stores as surrogates (uint16): outputs go through
    ``to_host`` before the comparison with onnxruntime."""
    model, feeds = one_op_model(op_type, inputs, attrs, opset)
    (ours,) = run_host(op_type, inputs, attrs, opset)
    assert_close(ours, run_onnxruntime(model, feeds)["out0"], f"{op_type}-opset{opset}")


def ties(scale=0.5):
    """Values whose quotient by ``scale`` is exactly x.5 (round half to even decides), plus
    values far outside the 8-bit ranges (saturation)."""
    halves = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -128.5, 300, -300, 0])
    return (halves * scale).astype(np.float32)


# --- QuantizeLinear ------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23])
@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8])
def test_quantize_per_tensor(opset, zp_dtype):
    x = np.concatenate([ties(), rand(20, low=-40, high=40, seed=1)])
    check_op("QuantizeLinear", [x, np.array(0.5, np.float32), np.array(3, zp_dtype)],
             opset=opset)


def test_quantize_default_zero_point_is_uint8():
    check_op("QuantizeLinear", [ties(), np.array(0.5, np.float32)], opset=13)


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_quantize_per_axis(axis):
    x = rand(3, 4, 5, low=-20, high=20, seed=2)
    n = x.shape[axis]
    scale = np.linspace(0.1, 0.5, n).astype(np.float32)
    zp = np.arange(n).astype(np.int8)
    check_op("QuantizeLinear", [x, scale, zp], {"axis": axis}, opset=13)


@pytest.mark.parametrize("opset", [21, 23])
def test_quantize_blocked(opset):
    """Axis 2 of size 5 in blocks of 2: the last block is short."""
    x = rand(2, 3, 5, low=-20, high=20, seed=3)
    scale = rand(2, 3, 3, low=0.1, high=0.6, seed=4)
    zp = RNG.integers(-5, 5, (2, 3, 3)).astype(np.int8)
    check_op("QuantizeLinear", [x, scale, zp], {"axis": 2, "block_size": 2}, opset=opset)


@pytest.mark.parametrize("zp_dtype", [np.int16, np.uint16])
def test_quantize_16_bit(zp_dtype):
    x = np.concatenate([ties(1e-3) * 300, rand(10, low=-80, high=80, seed=5)])
    check_host("QuantizeLinear", [x, np.array(1e-3, np.float32), np.array(7, zp_dtype)])


def test_quantize_float16_input_and_scale():
    x = ties().astype(np.float16)
    check_op("QuantizeLinear", [x, np.array(0.5, np.float16), np.array(-2, np.int8)], opset=19)


def test_quantize_int32_input():
    """onnxruntime has no int32 QuantizeLinear kernel: numpy formula (x / scale in float32)."""
    x = np.array([-1000, -3, -1, 0, 1, 3, 5, 1000], np.int32)
    expected = np.clip(np.round(x.astype(np.float32) / np.float32(2)) + 1, -128, 127)
    check_op("QuantizeLinear", [x, np.array(2.0, np.float32), np.array(1, np.int8)], opset=10,
             ref=lambda *_: expected.astype(np.int8))


def test_quantize_precision_attribute():
    """precision=float16 divides in float16 although the scale is float32 (opset 23)."""
    x = rand(12, low=-100, high=100, seed=6)
    scale = np.array(0.37, np.float32)
    (y,) = run_host("QuantizeLinear", [x, scale, np.array(0, np.int8)], {"precision": 10},
                    opset=23)
    q = np.round(x.astype(np.float16) / scale.astype(np.float16)).astype(np.float64)
    assert_close(y, np.clip(q, -128, 127).astype(np.int8))


def _float8_reference(x, dtype, largest, saturate):
    if saturate:
        x = np.clip(x, -largest, largest)
    return x.astype(dtype)  # ml_dtypes rounds half to even, overflow without saturation


@pytest.mark.parametrize("dtype,largest", [(ml_dtypes.float8_e4m3fn, 448.0),
                                           (ml_dtypes.float8_e4m3fnuz, 240.0),
                                           (ml_dtypes.float8_e5m2, 57344.0),
                                           (ml_dtypes.float8_e5m2fnuz, 57344.0)])
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_float8(dtype, largest, saturate):
    x = np.concatenate([np.array([0, 1, -1, 447, 449, 464, 470, 480, 6e4, 1e5, -1e5, np.inf,
                                  -np.inf, 2.2e-3, 1e-9], np.float32),
                        rand(40, low=-600, high=600, seed=8)])
    (y,) = run_host("QuantizeLinear", [x, np.array(2.0, np.float32), np.array(0, dtype)],
                    {"saturate": saturate}, opset=19, const_inputs=(2,))
    expected = _float8_reference(x / np.float32(2), dtype, largest, saturate)
    np.testing.assert_array_equal(y.astype(np.float32), expected.astype(np.float32))


@pytest.mark.parametrize("dtype,code,bounds,opset", [
    (ml_dtypes.int4, 22, (-8, 7), 21), (ml_dtypes.uint4, 21, (0, 15), 21),
    (ml_dtypes.int2, 26, (-2, 1), 25), (ml_dtypes.uint2, 25, (0, 3), 25)])
def test_quantize_narrow_ints(dtype, code, bounds, opset):
    """The zero point gives the type; without one, output_dtype does."""
    x = np.concatenate([ties(0.25), rand(10, low=-3, high=3, seed=9)])
    q = np.round(x / np.float32(0.25))
    (y,) = run_host("QuantizeLinear", [x, np.array(0.25, np.float32), np.array(1, dtype)],
                    opset=opset, const_inputs=(2,))
    np.testing.assert_array_equal(y, np.clip(q + 1, *bounds).astype(dtype))
    (y,) = run_host("QuantizeLinear", [x, np.array(0.25, np.float32)], {"output_dtype": code},
                    opset=opset)
    np.testing.assert_array_equal(y, np.clip(q, *bounds).astype(dtype))


def test_quantize_float4_saturates():
    x = np.array([0, 0.25, 0.75, 1.25, 2.5, 3.5, 5, 5.5, 7, 100, -100, -0.3], np.float32)
    (y,) = run_host("QuantizeLinear", [x, np.array(1, np.float32)], {"output_dtype": 23},
                    opset=23)
    np.testing.assert_array_equal(y.astype(np.float32),
                                  np.clip(x, -6, 6).astype(ml_dtypes.float4_e2m1fn)
                                  .astype(np.float32))


def test_quantize_errors():
    x = rand(3, 4, seed=10)
    with pytest.raises(ShapeError, match="QuantizeLinear.*per-axis scale"):
        check_op("QuantizeLinear", [x, rand(3, seed=1), np.zeros(3, np.uint8)], {"axis": 1},
                 opset=13)
    with pytest.raises(ShapeError, match="QuantizeLinear.*scalar scale only"):
        check_op("QuantizeLinear", [x, rand(4, seed=1), np.zeros(4, np.uint8)], opset=10)
    with pytest.raises(ShapeError, match="QuantizeLinear.*block_size=2"):
        check_op("QuantizeLinear", [x, rand(3, 3, seed=1), np.zeros((3, 3), np.uint8)],
                 {"axis": 1, "block_size": 2}, opset=21)
    with pytest.raises(ModelError, match="QuantizeLinear.*output_dtype=3"):
        check_op("QuantizeLinear", [x, np.array(1, np.float32), np.array(0, np.uint8)],
                 {"output_dtype": 3}, opset=21)


# --- DequantizeLinear ----------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_dequantize_per_tensor(opset, dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, (4, 6)).astype(dtype)
    check_op("DequantizeLinear", [x, np.array(0.37, np.float32), np.array(5, dtype)],
             opset=opset)


def test_dequantize_int32_without_zero_point():
    x = RNG.integers(-2**20, 2**20, (10,)).astype(np.int32)
    check_op("DequantizeLinear", [x, np.array(0.01, np.float32)], opset=13)


@pytest.mark.parametrize("dtype", [np.int16, np.uint16])
def test_dequantize_16_bit(dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, (3, 5)).astype(dtype)
    check_host("DequantizeLinear", [x, np.array(0.01, np.float32), np.array(100, dtype)])


def test_dequantize_per_axis_and_blocked():
    x = RNG.integers(-128, 128, (2, 5, 3)).astype(np.int8)
    check_op("DequantizeLinear", [x, rand(5, low=0.1, high=1, seed=11),
                                  RNG.integers(-3, 3, 5).astype(np.int8)], {"axis": 1}, opset=13)
    check_op("DequantizeLinear", [x, rand(2, 2, 3, low=0.1, high=1, seed=12),
                                  RNG.integers(-3, 3, (2, 2, 3)).astype(np.int8)],
             {"axis": 1, "block_size": 3}, opset=21)


def test_dequantize_float16_scale_and_output_dtype():
    x = RNG.integers(0, 256, (4, 4)).astype(np.uint8)
    check_op("DequantizeLinear", [x, np.array(0.25, np.float16), np.array(9, np.uint8)],
             opset=19)
    check_op("DequantizeLinear", [x, np.array(0.25, np.float32), np.array(9, np.uint8)],
             {"output_dtype": 10}, opset=23)


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
                                   ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2,
                                   ml_dtypes.float4_e2m1fn])
def test_dequantize_narrow_types(dtype):
    x = rand(16, low=-3, high=3, seed=13).astype(dtype)
    zp = np.array(1, dtype)
    (y,) = run_host("DequantizeLinear", [x, np.array(0.5, np.float32), zp], opset=25,
                    const_inputs=(0, 2))
    expected = (x.astype(np.float32) - zp.astype(np.float32)) * np.float32(0.5)
    assert_close(y, expected)


# --- DynamicQuantizeLinear -----------------------------------------------------------------------


@pytest.mark.parametrize("low,high", [(-2, 5), (1, 3), (-4, -1), (0, 0)])
def test_dynamic_quantize(low, high):
    x = rand(3, 7, low=low, high=high, seed=14) if high > low else np.zeros((3, 7), np.float32)
    check_op("DynamicQuantizeLinear", [x], opset=11, num_outputs=3)


# --- integer products ----------------------------------------------------------------------------


def _ints(dtype, *shape):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.mark.parametrize("a_dtype,b_dtype", [(np.uint8, np.uint8), (np.uint8, np.int8),
                                             (np.int8, np.int8)])
@pytest.mark.parametrize("a_shape,b_shape", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)),
                                             ((2, 1, 3, 4), (3, 4, 2)), ((4,), (4, 3))])
def test_matmul_integer(a_dtype, b_dtype, a_shape, b_shape):
    a, b = _ints(a_dtype, *a_shape), _ints(b_dtype, *b_shape)
    check_op("MatMulInteger", [a, b, np.array(7, a_dtype), np.array(3, b_dtype)], opset=10)
    check_op("MatMulInteger", [a, b], opset=10)


def test_matmul_integer_per_row_and_column_zero_points():
    a, b = _ints(np.uint8, 3, 4), _ints(np.int8, 4, 5)
    a_zp, b_zp = _ints(np.uint8, 3), _ints(np.int8, 5)
    ref = (a.astype(np.int32) - a_zp[:, None]) @ (b.astype(np.int32) - b_zp[None, :])
    check_op("MatMulInteger", [a, b, a_zp, b_zp], opset=10, ref=lambda *_: ref)


@pytest.mark.parametrize("opset", [10, 21])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("a_shape,b_shape", [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5))])
def test_qlinear_matmul(opset, dtype, a_shape, b_shape):
    a, b = _ints(dtype, *a_shape), _ints(dtype, *b_shape)
    f32 = np.float32
    check_op("QLinearMatMul", [a, np.array(0.02, f32), np.array(3, dtype), b, np.array(0.01, f32),
                               np.array(-1 if dtype == np.int8 else 130, dtype),
                               np.array(0.3, f32), np.array(5, dtype)], opset=opset)


def test_qlinear_matmul_float16_scales():
    a, b = _ints(np.uint8, 3, 4), _ints(np.uint8, 4, 2)
    f16 = np.float16
    check_op("QLinearMatMul", [a, np.array(0.02, f16), np.array(3, np.uint8), b,
                               np.array(0.01, f16), np.array(128, np.uint8), np.array(0.3, f16),
                               np.array(5, np.uint8)], opset=21)


@pytest.mark.parametrize("attrs", [{}, {"pads": [1, 0, 1, 2], "strides": [2, 1]},
                                   {"auto_pad": "SAME_UPPER"}, {"group": 2, "dilations": [2, 1]}])
def test_conv_integer(attrs):
    x = _ints(np.uint8, 2, 4, 6, 5)
    w = _ints(np.uint8, 6, 4 // attrs.get("group", 1), 3, 2)
    check_op("ConvInteger", [x, w, np.array(128, np.uint8), np.array(3, np.uint8)], attrs,
             opset=10)
    check_op("ConvInteger", [x, w], attrs, opset=10)


def test_conv_integer_per_channel_weight_zero_point_1d():
    """onnxruntime takes per-tensor zero points only: the reference runs it per output channel."""
    x, w = _ints(np.uint8, 1, 3, 8), _ints(np.uint8, 4, 3, 3)
    w_zp = _ints(np.uint8, 4)
    x_zp = np.array(10, np.uint8)
    parts = []
    for m in range(4):
        model, feeds = one_op_model("ConvInteger", [x, w[m:m + 1], x_zp, w_zp[m]],
                                    {"pads": [1, 1]}, opset=10)
        parts.append(run_onnxruntime(model, feeds)["out0"])
    check_op("ConvInteger", [x, w, x_zp, w_zp], {"pads": [1, 1]}, opset=10,
             ref=lambda *_: np.concatenate(parts, axis=1))


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_conv(per_channel, dtype):
    x = _ints(dtype, 2, 4, 5, 5)
    w = _ints(np.int8, 6, 2, 3, 3)
    m = w.shape[0]
    w_scale = rand(m, low=0.01, high=0.05, seed=15) if per_channel else np.array(0.02, np.float32)
    w_zp = np.zeros(m if per_channel else (), np.int8)
    bias = RNG.integers(-500, 500, m).astype(np.int32)
    check_op("QLinearConv", [x, np.array(0.05, np.float32), np.array(4, dtype), w, w_scale, w_zp,
                             np.array(0.7, np.float32), np.array(-3 if dtype == np.int8 else 120,
                                                                 dtype), bias],
             {"group": 2, "pads": [1, 1, 1, 1], "strides": [1, 2]}, opset=10)


# --- not differentiable --------------------------------------------------------------------------


def test_dequantize_has_no_gradient():
    """A trainable scale would need DequantizeLinear's gradient: autodiff says there is none."""
    x = _ints(np.int8, 4)
    model, _ = one_op_model("DequantizeLinear", [x, np.array(0.5, np.float32)], opset=13,
                            const_inputs=(1,))
    ir = import_model(model, constant_weights=False)
    seed = {"out0": np.ones(4, np.float32)}
    with pytest.raises(popart_exception, match="DequantizeLinear.*has no gradient"):
        Autodiff(None, output_grads=seed).run(ir)
