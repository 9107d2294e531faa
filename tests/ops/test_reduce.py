"""Reductions and ArgMax/ArgMin (F78, spec §6.1): every registered (op, version) against
onnxruntime, with axes as attribute (ReduceSum <= 11, others <= 13) and as a constant input
(ReduceSum >= 13, others >= 18). The comparison rules are those of test_elementwise.
"""

from __future__ import annotations

import numpy as np
import pytest

from popart_backend.errors import ShapeError
from popart_backend.ops.registry import registered_versions
from tests.helpers import check_op, one_op_model, run_popart
from tests.ops.test_elementwise import FLOATS, INTS, allowed_dtypes, compare, ids, op_versions, sample

REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
          "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")

# op -> input range; positive where the formula needs it (log of a sum)
RANGES = {"ReduceLogSum": (0.5, 4), "ReduceProd": (0.5, 1.5)}


def axes_input_since(op_type: str) -> int:
    return 13 if op_type == "ReduceSum" else 18


def _data(op_type, dtype, seed):
    low, high = RANGES.get(op_type, (-3, 3))
    if dtype.kind in "iu":
        low, high = (1, 4) if op_type == "ReduceLogSum" else (-2, 3)
    return sample((2, 3, 4), dtype, low, high, seed=seed)


@pytest.mark.parametrize("case", op_versions(*REDUCE), ids=ids)
def test_reduce(case):
    """keepdims 0/1, single/multiple/negative/unsorted axes, absent axes = all axes."""
    op_type, version = case
    as_input = version >= axes_input_since(op_type)
    axes_cases = [None, [1], [0, 2], [2, 0]] + ([[-1], [-3, 1]] if version >= 11 else [])
    for n, dtype in enumerate(allowed_dtypes(op_type, version, FLOATS + INTS + (np.bool_,))):
        x = _data(op_type, dtype, seed=version)
        tol = {"rtol": 3e-3, "atol": 3e-3} if dtype == np.float16 else {}
        # float32 sees every axes case with both keepdims; other dtypes a rotating share
        for k, axes in enumerate(axes_cases if n == 0 else axes_cases[n % 2::2]):
            for keepdims in (0, 1) if n == 0 else ((k + n) % 2,):
                if as_input:
                    inputs = [x] if axes is None else [x, np.array(axes, np.int64)]
                    compare(op_type, version, inputs, {"keepdims": keepdims},
                            const_inputs=(1,), **tol)
                else:
                    attrs = {"keepdims": keepdims} | ({} if axes is None else {"axes": axes})
                    compare(op_type, version, [x], attrs, **tol)


@pytest.mark.parametrize(
    "case", [c for c in op_versions(*REDUCE) if c[1] >= axes_input_since(c[0])], ids=ids)
def test_reduce_empty_axes(case):
    """An empty axes input reduces everything, or is an identity with noop_with_empty_axes."""
    op_type, version = case
    x = _data(op_type, np.dtype(np.float32), seed=1)
    empty = np.array([], np.int64)
    for noop in (0, 1):
        compare(op_type, version, [x, empty], {"noop_with_empty_axes": noop}, const_inputs=(1,))
    compare(op_type, version, [x], {"noop_with_empty_axes": 1, "keepdims": 0})


def test_reduce_integer_results_truncate():
    """Integer Mean/L2/LogSum truncate toward zero like onnxruntime; sums stay int32."""
    x = np.array([[-1, -2], [3, 3], [7, 0]], np.int32)
    (mean,) = compare("ReduceMean", 13, [x], {"axes": [1], "keepdims": 0})
    np.testing.assert_array_equal(mean, [-1, 3, 3])
    (l2,) = compare("ReduceL2", 13, [x], {"axes": [1], "keepdims": 0})
    np.testing.assert_array_equal(l2, [2, 4, 7])
    (total,) = compare("ReduceSum", 13, [x, np.array([0], np.int64)], const_inputs=(1,))
    assert total.dtype == np.int32


def test_reduce_scalar_input():
    compare("ReduceSum", 13, [np.array(2.5, np.float32)])
    compare("ReduceMax", 18, [np.array(2.5, np.float32)], {"keepdims": 0})


# --- ArgMax / ArgMin ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", op_versions("ArgMax", "ArgMin"), ids=ids)
def test_arg_reduce(case):
    """INT64 indices; ties (integer-valued data) resolve first, or last with select_last_index."""
    op_type, version = case
    axes = [0, 1, 2] + ([-1] if version >= 11 else [])
    last = (0, 1) if version >= 12 else (0,)
    for n, dtype in enumerate(allowed_dtypes(op_type, version, FLOATS + INTS)):
        x = np.round(sample((2, 3, 4), dtype, -2, 3, seed=version)).astype(dtype)
        for k, axis in enumerate(axes):
            for select_last in last:
                attrs = {"axis": axis, "keepdims": (k + n + select_last) % 2}
                if version >= 12:
                    attrs["select_last_index"] = select_last
                compare(op_type, version, [x], attrs)


# --- errors ---------------------------------------------------------------------------------------


def test_reduce_axis_out_of_range():
    x = sample((2, 3), np.float32)
    with pytest.raises(ShapeError, match=r"ReduceMean .*axis 2 is out of range"):
        check_op("ReduceMean", [x], {"axes": [2]}, opset=13)
    with pytest.raises(ShapeError, match=r"ReduceSum .*axis -3 is out of range"):
        check_op("ReduceSum", [x, np.array([-3], np.int64)], opset=13, const_inputs=(1,))
    with pytest.raises(ShapeError, match=r"ReduceMax .*axis 5 is out of range"):
        check_op("ReduceMax", [x, np.array([5], np.int64)], opset=18, const_inputs=(1,))
    with pytest.raises(ShapeError, match=r"ArgMax .*axis 2 is out of range"):
        check_op("ArgMax", [x], {"axis": 2}, opset=13)


def test_reduce_repeated_axis():
    with pytest.raises(ShapeError, match="ReduceProd .*twice"):
        check_op("ReduceProd", [sample((2, 3), np.float32)], {"axes": [1, -1]}, opset=13)


def test_reduce_axes_must_be_constant():
    model, feeds = one_op_model("ReduceSum", [sample((2, 3), np.float32),
                                              np.array([1], np.int64)], opset=13)
    with pytest.raises(ShapeError, match="ReduceSum .*constant"):
        run_popart(model, feeds)


def test_every_reduce_version_is_registered():
    """ReduceSum moved axes to an input at 13, the others at 18; Max/Min gained bool at 20."""
    assert registered_versions("ReduceSum") == [1, 11, 13]
    assert registered_versions("ReduceMean") == [1, 11, 13, 18]
    assert registered_versions("ReduceMax") == [1, 11, 12, 13, 18, 20]
