"""SessionOptions.enableConstantFoldingOfMultipleConsumers = False: a constant expression
reading a tensor that several ops read stays unfolded (the IR keeps its ops); the outputs
equal numpy's and those of the folded session. Compile-time operands (Reshape's shape) are
folded whatever the option."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart

C = np.array([0.5, -1.0, 2.0, 0.25], np.float32)


def _run(fold_multiple: bool):
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 4]), "x")
    c = b.aiOnnx.constant(C, "c")
    a = b.aiOnnx.neg([c])  # c has two readers: Neg and Exp
    e = b.aiOnnx.exp([c])
    y = b.aiOnnx.add([b.aiOnnx.add([x, a]), e])
    # A reshape whose shape is computed from a constant read twice: always folded.
    s = b.aiOnnx.constant(np.array([4], np.int64), "s")
    shape = b.aiOnnx.concat([s, s], 0)
    z = b.aiOnnx.reshape([b.aiOnnx.concat([y, y], 0), shape])
    b.addOutputTensor(z)
    opts = popart.SessionOptions()
    opts.enableConstantFoldingOfMultipleConsumers = fold_multiple
    session = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, [z]),
                                      popart.DeviceManager().createCpuDevice(), userOptions=opts)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    x_value = np.arange(8, dtype=np.float32).reshape(2, 4)
    session.run(popart.PyStepIO({x: x_value}, anchors))
    y_ref = x_value - C + np.exp(C)
    expected = np.concatenate([y_ref, y_ref]).reshape(4, 4)
    types = sorted(op.op_type for op in session.getIr().main.ops.values())
    return anchors[z], expected, types


@pytest.mark.parametrize("fold_multiple", [True, False])
def test_values_equal_numpy_either_way(fold_multiple):
    z, expected, _ = _run(fold_multiple)
    np.testing.assert_allclose(z, expected, rtol=1e-6)


def test_expressions_of_a_shared_constant_stay_unfolded_when_off():
    _, _, folded = _run(True)
    _, _, unfolded = _run(False)
    assert "Neg" not in folded and "Exp" not in folded
    assert "Neg" in unfolded and "Exp" in unfolded
    # The reshape's shape was folded in both.
    assert folded.count("Concat") == unfolded.count("Concat") == 1
