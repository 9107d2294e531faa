"""Floating-point exceptions (SessionOptions.enableFloatingPointChecks, PopTorch's
Precision.enableFloatingPointExceptions): the error names the op and the step, i.e. which
run() call and which micro-batch of it (batch, accumulation step, replica) produced the inf or
NaN. The expected micro-batch is computed from the host array layout of the spec
([batchesPerStep, accumulationFactor, replicas, ...]), where the bad value was placed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart


def _div_model(shape):
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", shape), "x")
    y = builder.addInputTensor(popart.TensorInfo("FLOAT", shape), "y")
    w = builder.addInitializedInputTensor(np.ones(shape[1:], np.float32), "w")
    q = builder.aiOnnx.div([x, y], "ratio")
    out = builder.aiOnnx.mul([q, w])
    loss = builder.aiGraphcore.l1loss([out], 0.5, reduction=popart.ReductionType.Sum)
    builder.addOutputTensor(out)
    return builder.getModelProto(), x, y, out, loss


def _feeds(host_shape, bad=None):
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1.0, host_shape).astype(np.float32)
    y = rng.uniform(0.5, 1.0, host_shape).astype(np.float32)
    if bad is not None:
        y[bad + (0,)] = 0.0  # x / 0 = inf in that micro-batch only
    return x, y


@pytest.mark.parametrize("replicas", [1, 2])
def test_inference_error_names_op_run_and_micro_batch(replicas):
    proto, x, y, out, _ = _div_model([2, 3])
    options = popart.SessionOptions()
    options.enableFloatingPointChecks = True
    if replicas > 1:
        options.enableReplicatedGraphs = True
        options.replicatedGraphCount = replicas
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": replicas})
    session = popart.InferenceSession(proto, popart.DataFlow(3, [out]), device,
                                      userOptions=options)
    session.prepareDevice()
    host = (3, replicas, 2, 3) if replicas > 1 else (3, 2, 3)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(dict(zip((x, y), _feeds(host))), anchors))  # run 1: clean
    batch, replica = 2, replicas - 1
    bad = (batch, replica, 1) if replicas > 1 else (batch, 1)
    with pytest.raises(popart.popart_runtime_error) as info:
        session.run(popart.PyStepIO(dict(zip((x, y), _feeds(host, bad))), anchors))
    message = str(info.value)
    index = batch * replicas + replica
    assert "ratio" in message and "Div" in message, message
    assert "run() call 2" in message, message
    assert (f"micro-batch {index} of that call (batch {batch}, accumulation step 0, replica "
            f"{replica})") in message, message


def test_training_error_names_accumulation_step():
    proto, x, y, _, loss = _div_model([2, 3])
    options = popart.SessionOptions()
    options.enableFloatingPointChecks = True
    options.enableGradientAccumulation = True
    options.accumulationFactor = 2
    session = popart.TrainingSession(proto, popart.DataFlow(2, {}), loss,
                                     popart.SGD({"defaultLearningRate": (0.01, True)}),
                                     popart.DeviceManager().createCpuDevice(),
                                     userOptions=options)
    session.prepareDevice()
    session.weightsFromHost()
    host = (2, 2, 2, 3)  # [batchesPerStep, accumulationFactor, micro-batch ...]
    with pytest.raises(popart.popart_runtime_error) as info:
        session.run(popart.PyStepIO(dict(zip((x, y), _feeds(host, (1, 0, 1)))), {}))
    message = str(info.value)
    assert "ratio" in message and "run() call 1" in message, message
    assert "micro-batch 2 of that call (batch 1, accumulation step 0, replica 0)" in message, \
        message


def test_checks_off_let_inf_through():
    proto, x, y, out, _ = _div_model([2, 3])
    session = popart.InferenceSession(proto, popart.DataFlow(1, [out]),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(dict(zip((x, y), _feeds((2, 3), (1,)))), anchors))
    assert np.isinf(anchors[out]).any()


class _Ratio(torch.nn.Module):
    def forward(self, a, b):
        return torch.relu(a / b)


def test_poptorch_error_names_op_and_call():
    import poptorch_lite as poptorch

    opts = poptorch.Options()
    opts.Precision.enableFloatingPointExceptions(True)
    model = poptorch.inferenceModel(_Ratio(), opts)
    a = torch.full((2, 3), 0.75)
    model(a, torch.ones(2, 3))  # call 1: finite
    b = torch.ones(2, 3)
    b[1, 1] = 0.0
    with pytest.raises(Exception) as info:
        model(a, b)
    message = str(info.value)
    assert "Div" in message and "floating-point exception" in message, message
    assert "run() call 2" in message and "micro-batch 0" in message, message
    model.destroy()
