"""Indexing ops (spec §6.1: Gather, Scatter, OneHot, TopK, CumSum, ...; F82 version resolution)
at every registered ONNX since-version, compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from popart_backend.errors import ShapeError, UnsupportedOpError, popart_runtime_error
from popart_backend.ops.registry import registered_versions
from tests.helpers import check_op, one_op_model, rand, run_popart

rng = np.random.default_rng(1234)


def versions(op_type, minimum=0):
    return [v for v in registered_versions(op_type) if v >= minimum]


def test_every_onnx_version_is_registered():
    """F82: each op family member has every since-version ONNX defines up to opset 28."""
    import onnx.defs

    for name in ["Gather", "GatherElements", "GatherND", "Scatter", "ScatterElements",
                 "ScatterND", "OneHot", "TopK", "CumSum", "NonZero", "Compress"]:
        onnx_versions = sorted(
            s.since_version for s in onnx.defs.get_all_schemas_with_history()
            if s.name == name and s.domain == "" and s.since_version <= 28
        )
        assert registered_versions(name) == onnx_versions, name


# --- Gather family ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", versions("Gather"))
@pytest.mark.parametrize(
    "axis, index_shape, index_dtype",
    [(0, (4,), np.int64), (1, (2, 3), np.int32), (-1, (), np.int64), (-2, (3, 1, 2), np.int64)],
)
def test_gather(version, axis, index_shape, index_dtype):
    data = rand(5, 6, 7)
    size = data.shape[axis]
    low = -size if version >= 11 else 0  # negative indices are defined from Gather-11
    indices = rng.integers(low, size, size=index_shape).astype(index_dtype)
    check_op("Gather", [data, indices], {"axis": axis}, opset=version)


@pytest.mark.parametrize("version", versions("Gather"))
def test_gather_constant_indices_and_int_data(version):
    data = rand(4, 3, dtype=np.int32, low=-50, high=50)
    indices = np.array([[3, 0], [1, 1]], dtype=np.int64)
    check_op("Gather", [data, indices], {"axis": 0}, opset=version, const_inputs=(1,))


def test_gather_index_out_of_range_names_the_op():
    model, feeds = one_op_model("Gather", [rand(4, 3), np.array([1, 4], dtype=np.int64)])
    with pytest.raises(popart_runtime_error, match="Gather"):
        run_popart(model, feeds)
    model, feeds = one_op_model("Gather", [rand(4, 3), np.array([-5], dtype=np.int64)])
    with pytest.raises(popart_runtime_error, match="Gather"):
        run_popart(model, feeds)


@pytest.mark.parametrize("version", versions("GatherElements"))
@pytest.mark.parametrize("axis, index_dtype", [(0, np.int64), (1, np.int32), (-1, np.int64)])
def test_gather_elements(version, axis, index_dtype):
    data = rand(4, 5, 3)
    index_shape = (3, 5, 2)
    size = data.shape[axis]
    indices = rng.integers(-size, size, size=index_shape).astype(index_dtype)
    check_op("GatherElements", [data, indices], {"axis": axis}, opset=version)


@pytest.mark.parametrize("version", versions("GatherND"))
@pytest.mark.parametrize(
    "data_shape, index_shape, batch_dims",
    [((4, 5, 6), (3, 2), 0), ((4, 5, 6), (2, 2, 3), 0), ((4, 5), (7, 1), 0),
     ((3, 4, 5, 2), (3, 6, 2), 1), ((2, 3, 4, 5), (2, 3, 1), 2), ((2, 3, 4), (2, 3, 1), 2)],
)
def test_gather_nd(version, data_shape, index_shape, batch_dims):
    if batch_dims and version < 12:
        pytest.skip("batch_dims arrived in GatherND-12")
    data = rand(*data_shape)
    k = index_shape[-1]
    dims = np.array(data_shape[batch_dims : batch_dims + k])
    indices = (rng.integers(0, 1 << 30, size=index_shape) % dims).astype(np.int64)
    indices[..., 0] -= dims[0] * (rng.random(index_shape[:-1]) < 0.3)  # some negative
    attrs = {"batch_dims": batch_dims} if version >= 12 else {}
    check_op("GatherND", [data, indices], attrs, opset=version)


def test_gather_nd_out_of_range_names_the_op():
    model, feeds = one_op_model("GatherND", [rand(3, 4), np.array([[1, 4]], dtype=np.int64)])
    with pytest.raises(popart_runtime_error, match="GatherND"):
        run_popart(model, feeds)


# --- Scatter family -----------------------------------------------------------------------------


def _unique_indices(data_shape, axis, update_shape):
    """Indices along ``axis`` that never repeat within a line (the 'none' reduction needs it)."""
    size = data_shape[axis]
    moved = np.moveaxis(np.zeros(update_shape), axis, -1)
    out = np.empty(moved.shape, dtype=np.int64)
    for pos in np.ndindex(moved.shape[:-1]):
        out[pos] = rng.permutation(size)[: moved.shape[-1]]
    out = np.moveaxis(out, -1, axis)
    return np.where(rng.random(out.shape) < 0.3, out - size, out)


@pytest.mark.parametrize("version", versions("ScatterElements"))
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(version, axis):
    data = rand(4, 5, 6)
    update_shape = [3, 4, 5]
    indices = _unique_indices(data.shape, axis, update_shape)
    check_op("ScatterElements", [data, indices, rand(*update_shape)], {"axis": axis},
             opset=version)


@pytest.mark.parametrize("version", versions("ScatterElements", 16))
@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_elements_reduction(version, reduction):
    if reduction in ("max", "min") and version < 18:
        pytest.skip("max/min arrived in ScatterElements-18")
    data = rand(5, 4)
    indices = rng.integers(-5, 5, size=(6, 4)).astype(np.int64)  # with duplicates
    check_op("ScatterElements", [data, indices, rand(6, 4)],
             {"axis": 0, "reduction": reduction}, opset=version)


def test_scatter_elements_rejects_reduction_of_a_later_version():
    model, feeds = one_op_model(
        "ScatterElements", [rand(3), np.array([0], dtype=np.int64), rand(1)],
        {"reduction": "max"}, opset=16)
    with pytest.raises(Exception, match="ScatterElements.*'max'"):
        run_popart(model, feeds)


@pytest.mark.parametrize("version", versions("Scatter"))
def test_scatter_deprecated_alias(version):
    data = rand(4, 5)
    indices = _unique_indices(data.shape, 1, (4, 3)).astype(np.int32)
    updates = rand(4, 3)

    def ref(d, i, u):
        out = d.copy()
        np.put_along_axis(out, np.where(i < 0, i + d.shape[1], i).astype(np.int64), u, axis=1)
        return out

    # onnxruntime has no Scatter-11 kernel (the op is deprecated there): numpy is the reference.
    check_op("Scatter", [data, indices, updates], {"axis": 1}, opset=version,
             ref=ref if version >= 11 else None)


@pytest.mark.parametrize("version", versions("ScatterND"))
@pytest.mark.parametrize("index_shape", [(3, 1), (2, 2, 2), (4, 3)])
def test_scatter_nd(version, index_shape):
    data = rand(4, 5, 6)
    k = index_shape[-1]
    count = int(np.prod(index_shape[:-1]))
    flat = rng.permutation(int(np.prod(data.shape[:k])))[:count]
    indices = np.stack(np.unravel_index(flat, data.shape[:k]), -1).reshape(index_shape)
    indices[..., 0] -= data.shape[0] * (rng.random(index_shape[:-1]) < 0.3)
    updates = rand(*index_shape[:-1], *data.shape[k:])
    check_op("ScatterND", [data, indices.astype(np.int64), updates], opset=version)


@pytest.mark.parametrize("version", versions("ScatterND", 16))
@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_nd_reduction(version, reduction):
    if reduction in ("max", "min") and version < 18:
        pytest.skip("max/min arrived in ScatterND-18")
    data = rand(4, 3, 2)
    indices = rng.integers(0, 3, size=(5, 2)).astype(np.int64)  # with duplicates
    check_op("ScatterND", [data, indices, rand(5, 2)], {"reduction": reduction}, opset=version)


# --- OneHot, TopK, CumSum -----------------------------------------------------------------------


@pytest.mark.parametrize("version", versions("OneHot"))
@pytest.mark.parametrize("axis", [-1, 0, 1, -3])
# (indices, depth, values) dtypes: the combinations onnxruntime has kernels for.
@pytest.mark.parametrize(
    "dtypes", [(np.int64, np.int64, np.float32), (np.int32, np.float32, np.float32),
               (np.float32, np.int64, np.int64), (np.int64, np.float32, np.int32)])
def test_one_hot(version, axis, dtypes):
    index_dtype, depth_dtype, value_dtype = dtypes
    depth = 5
    indices = rng.integers(-depth - 1, depth + 2, size=(3, 4)).astype(index_dtype)
    if index_dtype == np.float32:
        indices[0] += 0.5  # fractional indices match no position
    values = np.array([-2, 7], dtype=value_dtype)
    check_op("OneHot", [indices, np.array(depth, dtype=depth_dtype), values], {"axis": axis},
             opset=version, const_inputs=(1,))


def test_one_hot_depth_not_constant_is_a_shape_error():
    model, feeds = one_op_model(
        "OneHot", [np.array([0, 1], np.int64), np.array(3, np.int64), np.array([0, 1], np.float32)])
    with pytest.raises(ShapeError, match="OneHot"):
        run_popart(model, feeds)


@pytest.mark.parametrize("version", versions("TopK"))
@pytest.mark.parametrize("axis", [-1, 0])
def test_topk_with_ties(version, axis):
    x = rng.integers(0, 4, size=(6, 7)).astype(np.float32)  # many ties: lower index first
    k = 3
    if version == 1:
        check_op("TopK", [x], {"k": k, "axis": axis}, opset=version, num_outputs=2)
    else:
        check_op("TopK", [x, np.array([k], np.int64)], {"axis": axis}, opset=version,
                 num_outputs=2, const_inputs=(1,))


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float64])
def test_topk_11_largest_and_dtypes(largest, dtype):
    x = rng.integers(-5, 5, size=(4, 9)).astype(dtype)
    check_op("TopK", [x, np.array([4], np.int64)], {"largest": largest, "axis": 1}, opset=11,
             num_outputs=2, const_inputs=(1,))


def test_topk_11_unsorted_returns_the_same_set():
    x = rand(3, 8)
    values, indices = check_op(
        "TopK", [x, np.array([3], np.int64)], {"sorted": 0}, opset=11, num_outputs=2,
        const_inputs=(1,), ref=lambda x, k: [np.sort(x)[:, ::-1][:, :3], np.argsort(-x)[:, :3]])
    assert values.shape == (3, 3) and indices.dtype == np.int64


@pytest.mark.parametrize("version", versions("CumSum"))
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis, dtype", [(0, np.float32), (-1, np.int32), (1, np.float64)])
def test_cumsum(version, exclusive, reverse, axis, dtype):
    x = rand(3, 4, 5, dtype=dtype, low=-10, high=10)
    axis_value = np.array(axis, dtype=np.int32 if axis < 0 else np.int64)
    check_op("CumSum", [x, axis_value], {"exclusive": exclusive, "reverse": reverse},
             opset=version, const_inputs=(1,))


# --- data-dependent shapes -----------------------------------------------------------------------


@pytest.mark.parametrize("version", versions("NonZero"))
def test_non_zero_folds_a_constant_input(version):
    x = (rng.random((3, 4)) < 0.5).astype(np.float32) * rand(3, 4)
    check_op("NonZero", [x], opset=version, const_inputs=(0,))


def test_non_zero_of_a_computed_input_is_unsupported():
    model, feeds = one_op_model("NonZero", [rand(3, 4)])
    with pytest.raises(UnsupportedOpError, match="NonZero.*compile time"):
        run_popart(model, feeds)


@pytest.mark.parametrize("version", versions("Compress"))
@pytest.mark.parametrize(
    "axis, condition",
    [(None, [1, 0, 0, 1, 1]), (0, [0, 1, 1]), (1, [1, 0, 1, 1]), (-1, [0, 1]), (1, [0, 0, 0])],
)
def test_compress_with_a_constant_condition(version, axis, condition):
    attrs = {} if axis is None else {"axis": axis}
    x = rand(3, 4, 2)
    check_op("Compress", [x, np.array(condition, dtype=bool)], attrs, opset=version,
             const_inputs=(1,))


def test_compress_with_a_computed_condition_is_unsupported():
    model, feeds = one_op_model("Compress", [rand(3, 4), np.array([1, 0, 1], dtype=bool)],
                                {"axis": 0})
    with pytest.raises(UnsupportedOpError, match="Compress"):
        run_popart(model, feeds)
