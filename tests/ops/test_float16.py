"""float16 end to end (spec §2.4 precision options, P54, P63): half inputs, weights and
activations in Builder models and poptorch ``model.half()``, against torch computing in the same
dtypes; optimizer-state dtypes (``accl1_type`` ...); float16 Adam with the default eps; the
memory model's 2 bytes per element."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.device.memory import compute_memory
from popart_backend.device.spec import IpuSpec
from popart_backend.importer.onnx_model import import_model
from popart_backend.options.session_options import SessionOptions
from popart_backend.transforms.pipeline import run_passes, training_passes

IPU2_4 = IpuSpec.for_version("ipu2", 4)
RNG = np.random.default_rng(4)
X = RNG.standard_normal((2, 1, 6, 6)).astype(np.float16)
W_CONV = (RNG.standard_normal((3, 1, 3, 3)) * 0.5).astype(np.float16)
W_FC = (RNG.standard_normal((3 * 4 * 4, 5)) * 0.2).astype(np.float16)


def _cnn_model(dtype: str = "FLOAT16"):
    """conv -> relu -> flatten -> matmul -> L1 loss; returns (proto, ids)."""
    np_dtype = np.float16 if dtype == "FLOAT16" else np.float32
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo(dtype, [2, 1, 6, 6]), "x")
    wc = builder.addInitializedInputTensor(W_CONV.astype(np_dtype), "wc")
    wf = builder.addInitializedInputTensor(W_FC.astype(np_dtype), "wf")
    h = builder.aiOnnx.relu([builder.aiOnnx.conv([x, wc], strides=[1, 1], pads=[0, 0, 0, 0])])
    flat = builder.aiOnnx.flatten([h], axis=1)
    y = builder.aiOnnx.matmul([flat, wf])
    loss = builder.aiGraphcore.l1loss([y], 0.5, reduction=popart.ReductionType.Sum)
    builder.addOutputTensor(y)
    return builder.getModelProto(), {"x": x, "wc": wc, "wf": wf, "y": y, "loss": loss}


def _torch_forward(x, wc, wf):
    h = torch.relu(torch.nn.functional.conv2d(x, wc))
    return h.flatten(1) @ wf


def test_builder_float16_inference_matches_torch_half():
    """Half inputs, weights and activations: every tensor is float16 and the output equals
    torch's float16 computation (float32 accumulation inside conv / matmul, as torch's CPU
    kernels and the IPU's default float partials)."""
    proto, ids = _cnn_model()
    session = popart.InferenceSession(proto, popart.DataFlow(1, [ids["y"], ids["loss"]]),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({ids["x"]: X}, anchors))
    assert anchors[ids["y"]].dtype == np.float16 and anchors[ids["loss"]].dtype == np.float16
    expected = _torch_forward(torch.from_numpy(X), torch.from_numpy(W_CONV),
                              torch.from_numpy(W_FC))
    np.testing.assert_allclose(anchors[ids["y"]].astype(np.float32), expected.float().numpy(),
                               rtol=2e-3, atol=2e-3)


def _train_popart(optimizer, steps: int = 3) -> dict[str, np.ndarray]:
    proto, ids = _cnn_model()
    session = popart.TrainingSession(
        fnModel=proto, dataFlow=popart.DataFlow(1, {}), loss=ids["loss"], optimizer=optimizer,
        deviceInfo=popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    for _ in range(steps):
        session.run(popart.PyStepIO({ids["x"]: X}, session.initAnchorArrays()))
    session.weightsToHost()
    out = {ids["wc"]: np.zeros_like(W_CONV), ids["wf"]: np.zeros_like(W_FC)}
    session.readWeights(popart.PyWeightsIO(out))
    return {"wc": out[ids["wc"]], "wf": out[ids["wf"]]}


def _torch_adam_reference(steps: int, lr: float, eps: float) -> dict[str, np.ndarray]:
    """Half weights and gradients, float32 moments and update (PopART's float32 accl types),
    the result rounded to float16 once per step."""
    wc = torch.from_numpy(W_CONV.copy()).requires_grad_()
    wf = torch.from_numpy(W_FC.copy()).requires_grad_()
    state = {id(p): (torch.zeros_like(p, dtype=torch.float32),
                     torch.zeros_like(p, dtype=torch.float32)) for p in (wc, wf)}
    for t in range(1, steps + 1):
        for p in (wc, wf):
            p.grad = None
        y = _torch_forward(torch.from_numpy(X), wc, wf)
        (0.5 * y.abs().sum()).backward()
        with torch.no_grad():
            for p in (wc, wf):
                m, v = state[id(p)]
                g = p.grad.float()
                m.mul_(0.9).add_(g, alpha=0.1)
                v.mul_(0.999).addcmul_(g, g, value=0.001)
                m_hat, v_hat = m / (1 - 0.9**t), v / (1 - 0.999**t)
                p.copy_((p.float() - lr * m_hat / (v_hat.sqrt() + eps)).half())
    return {"wc": wc.detach().numpy(), "wf": wf.detach().numpy()}


def test_float16_adam_with_default_eps_stays_finite_and_matches_float32_update():
    """Adam's default eps (1e-6) underflows in float16 arithmetic; with float32 moments
    (accl1_type = accl2_type = FLOAT, the defaults) the update is computed in float32 as PopART
    does, so the weights stay finite and follow the reference."""
    actual = _train_popart(popart.Adam({"defaultLearningRate": (1e-3, True)}))
    expected = _torch_adam_reference(3, 1e-3, 1e-6)
    for name in expected:
        assert np.isfinite(actual[name]).all()
        np.testing.assert_allclose(actual[name].astype(np.float32),
                                   expected[name].astype(np.float32), rtol=0, atol=2e-3,
                                   err_msg=name)


@pytest.mark.parametrize("accl1, accl2, expected", [
    (popart.DataType.FLOAT, popart.DataType.FLOAT, np.float32),
    (popart.DataType.FLOAT16, popart.DataType.FLOAT16, np.float16),
    (popart.DataType.UNDEFINED, popart.DataType.UNDEFINED, np.float16),  # the weight's type
])
def test_adam_state_dtypes_follow_accl_types(tmp_path, accl1, accl2, expected):
    """accl1_type / accl2_type decide the moments' dtype (UNDEFINED: the weight's), as the
    checkpoint modelToHost writes shows."""
    proto, ids = _cnn_model()
    session = popart.TrainingSession(
        fnModel=proto, dataFlow=popart.DataFlow(1, {}), loss=ids["loss"],
        optimizer=popart.Adam({"defaultLearningRate": (1e-3, True)}, accl1_type=accl1,
                              accl2_type=accl2),
        deviceInfo=popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    session.run(popart.PyStepIO({ids["x"]: X}, session.initAnchorArrays()))
    session.modelToHost(str(tmp_path / "m.onnx"))
    import onnx

    inits = {i.name: onnx.numpy_helper.to_array(i)
             for i in onnx.load(str(tmp_path / "m.onnx")).graph.initializer}
    assert inits["Accl1___wf"].dtype == expected and inits["Accl2___wf"].dtype == expected
    assert inits["wf"].dtype == np.float16


def test_memory_model_counts_two_bytes_per_float16_element():
    def weights_and_state(dtype):
        proto, ids = _cnn_model(dtype)
        ir = import_model(proto)
        run_passes(ir, training_passes(SessionOptions(), ids["loss"],
                                       popart.SGD({"defaultMomentum": (0.9, True)}), 1))
        g = ir.main
        cats = compute_memory(g, g.topo_order(), IPU2_4, keep=[ids["loss"]]).ipu(0).categories
        return cats["weights"], cats["optimizer state"]

    half, full = weights_and_state("FLOAT16"), weights_and_state("FLOAT")
    elements = W_CONV.size + W_FC.size
    assert half == (2 * elements, 2 * elements)  # momentum takes the weight's type
    assert full == (4 * elements, 4 * elements)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 3, 3, bias=False)
        self.fc = torch.nn.Linear(48, 5, bias=False)

    def forward(self, x):
        y = self.fc(torch.relu(self.conv(x)).flatten(1))
        return y, y.float().abs().sum()


def test_poptorch_half_model_trains_like_torch_half():
    """model.half(): half parameters, inputs and activations; SGD steps equal torch's on the
    same half model (float32 loss as the model computes it)."""
    import poptorch_lite as poptorch

    torch.manual_seed(3)
    model = _Net().half()
    reference = copy.deepcopy(model)
    x = torch.from_numpy(X)
    wrapper = poptorch.trainingModel(model, poptorch.Options(),
                                     torch.optim.SGD(model.parameters(), lr=0.01))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.01)
    for _ in range(2):
        y, _ = wrapper(x)
        ref_opt.zero_grad()
        ref_y, ref_loss = reference(x)
        ref_loss.backward()
        ref_opt.step()
        assert y.dtype == torch.float16
    wrapper.copyWeightsToHost()
    for name, value in reference.state_dict().items():
        assert model.state_dict()[name].dtype == torch.float16
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=2e-3, msg=name)
    wrapper.destroy()


def _half_sum_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    acc = np.zeros((a.shape[0], b.shape[1]), np.float16)
    for k in range(a.shape[1]):
        acc = acc + a[:, k:k + 1] * b[k:k + 1, :]
    return acc


def test_poptorch_set_partials_type_half_accumulates_matmuls_in_half():
    """Precision.setPartialsType(torch.half): a half matmul accumulates in float16 (numpy
    float16 running sum); with float partials it matches the float32-accumulated product."""
    import poptorch_lite as poptorch

    a = (np.random.default_rng(2).standard_normal((4, 256)) * 4).astype(np.float16)
    b = (np.random.default_rng(3).standard_normal((256, 4)) * 4).astype(np.float16)

    class MatMul(torch.nn.Module):
        def forward(self, x, y):
            return x @ y

    results = {}
    for dtype in (torch.half, torch.float):
        opts = poptorch.Options()
        opts.Precision.setPartialsType(dtype)
        wrapper = poptorch.inferenceModel(MatMul(), opts)
        results[dtype] = wrapper(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        wrapper.destroy()
    np.testing.assert_array_equal(results[torch.half], _half_sum_matmul(a, b))
    exact = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(results[torch.float], exact)
    assert not np.array_equal(results[torch.half], results[torch.float])


def _half_sum_conv2d(x: np.ndarray, w: np.ndarray, stride: int = 1, pad: int = 0,
                     groups: int = 1) -> np.ndarray:
    """numpy float16 convolution with a float16 running sum over (channel, kernel row,
    kernel column) in that order, each product and addition rounded to float16."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))).astype(np.float16)
    n, _, h, wd = x.shape
    m, cg, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, m, oh, ow), np.float16)
    for o in range(m):
        g = o // (m // groups)
        for c in range(cg):
            for i in range(kh):
                for j in range(kw):
                    window = x[:, g * cg + c, i:i + stride * oh:stride, j:j + stride * ow:stride]
                    out[:, o] = out[:, o] + window * w[o, c, i, j]
    return out


def _run_conv(x, w, set_partials=None, options=None, stride=1, pad=0, groups=1):
    builder = popart.Builder()
    ix = builder.addInputTensor(popart.TensorInfo("FLOAT16", list(x.shape)), "x")
    iw = builder.addInitializedInputTensor(w, "w")
    y = builder.aiOnnx.conv([ix, iw], strides=[stride, stride], pads=[pad] * 4, group=groups)
    if set_partials:
        builder.setPartialsType(y, set_partials)
    builder.addOutputTensor(y)
    session = popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, [y]),
                                      popart.DeviceManager().createCpuDevice(),
                                      userOptions=options or popart.SessionOptions())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({ix: x}, anchors))
    return anchors[y]


CONV_X = (np.random.default_rng(8).standard_normal((2, 4, 7, 7)) * 3).astype(np.float16)
CONV_W = (np.random.default_rng(9).standard_normal((4, 2, 3, 3)) * 3).astype(np.float16)


@pytest.mark.parametrize("how", ["builder", "convolutionOptions"])
def test_half_partials_convolution_accumulates_in_half(how):
    """setPartialsType(conv, "half") or convolutionOptions partialsType "half": the float16
    convolution's sums run in float16 (numpy reference with the same dtypes); float partials
    (the default) give the float32-accumulated half convolution."""
    options = popart.SessionOptions()
    if how == "convolutionOptions":
        options.convolutionOptions = {"partialsType": "half"}
    half = _run_conv(CONV_X, CONV_W, "half" if how == "builder" else None, options,
                     stride=2, pad=1, groups=2)
    np.testing.assert_array_equal(half, _half_sum_conv2d(CONV_X, CONV_W, 2, 1, 2))
    full = _run_conv(CONV_X, CONV_W, stride=2, pad=1, groups=2)
    expected = torch.nn.functional.conv2d(torch.from_numpy(CONV_X).float(),
                                          torch.from_numpy(CONV_W).float(), stride=2,
                                          padding=1, groups=2).half().numpy()
    # Float partials: the float32-accumulated result up to torch's own final rounding.
    np.testing.assert_allclose(full.astype(np.float32), expected.astype(np.float32),
                               rtol=2e-3, atol=1e-3)
    assert not np.array_equal(half, full)
