"""SessionOptions.decomposeGradSum (training): the gradient Sum of a tensor read by several ops
becomes a chain of Adds. The trained weights equal those of the undecomposed run and numpy's
hand-written gradient; the IR differs, each Add is one more superstep, and the liveness walk
lets the partial gradients die as they are added."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart

B, D = 4, 16
LR = 0.1


def _train(decompose: bool):
    rng = np.random.default_rng(0)
    w_value = rng.standard_normal((D, D)).astype(np.float32) * 0.3
    x_value = rng.standard_normal((B, D)).astype(np.float32)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [B, D]), "x")
    w = b.addInitializedInputTensor(w_value, "w")
    h = b.aiOnnx.matmul([x, w])
    # h has three readers (Mul reads it twice), so its gradient is the sum of four partials.
    branches = [b.aiOnnx.tanh([h]), b.aiOnnx.sigmoid([h]), b.aiOnnx.mul([h, h])]
    total = b.aiOnnx.sum(branches)
    loss = b.aiGraphcore.l1loss([total], 1.0, reduction=popart.ReductionType.Sum)
    opts = popart.SessionOptions()
    opts.decomposeGradSum = decompose
    opts.engineOptions = {"autoReport.all": "true"}
    session = popart.TrainingSession(
        b.getModelProto(), popart.DataFlow(1, [loss]), loss, popart.ConstSGD(LR),
        popart.DeviceManager().createIpuModelDevice({}), userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    session.run(popart.PyStepIO({x: x_value}, session.initAnchorArrays()))
    out = {w: np.zeros((D, D), np.float32)}
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(out))
    return session, out[w], (x_value, w_value)


def _reference(x, w):
    """One SGD step of the model by hand."""
    h = x @ w
    t, s = np.tanh(h), 1 / (1 + np.exp(-h))
    sign = np.sign(t + s + h * h)
    dh = sign * (1 - t * t) + sign * s * (1 - s) + sign * 2 * h
    return w - LR * (x.T @ dh)


@pytest.fixture(scope="module")
def runs():
    return _train(False), _train(True)


def _grad_sums(session):
    return [op for op in session.getIr().main.ops.values()
            if op.op_type == "Sum" and op.outputs[0].id.startswith("Gradient___")]


def test_decomposed_grad_sum_keeps_the_numbers(runs):
    (plain, w_plain, (x, w0)), (decomposed, w_decomposed, _) = runs
    np.testing.assert_array_equal(w_decomposed, w_plain)
    np.testing.assert_allclose(w_decomposed, _reference(x, w0), rtol=1e-5, atol=1e-5)


def test_decomposed_grad_sum_is_a_chain_of_adds(runs):
    (plain, _, _), (decomposed, _, _) = runs
    sums = _grad_sums(plain)
    assert [len(op.inputs) for op in sums] == [4]
    assert _grad_sums(decomposed) == []
    chain = [op for op in decomposed.getIr().main.ops.values()
             if op.op_type == "Add" and op.settings.early_in_liveness]
    assert len(chain) == 3
    assert sums[0].outputs[0].id in {op.outputs[0].id for op in chain}


def test_decomposed_grad_sum_changes_the_cycles_and_not_the_peak_upwards(runs):
    (plain, _, _), (decomposed, _, _) = runs
    model_plain, model_dec = plain.getReport().model, decomposed.getReport().model
    assert model_dec.cycles.step_cycles != model_plain.cycles.step_cycles
    peak = lambda m: m.memory.ipus[0].categories["activations"]  # noqa: E731
    assert peak(model_dec) <= peak(model_plain)
