"""Builder details PopART programs rely on (spec §3.1, F17): ``aiOnnx.cast`` with PopART's type
names, BatchNormalization's five training outputs (inference and training), Resize's
``nearest_mode="pytorch"``, uint32 gather indices, ``ctcloss(zeroInfinity=...)``, and the
errors PopART raises for a bad broadcast, a detached gradient and bad reverse dimensions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart
from tests.helpers import assert_close

GRAD = popart.reservedGradientPrefix()


def _run(builder, feeds, outputs, training=False, loss=None, lr=0.0):
    device = popart.DeviceManager().createCpuDevice()
    flow = popart.DataFlow(1, outputs)
    proto = builder.getModelProto()
    if training:
        session = popart.TrainingSession(proto, flow, loss, popart.ConstSGD(lr), device)
    else:
        session = popart.InferenceSession(proto, flow, device)
    session.prepareDevice()
    if training:
        session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, anchors))
    return [anchors[o] for o in outputs], session


# --- cast -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,dtype", [
    ("FLOAT16", np.float16), ("INT32", np.int32), ("UINT8", np.uint8), ("BOOL", np.bool_),
    ("FLOAT", np.float32), ("INT8", np.int8), ("float16", np.float16),
])
def test_cast_takes_popart_type_names(name, dtype):
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [5]))
    y = builder.aiOnnx.cast([x], name)
    data = np.array([-1.5, 0.0, 0.7, 2.0, 3.25], np.float32)
    if dtype == np.uint8:
        data = np.abs(data)
    (out,), _ = _run(builder, {x: data}, [y])
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, data.astype(dtype))


def test_cast_rejects_an_unknown_type_name():
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [5]))
    with pytest.raises(popart.popart_exception, match="Unknown data type string 'FLAOT'"):
        builder.aiOnnx.cast([x], "FLAOT")


# --- BatchNormalization with its five outputs -------------------------------------------------


def _bn_model(opset):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    params = [rng.uniform(0.5, 1.5, 3), rng.uniform(-1, 1, 3), rng.uniform(-0.5, 0.5, 3),
              rng.uniform(0.5, 2, 3)]
    params = [p.astype(np.float32) for p in params]
    builder = popart.Builder(opsets={"ai.onnx": opset, "ai.graphcore": 1})
    x_id = builder.addInputTensor(popart.TensorInfo("FLOAT", list(x.shape)))
    ids = [builder.addInitializedInputTensor(p) for p in params]
    outs = builder.aiOnnx.batchnormalization([x_id, *ids], 5, epsilon=1e-5, momentum=0.8)
    return builder, x, x_id, params, ids, outs


@pytest.mark.parametrize("opset", [9, 11])
def test_batchnormalization_five_outputs_in_inference(opset):
    builder, x, x_id, (scale, bias, mean, var), _, outs = _bn_model(opset)
    values, _ = _run(builder, {x_id: x}, outs)
    want = torch.nn.functional.batch_norm(*map(torch.from_numpy, (x, mean, var, scale, bias)))
    assert_close(values[0], want.numpy(), rtol=1e-5, atol=1e-5)
    assert_close(values[1], mean)
    assert_close(values[2], var)
    assert_close(values[3], x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    assert_close(values[4], x.var(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)


def test_batchnormalization_five_outputs_in_training():
    builder, x, x_id, (scale, bias, mean, var), ids, outs = _bn_model(9)
    rng = np.random.default_rng(1)
    seed = rng.uniform(-1, 1, x.shape).astype(np.float32)
    weighted = builder.aiOnnx.mul([outs[0], builder.aiOnnx.constant(seed)])
    loss = builder.aiGraphcore.identityloss([weighted], reduction=popart.ReductionType.Sum)
    values, session = _run(builder, {x_id: x}, outs + [GRAD + ids[0], GRAD + ids[1]],
                           training=True, loss=loss)

    leaves = [torch.tensor(p, requires_grad=True) for p in (scale, bias)]
    running = [torch.from_numpy(mean.copy()), torch.from_numpy(var.copy())]
    y = torch.nn.functional.batch_norm(torch.from_numpy(x), *running, *leaves, training=True,
                                       momentum=0.2, eps=1e-5)
    (y * torch.from_numpy(seed)).sum().backward()
    assert_close(values[0], y.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert_close(values[1], running[0].numpy(), rtol=1e-5, atol=1e-6)
    assert_close(values[2], running[1].numpy(), rtol=1e-5, atol=1e-6)
    assert_close(values[3], x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    assert_close(values[4], x.var(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    assert_close(values[5], leaves[0].grad.numpy(), rtol=1e-4, atol=1e-5)
    assert_close(values[6], leaves[1].grad.numpy(), rtol=1e-4, atol=1e-5)
    # The running statistics are state: the host sees them updated.
    weights = {ids[2]: np.zeros(3, np.float32), ids[3]: np.zeros(3, np.float32)}
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(weights))
    assert_close(weights[ids[2]], running[0].numpy(), rtol=1e-5, atol=1e-6)


# --- Resize nearest_mode="pytorch" ------------------------------------------------------------


@pytest.mark.parametrize("scales,transform", [
    ([1.0, 1.0, 0.75, 2.5], "half_pixel"), ([1.0, 1.0, 0.5, 1.5], "asymmetric"),
    ([1.0, 1.0, 0.75, 3.0], "align_corners")])
def test_resize_nearest_mode_pytorch_is_torch_nearest(scales, transform):
    x = np.arange(2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4)
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x_id = builder.addInputTensor(popart.TensorInfo("FLOAT", list(x.shape)))
    roi = builder.aiOnnx.constant(np.array([], np.float32))
    scales_id = builder.aiOnnx.constant(np.array(scales, np.float32))
    y = builder.aiOnnx.resize([x_id, roi, scales_id], mode="nearest", nearest_mode="pytorch",
                              coordinate_transformation_mode=transform)
    (out,), _ = _run(builder, {x_id: x}, [y])
    want = torch.nn.functional.interpolate(torch.from_numpy(x), scale_factor=scales[2:],
                                           mode="nearest")
    np.testing.assert_array_equal(out, want.numpy())


def test_resize_rejects_an_unknown_nearest_mode():
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x_id = builder.addInputTensor(popart.TensorInfo("FLOAT", [1, 1, 2, 2]))
    roi = builder.aiOnnx.constant(np.array([], np.float32))
    scales_id = builder.aiOnnx.constant(np.array([1, 1, 2, 2], np.float32))
    y = builder.aiOnnx.resize([x_id, roi, scales_id], nearest_mode="torch")
    with pytest.raises(popart.popart_exception, match="nearest_mode 'torch'.*pytorch"):
        _run(builder, {x_id: np.zeros((1, 1, 2, 2), np.float32)}, [y])


# --- uint32 gather indices ----------------------------------------------------------------------


def test_gather_takes_uint32_indices_with_gradient():
    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    ids = np.array([[0, 4], [4, 2]], np.uint32)
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    w = builder.addInitializedInputTensor(table)
    i = builder.addInputTensor(popart.TensorInfo("UINT32", [2, 2]))
    y = builder.aiOnnx.gather([w, i], axis=0)
    loss = builder.aiGraphcore.identityloss([y], reduction=popart.ReductionType.Sum)
    (out, grad), _ = _run(builder, {i: ids}, [y, GRAD + w], training=True, loss=loss)
    np.testing.assert_array_equal(out, table[ids.astype(np.int64)])
    want = np.zeros_like(table)
    np.add.at(want, ids.reshape(-1).astype(np.int64), 1.0)
    np.testing.assert_array_equal(grad, want)


def test_gather_uint32_index_out_of_range_fails_naming_the_op():
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    w = builder.addInitializedInputTensor(np.zeros((5, 3), np.float32))
    i = builder.addInputTensor(popart.TensorInfo("UINT32", [2]))
    y = builder.aiOnnx.gather([w, i], axis=0, debugContext="embed")
    with pytest.raises(popart.popart_exception, match="Gather.*index out of range"):
        _run(builder, {i: np.array([1, 5], np.uint32)}, [y])


# --- ctcloss zeroInfinity -----------------------------------------------------------------------


@pytest.mark.parametrize("zero_infinity", [0, 1])
def test_ctcloss_zero_infinity(zero_infinity):
    torch.manual_seed(0)
    log_probs = torch.randn(3, 2, 4).log_softmax(-1)
    # The first sample's 3 labels cannot fit in 2 steps: its loss is infinite.
    targets = np.array([[1, 2, 3], [1, 2, 0]], np.int32)
    in_len, tgt_len = np.array([2, 3], np.int32), np.array([3, 2], np.int32)
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    lp = builder.addInitializedInputTensor(log_probs.numpy())
    ids = [builder.addInputTensor(popart.TensorInfo("INT32", list(a.shape)))
           for a in (targets, in_len, tgt_len)]
    loss = builder.aiGraphcore.ctcloss([lp, *ids], reduction=popart.ReductionType.Sum,
                                       zeroInfinity=zero_infinity)
    (value, grad), _ = _run(builder, dict(zip(ids, (targets, in_len, tgt_len))),
                            [loss, GRAD + lp], training=True, loss=loss)
    leaf = log_probs.clone().requires_grad_(True)
    want = torch.nn.functional.ctc_loss(leaf, torch.from_numpy(targets).long(),
                                        torch.from_numpy(in_len).long(),
                                        torch.from_numpy(tgt_len).long(), reduction="sum",
                                        zero_infinity=bool(zero_infinity))
    if not zero_infinity:
        assert np.isinf(value)
        return
    want.backward()
    assert_close(value, np.float32(want.item()), rtol=1e-5, atol=1e-5)
    assert_close(grad, leaf.grad.numpy(), rtol=1e-4, atol=1e-5)


# --- errors PopART raises -----------------------------------------------------------------------


def _session_error(build, shapes):
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    ids = [builder.addInputTensor(popart.TensorInfo("FLOAT", s)) for s in shapes]
    y = build(builder, *ids)
    popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, [y]),
                            popart.DeviceManager().createCpuDevice())


def test_bad_broadcast_names_the_shapes():
    with pytest.raises(popart.popart_exception, match=r"Add.*\[2, 3\], \[4, 3\] do not broadcast"):
        _session_error(lambda b, x, y: b.aiOnnx.add([x, y]), [[2, 3], [4, 3]])


@pytest.mark.parametrize("dims,match", [
    ([2], r"dimensions \[2\] must be axes of the input"),
    ([-3], r"dimensions \[-3\] must be axes"),
    ([0, -2], r"name an axis of .* twice"),
])
def test_reverse_with_bad_dimensions(dims, match):
    with pytest.raises(popart.popart_exception, match=match):
        _session_error(lambda b, x: b.aiGraphcore.reverse([x], dims), [[2, 3]])


def test_gradient_of_a_detached_weight_is_refused():
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    w = builder.addInitializedInputTensor(np.ones(3, np.float32))
    loss = builder.aiGraphcore.identityloss([builder.aiGraphcore.detach([w])])
    with pytest.raises(popart.popart_exception, match="has no gradient.*detach"):
        _run(builder, {}, [loss, GRAD + w], training=True, loss=loss)
    with pytest.raises(popart.popart_exception, match="Detach-1 takes 1 inputs, got 2"):
        builder.aiGraphcore.detach([w, w])
