"""MatMul, Gemm and Einsum (spec §6.1, F78) against onnxruntime, at every registered version."""

import numpy as np
import onnx.defs
import pytest
import torch

from popart_backend.errors import ShapeError
from popart_backend.ops.registry import registered_versions
from tests.helpers import check_op, one_op_model, rand, run_popart

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((7, 2, 3, 4), (1, 4, 6)),
]


@pytest.mark.parametrize("version", registered_versions("MatMul"))
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul_f78(version, shapes):
    a, b = shapes
    check_op("MatMul", [rand(*a), rand(*b)], opset=version)


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.int64, np.uint32, np.uint64])
def test_matmul_dtypes(dtype):
    if np.dtype(dtype).kind == "f":
        check_op("MatMul", [rand(2, 3, 8, dtype=dtype), rand(8, 5, dtype=dtype)], opset=13)
        return
    a = rand(2, 3, 4, dtype=dtype, low=0, high=50)
    b = rand(4, 5, dtype=dtype, low=0, high=50)
    check_op("MatMul", [a, b], opset=13, ref=lambda a, b: np.matmul(a, b).astype(dtype))


def test_matmul_inner_dims_error_names_op_and_shapes():
    model, feeds = one_op_model("MatMul", [rand(8, 256), rand(128, 10)], opset=13)
    with pytest.raises(ShapeError, match=r"MatMul .*inner dims.*f32\[8,256\].*f32\[128,10\]"):
        run_popart(model, feeds)


def test_matmul_batch_dims_error():
    model, feeds = one_op_model("MatMul", [rand(2, 3, 4), rand(3, 4, 5)], opset=13)
    with pytest.raises(ShapeError, match="MatMul"):
        run_popart(model, feeds)


def _gemm_ref(alpha=1.0, beta=1.0, transA=0, transB=0, **_):
    def ref(a, b, c=None):
        a = a.T if transA else a
        b = b.T if transB else b
        y = alpha * (a.astype(np.float64) @ b.astype(np.float64))
        if c is not None:
            y = y + beta * c
        return y.astype(a.dtype)

    return ref


GEMM_CASES = [
    dict(attrs={}, c=(3, 5)),
    dict(attrs={"transB": 1}, c=(5,)),
    dict(attrs={"transB": 1}, c=(3, 5)),
    dict(attrs={"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, c=(1, 5)),
    dict(attrs={"transA": 1, "alpha": 1.5}, c=(3, 1)),
    dict(attrs={"alpha": 2.0, "beta": 0.25}, c=()),
    dict(attrs={"transB": 1, "alpha": 2.0}, c=None),
    dict(attrs={}, c=None),
]


@pytest.mark.parametrize("version", registered_versions("Gemm"))
@pytest.mark.parametrize("case", GEMM_CASES, ids=lambda c: f"{c['attrs']}-C{c['c']}")
def test_gemm_f78(version, case):
    attrs = dict(case["attrs"])
    a = rand(4, 3) if attrs.get("transA") else rand(3, 4)
    b = rand(5, 4) if attrs.get("transB") else rand(4, 5)
    c_shape = case["c"]
    if c_shape is None and version < 11:
        model, feeds = one_op_model("Gemm", [a, b], attrs, opset=version)
        with pytest.raises(ShapeError, match="C is required before Gemm-11"):
            run_popart(model, feeds)
        return
    c = rand(*c_shape) if c_shape is not None else None
    inputs = [a, b] if c is None else [a, b, c]
    ref = None
    if version < 7:
        # onnxruntime has no Gemm-1/6; the legacy broadcast attribute must be set for C to broadcast.
        if c is not None and c.shape != (3, 5):
            attrs["broadcast"] = 1
        ref = _gemm_ref(**attrs)
    check_op("Gemm", inputs, attrs=attrs, opset=version, ref=ref, rtol=1e-5, atol=1e-5)


def test_gemm_legacy_broadcast_required():
    model, feeds = one_op_model("Gemm", [rand(3, 4), rand(4, 5), rand(5)], opset=6)
    with pytest.raises(ShapeError, match="broadcast=0"):
        run_popart(model, feeds)


def test_gemm_int_and_f16():
    a, b, c = (rand(3, 4, dtype=np.int64, low=-5, high=5), rand(4, 5, dtype=np.int64, low=-5, high=5),
               rand(5, dtype=np.int64, low=-5, high=5))
    check_op("Gemm", [a, b, c], attrs={"alpha": 2.0, "beta": 3.0}, opset=13,
             ref=lambda a, b, c: (2 * a @ b + 3 * c).astype(np.int64))
    check_op("Gemm", [rand(3, 4, dtype=np.float16), rand(5, 4, dtype=np.float16),
                      rand(5, dtype=np.float16)], attrs={"transB": 1}, opset=13)


def test_gemm_inner_dims_error():
    model, feeds = one_op_model("Gemm", [rand(3, 4), rand(5, 4)], opset=13)
    with pytest.raises(ShapeError, match="Gemm.*inner dims"):
        run_popart(model, feeds)


EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ij,ij->", [(3, 4), (3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...j->...", [(2, 3, 4)]),
]


@pytest.mark.parametrize("equation,shapes", EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES])
def test_einsum_f78(equation, shapes):
    check_op("Einsum", [rand(*s) for s in shapes], attrs={"equation": equation}, opset=12,
             rtol=1e-5, atol=1e-5)


def test_einsum_int():
    a, b = rand(3, 4, dtype=np.int64, low=-5, high=5), rand(4, 2, dtype=np.int64, low=-5, high=5)
    check_op("Einsum", [a, b], attrs={"equation": "ij,jk->ik"}, opset=12,
             ref=lambda a, b: np.einsum("ij,jk->ik", a, b))


@pytest.mark.parametrize("equation,shapes,why", [
    ("ij,jk->ik", [(3, 4), (5, 6)], "label 'j'"),
    ("ij,jk->ik", [(3, 4)], "1 input"),
    ("ijk->ik", [(3, 4)], "rank"),
    ("ij->iz", [(3, 4)], "'z'"),
])
def test_einsum_equation_errors(equation, shapes, why):
    model, feeds = one_op_model("Einsum", [rand(*s) for s in shapes], {"equation": equation},
                                opset=12)
    with pytest.raises(ShapeError, match=f"Einsum.*{equation}.*{why}"):
        run_popart(model, feeds)


def test_matmul_kernel_matches_torch_directly():
    """The MatMul kernel is torch.matmul itself (no copies): a large case is bitwise equal."""
    a, b = rand(4, 32, 64, seed=1), rand(64, 48, seed=2)
    model, feeds = one_op_model("MatMul", [a, b], opset=13)
    out = run_popart(model, feeds)["out0"]
    np.testing.assert_array_equal(out, torch.matmul(torch.from_numpy(a), torch.from_numpy(b)).numpy())


@pytest.mark.parametrize("op", ["MatMul", "Gemm", "Einsum"])
def test_every_onnx_version_up_to_28_is_registered_f82(op):
    expected = sorted({
        s.since_version
        for s in onnx.defs.get_all_schemas_with_history()
        if s.name == op and s.domain == "" and s.since_version <= 28
    })
    assert registered_versions(op) == expected
