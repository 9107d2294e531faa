"""SessionOptions.partialsTypeMatMuls = "half" (spec §2.4): float16 MatMul / Gemm (and their
gradients) accumulate in float16 (ops/matmul.py, transforms/numerics_options.py).

The reference is numpy float16 arithmetic: each product a_ik·b_kj rounded to float16, added in
order k = 0, 1, ... to a float16 sum (numpy rounds every float16 operation).
"""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart
from tests.helpers import rand


def half_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy float16 matmul with a float16 running sum (broadcast batch dims)."""
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    acc = np.zeros(np.broadcast_shapes(a16.shape[:-2], b16.shape[:-2])
                   + (a16.shape[-2], b16.shape[-1]), np.float16)
    for k in range(a16.shape[-1]):
        acc = acc + a16[..., :, k:k + 1] * b16[..., k:k + 1, :]
    return acc


def run(build, feeds, partials="half", training=False):
    builder = popart.Builder(opsets={"ai.onnx": 13, "ai.graphcore": 1})
    dtype = {np.float16: "FLOAT16", np.float32: "FLOAT"}
    ids = [builder.addInputTensor(popart.TensorInfo(dtype[v.dtype.type], list(v.shape)), name)
           for name, v in feeds.items()]
    out = build(builder, builder.aiOnnx, *ids)
    builder.addOutputTensor(out)
    options = popart.SessionOptions()
    options.partialsTypeMatMuls = partials
    session = popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, [out]),
                                      popart.DeviceManager().createCpuDevice(),
                                      userOptions=options)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(dict(zip(ids, feeds.values())), anchors))
    return anchors[out], session


def matmul(b, ops, x, y):
    return ops.matmul([x, y])


@pytest.mark.parametrize("a_shape, b_shape", [((5, 64), (64, 7)), ((2, 3, 33), (33, 4)),
                                              ((3, 1, 4, 16), (2, 16, 5))])
def test_float16_matmul_accumulates_in_float16(a_shape, b_shape):
    a = rand(*a_shape, dtype=np.float16, seed=1, low=0, high=2)
    b = rand(*b_shape, dtype=np.float16, seed=2, low=0, high=2)
    got, _ = run(matmul, {"a": a, "b": b})
    np.testing.assert_array_equal(got, half_reference(a, b))


def test_vector_operands():
    a = rand(40, dtype=np.float16, seed=3)
    b = rand(40, 6, dtype=np.float16, seed=4)
    got, _ = run(matmul, {"a": a, "b": b})
    np.testing.assert_array_equal(got, half_reference(a[None], b)[0])
    got, _ = run(matmul, {"b": b.T.copy(), "a": a})
    np.testing.assert_array_equal(got, half_reference(b.T, a[:, None])[:, 0])


def test_half_partials_lose_what_float_partials_keep():
    # 4096 ones: float32 partials reach 4096 exactly; a float16 sum stops at 2048, where
    # 2048 + 1 rounds back to 2048 (float16 has an 11-bit significand).
    a = np.ones((1, 4096), np.float16)
    b = np.ones((4096, 1), np.float16)
    half, _ = run(matmul, {"a": a, "b": b})
    assert half[0, 0] == 2048
    for partials in ("float", ""):
        full, _ = run(matmul, {"a": a, "b": b}, partials=partials)
        assert full[0, 0] == 4096


def test_float32_products_are_unaffected():
    a, b = rand(6, 50, seed=5), rand(50, 3, seed=6)
    half, _ = run(matmul, {"a": a, "b": b})
    plain, _ = run(matmul, {"a": a, "b": b}, partials="")
    np.testing.assert_array_equal(half, plain)


def test_gemm_and_matmul_add_keep_half_partials():
    a = rand(4, 24, dtype=np.float16, seed=7, low=0, high=2)
    w = rand(5, 24, dtype=np.float16, seed=8, low=0, high=2)
    c = rand(5, dtype=np.float16, seed=9)
    got, _ = run(lambda bl, ops, x, y, z: ops.gemm([x, y, z], alpha=0.5, beta=2.0, transB=1),
                 {"a": a, "w": w, "c": c})
    ref = half_reference(a, w.T) * np.float16(0.5) + c * np.float16(2.0)
    np.testing.assert_array_equal(got, ref)
    # MatMul + bias Add is not fused into an addmm with float32 partials.
    got, session = run(lambda bl, ops, x, y, z: ops.add([ops.matmul([x, y]), z]),
                       {"a": a, "wt": w.T.copy(), "c": c})
    np.testing.assert_array_equal(got, half_reference(a, w.T) + c)
    assert "MatMul" in {op.op_type for op in session.getIr().main.ops.values()}


def test_training_marks_the_gradient_products():
    builder = popart.Builder(opsets={"ai.onnx": 13, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT16", [2, 8]), "x")
    w = builder.addInitializedInputTensor(rand(8, 3, dtype=np.float16, seed=10), "w")
    y = builder.aiOnnx.matmul([x, w])
    loss = builder.aiGraphcore.l1loss([y], 1.0)
    options = popart.SessionOptions()
    options.partialsTypeMatMuls = "half"
    session = popart.TrainingSession(builder.getModelProto(), popart.DataFlow(1, [loss]), loss,
                                     popart.ConstSGD(0.1),
                                     popart.DeviceManager().createCpuDevice(),
                                     userOptions=options)
    marked = {op.op_type for op in session.getIr().main.ops.values()
              if getattr(op, "half_partials", False)}
    assert {"MatMul", "MatMulRhsGrad"} <= marked


def test_unknown_partials_type_is_rejected():
    a = rand(2, 2, dtype=np.float16, seed=11)
    with pytest.raises(popart.popart_exception, match="partialsTypeMatMuls = 'double'.*half"):
        run(matmul, {"a": a, "b": a}, partials="double")
