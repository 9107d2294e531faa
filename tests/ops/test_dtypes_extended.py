"""The ONNX element types beyond PopART's (float8, float4, float6, e8m0, int4/uint4, int2/uint2,
bfloat16) end to end, Cast / CastLike / BitCast conversions between them, and exact uint16 /
uint32 / uint64 arithmetic (spec §3.3 data types, F78-F82 ops).

References: ``ml_dtypes`` conversions (the numpy types ONNX itself uses), onnx's
``to_float8e8m0`` for float8e8m0, numpy unsigned arithmetic and ``ndarray.view`` for BitCast.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.numpy_helper import to_float8e8m0

import popart_backend as popart
from popart_backend.dtypes import DataType
from popart_backend.errors import UnsupportedOpError
from popart_backend.ir.tensor import TensorInfo as IrTensorInfo
from tests.helpers import one_op_model, run_popart

NARROW_FLOATS = [
    DataType.FLOAT8E4M3FN, DataType.FLOAT8E4M3FNUZ, DataType.FLOAT8E5M2,
    DataType.FLOAT8E5M2FNUZ, DataType.FLOAT4E2M1, DataType.FLOAT6E2M3, DataType.FLOAT6E3M2,
]
PACKED_INTS = [DataType.INT4, DataType.UINT4, DataType.INT2, DataType.UINT2]
NEW_TYPES = NARROW_FLOATS + PACKED_INTS + [DataType.FLOAT8E8M0, DataType.BFLOAT16]

_rng = np.random.default_rng(7)


def _run(op_type, inputs, attrs=None, opset=28, **kwargs):
    model, feeds = one_op_model(op_type, inputs, attrs, opset=opset, **kwargs)
    return run_popart(model, feeds)["out0"]


def _floats(count=2000) -> np.ndarray:
    """Random float32 values over many binades plus the special values."""
    values = _rng.standard_normal(count) * np.exp2(_rng.integers(-20, 20, count))
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 480, 57344, 61440, 6.0, 7.0,
                0.25, 0.75, 2.5, 1e-9, -1e9]
    return np.concatenate([values, specials]).astype(np.float32)


def _same(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal dtype and values, NaN matching NaN and the sign of zero compared."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    bad = ~((a == e) | (np.isnan(a) & np.isnan(e))) | ((a == 0) & (np.signbit(a) != np.signbit(e)))
    assert not bad.any(), f"{bad.sum()} differ, e.g. {a[bad][:5]} != {e[bad][:5]}"


# --- the types themselves ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", NEW_TYPES, ids=lambda d: d.name)
def test_type_codes_and_host_dtypes_match_onnx(dtype):
    """The enum value is the TensorProto code; the host dtype is the one onnx maps it to."""
    assert dtype.value == getattr(TensorProto, dtype.name)
    assert dtype.numpy == helper.tensor_dtype_to_np_dtype(dtype.value)
    assert DataType.from_numpy(dtype.numpy) is dtype
    assert DataType.from_string(dtype.numpy.name) is dtype


def test_packed_types_count_bits_in_memory():
    assert IrTensorInfo(DataType.INT4, (3,)).num_bytes == 2
    assert IrTensorInfo(DataType.UINT2, (5,)).num_bytes == 2
    assert IrTensorInfo(DataType.FLOAT6E2M3, (4,)).num_bytes == 3
    assert IrTensorInfo(DataType.FLOAT8E5M2, (4,)).num_bytes == 4
    info = popart.TensorInfo("INT4", [2, 3])
    assert info.nbytes() == 3 and info.data_type_lcase() == "int4"
    assert str(IrTensorInfo(DataType.FLOAT8E4M3FN, (2,))) == "f8e4m3fn[2]"


@pytest.mark.parametrize("dtype", NEW_TYPES, ids=lambda d: d.name)
def test_new_types_pass_through_data_movement(dtype):
    """Initializer and graph input of the type go through Concat/Transpose/Reshape/Pad (opset
    25) and come back as numpy arrays of the ml_dtypes type."""
    host = dtype.numpy
    x = _rng.integers(-1, 2, (2, 3)).astype(np.float32).astype(host)
    w = _rng.integers(0, 2, (2, 3)).astype(np.float32).astype(host)
    nodes = [
        helper.make_node("Concat", ["x", "w"], ["c"], axis=0),
        helper.make_node("Transpose", ["c"], ["t"], perm=[1, 0]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Pad", ["r", "pads"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "move", [helper.make_tensor_value_info("x", dtype.value, [2, 3])],
        [helper.make_tensor_value_info("y", dtype.value, None)],
        initializer=[numpy_helper.from_array(w, "w"),
                     numpy_helper.from_array(np.array([2, 6], np.int64), "shape"),
                     numpy_helper.from_array(np.array([0, 1, 0, 1], np.int64), "pads")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    expected = np.pad(np.concatenate([x, w]).T.reshape(2, 6), ((0, 0), (1, 1)))
    _same(run_popart(model, {"x": x})["y"], expected.astype(host))

    # The same through a session: PyStepIO feeds and anchors of the ml_dtypes type, 2 batches.
    data_flow = popart.DataFlow(2, {"y": popart.AnchorReturnType("All")})
    session = popart.InferenceSession(model.SerializeToString(), data_flow,
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    assert anchors["y"].dtype == host
    session.run(popart.PyStepIO({"x": np.stack([x, w])}, anchors))
    expected_w = np.pad(np.concatenate([w, w]).T.reshape(2, 6), ((0, 0), (1, 1)))
    _same(anchors["y"], np.stack([expected, expected_w]).astype(host))


# --- Cast -------------------------------------------------------------------------------------


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("dtype", NARROW_FLOATS, ids=lambda d: d.name)
def test_cast_float_to_narrow_float(dtype, saturate):
    """F78: round to nearest even; saturate clamps to +-max (float8), else NaN / inf; float4
    and float6 always saturate and send NaN to 0."""
    x = _floats()
    out = _run("Cast", [x], {"to": dtype.value, "saturate": saturate})
    finfo = ml_dtypes.finfo(dtype.numpy)
    has_nan = dtype.name.startswith("FLOAT8")
    source = np.clip(x, -float(finfo.max), float(finfo.max)) if saturate and has_nan else x
    with np.errstate(invalid="ignore"):
        expected = source.astype(dtype.numpy)
    if not has_nan:
        expected = np.where(np.isnan(x), 0, expected).astype(dtype.numpy)
    _same(out, expected)


@pytest.mark.parametrize("dtype", NARROW_FLOATS + [DataType.FLOAT8E8M0], ids=lambda d: d.name)
def test_cast_narrow_float_to_float16_and_double(dtype):
    codes = np.arange(1 << dtype.bits, dtype=np.uint8)
    x = codes.view(dtype.numpy)  # every code (sub-byte types sit in the low bits)
    for target in (np.float16, np.float64):
        out = _run("Cast", [x], {"to": DataType.from_numpy(target).value})
        _same(out, x.astype(target))


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_to_float8e8m0(saturate, round_mode):
    x = np.abs(_floats())
    x = x[np.isfinite(x) & (x > 0)]
    out = _run("Cast", [x], {"to": TensorProto.FLOAT8E8M0, "saturate": saturate,
                             "round_mode": round_mode})
    _same(out, to_float8e8m0(x, bool(saturate), round_mode))


def test_cast_float8e8m0_special_values():
    """The schema's table: inf -> max (saturate) or NaN; 0 -> 2**-127 (saturate) or NaN."""
    x = np.array([np.inf, 0.0, np.nan], np.float32)
    sat = _run("Cast", [x], {"to": TensorProto.FLOAT8E8M0}).astype(np.float32)
    np.testing.assert_array_equal(sat[:2], [2.0**127, 2.0**-127])
    assert np.isnan(sat[2])
    raw = _run("Cast", [x], {"to": TensorProto.FLOAT8E8M0, "saturate": 0,
                             "round_mode": "nearest"}).astype(np.float32)
    assert np.isnan(raw).all()


@pytest.mark.parametrize("dtype", PACKED_INTS, ids=lambda d: d.name)
def test_cast_to_packed_ints_keeps_low_bits(dtype):
    """Integers keep their low bits (two's complement for signed); floats truncate first."""
    bits = dtype.bits
    ints = np.arange(-40, 40, dtype=np.int32)
    low = ints & ((1 << bits) - 1)
    if dtype.name.startswith("INT"):
        low = np.where(low >= 1 << (bits - 1), low - (1 << bits), low)
    _same(_run("Cast", [ints], {"to": dtype.value}), low.astype(dtype.numpy))
    floats = np.array([-9.7, -2.5, -0.5, 0.5, 2.5, 7.9, 15.2], np.float32)
    _same(_run("Cast", [floats], {"to": dtype.value}), floats.astype(dtype.numpy))
    back = _run("Cast", [low.astype(dtype.numpy)], {"to": TensorProto.INT32})
    np.testing.assert_array_equal(back, low)


def test_cast_bfloat16_round_trip():
    x = _floats()
    bf = _run("Cast", [x], {"to": TensorProto.BFLOAT16}, opset=13)
    _same(bf, x.astype(ml_dtypes.bfloat16))
    _same(_run("Cast", [bf], {"to": TensorProto.FLOAT}, opset=13), bf.astype(np.float32))


def test_cast_uint64_above_2_63():
    x = np.array([0, 1, 2**63 - 1, 2**63, 2**64 - 1, 12345678901234567890], np.uint64)
    _same(_run("Cast", [x], {"to": TensorProto.DOUBLE}), x.astype(np.float64))
    _same(_run("Cast", [x], {"to": TensorProto.UINT8}), x.astype(np.uint8))
    _same(_run("Cast", [x], {"to": TensorProto.INT64}), x.view(np.int64))
    doubles = np.array([0.0, 3.7, 2.0**63, 2.0**64 - 2048], np.float64)
    _same(_run("Cast", [doubles], {"to": TensorProto.UINT64}), doubles.astype(np.uint64))


def test_castlike_and_cast_versions():
    """Cast-1 names the type as a string; CastLike takes the type of its second input."""
    x = np.array([1.5, -2.25, 300.0], np.float32)
    np.testing.assert_array_equal(_run("Cast", [x], {"to": "INT32"}, opset=1), [1, -2, 300])
    like = np.zeros(1, ml_dtypes.float8_e4m3fn)
    out = _run("CastLike", [x, like], {"saturate": 0}, opset=19)
    _same(out, x.astype(ml_dtypes.float8_e4m3fn))
    with pytest.raises(UnsupportedOpError, match="Cast-13 cannot cast to float8e4m3fn"):
        _run("Cast", [x], {"to": TensorProto.FLOAT8E4M3FN}, opset=13)


def test_cast_to_and_from_string():
    x = np.array([1.5, -2.0, np.inf], np.float32)
    strings = _run("Cast", [x], {"to": TensorProto.STRING})
    np.testing.assert_array_equal(strings, np.array(["1.5", "-2.0", "inf"], dtype=object))
    text = np.array(["3.25", "-1E2", "+INF", "NaN", "7"], dtype=object)
    out = _run("Cast", [text], {"to": TensorProto.FLOAT})
    np.testing.assert_array_equal(out, np.array([3.25, -100, np.inf, np.nan, 7], np.float32))


# --- BitCast ----------------------------------------------------------------------------------


@pytest.mark.parametrize("source, target", [
    (np.float32, np.int32), (np.int32, np.float32), (np.uint64, np.float64),
    (np.float64, np.uint64), (np.uint32, np.float32), (np.float16, np.uint16),
    (ml_dtypes.bfloat16, np.int16), (ml_dtypes.float8_e4m3fn, np.uint8),
    (np.int8, ml_dtypes.float8_e5m2fnuz), (ml_dtypes.float8_e8m0fnu, np.int8),
])
def test_bitcast_matches_numpy_view(source, target):
    bits = np.dtype(source).itemsize * 8
    raw = _rng.integers(0, 2**min(bits, 62), 64, dtype=np.int64).astype(f"u{bits // 8}")
    raw[:2] = [0, (1 << (bits - 1)) + 1]  # the sign bit set
    x = raw.view(source)
    out = _run("BitCast", [x], {"to": DataType.from_numpy(target).value}, opset=26)
    expected = x.view(target)
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(out.view(f"u{bits // 8}"), expected.view(f"u{bits // 8}"))


def test_bitcast_four_bit_types():
    codes = np.arange(16, dtype=np.uint8).astype(ml_dtypes.uint4)
    as_int4 = _run("BitCast", [codes], {"to": TensorProto.INT4}, opset=26)
    np.testing.assert_array_equal(as_int4.astype(np.int8), [*range(8), *range(-8, 0)])
    as_float4 = _run("BitCast", [as_int4], {"to": TensorProto.FLOAT4E2M1}, opset=26)
    table = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    _same(as_float4.astype(np.float32), np.concatenate([table, -table]))
    back = _run("BitCast", [as_float4], {"to": TensorProto.UINT4}, opset=26)
    np.testing.assert_array_equal(back.astype(np.uint8), np.arange(16))
    with pytest.raises(UnsupportedOpError, match="differ in width"):
        _run("BitCast", [codes], {"to": TensorProto.UINT8}, opset=26)


# --- unsigned arithmetic ----------------------------------------------------------------------


def _unsigned(dtype, shape=(4, 5)) -> np.ndarray:
    info = np.iinfo(dtype)
    x = _rng.integers(0, int(info.max), shape, dtype=np.uint64, endpoint=True).astype(dtype)
    x.flat[:4] = [0, 1, info.max, info.max // 2 + 1]
    return x


BINARY = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Max": np.maximum,
    "Min": np.minimum, "BitwiseAnd": np.bitwise_and, "BitwiseXor": np.bitwise_xor,
    "Equal": np.equal, "Greater": np.greater, "Less": np.less, "LessOrEqual": np.less_equal,
    "Div": lambda a, b: a // b, "Mod": np.remainder,
}


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("op_type", sorted(BINARY))
def test_unsigned_binary_ops(op_type, dtype):
    """Exact, wrapping modulo 2**bits, correct for uint64 values >= 2**63."""
    a, b = _unsigned(dtype), _unsigned(dtype, (5,))
    if op_type in ("Div", "Mod"):
        b = np.where(b == 0, 3, b).astype(dtype)
        b[0] = np.iinfo(dtype).max  # a divisor with the top bit set
    with np.errstate(over="ignore"):
        expected = BINARY[op_type](a, b)
    np.testing.assert_array_equal(_run(op_type, [a, b], opset=18), expected)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_unsigned_unary_reduce_and_topk(dtype):
    x = _unsigned(dtype)
    np.testing.assert_array_equal(_run("BitwiseNot", [x], opset=18), ~x)
    axes = np.array([1], np.int64)
    if dtype != np.uint16:  # ReduceMax and ReduceSum have no uint16
        np.testing.assert_array_equal(
            _run("ReduceMax", [x, axes], {"keepdims": 0}, opset=18, const_inputs=(1,)),
            x.max(1))
        np.testing.assert_array_equal(
            _run("ReduceSum", [x, axes], {"keepdims": 0}, opset=18, const_inputs=(1,)),
            x.sum(1, dtype=dtype))
    arg_min = _run("ArgMin", [x], {"axis": 1, "keepdims": 0}, opset=13)
    np.testing.assert_array_equal(arg_min, x.argmin(1))
    model, feeds = one_op_model("TopK", [x, np.array([2], np.int64)], opset=11, num_outputs=2,
                                const_inputs=(1,))
    out = run_popart(model, feeds)
    order = np.argsort(-x.astype(np.float64), axis=1, kind="stable")[:, :2]
    np.testing.assert_array_equal(out["out0"], np.take_along_axis(x, order, 1))


def test_unsigned_wraps_between_ops():
    """A uint32 difference that wraps feeds a comparison: the comparison sees the wrapped value."""
    a = np.array([1, 5], np.uint32)
    b = np.array([2, 1], np.uint32)
    graph = helper.make_graph(
        [helper.make_node("Sub", ["a", "b"], ["d"]),
         helper.make_node("Greater", ["d", "b"], ["y"])], "wrap",
        [helper.make_tensor_value_info(n, TensorProto.UINT32, [2]) for n in "ab"],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    np.testing.assert_array_equal(run_popart(model, {"a": a, "b": b})["y"], [True, True])


def test_uint64_without_declared_semantics_is_rejected():
    with pytest.raises(UnsupportedOpError, match="Abs .*uint64"):
        _run("Abs", [np.array([1], np.uint64)], opset=13)


# --- BitShift ---------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint8, np.uint16, np.uint32, np.uint64])
def test_bitshift_28(dtype, direction):
    """Shifts past the width or negative give the sign fill (-1 or 0); left shifts drop bits."""
    bits = np.dtype(dtype).itemsize * 8
    info = np.iinfo(dtype)
    x = np.array([0, 1, 3, int(info.max), int(info.min), int(info.max) // 3], dtype)
    x = np.concatenate([x, x])
    raw_shift = np.array([0, 1, 2, 1, 3, bits - 1, bits, bits + 5, -1, -2, 1, 4])
    if info.min == 0:
        raw_shift = np.where(raw_shift < 0, bits + 1, raw_shift)
    shift = raw_shift.astype(dtype)
    outside = (raw_shift < 0) | (raw_shift >= bits)
    safe = np.where(outside, 0, raw_shift).astype(dtype)
    with np.errstate(over="ignore"):
        ref = (np.left_shift if direction == "LEFT" else np.right_shift)(x, safe)
    fill = (x < 0).astype(dtype) * dtype(-1 if info.min else 0) if direction == "RIGHT" else 0
    fill = np.asarray(fill, dtype)  # np.where of int64 and uint64 would go through float64
    expected = np.where(outside, fill, ref).astype(dtype)
    out = _run("BitShift", [x, shift], {"direction": direction}, opset=28)
    np.testing.assert_array_equal(out, expected)


def test_bitshift_11_rejects_signed():
    x = np.array([1], np.int32)
    with pytest.raises(Exception, match="BitShift.*int32"):
        _run("BitShift", [x, x], {"direction": "LEFT"}, opset=11)


def test_reference_evaluator_agrees_on_cast_to_float8():
    """Cross-check one cast with onnx's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    x = _floats(200)
    model, feeds = one_op_model("Cast", [x], {"to": TensorProto.FLOAT8E5M2, "saturate": 0},
                                opset=21)
    (expected,) = ReferenceEvaluator(model).run(None, feeds)
    _same(run_popart(model, feeds)["out0"], expected)
    assert onnx.helper.np_dtype_to_tensor_dtype(expected.dtype) == TensorProto.FLOAT8E5M2
