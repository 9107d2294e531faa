"""The ai.graphcore Builder ops batchnormalization, normalize_image, nearbyint,
replicatedreducescatter, slice, bucketize, sort, groupedscatterreduce, groupedgather,
incrementmod, tensorremap, splinebasis and splineweighting (spec §6.3, F17): each built with
``builder.aiGraphcore``, run in an InferenceSession against numpy / torch, its gradient (where it
has one) run in a TrainingSession against torch.autograd, and its error cases.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart
from tests.helpers import assert_close, rand

_DTYPES = {np.float32: "FLOAT", np.float16: "FLOAT16", np.int32: "INT32", np.int64: "INT64",
           np.uint8: "UINT8", np.uint32: "UINT32"}


def run_builder(build, *arrays):
    """``build(builder, aiGraphcore, *input ids)`` returns output id(s); one InferenceSession
    run at ai.onnx opset 11; returns the numpy outputs."""
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    ids = [builder.addInputTensor(popart.TensorInfo(_DTYPES[a.dtype.type], list(a.shape)))
           for a in arrays]
    result = build(builder, builder.aiGraphcore, *ids)
    result = [result] if isinstance(result, str) else list(result)
    for r in result:
        builder.addOutputTensor(r)
    session = popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, result),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(dict(zip(ids, arrays)), anchors))
    values = [anchors[r] for r in result]
    return values[0] if len(values) == 1 else values


def train_grads(build, weights, inputs=(), out_index=0):
    """Gradients of sum(R * out) w.r.t. ``weights`` (float arrays made initializers), from a
    TrainingSession; ``inputs`` are streamed. Returns (forward output, grads, R)."""
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    w_ids = [builder.addInitializedInputTensor(w) for w in weights]
    x_ids = [builder.addInputTensor(popart.TensorInfo(_DTYPES[x.dtype.type], list(x.shape)))
             for x in inputs]
    out = build(builder, builder.aiGraphcore, *w_ids, *x_ids)
    out = out if isinstance(out, str) else out[out_index]
    shape = build.out_shape
    seed = np.random.default_rng(7).uniform(-1, 1, shape).astype(np.float32)
    weighted = builder.aiOnnx.mul([out, builder.aiOnnx.constant(seed)])
    loss = builder.aiGraphcore.identityloss([weighted], reduction=popart.ReductionType.Sum)
    grads = [popart.reservedGradientPrefix() + w for w in w_ids]
    session = popart.TrainingSession(builder.getModelProto(), popart.DataFlow(1, [out, *grads]),
                                     loss, popart.ConstSGD(0.0),
                                     popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(dict(zip(x_ids, inputs)), anchors))
    return anchors[out], [anchors[g] for g in grads], seed


def torch_grads(ref, weights, inputs, seed):
    leaves = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in weights]
    (ref(*leaves, *[torch.from_numpy(x) for x in inputs]) * torch.from_numpy(seed)).sum().backward()
    return [leaf.grad.numpy() for leaf in leaves]


def check_training(build, ref, weights, inputs=(), out_shape=None, rtol=1e-4, atol=1e-5):
    build.out_shape = out_shape
    out, grads, seed = train_grads(build, weights, inputs)
    for i, (ours, want) in enumerate(zip(grads, torch_grads(ref, weights, inputs, seed))):
        assert_close(ours, want.astype(np.float32), f"gradient of weight {i}", rtol, atol)
    return out


# --- elementwise ----------------------------------------------------------------------------------


def test_nearbyint_rounds_halves_to_even():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.3, -0.7], np.float32)
    assert_close(run_builder(lambda b, gc, a: gc.nearbyint([a]), x), np.rint(x))
    # Round (halves away from zero) differs on the halves.
    assert not np.array_equal(run_builder(lambda b, gc, a: gc.round([a]), x), np.rint(x))


def test_nearbyint_gradient_is_zero():
    x = rand(2, 3, seed=1)

    def build(b, gc, w):
        return b.aiOnnx.add([gc.nearbyint([w]), w])
    check_training(build, lambda w: torch.round(w) + w, [x], out_shape=(2, 3))


@pytest.mark.parametrize("dtype,increment,modulus", [
    (np.float32, 1.5, 4.0), (np.float32, -0.5, 3.0), (np.int32, 3, 5),
])
def test_incrementmod(dtype, increment, modulus):
    x = (np.arange(-6, 6).reshape(3, 4) * (0.7 if dtype == np.float32 else 1)).astype(dtype)
    out = run_builder(lambda b, gc, a: gc.incrementmod([a], increment, modulus), x)
    assert out.dtype == dtype
    assert_close(out, np.fmod(x + dtype(increment), dtype(modulus)))


def test_incrementmod_gradient_and_errors():
    x = rand(2, 3, low=0.1, high=0.9, seed=2)

    def build(b, gc, w):
        return gc.incrementmod([w], 0.5, 2.0)
    check_training(build, lambda w: torch.fmod(w + 0.5, 2.0), [x], out_shape=(2, 3))
    with pytest.raises(popart.popart_exception, match="IncrementMod.*whole numbers"):
        run_builder(lambda b, gc, a: gc.incrementmod([a], 0.5, 3), np.arange(3, dtype=np.int32))
    with pytest.raises(popart.popart_exception, match="modulus must not be 0"):
        run_builder(lambda b, gc, a: gc.incrementmod([a], 1.0, 0.0), x)


@pytest.mark.parametrize("remap_type", [0, 1, 2, "Fwd"])
def test_tensorremap_keeps_values_and_gradient(remap_type):
    x = rand(3, 4, seed=3)
    assert_close(run_builder(lambda b, gc, a: gc.tensorremap([a], remap_type), x), x)

    def build(b, gc, w):
        return gc.tensorremap([b.aiOnnx.mul([w, w])], remap_type=remap_type)
    check_training(build, lambda w: w * w, [x], out_shape=(3, 4))


def test_tensorremap_rejects_an_unknown_type():
    with pytest.raises(popart.popart_exception, match="TensorRemapType"):
        run_builder(lambda b, gc, a: gc.tensorremap([a], "Backward"), rand(2))
    with pytest.raises(popart.popart_exception, match="remap_type=5"):
        run_builder(lambda b, gc, a: gc.tensorremap([a], 5), rand(2))


# --- normalize_image and batchnormalization ---------------------------------------------------


@pytest.mark.parametrize("image_dtype,param_dtype", [
    (np.uint8, np.float16), (np.float16, np.float16), (np.float32, np.float32)])
def test_normalize_image(image_dtype, param_dtype):
    rng = np.random.default_rng(4)
    image = rng.integers(0, 255, (2, 3, 4, 3)).astype(image_dtype)
    offsets = np.array([0.4, 0.5, 0.6], param_dtype)
    scales = np.array([2.0, 1.5, 0.5], param_dtype)
    out = run_builder(lambda b, gc, i, o, s: gc.normalize_image([i, o, s], scale=1 / 255),
                      image, offsets, scales)
    want = (image.astype(np.float64) / 255 - offsets.astype(np.float64)) * scales
    want = np.concatenate([want, np.zeros((2, 3, 4, 1))], axis=-1)
    assert out.dtype == param_dtype and out.shape == (2, 3, 4, 4)
    tol = 2e-3 if param_dtype == np.float16 else 1e-6
    assert_close(out.astype(np.float64), want, rtol=tol, atol=tol)


def test_normalize_image_errors():
    with pytest.raises(popart.popart_exception, match="3 channels"):
        run_builder(lambda b, gc, i, o, s: gc.normalize_image([i, o, s]),
                    rand(2, 4), rand(3), rand(3))
    with pytest.raises(popart.popart_exception, match="uint8 .with float16"):
        run_builder(lambda b, gc, i, o, s: gc.normalize_image([i, o, s]),
                    np.zeros((2, 3), np.uint8), rand(3), rand(3))


def _bn_inputs():
    rng = np.random.default_rng(5)
    return (rng.standard_normal((4, 3, 2, 2)).astype(np.float32),
            rng.uniform(0.5, 1.5, 3).astype(np.float32), rng.uniform(-1, 1, 3).astype(np.float32),
            rng.uniform(-0.5, 0.5, 3).astype(np.float32), rng.uniform(0.5, 2, 3).astype(np.float32))


@pytest.mark.parametrize("num_outputs", [1, 5])
def test_graphcore_batchnormalization_inference(num_outputs):
    x, scale, bias, mean, var = _bn_inputs()
    outs = run_builder(lambda b, gc, *ids: gc.batchnormalization(list(ids), num_outputs,
                                                                 epsilon=1e-3),
                       x, scale, bias, mean, var)
    outs = [outs] if num_outputs == 1 else outs
    want = torch.nn.functional.batch_norm(*map(torch.from_numpy, (x, mean, var, scale, bias)),
                                          eps=1e-3)
    assert_close(outs[0], want.numpy(), rtol=1e-5, atol=1e-5)
    if num_outputs == 5:
        assert_close(outs[1], mean)
        assert_close(outs[2], var)
        assert_close(outs[3], x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
        assert_close(outs[4], x.var(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)


def test_graphcore_batchnormalization_training_gradient():
    x, scale, bias, mean, var = _bn_inputs()

    def build(b, gc, s, bb, xx):
        m = b.addInitializedInputTensor(mean)
        v = b.addInitializedInputTensor(var)
        return gc.batchnormalization([xx, s, bb, m, v], 5, epsilon=1e-5, momentum=0.9)

    def ref(s, bb, xx):
        return torch.nn.functional.batch_norm(xx.double(), None, None, s, bb, training=True)
    check_training(build, ref, [scale, bias], [x], out_shape=x.shape)


# --- slice, gathers and scatters ------------------------------------------------------------------


def test_slice_with_attributes():
    x = rand(4, 5, 6, seed=6)
    out = run_builder(lambda b, gc, a: gc.slice([a], ends=[3, -1], starts=[1, 2], axes=[0, 2]), x)
    assert_close(out, x[1:3, :, 2:-1])
    out = run_builder(lambda b, gc, a: gc.slice([a], [2, 4], [0, 1]), x)
    assert_close(out, x[0:2, 1:4])

    def build(b, gc, w):
        return gc.slice([w], ends=[3], starts=[1], axes=[1])
    check_training(build, lambda w: w[:, 1:3], [x], out_shape=(4, 2, 6))


def _grouped_gather_ref(data, indices, axis, groups):
    if groups == 1:
        return np.take(data, indices, axis=axis)
    return np.stack([np.take(data[g], indices[g], axis=axis - 1) for g in range(groups)])


@pytest.mark.parametrize("axis,groups,index_dtype", [
    (1, 3, np.int32), (2, 3, np.int64), (-1, 3, np.uint32), (0, 1, np.int32), (1, 1, np.int32)])
def test_groupedgather(axis, groups, index_dtype):
    data = rand(3, 4, 5, seed=7)
    size = data.shape[axis]
    shape = (groups, 2, 2) if groups > 1 else (2, 2)
    indices = np.random.default_rng(8).integers(0, size, shape).astype(index_dtype)
    out = run_builder(lambda b, gc, d, i: gc.groupedgather([d, i], axis=axis, group_size=groups),
                      data, indices)
    want = _grouped_gather_ref(data, indices.astype(np.int64), axis if axis >= 0 else 2, groups)
    assert_close(out, want)

    def build(b, gc, w, i):
        return gc.groupedgather([w, i], axis=axis, group_size=groups)

    def ref(w, i):
        i = i.long()
        if groups == 1:
            return w.index_select(axis, i.reshape(-1)).reshape(want.shape)
        a = (axis if axis >= 0 else 2) - 1
        return torch.stack([w[g].index_select(a, i[g].reshape(-1)) for g in range(groups)]
                           ).reshape(want.shape)
    check_training(build, ref, [data], [indices], out_shape=want.shape)


def test_groupedgather_errors():
    data, idx = rand(3, 4), np.zeros((3, 2), np.int32)
    with pytest.raises(popart.popart_exception, match="group axis of size 2"):
        run_builder(lambda b, gc, d, i: gc.groupedgather([d, i], axis=1, group_size=2), data, idx)
    with pytest.raises(popart.popart_exception, match="is the group axis"):
        run_builder(lambda b, gc, d, i: gc.groupedgather([d, i], axis=0, group_size=3), data, idx)
    with pytest.raises(popart.popart_exception, match="int32, int64 or uint32"):
        run_builder(lambda b, gc, d, i: gc.groupedgather([d, i], axis=1, group_size=3),
                    data, idx.astype(np.float32))
    with pytest.raises(popart.popart_exception, match="GroupedGather"):
        run_builder(lambda b, gc, d, i: gc.groupedgather([d, i], axis=1, group_size=3),
                    data, np.full((3, 2), 9, np.int32))


def _scatter_ref(src, index, axis, size, reduction):
    out_shape = list(src.shape)
    out_shape[axis] = size
    out = torch.zeros(out_shape, dtype=src.dtype)
    if reduction == "none":
        return out.scatter(axis, index, src)
    return out.scatter_reduce(axis, index, src, {"sum": "sum", "max": "amax", "min": "amin"}[
        reduction], include_self=False)


@pytest.mark.parametrize("reduction", ["sum", "max", "min"])
@pytest.mark.parametrize("broadcast", [False, True])
def test_groupedscatterreduce(reduction, broadcast):
    src = rand(2, 3, 5, seed=9)
    rng = np.random.default_rng(10)
    if broadcast:
        index = rng.integers(0, 4, (2, 5)).astype(np.int32)
        full = np.broadcast_to(index[:, None, :], src.shape)
    else:
        index = rng.integers(0, 4, src.shape).astype(np.int32)
        full = index
    out = run_builder(lambda b, gc, s, i: gc.groupedscatterreduce(
        [s, i], axis_size=4, axis=2, reduction=reduction, group_size=2), src, index)
    want = _scatter_ref(torch.from_numpy(src), torch.from_numpy(full.astype(np.int64)), 2, 4,
                        reduction)
    assert_close(out, want.numpy())

    def build(b, gc, w, i):
        return gc.groupedscatterreduce([w, i], 4, axis=-1, reduction=reduction, group_size=2)
    check_training(build, lambda w, i: _scatter_ref(w, torch.from_numpy(
        full.astype(np.int64)), 2, 4, reduction), [src], [index], out_shape=(2, 3, 4))


def test_groupedscatterreduce_errors():
    src = rand(2, 3, 5)
    with pytest.raises(popart.popart_exception, match="enable_index_broadcast=0"):
        run_builder(lambda b, gc, s, i: gc.groupedscatterreduce(
            [s, i], 4, axis=2, group_size=2, enable_index_broadcast=0),
            src, np.zeros((2, 5), np.int32))
    with pytest.raises(popart.popart_exception, match="leading group axis of size 3"):
        run_builder(lambda b, gc, s, i: gc.groupedscatterreduce([s, i], 4, group_size=3),
                    src, np.zeros(src.shape, np.int32))
    with pytest.raises(popart.popart_exception, match="ScatterReduction"):
        run_builder(lambda b, gc, s, i: gc.groupedscatterreduce(
            [s, i], 4, reduction="Average", group_size=2), src, np.zeros(src.shape, np.int32))


def test_scatterreduce_enable_index_broadcast():
    src, index = rand(3, 5), np.array([0, 2, 2, 1, 0], np.int32)
    out = run_builder(lambda b, gc, s, i: gc.scatterreduce([s, i], 3, axis=1), src, index)
    want = _scatter_ref(torch.from_numpy(src), torch.from_numpy(index).long().expand(3, 5), 1, 3,
                        "sum")
    assert_close(out, want.numpy())
    with pytest.raises(popart.popart_exception, match="enable_index_broadcast=0"):
        run_builder(lambda b, gc, s, i: gc.scatterreduce(
            [s, i], 3, axis=1, enable_index_broadcast=0), src, index)


# --- bucketize and sort ---------------------------------------------------------------------------


@pytest.mark.parametrize("right", [0, 1])
def test_bucketize(right):
    boundaries = np.array([-0.5, 0.0, 0.25, 0.5], np.float32)
    x = np.array([[-1, -0.5, 0.0, 0.1], [0.25, 0.3, 0.5, 0.9]], np.float32)
    out = run_builder(lambda b, gc, a, bd: gc.bucketize([a, bd], right=right), x, boundaries)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(
        out, np.searchsorted(boundaries, x, side="right" if right else "left"))
    with pytest.raises(popart.popart_exception, match="Bucketize.*1-D"):
        run_builder(lambda b, gc, a, bd: gc.bucketize([a, bd]), x, x)


@pytest.mark.parametrize("axis,descending", [(-1, 0), (0, 1), (1, 1)])
def test_sort(axis, descending):
    x = np.random.default_rng(11).permutation(24).reshape(2, 3, 4).astype(np.float32) / 7
    values, indices = run_builder(
        lambda b, gc, a: gc.sort([a], axis=axis, descending=descending, stable=1), x)
    order = np.argsort(-x if descending else x, axis=axis, kind="stable")
    np.testing.assert_array_equal(indices, order.astype(np.int32))
    assert_close(values, np.take_along_axis(x, order, axis=axis))

    def build(b, gc, w):
        return gc.sort([w], axis=axis, descending=descending)[0]
    check_training(build, lambda w: torch.sort(w, dim=axis, descending=bool(descending)).values,
                   [x], out_shape=x.shape)


# --- splines --------------------------------------------------------------------------------------


def _spline_basis_ref(pseudo, kernel_size, is_open, degree):
    """The B-spline basis written per edge and kernel weight, as in PyTorch Geometric."""
    def piece(t, k):
        if degree == 1:
            return 1 - t if k == 0 else t
        if degree == 2:
            return [0.5 * t * t - t + 0.5, -t * t + t + 0.5, 0.5 * t * t][k]
        return [(1 - t) ** 3 / 6, (3 * t ** 3 - 6 * t * t + 4) / 6,
                (-3 * t ** 3 + 3 * t * t + 3 * t + 1) / 6, t ** 3 / 6][k]

    edges, dims = pseudo.shape
    count = (degree + 1) ** dims
    basis = np.zeros((edges, count))
    index = np.zeros((edges, count), np.int64)
    for e in range(edges):
        for s in range(count):
            b, wi, offset = 1.0, 0, 1
            for d in range(dims):
                k = (s // (degree + 1) ** d) % (degree + 1)
                v = float(pseudo[e, d]) * (kernel_size[d] - degree * is_open[d])
                wi += ((int(v) + k) % kernel_size[d]) * offset
                offset *= kernel_size[d]
                b *= piece(v - np.floor(v), k)
            basis[e, s], index[e, s] = b, wi
    return basis, index


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_splinebasis(degree):
    pseudo = np.random.default_rng(12).uniform(0, 1, (5, 2)).astype(np.float32)
    kernel_size = np.array([5, 4], np.int32)
    is_open = np.array([1, 0], np.uint8)
    basis, index = run_builder(lambda b, gc, p, k, o: gc.splinebasis([p, k, o], degree=degree),
                               pseudo, kernel_size, is_open)
    want_basis, want_index = _spline_basis_ref(pseudo, kernel_size, is_open, degree)
    assert index.dtype == np.int32
    np.testing.assert_array_equal(index, want_index)
    assert_close(basis, want_basis.astype(np.float32), rtol=1e-5, atol=1e-6)
    with pytest.raises(popart.popart_exception, match="degree=4"):
        run_builder(lambda b, gc, p, k, o: gc.splinebasis([p, k, o], 4),
                    pseudo, kernel_size, is_open)


def _spline_weighting_ref(x, weight, basis, index):
    return torch.einsum("es,ei,esio->eo", basis, x, weight[index.long()])


def test_splineweighting_forward_and_gradient():
    rng = np.random.default_rng(13)
    x, weight = rand(6, 3, seed=14), rand(5, 3, 2, seed=15)
    basis = rng.uniform(0, 1, (6, 4)).astype(np.float32)
    index = rng.integers(0, 5, (6, 4)).astype(np.int32)
    out = run_builder(lambda b, gc, *ids: gc.splineweighting(list(ids)), x, weight, basis, index)
    want = sum(basis[:, s, None] * np.einsum("ei,eio->eo", x, weight[index[:, s]])
               for s in range(4))
    assert_close(out, want, rtol=1e-5, atol=1e-6)

    def build(b, gc, xx, w, bs, i):
        return gc.splineweighting([xx, w, bs, i])
    check_training(build, _spline_weighting_ref, [x, weight, basis], [index], out_shape=(6, 2))


def test_splineweighting_errors():
    with pytest.raises(popart.popart_exception, match="SplineWeighting.*one row per edge"):
        run_builder(lambda b, gc, *ids: gc.splineweighting(list(ids)), rand(6, 3),
                    rand(5, 3, 2), rand(5, 4), np.zeros((5, 4), np.int32))


# --- replicatedreducescatter ------------------------------------------------------------------


@pytest.mark.parametrize("comm_group", [
    popart.CommGroup(popart.CommGroupType.Consecutive, 2),
    popart.CommGroup(popart.CommGroupType.Ungrouped, 0),
], ids=["Consecutive2", "Ungrouped"])
def test_replicatedreducescatter(comm_group):
    rf = 2
    x = np.random.default_rng(16).standard_normal((1, rf, 5)).astype(np.float32)
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    a = builder.addInputTensor(popart.TensorInfo("FLOAT", [5]), "x")
    y = builder.aiGraphcore.replicatedreducescatter([a], commGroup=comm_group)
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = rf
    session = popart.InferenceSession(
        builder.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}),
        popart.DeviceManager().createIpuModelDevice({"numIPUs": rf}), userOptions=opts)
    session.prepareDevice()
    out = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, out))
    if comm_group.type == popart.CommGroupType.Ungrouped:
        assert_close(out[y], x[0])
        return
    total = np.concatenate([x[0].sum(axis=0), [0.0]]).astype(np.float32)  # 2 shards of 3
    assert_close(out[y], np.stack([total[:3], total[3:]]), rtol=1e-6, atol=1e-6)


def test_replicatedreducescatter_needs_a_group_size_and_sums():
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    a = builder.addInputTensor(popart.TensorInfo("FLOAT", [5]), "x")
    with pytest.raises(popart.popart_exception, match="collectiveOperator 'Max'"):
        builder.aiGraphcore.replicatedreducescatter([a], collectiveOperator="Max")
    # Without commGroup the shard count is the session's replica count (tests/builder/
    # test_reduce_scatter_default.py); the Builder alone cannot know it.
    y = builder.aiGraphcore.replicatedreducescatter([a])
    with pytest.raises(popart.popart_exception, match="replicatedGraphCount"):
        builder.getTensorShape(y)
