"""Float16 partials of 3-D convolutions and of ConvGrad (convolutionOptions partialsType
"half"): the sums run in float16, against torch computing with the same dtypes (float16 tensors,
each product and each addition rounded to float16, in the order ops/conv_partials.py states);
float partials (the default) give torch's float32-accumulated convolution and its gradients."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import popart_backend as popart
from popart_backend.ops.conv_partials import unfold_nd

RNG = np.random.default_rng(21)
X3 = (RNG.standard_normal((2, 4, 5, 6, 5)) * 3).astype(np.float16)
W3 = (RNG.standard_normal((4, 2, 3, 2, 3)) * 3).astype(np.float16)
STRIDE, PAD, GROUPS = (2, 1, 2), (1, 0, 1), 2


def _windows(x, kernel, stride, pad, outs):
    """x padded, then for each kernel position the strided view that position reads."""
    x = F.pad(x, tuple(p for q in reversed(pad) for p in (q, q)))
    for position in itertools.product(*(range(k) for k in kernel)):
        index = tuple(slice(p, p + s * (o - 1) + 1, s) for p, s, o in zip(position, stride, outs))
        yield position, x[(slice(None), slice(None), *index)]


def _half_conv(x, w, stride, pad, groups):
    """torch float16: Y accumulated over (channel, kernel position) in float16."""
    m, cg = w.shape[:2]
    kernel = w.shape[2:]
    outs = tuple((i + 2 * p - k) // s + 1 for i, p, k, s in zip(x.shape[2:], pad, kernel, stride))
    y = torch.zeros(x.shape[0], m, *outs, dtype=torch.float16)
    windows = list(_windows(x, kernel, stride, pad, outs))
    for o in range(m):
        g = o // (m // groups)
        for c in range(cg):
            for position, view in windows:
                y[:, o] = y[:, o] + view[:, g * cg + c] * w[(o, c, *position)]
    return y


def _half_grads(dy, x, w, stride, pad, groups):
    """torch float16: dW summed over (n, output position) and dX over (m, then kernel
    position), every product and addition rounded to float16."""
    n, channels = x.shape[:2]
    m, cg = w.shape[:2]
    kernel, outs = tuple(w.shape[2:]), tuple(dy.shape[2:])
    per = m // groups
    cols = unfold_nd(x, kernel, stride, pad, (1,) * len(kernel)).reshape(
        n, groups, -1, int(np.prod(outs)))
    dyf = dy.reshape(n, groups, per, -1)
    dw = torch.zeros(groups, per, cols.shape[2], dtype=torch.float16)
    for b in range(n):
        for pos in range(dyf.shape[-1]):
            dw = dw + dyf[b, :, :, pos][:, :, None] * cols[b, :, :, pos][:, None, :]
    dw = dw.reshape(w.shape)
    padded = torch.zeros(n, channels, *(i + 2 * p for i, p in zip(x.shape[2:], pad)),
                         dtype=torch.float16)
    for position in itertools.product(*(range(k) for k in kernel)):
        for c in range(channels):
            g = c // cg
            contribution = torch.zeros(n, *outs, dtype=torch.float16)
            for j in range(per):
                contribution = contribution + w[(g * per + j, c % cg, *position)] * dy[:, g * per + j]
            index = tuple(slice(p, p + s * (o - 1) + 1, s)
                          for p, s, o in zip(position, stride, outs))
            padded[(slice(None), c, *index)] += contribution
    dx = padded[(slice(None), slice(None), *(slice(p, p + i) for p, i in zip(pad, x.shape[2:])))]
    return dx, dw


def _session(half: bool, training: bool):
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT16", list(X3.shape)), "x")
    w = builder.addInitializedInputTensor(W3, "w")
    y = builder.aiOnnx.conv([x, w], strides=list(STRIDE), pads=[*PAD, *PAD], group=GROUPS)
    options = popart.SessionOptions()
    if half:
        options.convolutionOptions = {"partialsType": "half"}
    device = popart.DeviceManager().createCpuDevice()
    if not training:
        builder.addOutputTensor(y)
        session = popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, [y]),
                                          device, userOptions=options)
        anchors_ids = [y]
    else:
        scale = builder.addInputTensor(popart.TensorInfo("FLOAT16", [2, 4, 3, 5, 3]), "scale")
        loss = builder.aiGraphcore.l1loss([builder.aiOnnx.mul([y, scale])], 1.0,
                                          reduction=popart.ReductionType.Sum)
        builder.addOutputTensor(loss)
        anchors_ids = [y, "Gradient___" + y, "Gradient___x", "Gradient___w"]
        session = popart.TrainingSession(
            builder.getModelProto(), popart.DataFlow(1, anchors_ids), loss,
            popart.ConstSGD(0.0), device, userOptions=options)
    session.prepareDevice()
    if training:
        session.weightsFromHost()
    anchors = session.initAnchorArrays()
    feeds = {x: X3}
    if training:
        feeds["scale"] = (np.random.default_rng(5).standard_normal((2, 4, 3, 5, 3)) * 2).astype(
            np.float16)
    session.run(popart.PyStepIO(feeds, anchors))
    return [anchors[a] for a in anchors_ids]


def test_3d_conv_half_partials_sum_in_half():
    (half,) = _session(True, False)
    expected = _half_conv(torch.from_numpy(X3), torch.from_numpy(W3), STRIDE, PAD, GROUPS)
    np.testing.assert_array_equal(half, expected.numpy())
    (full,) = _session(False, False)
    reference = F.conv3d(torch.from_numpy(X3).float(), torch.from_numpy(W3).float(),
                         stride=STRIDE, padding=PAD, groups=GROUPS).half().numpy()
    np.testing.assert_allclose(full.astype(np.float32), reference.astype(np.float32),
                               rtol=2e-3, atol=1e-2)
    assert not np.array_equal(half, full)


def test_conv_grad_half_partials_sum_in_half():
    _, dy, dx, dw = _session(True, True)
    assert dx.dtype == np.float16 and dw.dtype == np.float16
    ref_dx, ref_dw = _half_grads(torch.from_numpy(dy), torch.from_numpy(X3),
                                 torch.from_numpy(W3), STRIDE, PAD, GROUPS)
    np.testing.assert_array_equal(dw, ref_dw.numpy())
    np.testing.assert_array_equal(dx, ref_dx.numpy())
    _, dy_full, dx_full, dw_full = _session(False, True)
    np.testing.assert_array_equal(dy_full, dy)  # same upstream gradient both ways
    xf = torch.from_numpy(X3).float().requires_grad_()
    wf = torch.from_numpy(W3).float().requires_grad_()
    F.conv3d(xf, wf, stride=STRIDE, padding=PAD, groups=GROUPS).backward(
        torch.from_numpy(dy).float())
    np.testing.assert_allclose(dw_full.astype(np.float32), wf.grad.half().float().numpy(),
                               rtol=2e-3, atol=0.1)
    np.testing.assert_allclose(dx_full.astype(np.float32), xf.grad.half().float().numpy(),
                               rtol=2e-3, atol=2e-2)
    assert not np.array_equal(dw, dw_full)


@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_unfold_nd_matches_torch_unfold_order(spatial):
    """unfold_nd's rows are (channel, kernel position) like F.unfold, for 1-3 spatial dims
    (checked by the product with the weights against torch's convolution)."""
    rng = np.random.default_rng(spatial)
    x = torch.from_numpy(rng.standard_normal((2, 3, *(7,) * spatial)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((4, 3, *(3,) * spatial)).astype(np.float32))
    stride, pad, dil = (2,) * spatial, (1,) * spatial, (2,) * spatial
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[spatial]
    expected = conv(x, w, stride=stride, padding=pad, dilation=dil)
    cols = unfold_nd(x, w.shape[2:], stride, pad, dil)
    got = (w.reshape(4, -1) @ cols).reshape(expected.shape)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
