"""Elementwise ops (F78, spec §6.1): every registered (op, version) against onnxruntime.

Each case runs our import + kernels on a model stamped with the op's since-version. The
reference is onnxruntime on the same node; for versions below opset 7 (which onnxruntime does not
implement) it is onnxruntime at opset 7, whose version of the op computes the same thing, with
legacy-only attributes dropped. Where onnxruntime lacks a kernel for a dtype, the reference runs
at a substitute dtype and is cast back: float16 -> float32, small integers -> float64/float32,
float64 -> float32 (then compared with float32 tolerances).
"""

from __future__ import annotations

import numpy as np
import onnx.defs
import onnxruntime.capi.onnxruntime_pybind11_state as ort_state
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from popart_backend.dtypes import DataType
from popart_backend.errors import ShapeError, UnsupportedOpError
from popart_backend.ops import elementwise
from popart_backend.ops.base import _type_constraints, broadcast_shapes
from popart_backend.ops.registry import registered_versions
from tests.helpers import check_op, one_op_model, run_onnxruntime, run_popart

FLOATS = (np.float32, np.float16, np.float64)
INTS = (np.int32, np.int64, np.int8, np.uint8)
ORT_MIN_OPSET = 7


def allowed_dtypes(op_type: str, version: int, candidates, param: str = "T") -> list[np.dtype]:
    """The candidates ONNX allows for ``param`` of ``op_type``-``version``."""
    allowed = _type_constraints(op_type, version)[1][param]
    return [np.dtype(d) for d in candidates if _onnx_name(np.dtype(d)) in allowed]


def _onnx_name(dtype: np.dtype) -> str:
    return {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}.get(dtype, str(dtype))


class NoReference(Exception):
    """onnxruntime has no kernel for this dtype, not even at another one."""


def _substitutes(dtype: np.dtype) -> list:
    """Dtypes to retry onnxruntime with when it lacks a kernel for ``dtype``."""
    if dtype == np.float16:
        return [np.float32]
    if dtype == np.float64:
        return [np.float32]  # compared with float32 tolerances, see compare()
    if dtype.kind in "iu":
        return [np.float64, np.float32]  # test integers are small: exact in both
    return []


def ort_reference(op_type, inputs, attrs, opset, const_inputs=(), num_outputs=1):
    """(onnxruntime's outputs, dtype substituted or None).

    When onnxruntime lacks a kernel for the first input's dtype, inputs of that dtype are
    converted to a substitute (so a Where condition stays bool) and outputs of the substitute
    dtype are cast back. Raises NoReference if nothing runs.
    """
    first = np.asarray(inputs[0]).dtype
    for sub in [None, *_substitutes(first)]:
        feed = [
            x if sub is None or x is None or i in const_inputs or x.dtype != first
            else x.astype(sub)
            for i, x in enumerate(inputs)
        ]
        model, feeds = one_op_model(op_type, feed, attrs, opset, num_outputs,
                                    const_inputs=const_inputs)
        try:
            result = run_onnxruntime(model, feeds)
        except (ort_state.NotImplemented, ort_state.InvalidGraph):
            # InvalidGraph: a version above onnxruntime's opset runs as the previous version
            # (tests/helpers.py), whose type list may lack the dtype (Celu-28 float16).
            continue
        outs = [result[f"out{i}"] for i in range(num_outputs)]
        if sub is not None:
            outs = [o.astype(first) if o.dtype == np.dtype(sub) else o for o in outs]
        return outs, sub
    raise NoReference(f"{op_type}-opset{opset}: onnxruntime has no kernel for {first}")


def compare(op_type, version, inputs, attrs=None, legacy_attrs=None, ref_attrs=None,
            ref_inputs=None, const_inputs=(), num_outputs=1, **tol):
    """Run ``op_type`` at opset ``version`` and compare with onnxruntime (see module doc).

    A float64 case whose reference had to run in float32 is compared with float32 tolerances.
    """
    attrs = dict(attrs or {})
    ours = {**attrs, **(legacy_attrs or {})}
    expected, substitute = ort_reference(
        op_type, inputs if ref_inputs is None else ref_inputs,
        attrs if ref_attrs is None else ref_attrs,
        max(version, ORT_MIN_OPSET), const_inputs, num_outputs)
    if substitute == np.float32 and np.asarray(inputs[0]).dtype == np.float64 and not tol:
        tol = {"rtol": 1e-5, "atol": 1e-6}
    return check_op(op_type, inputs, ours, opset=version, num_outputs=num_outputs,
                    const_inputs=const_inputs, ref=lambda *_: expected, **tol)


def legacy_attrs(op_type: str, version: int) -> dict:
    """consumed_inputs for the opset-1 schemas that have it (accepted, no effect)."""
    has = "consumed_inputs" in onnx.defs.get_schema(op_type, version, "").attributes
    return {"consumed_inputs": [0]} if has else {}


def sample(shape, dtype, low=-3.0, high=3.0, seed=0):
    """Seeded values in [low, high) for floats; small integers (>= 0 for unsigned)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else int(np.floor(low))
        return rng.integers(lo, max(int(np.ceil(high)), lo + 2), size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def op_versions(*op_types):
    return [(op, v) for op in op_types for v in registered_versions(op)]


def ids(case):
    return f"{case[0]}-{case[1]}"


# --- unary --------------------------------------------------------------------------------------

# op -> (input range, attribute sets)
UNARY = {
    "Abs": ((-3, 3), [{}]),
    "Neg": ((-3, 3), [{}]),
    "Exp": ((-3, 3), [{}]),
    "Log": ((0.1, 3), [{}]),
    "Sqrt": ((0.1, 3), [{}]),
    "Reciprocal": ((0.5, 2), [{}]),
    "Floor": ((-3, 3), [{}]),
    "Ceil": ((-3, 3), [{}]),
    "Round": ((-3, 3), [{}]),
    "Sign": ((-3, 3), [{}]),
    "Sin": ((-3, 3), [{}]),
    "Cos": ((-3, 3), [{}]),
    "Tan": ((-1.2, 1.2), [{}]),
    "Asin": ((-0.9, 0.9), [{}]),
    "Acos": ((-0.9, 0.9), [{}]),
    "Atan": ((-3, 3), [{}]),
    "Sinh": ((-3, 3), [{}]),
    "Cosh": ((-3, 3), [{}]),
    "Asinh": ((-3, 3), [{}]),
    "Acosh": ((1.1, 3), [{}]),
    "Atanh": ((-0.9, 0.9), [{}]),
    "Tanh": ((-3, 3), [{}]),
    "Sigmoid": ((-3, 3), [{}]),
    "HardSigmoid": ((-4, 4), [{}, {"alpha": 0.3, "beta": 0.4}]),
    "HardSwish": ((-4, 4), [{}]),
    "Relu": ((-3, 3), [{}]),
    "LeakyRelu": ((-3, 3), [{}, {"alpha": 0.2}]),
    "Elu": ((-3, 3), [{}, {"alpha": 0.5}]),
    "Selu": ((-3, 3), [{"alpha": 1.5, "gamma": 1.2}]),
    "Celu": ((-3, 3), [{}, {"alpha": 2.0}]),
    "ThresholdedRelu": ((-3, 3), [{}, {"alpha": 0.5}]),
    "Softplus": ((-3, 3), [{}]),
    "Softsign": ((-3, 3), [{}]),
    "Erf": ((-2, 2), [{}]),
    "Gelu": ((-3, 3), [{}, {"approximate": "tanh"}]),
    "Mish": ((-3, 3), [{}]),
    "Shrink": ((-3, 3), [{}, {"lambd": 1.5, "bias": 0.5}]),
    "IsNaN": ((-3, 3), [{}]),
    "IsInf": ((-3, 3), [{}, {"detect_positive": 0}, {"detect_negative": 0}]),
    "Not": ((0, 1), [{}]),
    "BitwiseNot": ((-100, 100), [{}]),
}


@pytest.mark.parametrize("case", op_versions(*UNARY), ids=ids)
def test_unary(case):
    """F78: unary math/activations at every registered version, every allowed test dtype."""
    op_type, version = case
    (low, high), attr_sets = UNARY[op_type]
    param = "T1" if op_type in ("IsNaN", "IsInf") else "T"
    dtypes = allowed_dtypes(op_type, version, FLOATS + INTS + (np.bool_,), param)
    assert dtypes, f"no test dtype for {op_type}-{version}"
    legacy = legacy_attrs(op_type, version)
    for dtype in dtypes:
        x = sample((3, 4), dtype, low, high, seed=version)
        if dtype.kind == "f" and op_type in ("IsNaN", "IsInf", "Round", "Sign", "Relu"):
            x.flat[:6] = [np.nan, np.inf, -np.inf, 0.5, -2.5, 0.0]
            if op_type == "Sign" and dtype == np.float16:
                x.flat[0] = 1.0  # onnxruntime's float16 Sign maps NaN to 0, its float32 to NaN
        for attrs in attr_sets:
            compare(op_type, version, [x], attrs, legacy)


def test_selu_opset1_defaults():
    """Selu-1 rounded its default alpha/gamma; opset 6 changed them."""
    x = sample((3, 4), np.float32)
    compare("Selu", 1, [x], ref_attrs={"alpha": 1.6732, "gamma": 1.0507})
    compare("Selu", 6, [x])


@pytest.mark.parametrize("version", registered_versions("Clip"), ids=lambda v: f"Clip-{v}")
def test_clip(version):
    """Clip-6 bounds are attributes (default +-FLT_MAX); Clip-11+ takes optional scalar inputs."""
    for dtype in allowed_dtypes("Clip", version, FLOATS + INTS):
        x = sample((3, 4), dtype, -5, 5)
        if version < 11:
            compare("Clip", version, [x])
            compare("Clip", version, [x], {"min": -0.5, "max": 2.0})
            continue
        low, high = np.array(1 if dtype.kind == "u" else -1, dtype), np.array(2, dtype)
        compare("Clip", version, [x, low, high])
        compare("Clip", version, [x, None, high])
        compare("Clip", version, [x, low])
        compare("Clip", version, [x])
        compare("Clip", version, [x, high, low])  # min > max: everything becomes max
        if dtype != np.float64:  # the float32 stand-in reference would keep float64 bounds
            compare("Clip", version, [x, low, high], const_inputs=(1, 2))


@pytest.mark.parametrize("version", registered_versions("PRelu"), ids=lambda v: f"PRelu-{v}")
def test_prelu(version):
    """The slope broadcasts one way to x's shape."""
    slopes = [(2, 3, 4), (1,)] if version < 7 else [(2, 3, 4), (4,), (3, 1), (1,), ()]
    for dtype in allowed_dtypes("PRelu", version, FLOATS + INTS):
        x = sample((2, 3, 4), dtype, -3, 3)
        for shape in slopes:
            slope = sample(shape, dtype, -2, 2, seed=1)
            compare("PRelu", version, [x, slope])


def test_prelu_slope_must_broadcast_to_input():
    with pytest.raises(ShapeError, match="PRelu"):
        check_op("PRelu", [sample((3, 1), np.float32), sample((3, 4), np.float32)], opset=16)


def test_legacy_consumed_inputs_only_before_opset_6():
    with pytest.raises(Exception, match="consumed_inputs"):
        check_op("Floor", [sample((3,), np.float32)], {"consumed_inputs": [0]}, opset=6)


# --- binary -------------------------------------------------------------------------------------

BINARY_SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((), (3,)), ((2, 1, 4), (3, 1))]


def _binary_inputs(op_type, version, dtype, shape_a, shape_b, seed):
    a = sample(shape_a, dtype, -5, 5, seed=seed)
    b = sample(shape_b, dtype, -5, 5, seed=seed + 1)
    if op_type in ("Div", "Mod"):
        if dtype.kind in "iu":
            # nonzero divisors of both signs (for signed types)
            b = np.where(b == 0, 3, b).astype(dtype)
        else:
            b = np.where(np.abs(b) < 0.5, 1.5, b).astype(dtype)
    if op_type == "BitShift":
        b = sample(shape_b, dtype, 0, 4, seed=seed + 1)
    return a, b


ARITHMETIC = ("Add", "Sub", "Mul", "Div", "Mod", "BitShift", "BitwiseAnd", "BitwiseOr",
              "BitwiseXor")


@pytest.mark.parametrize("case", [c for c in op_versions(*ARITHMETIC) if c[1] >= 7], ids=ids)
def test_binary_arithmetic(case):
    """F78: numpy broadcasting (opset >= 7), ints stay exact, integer Div truncates toward 0."""
    op_type, version = case
    candidates = FLOATS + INTS + ((np.uint16, np.uint32) if op_type == "BitShift" else ())
    dtypes = allowed_dtypes(op_type, version, candidates)
    attr_sets = [{}]
    if op_type == "Mod":
        attr_sets = [{"fmod": 1}]
    if op_type == "BitShift":
        attr_sets = [{"direction": "LEFT"}, {"direction": "RIGHT"}]
    for dtype in dtypes:
        for k, (sa, sb) in enumerate(BINARY_SHAPES):
            a, b = _binary_inputs(op_type, version, dtype, sa, sb, seed=k)
            for attrs in attr_sets:
                # onnxruntime has no uint16 BitShift, nor signed ones (BitShift-28 > its opset)
                no_ort = dtype == np.uint16 or np.dtype(dtype).kind == "i"
                if op_type == "BitShift" and no_ort:
                    shift = np.left_shift if attrs["direction"] == "LEFT" else np.right_shift
                    check_op(op_type, [a, b], attrs, opset=version, ref=shift)
                    continue
                compare(op_type, version, [a, b], attrs)
            if op_type == "Mod" and dtype.kind in "iu":
                compare(op_type, version, [a, b], {"fmod": 0})


def test_integer_division_truncates_toward_zero():
    a = np.array([7, -7, 7, -7, 0], np.int32)
    b = np.array([2, 2, -2, -2, 3], np.int32)
    (out,) = compare("Div", 14, [a, b])
    np.testing.assert_array_equal(out, [3, -3, -3, 3, 0])
    (out,) = compare("Mod", 13, [a, b])
    np.testing.assert_array_equal(out, [1, 1, -1, -1, 0])
    (out,) = compare("Mod", 13, [a, b], {"fmod": 1})
    np.testing.assert_array_equal(out, [1, -1, 1, -1, 0])


@pytest.mark.parametrize("version", registered_versions("Pow"), ids=lambda v: f"Pow-{v}")
def test_pow(version):
    """Mixed base/exponent dtypes (opset 12+); the result has the base's dtype."""
    base_types = allowed_dtypes("Pow", version, FLOATS + INTS)
    exp_param = "T1" if version >= 12 else "T"
    exp_types = allowed_dtypes("Pow", version, FLOATS + INTS, exp_param)
    for bt in base_types:
        for et in exp_types:
            if version < 12 and bt != et:
                continue
            base = sample((3, 4), bt, 0.5, 3, seed=1)
            exponent = sample((4,), et, -2, 3, seed=2)
            if bt.kind in "iu" and et.kind in "iu":
                exponent = sample((4,), et, 0, 3, seed=2)
            if version < 7:  # no broadcasting without the legacy attribute
                exponent = np.resize(exponent, base.shape)
            tol = {"rtol": 2e-3} if np.float16 in (bt, et) else {}
            try:
                compare("Pow", version, [base, exponent], **tol)
            except NoReference:  # onnxruntime lacks this (base, exponent) pair
                check_op("Pow", [base, exponent], opset=version, ref=_pow_reference, **tol)
    if version >= 12:
        # integer base with negative exponent truncates like onnxruntime's std::pow
        base = np.array([2, 3, 4, 5], np.int32)
        compare("Pow", version, [base, np.array([-1, 2, 0, 1], np.int64)])


def _pow_reference(base, exponent):
    # float64 power, then the base's dtype (integers truncate, like onnxruntime's std::pow)
    return np.power(base.astype(np.float64), exponent.astype(np.float64)).astype(base.dtype)


LOGIC = ("And", "Or", "Xor")
COMPARE = ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual")


@pytest.mark.parametrize("case", [c for c in op_versions(*LOGIC, *COMPARE) if c[1] >= 7],
                         ids=ids)
def test_logic_and_comparison(case):
    """BOOL outputs; ties included (small integer-valued inputs)."""
    op_type, version = case
    for dtype in allowed_dtypes(op_type, version, FLOATS + INTS + (np.bool_,)):
        for k, (sa, sb) in enumerate(BINARY_SHAPES):
            a = sample(sa, dtype, -2, 2, seed=k)
            b = sample(sb, dtype, -2, 2, seed=k + 7)
            if dtype.kind == "f":
                a, b = np.round(a).astype(dtype), np.round(b).astype(dtype)
            compare(op_type, version, [a, b])


LEGACY_BINARY = [(op, v) for op, v in op_versions(*ARITHMETIC, "Pow", *LOGIC, *COMPARE) if v < 7]


@pytest.mark.parametrize("case", LEGACY_BINARY, ids=ids)
def test_legacy_broadcast(case):
    """Before opset 7, broadcast=1 aligns B with A's trailing axes, or at ``axis``."""
    op_type, version = case
    dtype = allowed_dtypes(op_type, version, FLOATS + (np.int32, np.bool_))[0]
    low = 0.5 if op_type in ("Pow", "Div") else -2
    a = sample((2, 3, 4), dtype, low, 2)
    same = sample((2, 3, 4), dtype, low, 2, seed=1)
    compare(op_type, version, [a, same], legacy_attrs=legacy_attrs(op_type, version))
    tail = sample((4,), dtype, low, 2, seed=2)
    compare(op_type, version, [a, tail], legacy_attrs={"broadcast": 1})
    mid = sample((3,), dtype, low, 2, seed=3)
    compare(op_type, version, [a, mid], legacy_attrs={"broadcast": 1, "axis": 1},
            ref_inputs=[a, mid.reshape(3, 1)])
    with pytest.raises(ShapeError, match=op_type):
        check_op(op_type, [a, tail], opset=version)


# --- variadic, Where ----------------------------------------------------------------------------

VARIADIC_SHAPES = [[(3, 4)], [(3, 4), (3, 4)], [(3, 4), (4,), (2, 1, 1)], [(3, 1), (1, 4)]]


@pytest.mark.parametrize("case", op_versions("Sum", "Mean", "Max", "Min"), ids=ids)
def test_variadic(case):
    """1..3 inputs; broadcasting from opset 8, equal shapes before."""
    op_type, version = case
    for dtype in allowed_dtypes(op_type, version, FLOATS + INTS):
        for k, shapes in enumerate(VARIADIC_SHAPES):
            if version < 8 and len(set(shapes)) > 1:
                continue
            xs = [sample(s, dtype, -3, 3, seed=k + i) for i, s in enumerate(shapes)]
            compare(op_type, version, xs)
    if version < 8:
        with pytest.raises(ShapeError, match=op_type):
            check_op(op_type, [sample((3, 4), np.float32), sample((4,), np.float32)], opset=version)


@pytest.mark.parametrize("version", registered_versions("Where"), ids=lambda v: f"Where-{v}")
def test_where(version):
    """Three-way broadcast of condition, X and Y."""
    shapes = [((3, 4), (3, 4), (3, 4)), ((3, 1), (1, 4), (4,)), ((2, 1, 1), (3, 1), ())]
    for dtype in allowed_dtypes("Where", version, FLOATS + INTS + (np.bool_,)):
        for k, (sc, sx, sy) in enumerate(shapes):
            inputs = [sample(sc, np.bool_, seed=k), sample(sx, dtype, seed=k + 1),
                      sample(sy, dtype, seed=k + 2)]
            if dtype == np.bool_:  # onnxruntime has no bool Where
                check_op("Where", inputs, opset=version, ref=np.where)
                continue
            compare("Where", version, inputs)


# --- Cast -----------------------------------------------------------------------------------------

CAST_TYPES = (np.float32, np.float16, np.float64, np.int32, np.int64, np.int8, np.uint8, np.bool_)


def _cast_input(dtype, seed):
    dtype = np.dtype(dtype)
    values = sample((3, 4), np.float32, -100, 100, seed=seed)
    values.flat[:4] = [0.0, -0.0, 2.7, -2.7]  # truncation toward zero, both signs
    if dtype.kind == "u":
        values = np.abs(values)
    return values.astype(dtype)


@pytest.mark.parametrize("version", registered_versions("Cast"), ids=lambda v: f"Cast-{v}")
def test_cast(version):
    """Every pair of common dtypes: float->int truncates, anything->bool tests != 0."""
    for k, src in enumerate(CAST_TYPES):
        for dst in CAST_TYPES:
            x = _cast_input(src, seed=k)
            if np.dtype(dst).kind in "iu" and np.dtype(src).kind == "f":
                x = np.clip(x, -100 if np.dtype(dst).kind == "i" else 0, 100).astype(src)
            attrs = {"to": DataType.from_numpy(dst).onnx}
            if version >= 19:
                attrs["saturate"] = 1
            compare("Cast", version, [x], attrs)


@pytest.mark.parametrize("version", registered_versions("CastLike"), ids=lambda v: f"CastLike-{v}")
def test_cast_like(version):
    for src in (np.float32, np.int64, np.bool_):
        for dst in (np.float16, np.int32, np.uint8, np.bool_):
            compare("CastLike", version, [_cast_input(src, 0), np.zeros((1,), dst)])


def test_cast_errors():
    with pytest.raises(UnsupportedOpError, match="Cast-13 cannot cast to float8e4m3fn"):
        check_op("Cast", [sample((2,), np.float32)], {"to": 17}, opset=13)
    with pytest.raises(UnsupportedOpError, match="Cast .*to=99"):
        check_op("Cast", [sample((2,), np.float32)], {"to": 99}, opset=19)


# --- errors and the broadcast rule ----------------------------------------------------------------


@pytest.mark.parametrize("op_type", ["Add", "Mul", "Equal", "Pow", "And"])
def test_non_broadcastable_shapes_name_the_op(op_type):
    dtype = np.bool_ if op_type == "And" else np.float32
    with pytest.raises(ShapeError, match=rf"{op_type} .*\[3, 4\].*\[3\].*do not broadcast"):
        check_op(op_type, [sample((3, 4), dtype), sample((3,), dtype)], opset=14)


def test_non_broadcastable_variadic_and_where():
    with pytest.raises(ShapeError, match="Sum"):
        check_op("Sum", [sample((3, 4), np.float32), sample((2, 4), np.float32)], opset=13)
    with pytest.raises(ShapeError, match="Where"):
        check_op("Where", [sample((3, 1), np.bool_), sample((2, 4), np.float32),
                           sample((4,), np.float32)], opset=16)


def test_dtype_errors():
    with pytest.raises(ShapeError, match="Add .*dtype"):
        check_op("Add", [sample((3,), np.float32), sample((3,), np.int64)], opset=14)
    with pytest.raises(ShapeError, match="Exp .*int32"):
        check_op("Exp", [sample((3,), np.int32)], opset=13)
    with pytest.raises(UnsupportedOpError, match="Mod .*fmod=1"):
        check_op("Mod", [sample((3,), np.float32), sample((3,), np.float32)], opset=13)
    with pytest.raises(UnsupportedOpError, match="Abs .*uint64"):
        check_op("Abs", [sample((3,), np.uint64)], opset=13)


_dims = st.integers(min_value=1, max_value=4)
_shape = st.lists(st.one_of(_dims, st.just(1)), max_size=4).map(tuple)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(_shape, min_size=1, max_size=4))
def test_broadcast_rule_matches_numpy(shapes):
    """The shared broadcast rule equals numpy's, and raises ShapeError where numpy refuses."""
    op = elementwise.Add(version=14)
    try:
        expected = np.broadcast_shapes(*shapes)
    except ValueError:
        with pytest.raises(ShapeError, match="Add"):
            broadcast_shapes(op, *shapes)
        return
    assert broadcast_shapes(op, *shapes) == expected


def test_scalar_broadcast_through_importer():
    model, feeds = one_op_model("Add", [np.float32(2.0), sample((2, 3), np.float32)], opset=14)
    out = run_popart(model, feeds)["out0"]
    np.testing.assert_allclose(out, feeds["in1"] + 2.0)


def test_legacy_broadcast_b_must_fit_a():
    a = sample((2, 3, 4), np.float32)
    with pytest.raises(ShapeError, match="Mul .*do not broadcast"):
        check_op("Mul", [a, sample((3,), np.float32)], {"broadcast": 1}, opset=6)
    with pytest.raises(ShapeError, match="Add .*do not broadcast"):
        check_op("Add", [a, sample((4,), np.float32)], {"broadcast": 1, "axis": 1}, opset=6)
    with pytest.raises(ShapeError, match="Sub .*does not fit"):
        check_op("Sub", [sample((3, 4), np.float32), a], {"broadcast": 1}, opset=6)
