"""Weight-gradient products computed inside their SGD updates (transforms/fuse_grad_update.py,
ops/fused_grad.py): the trained weights equal eager torch.optim.SGD and the same session with
the fusion switched off (anchoring a gradient keeps it a tensor, so its update is not fused).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

import popart_backend as popart
from tests.transforms.test_training_fusions import _feeds, _model, _params

B, IN, H, OUT = 4, 6, 5, 3
ALPHA = 0.5  # the last Gemm's alpha: its gradient product is scaled too
WEIGHTS = ("w1", "b1", "w2", "b2", "w3", "b3")


def _mlp_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"w1": (H, IN), "b1": (H,), "w2": (H, H), "b2": (H,), "w3": (H, OUT), "b3": (OUT,)}
    return {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}


def _mlp_session(params, optimizer, anchored=(), bps: int = 1, gather: bool = False,
                 options=None):
    """x → Gemm(transB) → Relu → MatMul + Add (LinearBias) → Relu → Gemm(alpha) → 0.1·Σ|y|.
    With ``gather``, x is a row gather of an input table (so a bad index fails a run)."""
    builder = popart.Builder()
    ids = {k: builder.addInitializedInputTensor(v, k) for k, v in params.items()}
    if gather:
        table = builder.addInitializedInputTensor(
            np.random.default_rng(5).standard_normal((8, IN)).astype(np.float32), "table")
        x_in = builder.addInputTensor(popart.TensorInfo("INT32", [B]), "idx")
        x = builder.aiOnnx.gather([table, x_in])
    else:
        x_in = x = builder.addInputTensor(popart.TensorInfo("FLOAT", [B, IN]), "x")
    h = builder.aiOnnx.relu([builder.aiOnnx.gemm([x, ids["w1"], ids["b1"]], transB=1)])
    h = builder.aiOnnx.relu([builder.aiOnnx.add([builder.aiOnnx.matmul([h, ids["w2"]]),
                                                 ids["b2"]])])
    y = builder.aiOnnx.gemm([h, ids["w3"], ids["b3"]], alpha=ALPHA)
    loss = builder.aiGraphcore.l1loss([y], 0.1, reduction=popart.ReductionType.Sum)
    anchors = {loss: popart.AnchorReturnType("All")}
    anchors.update({f"Gradient___{w}": popart.AnchorReturnType("All") for w in anchored})
    if options is None:
        options = _early_updates()
    session = popart.TrainingSession(
        fnModel=builder.getModelProto(), dataFlow=popart.DataFlow(bps, anchors), loss=loss,
        optimizer=optimizer, deviceInfo=popart.DeviceManager().createCpuDevice(),
        userOptions=options)
    session.prepareDevice()
    session.weightsFromHost()
    return session, x_in


def _early_updates() -> popart.SessionOptions:
    options = popart.SessionOptions()
    options.delayVarUpdates = False  # the fusion's condition (module doc of the pass)
    return options


def _read(session, names) -> dict[str, np.ndarray]:
    got = {k: np.zeros(session.getInfo(k).shape(), np.float32) for k in names}
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(got))
    return got


def _fused(session) -> int:
    return Counter(op.op_type for op in session.getIr().main.ops.values())["SGDMatMulUpdate"]


def _x(step: int) -> np.ndarray:
    return np.random.default_rng(10 + step).standard_normal((B, IN)).astype(np.float32)


def _torch_mlp(params, steps: int, **sgd) -> dict[str, np.ndarray]:
    p = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    opt = torch.optim.SGD(p.values(), **sgd)
    for step in range(steps):
        opt.zero_grad()
        x = torch.from_numpy(_x(step))
        h = torch.relu(x @ p["w1"].T + p["b1"])
        h = torch.relu(h @ p["w2"] + p["b2"])
        y = ALPHA * (h @ p["w3"]) + p["b3"]
        (0.1 * y.abs().sum()).backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in p.items()}


# (popart SGD values, the torch.optim.SGD arguments it means)
CASES = {
    "momentum_dynamic_loss_scaling": (
        {"defaultLearningRate": (0.1, False), "defaultMomentum": (0.9, False),
         "lossScaling": (4.0, False)},
        {"lr": 0.1, "momentum": 0.9}),
    "momentum_weight_decay_dampening_velocity_scaling": (
        {"defaultLearningRate": (0.1, True), "defaultMomentum": (0.9, True),
         "defaultWeightDecay": (0.05, True), "defaultDampening": (0.2, True),
         "defaultVelocityScaling": (2.0, True), "lossScaling": (8.0, True)},
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.05, "dampening": 0.2}),
    "no_momentum_weight_decay": (
        {"defaultLearningRate": (0.1, False), "defaultWeightDecay": (0.05, False)},
        {"lr": 0.1, "weight_decay": 0.05}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_sgd_trains_like_torch_and_like_the_unfused_session(case):
    values, torch_sgd = CASES[case]
    params = _mlp_params()
    fused, x = _mlp_session(params, popart.SGD(values))
    # Anchored gradients stay tensors: w1's and w3's updates are not fused.
    plain, x_plain = _mlp_session(params, popart.SGD(values), anchored=("w1", "w3"))
    assert _fused(fused) == 3 and _fused(plain) == 1
    ir = fused.getIr().main
    assert not any(t.startswith("Gradient___w") for t in ir.tensors)
    # They remain tensor ids of the session, with the weight's info.
    assert {f"Gradient___{w}" for w in WEIGHTS} <= fused.getAllTensorIds()
    assert fused.getInfo("Gradient___w1").shape() == [H, IN]
    steps = 3
    for step in range(steps):
        fused.run(popart.PyStepIO({x: _x(step)}, fused.initAnchorArrays()))
        plain.run(popart.PyStepIO({x_plain: _x(step)}, plain.initAnchorArrays()))
    got, off = _read(fused, WEIGHTS), _read(plain, WEIGHTS)
    want = _torch_mlp(params, steps, **torch_sgd)
    for k in WEIGHTS:
        np.testing.assert_allclose(got[k], off[k], rtol=1e-5, atol=1e-6, err_msg=k)
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6, err_msg=k)


def test_nesterov_is_not_fused_and_still_trains_like_torch():
    params = _mlp_params()
    nesterov = popart.SGD({"defaultLearningRate": (0.1, True), "defaultMomentum": (0.9, True),
                           "nesterov": (1.0, True)})
    session, x = _mlp_session(params, nesterov)
    assert _fused(session) == 0
    for step in range(2):
        session.run(popart.PyStepIO({x: _x(step)}, session.initAnchorArrays()))
    want = _torch_mlp(params, 2, lr=0.1, momentum=0.9, nesterov=True)
    got = _read(session, WEIGHTS)
    for k in WEIGHTS:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6, err_msg=k)


def _torch_accumulated(params, steps: int, factor: int, mean: bool) -> dict[str, np.ndarray]:
    """Each step: the summed (mean: averaged) gradients of ``factor`` micro-batches."""
    p = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    opt = torch.optim.SGD(p.values(), lr=0.1, momentum=0.9, weight_decay=0.01)
    for step in range(steps):
        opt.zero_grad()
        for micro in range(factor):
            x = torch.from_numpy(_x(step * factor + micro))
            h = torch.relu(x @ p["w1"].T + p["b1"])
            h = torch.relu(h @ p["w2"] + p["b2"])
            y = ALPHA * (h @ p["w3"]) + p["b3"]
            (0.1 * y.abs().sum() / (factor if mean else 1)).backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in p.items()}


@pytest.mark.parametrize("mean", [False, True])
def test_accumulated_products_go_into_the_accumulators_F73(mean):
    """Gradient accumulation (Sum, and the Running mean): each weight's product is added to its
    accumulator by addmm; trained weights equal torch and the unfused (anchored) session."""
    params, factor, steps = _mlp_params(), 2, 2
    options = _early_updates()
    options.enableGradientAccumulation = True
    options.accumulationFactor = factor
    if mean:
        options.accumulationAndReplicationReductionType = popart.ReductionType.Mean
        options.meanAccumulationAndReplicationReductionStrategy = (
            popart.MeanReductionStrategy.Running)
    values = {"defaultLearningRate": (0.1, False), "defaultMomentum": (0.9, False),
              "defaultWeightDecay": (0.01, False)}
    fused, x = _mlp_session(params, popart.SGD(values), options=options)
    plain, x_plain = _mlp_session(params, popart.SGD(values), anchored=("w1", "w2", "w3"),
                                  options=options)
    count = Counter(op.op_type for op in fused.getIr().main.ops.values())
    assert count["MatMulAccumulate"] == 3 and count["SGDMatMulUpdate"] == 0
    assert _fused(plain) == 0 and not any(
        op.op_type == "MatMulAccumulate" for op in plain.getIr().main.ops.values())
    for step in range(steps):
        batch = np.stack([_x(step * factor + m) for m in range(factor)])
        fused.run(popart.PyStepIO({x: batch}, fused.initAnchorArrays()))
        plain.run(popart.PyStepIO({x_plain: batch}, plain.initAnchorArrays()))
    got, off = _read(fused, WEIGHTS), _read(plain, WEIGHTS)
    want = _torch_accumulated(params, steps, factor, mean)
    for k in WEIGHTS:
        np.testing.assert_allclose(got[k], off[k], rtol=1e-5, atol=1e-6, err_msg=k)
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6, err_msg=k)


def test_failed_run_leaves_fused_updates_unchanged():
    """Two micro-batches per run: the first updates weights and velocities through the fused
    op (out of place, journaled), the second fails on a bad gather index. The state is as
    before the run, and later runs match a session that never failed."""
    values = {"defaultLearningRate": (0.1, False), "defaultMomentum": (0.9, False),
              "defaultWeightDecay": (0.01, True)}
    params = _mlp_params()
    session, idx = _mlp_session(params, popart.SGD(values), bps=2, gather=True)
    reference, ref_idx = _mlp_session(params, popart.SGD(values), bps=2, gather=True)
    assert _fused(session) == 3
    good = np.array([0, 1, 2, 3, 4, 5, 6, 7], np.int32)
    bad = good.copy()
    bad[-1] = 99
    names = [*WEIGHTS, "Accl___w1", "Accl___w3"]

    def run(s, i, indices):
        s.run(popart.PyStepIO({i: indices}, s.initAnchorArrays()))

    run(session, idx, good)
    run(reference, ref_idx, good)
    before = _read(session, names)
    with pytest.raises(popart.popart_exception):
        run(session, idx, bad)
    assert all(before[k].tobytes() == v.tobytes() for k, v in _read(session, names).items())
    for _ in range(2):
        run(session, idx, good)
        run(reference, ref_idx, good)
    want = _read(reference, names)
    assert all(want[k].tobytes() == v.tobytes() for k, v in _read(session, names).items())


def test_encoder_block_with_momentum_fuses_its_linear_weights_F6():
    """The transformer-ish block of test_training_fusions (LinearBias weights in both layouts,
    attention): SGD with momentum and weight decay, fused vs anchored (unfused) gradients."""
    params, feeds = _params(), _feeds(-np.inf)
    r = np.random.default_rng(2).standard_normal((2, 4, 8)).astype(np.float32)
    model = _model(params, r, False)
    values = {"defaultLearningRate": (0.1, False), "defaultMomentum": (0.9, False),
              "defaultWeightDecay": (0.01, False)}

    def train(anchored):
        anchors = {"loss": popart.AnchorReturnType("All")}
        anchors.update({f"Gradient___{w}": popart.AnchorReturnType("All") for w in anchored})
        session = popart.TrainingSession(
            fnModel=model, dataFlow=popart.DataFlow(1, anchors), loss="loss",
            optimizer=popart.SGD(values), deviceInfo=popart.DeviceManager().createCpuDevice(),
            userOptions=_early_updates())
        session.prepareDevice()
        session.weightsFromHost()
        for _ in range(3):
            session.run(popart.PyStepIO(feeds, session.initAnchorArrays()))
        return _fused(session), _read(session, list(params))

    n_fused, got = train(())
    n_plain, off = train(("wq", "wk", "wv", "w1", "w2"))
    assert n_fused == 5 and n_plain == 0
    for k in params:
        np.testing.assert_allclose(got[k], off[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_default_delayed_updates_keep_every_gradient():
    """With PopART's default delayVarUpdates = True every gradient lives until the updates at
    the end of the backward pass, so nothing is fused and the memory model sees them all."""
    params = _mlp_params()
    values = {"defaultLearningRate": (0.1, False), "defaultMomentum": (0.9, False)}
    session, _ = _mlp_session(params, popart.SGD(values), options=popart.SessionOptions())
    assert _fused(session) == 0
    assert all(f"Gradient___{w}" in session.getIr().main.tensors for w in WEIGHTS)
