"""Anchoring the gradient of any tensor (F35): ``Gradient___<id>`` of a stream input or an
activation, in a TrainingSession, compared with torch.autograd on the same tiny models built
with the popart Builder (an MLP, a small CNN, a transformer-style layer), for every
AnchorReturnType, with gradient accumulation, replication and a 2-stage pipeline; tensors
without a gradient are refused; ``getAllTensorIds`` / ``getTensorIds``.

The gradient of an input or activation is per micro-batch (each micro-batch's own, never
accumulated or all-reduced), with the host shape of an activation anchor (spec §4.2).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import onnx
import pytest
import torch

import popart_backend as popart

GRAD = popart.reservedGradientPrefix()
RTOL, ATOL = 1e-5, 1e-6


@dataclasses.dataclass
class Model:
    """A Builder model with a loss, and the torch function computing the same forward."""

    proto: bytes
    loss: str
    inputs: dict[str, tuple[int, ...]]  # stream input id -> micro-batch shape
    watched: dict[str, str]  # short name -> tensor id whose gradient the tests anchor
    params: dict[str, np.ndarray]
    # torch forward: (inputs, params) -> (loss, {short name: tensor})
    forward: Callable


def _builder() -> popart.Builder:
    return popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})


def mlp(mb: int = 3, seed: int = 0) -> Model:
    rng = np.random.default_rng(seed)
    p = {"w1": rng.standard_normal((4, 5)).astype(np.float32) * 0.5,
         "b1": rng.standard_normal(5).astype(np.float32) * 0.1,
         "w2": rng.standard_normal((5, 2)).astype(np.float32) * 0.5}
    b = _builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [mb, 4]), "x")
    w1, b1, w2 = (b.addInitializedInputTensor(p[k], k) for k in ("w1", "b1", "w2"))
    mm = b.aiOnnx.matmul([x, w1])  # MatMul + Add: fused unless its gradient is anchored
    pre = b.aiOnnx.add([mm, b1])
    act = b.aiOnnx.relu([pre])
    out = b.aiOnnx.matmul([act, w2])
    loss = b.aiGraphcore.l1loss([out], 0.5, reduction=popart.ReductionType.Mean)

    def forward(t, q):
        h = {"x": t["x"]}
        h["mm"] = t["x"] @ q["w1"]
        h["act"] = torch.relu(h["mm"] + q["b1"])
        h["out"] = h["act"] @ q["w2"]
        return 0.5 * h["out"].abs().mean(), h

    return Model(b.getModelProto(), loss, {"x": (mb, 4)},
                 {"x": x, "mm": mm, "act": act, "out": out}, p, forward)


def cnn(mb: int = 2, seed: int = 1) -> Model:
    rng = np.random.default_rng(seed)
    p = {"wc": rng.standard_normal((2, 1, 3, 3)).astype(np.float32) * 0.5,
         "bc": rng.standard_normal(2).astype(np.float32) * 0.1,
         "wf": rng.standard_normal((2 * 3 * 3, 3)).astype(np.float32) * 0.5}
    b = _builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [mb, 1, 6, 6]), "image")
    wc, bc, wf = (b.addInitializedInputTensor(p[k], k) for k in ("wc", "bc", "wf"))
    conv = b.aiOnnx.conv([x, wc, bc], pads=[1, 1, 1, 1], strides=[1, 1])
    act = b.aiOnnx.relu([conv])
    pool = b.aiOnnx.maxpool([act], num_outputs=1, kernel_shape=[2, 2], strides=[2, 2])[0]
    flat = b.aiOnnx.reshape([pool, b.aiOnnx.constant(np.array([mb, 18], np.int64))])
    logits = b.aiOnnx.matmul([flat, wf])
    loss = b.aiGraphcore.l1loss([logits], 1.0, reduction=popart.ReductionType.Sum)

    def forward(t, q):
        h = {"image": t["image"]}
        h["conv"] = torch.nn.functional.conv2d(t["image"], q["wc"], q["bc"], padding=1)
        h["pool"] = torch.nn.functional.max_pool2d(torch.relu(h["conv"]), 2)
        logits = h["pool"].reshape(mb, 18) @ q["wf"]
        return logits.abs().sum(), h

    return Model(b.getModelProto(), loss, {"image": (mb, 1, 6, 6)},
                 {"image": x, "conv": conv, "pool": pool}, p, forward)


def attention_layer(mb: int = 2, seq: int = 3, d: int = 4, seed: int = 2) -> Model:
    """Self-attention (matmuls, softmax), residual, LayerNormalization, projection, L1 loss."""
    rng = np.random.default_rng(seed)
    p = {k: rng.standard_normal((d, d)).astype(np.float32) * 0.5
         for k in ("wq", "wk", "wv", "wo")}
    p["g"] = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    p["beta"] = (0.1 * rng.standard_normal(d)).astype(np.float32)
    b = _builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [mb, seq, d]), "tokens")
    w = {k: b.addInitializedInputTensor(v, k) for k, v in p.items()}
    q, k, v = (b.aiOnnx.matmul([x, w[n]]) for n in ("wq", "wk", "wv"))
    scores = b.aiOnnx.matmul([q, b.aiOnnx.transpose([k], perm=[0, 2, 1])])
    scaled = b.aiOnnx.mul([scores, b.aiOnnx.constant(np.array(d ** -0.5, np.float32))])
    probs = b.aiOnnx.softmax([scaled], axis=-1)
    attn = b.aiOnnx.matmul([probs, v])
    res = b.aiOnnx.add([x, attn])
    norm = b.aiOnnx.layernormalization([res, w["g"], w["beta"]], num_outputs=1,
                                       epsilon=1e-5)[0]
    out = b.aiOnnx.matmul([norm, w["wo"]])
    loss = b.aiGraphcore.l1loss([out], 1.0, reduction=popart.ReductionType.Mean)

    def forward(t, q_):
        h = {"tokens": t["tokens"]}
        qq, kk, vv = (t["tokens"] @ q_[n] for n in ("wq", "wk", "wv"))
        h["probs"] = torch.softmax(qq @ kk.transpose(1, 2) * d ** -0.5, -1)
        h["res"] = t["tokens"] + h["probs"] @ vv
        h["norm"] = torch.nn.functional.layer_norm(h["res"], (d,), q_["g"], q_["beta"], 1e-5)
        return (h["norm"] @ q_["wo"]).abs().mean(), h

    return Model(b.getModelProto(), loss, {"tokens": (mb, seq, d)},
                 {"tokens": x, "probs": probs, "res": res, "norm": norm}, p, forward)


# --- running and the torch reference --------------------------------------------------------


def feeds(model: Model, lead: tuple[int, ...], seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i: rng.standard_normal((*lead, *s)).astype(np.float32)
            for i, s in model.inputs.items()}


def torch_grads(model: Model, data: dict[str, np.ndarray], names, lead: int
                ) -> dict[str, np.ndarray]:
    """Per micro-batch gradients with fixed weights: {name: [*lead dims, *T]}; the inputs in
    ``data`` have ``lead`` leading dims before the micro-batch shape."""
    some = next(iter(data.values()))
    lead_shape = some.shape[:lead]
    out = {n: [] for n in names}
    params = {k: torch.tensor(v, requires_grad=True) for k, v in model.params.items()}
    for index in np.ndindex(*lead_shape):
        t = {k: torch.tensor(v[index], requires_grad=True) for k, v in data.items()}
        loss, h = model.forward(t, params)
        wanted = [h[n] for n in names]
        for tensor in wanted:
            tensor.retain_grad()
        loss.backward()
        for n, tensor in zip(names, wanted):
            out[n].append(tensor.grad.numpy().copy())
    return {n: np.stack(v).reshape(*lead_shape, *v[0].shape) for n, v in out.items()}


def session_of(model: Model, anchors: dict[str, popart.AnchorReturnType], bps: int = 1,
               af: int = 1, rf: int = 1, pipeline_ipus: int = 0, lr: float = 0.0
               ) -> popart.TrainingSession:
    opts = popart.SessionOptions()
    ipus = rf
    if af > 1:
        opts.enableGradientAccumulation = True
        opts.accumulationFactor = af
    if rf > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = rf
    if pipeline_ipus:
        opts.virtualGraphMode = popart.VirtualGraphMode.Manual
        opts.enablePipelining = True
        ipus = rf * pipeline_ipus
    session = popart.TrainingSession(
        model.proto, popart.DataFlow(bps, anchors), model.loss, popart.ConstSGD(lr),
        popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus}), userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    return session


def run(session, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    arrays = session.initAnchorArrays()
    session.run(popart.PyStepIO({k: np.ascontiguousarray(v) for k, v in data.items()}, arrays))
    return arrays


def assert_close(got, want, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


# --- models ----------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [mlp, cnn, attention_layer], ids=["mlp", "cnn", "attention"])
def test_input_and_activation_gradients_equal_torch_F35(make):
    model = make()
    art = popart.AnchorReturnType("All")
    session = session_of(model, {GRAD + tid: art for tid in model.watched.values()}, bps=2)
    data = feeds(model, (2,))
    got = run(session, data)
    want = torch_grads(model, data, list(model.watched), lead=1)
    for name, tid in model.watched.items():
        assert_close(got[GRAD + tid], want[name], GRAD + tid)


def test_gradients_with_weight_updates_equal_torch_training_F35():
    """lr > 0: each batch's input gradient is taken with the weights of that batch."""
    model = mlp()
    lr, bps = 0.1, 3
    anchors = {GRAD + "x": popart.AnchorReturnType("All"),
               GRAD + "w1": popart.AnchorReturnType("All")}
    session = session_of(model, anchors, bps=bps, lr=lr)
    data = feeds(model, (bps,))
    got = run(session, data)
    params = {k: torch.tensor(v, requires_grad=True) for k, v in model.params.items()}
    optimizer = torch.optim.SGD(list(params.values()), lr=lr)
    for step in range(bps):
        optimizer.zero_grad()
        x = torch.tensor(data["x"][step], requires_grad=True)
        loss, _ = model.forward({"x": x}, params)
        loss.backward()
        assert_close(got[GRAD + "x"][step], x.grad.numpy(), f"Gradient___x[{step}]")
        assert_close(got[GRAD + "w1"][step], params["w1"].grad.numpy(), f"Gradient___w1[{step}]")
        optimizer.step()


def _spec_anchor(per_mb: np.ndarray, art: popart.AnchorReturnType, leading: int
                 ) -> np.ndarray:
    """Spec §4.2 from per micro-batch values ``[bps, af, rf, *T]``: select or sum, then drop
    the size-1 dims of the leading part only."""
    name = art.id()
    if name == popart.AnchorReturnTypeId.All:
        chosen, lead = per_mb, per_mb.shape[:3]
    elif name == popart.AnchorReturnTypeId.EveryN:
        chosen = per_mb[art.rp() - 1::art.rp()]
        lead = chosen.shape[:3]
    elif name == popart.AnchorReturnTypeId.Final:
        chosen = per_mb[-1, -1]
        lead = chosen.shape[:1]
    else:
        chosen = per_mb.sum(axis=(0, 1))
        lead = chosen.shape[:1]
    sample = per_mb.shape[leading:]
    return chosen.reshape(*(d for d in lead if d != 1), *sample)


ARTS = [popart.AnchorReturnType("All"), popart.AnchorReturnType("Final"),
        popart.AnchorReturnType("EveryN", 2), popart.AnchorReturnType("Sum")]


@pytest.mark.parametrize("af", [1, 2], ids=["plain", "accumulated"])
@pytest.mark.parametrize("art", ARTS, ids=["All", "Final", "EveryN2", "Sum"])
def test_every_anchor_return_type_F35(art, af):
    """With accumulation, All returns each micro-batch's own activation gradient (not the
    accumulated sum), as it does for a weight gradient anchor."""
    model, bps = mlp(), 4
    watched = {"x": "x", "act": model.watched["act"]}
    session = session_of(model, {GRAD + t: art for t in watched.values()}, bps=bps, af=af)
    lead = (bps, af) if af > 1 else (bps,)
    data = feeds(model, lead, seed=11)
    got = run(session, data)
    want = torch_grads(model, data, list(watched), lead=len(lead))
    for name, tid in watched.items():
        per_mb = want[name].reshape(bps, af, 1, *want[name].shape[len(lead):])
        assert_close(got[GRAD + tid], _spec_anchor(per_mb, art, 3), f"{GRAD}{tid} {art}")
        assert got[GRAD + tid].shape == session.initAnchorArrays()[GRAD + tid].shape


def test_replicated_gradients_are_each_replicas_own_F35():
    model, bps, rf, af = mlp(), 2, 2, 2
    art = popart.AnchorReturnType("All")
    anchors = {GRAD + "x": art, GRAD + model.watched["act"]: art}
    session = session_of(model, anchors, bps=bps, af=af, rf=rf)
    data = feeds(model, (bps, af, rf), seed=12)
    got = run(session, data)
    want = torch_grads(model, data, ["x", "act"], lead=3)
    assert got[GRAD + "x"].shape == (bps, af, rf, 3, 4)
    assert_close(got[GRAD + "x"], want["x"], "Gradient___x")
    assert_close(got[GRAD + model.watched["act"]], want["act"], "Gradient___act")


def chain(mb: int = 2, d: int = 3, seed: int = 3) -> Model:
    """tanh(tanh(x @ w0) @ w1), L1 loss: layer k on IPU k and pipeline stage k."""
    rng = np.random.default_rng(seed)
    p = {f"w{k}": rng.standard_normal((d, d)).astype(np.float32) * 0.5 for k in range(2)}
    b = _builder()
    h = x = b.addInputTensor(popart.TensorInfo("FLOAT", [mb, d]), "x")
    acts = []
    for k in range(2):
        w = b.addInitializedInputTensor(p[f"w{k}"], f"w{k}")
        with b.virtualGraph(k), b.pipelineStage(k):
            h = b.aiOnnx.tanh([b.aiOnnx.matmul([h, w])])
            acts.append(h)
    with b.virtualGraph(1), b.pipelineStage(1):
        loss = b.aiGraphcore.l1loss([h], 0.5, reduction=popart.ReductionType.Mean)

    def forward(t, q):
        hid = {"x": t["x"]}
        hid["h0"] = torch.tanh(t["x"] @ q["w0"])
        hid["h1"] = torch.tanh(hid["h0"] @ q["w1"])
        return 0.5 * hid["h1"].abs().mean(), hid

    return Model(b.getModelProto(), loss, {"x": (mb, d)},
                 {"x": x, "h0": acts[0], "h1": acts[1]}, p, forward)


def test_pipelined_gradients_equal_torch_F35():
    model, bps, af = chain(), 1, 4
    art = popart.AnchorReturnType("All")
    session = session_of(model, {GRAD + t: art for t in model.watched.values()}, bps=bps,
                         af=af, pipeline_ipus=2)
    data = feeds(model, (bps, af), seed=13)
    got = run(session, data)
    want = torch_grads(model, data, list(model.watched), lead=2)
    for name, tid in model.watched.items():
        assert_close(got[GRAD + tid], want[name][0], GRAD + tid)


# --- what autodiff builds --------------------------------------------------------------------


def test_input_gradient_is_built_only_when_anchored_F35():
    model = mlp()
    plain = session_of(model, {})
    anchored = session_of(model, {GRAD + "x": popart.AnchorReturnType("Final")})
    assert GRAD + "x" not in plain.getTensorIds()
    assert GRAD + "x" in anchored.getTensorIds()
    # The gradient of x costs ops (one MatMul with w1's transpose at least), only when asked.
    assert len(anchored.getIr().main.ops) > len(plain.getIr().main.ops)


def test_tensor_ids_name_gradients_with_the_reserved_prefix():
    model = mlp()
    session = session_of(model, {GRAD + model.watched["act"]: popart.AnchorReturnType("All")})
    ids = session.getTensorIds()
    assert ids == session.getAllTensorIds()
    onnx_graph = onnx.load_from_string(model.proto).graph
    assert {i.name for i in onnx_graph.input} <= ids
    assert {GRAD + w for w in model.params} <= ids
    assert GRAD + model.watched["act"] in ids
    assert model.loss in ids


def test_inference_tensor_ids_are_the_onnx_tensors():
    b = _builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    w = b.addInitializedInputTensor(np.ones((3, 2), np.float32), "w")
    y = b.aiOnnx.relu([b.aiOnnx.matmul([x, w])])
    b.addOutputTensor(y)
    proto = b.getModelProto()
    session = popart.InferenceSession(proto, popart.DataFlow(1, [y]),
                                      popart.DeviceManager().createCpuDevice())
    graph = onnx.load_from_string(proto).graph
    want = ({i.name for i in graph.input} | {i.name for i in graph.initializer}
            | {o for n in graph.node for o in n.output})
    assert session.getAllTensorIds() == want


# --- tensors without a gradient -------------------------------------------------------------


def _with_side_tensors() -> tuple[bytes, str, dict[str, str]]:
    """An MLP whose loss ignores a side branch, reads an INT32 input through a Cast, and
    sees one branch only through a detach."""
    b = _builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    count = b.addInputTensor(popart.TensorInfo("INT32", [2, 3]), "count")
    w = b.addInitializedInputTensor(np.ones((3, 3), np.float32), "w")
    h = b.aiOnnx.matmul([x, w])
    side = b.aiOnnx.sigmoid([x])
    b.addOutputTensor(side)
    detached_src = b.aiOnnx.exp([x])
    detached = b.aiGraphcore.detach([detached_src])
    mixed = b.aiOnnx.add([b.aiOnnx.add([h, b.aiOnnx.cast([count], "FLOAT")]), detached])
    loss = b.aiGraphcore.l1loss([mixed], 1.0, reduction=popart.ReductionType.Sum)
    return b.getModelProto(), loss, {"side": side, "detached": detached_src}


def _session_anchoring(anchor: str):
    proto, loss, _ = _with_side_tensors()
    return popart.TrainingSession(proto, popart.DataFlow(1, [anchor]), loss,
                                  popart.ConstSGD(0.1), popart.DeviceManager().createCpuDevice())


def test_gradient_of_an_integer_input_is_refused():
    with pytest.raises(popart.popart_exception, match=r"'Gradient___count'.*'count'.*INT32"):
        _session_anchoring(GRAD + "count")


def test_gradient_of_a_tensor_off_the_loss_path_is_refused():
    _, _, ids = _with_side_tensors()
    with pytest.raises(popart.popart_exception,
                       match=rf"tensor '{ids['side']}'.*not on a path to the loss"):
        _session_anchoring(GRAD + ids["side"])


def test_gradient_through_a_detach_is_refused():
    _, _, ids = _with_side_tensors()
    with pytest.raises(popart.popart_exception,
                       match=rf"tensor '{ids['detached']}'.*no gradient flows back"):
        _session_anchoring(GRAD + ids["detached"])


def test_gradient_of_an_unknown_tensor_suggests_names():
    with pytest.raises(popart.popart_exception, match=r"'Gradient___xx'.*Did you mean"):
        _session_anchoring(GRAD + "xx")


def test_loss_gradient_anchor_survives_non_const_loss_scaling():
    """The loss gradient seeds the backward pass: lossScaling (non-const) times the seed."""
    model = mlp()
    optimizer = popart.SGD({"defaultLearningRate": (0.0, True), "lossScaling": (4.0, False)})
    session = popart.TrainingSession(
        model.proto, popart.DataFlow(1, {GRAD + model.loss: popart.AnchorReturnType("All"),
                                         GRAD + "x": popart.AnchorReturnType("All")}),
        model.loss, optimizer, popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    data = feeds(model, ())
    got = run(session, data)
    want = torch_grads(model, {"x": data["x"][None]}, ["x"], lead=1)["x"][0]
    np.testing.assert_allclose(got[GRAD + model.loss], 4.0, rtol=RTOL)
    assert_close(got[GRAD + "x"], 4.0 * want, "Gradient___x")
