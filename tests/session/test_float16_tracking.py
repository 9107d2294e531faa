"""float16 training of an MLP and a CNN tracks the float32 run within float16 tolerances:
both runs start from the same (float16-representable) weights and see the same data; the
float32 run equals torch's float32 SGD steps, and the float16 run stays within float16
tolerances of it (and is not simply equal to it: it really computes in float16)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart

STEPS, LR = 5, 0.01
RNG = np.random.default_rng(12)


def _f16_exact(shape, scale):
    return (RNG.standard_normal(shape) * scale).astype(np.float16).astype(np.float32)


MLP = {"w1": _f16_exact((8, 16), 0.4), "w2": _f16_exact((16, 4), 0.3)}
MLP_X = [_f16_exact((4, 8), 1.0) for _ in range(STEPS)]
CNN = {"wc": _f16_exact((3, 1, 3, 3), 0.5), "wf": _f16_exact((48, 5), 0.2)}
CNN_X = [_f16_exact((2, 1, 6, 6), 1.0) for _ in range(STEPS)]


def _mlp(builder, x, w):
    ops = builder.aiOnnx
    return ops.matmul([ops.relu([ops.matmul([x, w["w1"]])]), w["w2"]])


def _cnn(builder, x, w):
    ops = builder.aiOnnx
    h = ops.relu([ops.conv([x, w["wc"]], strides=[1, 1], pads=[0, 0, 0, 0])])
    return ops.matmul([ops.flatten([h], axis=1), w["wf"]])


def _train(build, weights, data, dtype):
    np_dtype = np.float16 if dtype == "FLOAT16" else np.float32
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo(dtype, list(data[0].shape)), "x")
    ids = {k: builder.addInitializedInputTensor(v.astype(np_dtype), k) for k, v in weights.items()}
    y = build(builder, x, ids)
    loss = builder.aiGraphcore.l1loss([y], 0.5, reduction=popart.ReductionType.Sum)
    session = popart.TrainingSession(builder.getModelProto(), popart.DataFlow(1, [loss]), loss,
                                     popart.ConstSGD(LR), popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    for batch in data:
        session.run(popart.PyStepIO({x: batch.astype(np_dtype)}, session.initAnchorArrays()))
    session.weightsToHost()
    out = {ids[k]: np.zeros(v.shape, np_dtype) for k, v in weights.items()}
    session.readWeights(popart.PyWeightsIO(out))
    return {k: out[ids[k]].astype(np.float32) for k in weights}


def _torch(forward, weights, data):
    params = {k: torch.tensor(v, requires_grad=True) for k, v in weights.items()}
    opt = torch.optim.SGD(params.values(), lr=LR)
    for batch in data:
        opt.zero_grad()
        (0.5 * forward(torch.from_numpy(batch), params).abs().sum()).backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in params.items()}


def _torch_mlp(x, p):
    return torch.relu(x @ p["w1"]) @ p["w2"]


def _torch_cnn(x, p):
    return torch.relu(torch.nn.functional.conv2d(x, p["wc"])).flatten(1) @ p["wf"]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_float16_training_tracks_float32(name):
    build, weights, data, forward = {
        "mlp": (_mlp, MLP, MLP_X, _torch_mlp),
        "cnn": (_cnn, CNN, CNN_X, _torch_cnn),
    }[name]
    reference = _torch(forward, weights, data)
    full = _train(build, weights, data, "FLOAT")
    half = _train(build, weights, data, "FLOAT16")
    for k in weights:
        np.testing.assert_allclose(full[k], reference[k], rtol=1e-5, atol=1e-6, err_msg=k)
        moved = np.abs(reference[k] - weights[k]).max()
        assert moved > 1e-3, k  # the steps change the weights well beyond float16's error
        # float16: ~3 significant digits per value, a few roundings per step.
        np.testing.assert_allclose(half[k], reference[k], rtol=1e-2, atol=5e-3, err_msg=k)
    assert any(not np.array_equal(half[k], full[k]) for k in weights)
