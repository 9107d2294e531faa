"""Optimizer update ops (spec §4.3, F39) step by step against torch.optim or the formulas.

Each case builds a tiny IR (two weight variables, their gradients as host streams), lets the
optimizer ``apply()`` its update ops, and executes the plan for several steps with a new
gradient each step. The weights after every step must equal those of torch.optim given the same
gradients in ``.grad`` (or a float64 numpy reference written from the formula where torch has no
such optimizer: AdamNoBias, Lamb, TF-style RMSProp, decoupled decay in Adaptive).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.ir import ExecutionContext, Ir, TensorInfo, TensorKind, TensorRole
from popart_backend.optim.values import AdamMode, AdaptiveMode, WeightDecayMode

STEPS = 5
RTOL, ATOL = 2e-5, 2e-6


def _data(seed=0):
    rng = np.random.default_rng(seed)
    weights = {"w": rng.uniform(-1, 1, (3, 4)).astype(np.float32),
               "b": rng.uniform(-1, 1, (4,)).astype(np.float32)}
    grads = [{n: rng.uniform(-1, 1, w.shape).astype(np.float32) for n, w in weights.items()}
             for _ in range(STEPS)]
    return weights, grads


def run_backend(optimizer, weights, grads, grad_scale=1.0, feed_scale=1.0, updates=None):
    """Weights after each step; the fed gradient is ``feed_scale`` × the true gradient and
    ``updates[i]`` replaces the optimizer (non-const values) before step i."""
    ir = Ir()
    graph = ir.main
    weight_grads = {}
    for name, value in weights.items():
        graph.add_tensor(name, TensorInfo.of(value), TensorKind.VARIABLE, value.copy())
        grad_id = popart.reservedGradientPrefix() + name
        graph.add_tensor(grad_id, TensorInfo.of(value), TensorKind.STREAM)
        graph.inputs.append(grad_id)
        weight_grads[name] = grad_id
    tensors = optimizer.apply(ir, weight_grads, ExecutionContext.Normal, grad_scale)
    for op in graph.ops.values():
        assert op.settings.execution_context is ExecutionContext.Normal
    plan = ExecutionPlan(graph, keep=list(weights))

    def write_hyper(opt):
        for tid, (key, weight_id) in tensors.hyper_params.items():
            assert graph.tensors[tid].role is TensorRole.OPTIMIZER_PARAM
            value = opt.hyper_parameter_values(weight_id)[key]
            plan.set_value(tid, torch.tensor(value, dtype=torch.float32))

    write_hyper(optimizer)
    trajectory = []
    for step, grad in enumerate(grads):
        if updates and step in updates:
            optimizer.check_update(updates[step])
            write_hyper(updates[step])
        for name, value in grad.items():
            plan.set_value(weight_grads[name], to_torch(value * np.float32(feed_scale)))
        plan.execute()
        trajectory.append({n: plan.get_value(n).numpy().copy() for n in weights})
    return trajectory, tensors, graph


def run_torch(make, weights, grads, clip=None, updates=None):
    params = {n: torch.tensor(w, requires_grad=True) for n, w in weights.items()}
    opt = make(list(params.values()))
    trajectory = []
    for step, grad in enumerate(grads):
        if updates and step in updates:
            for group in opt.param_groups:
                group.update(updates[step])
        for name, p in params.items():
            p.grad = torch.tensor(grad[name])
        if clip is not None:
            torch.nn.utils.clip_grad_norm_([params[n] for n in clip[0]], clip[1])
        opt.step()
        trajectory.append({n: p.detach().numpy().copy() for n, p in params.items()})
    return trajectory


def assert_same(got, want, rtol=RTOL, atol=ATOL):
    for step, (g, w) in enumerate(zip(got, want)):
        for name in w:
            err = np.abs(g[name].astype(np.float64) - w[name])
            worst = np.unravel_index(np.argmax(err), err.shape)
            assert np.allclose(g[name], w[name], rtol=rtol, atol=atol), (
                f"step {step + 1}, weight '{name}': max error {err.max():.3g} at {worst}: "
                f"got {g[name][worst]}, want {w[name][worst]} (rtol {rtol}, atol {atol})")


def ov(value, const=True):
    return (value, const)


# --- SGD --------------------------------------------------------------------------------------

SGD_CASES = {
    "plain": ({"defaultLearningRate": ov(0.1)}, dict(lr=0.1)),
    "weight_decay": ({"defaultLearningRate": ov(0.05), "defaultWeightDecay": ov(0.1)},
                     dict(lr=0.05, weight_decay=0.1)),
    "momentum": ({"defaultLearningRate": ov(0.1), "defaultMomentum": ov(0.9)},
                 dict(lr=0.1, momentum=0.9)),
    # torch does not dampen the first momentum step; neither do we.
    "momentum_dampening_wd": (
        {"defaultLearningRate": ov(0.1), "defaultMomentum": ov(0.8),
         "defaultDampening": ov(0.3), "defaultWeightDecay": ov(0.01)},
        dict(lr=0.1, momentum=0.8, dampening=0.3, weight_decay=0.01)),
    "nesterov": ({"defaultLearningRate": ov(0.1), "defaultMomentum": ov(0.9),
                  "defaultNesterov": ov(1), "defaultWeightDecay": ov(0.01)},
                 dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "velocity_scaling": ({"defaultLearningRate": ov(0.1), "defaultMomentum": ov(0.9),
                          "defaultVelocityScaling": ov(8.0), "defaultDampening": ov(0.2)},
                         dict(lr=0.1, momentum=0.9, dampening=0.2)),
    "dampening_without_momentum": ({"defaultLearningRate": ov(0.1), "defaultDampening": ov(0.5)},
                                   dict(lr=0.1, dampening=0.5)),
    "non_const": ({"defaultLearningRate": ov(0.1, False), "defaultMomentum": ov(0.9, False),
                   "defaultDampening": ov(0.1, False), "defaultWeightDecay": ov(0.01, False)},
                  dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
}


@pytest.mark.parametrize("mode", list(popart.SGDAccumulatorAndMomentum))
@pytest.mark.parametrize("case", sorted(SGD_CASES))
def test_sgd_matches_torch(case, mode):
    """F39: SGD (Combined and Separate) gives torch.optim.SGD's weights after every step."""
    values, torch_args = SGD_CASES[case]
    weights, grads = _data()
    got, _, _ = run_backend(popart.SGD(values, accumulatorAndMomentum=mode), weights, grads)
    want = run_torch(lambda p: torch.optim.SGD(p, **torch_args), weights, grads)
    assert_same(got, want)


def test_sgd_state_tensors():
    """Momentum adds Accl___<w>; dampening adds the step counter; plain SGD adds nothing."""
    weights, grads = _data()
    _, tensors, graph = run_backend(popart.SGD(0.1), weights, grads[:1])
    assert tensors.state == {"w": [], "b": []} and tensors.hyper_params == {}
    assert tensors.updated == {"w": "UpdatedVar___w", "b": "UpdatedVar___b"}
    opt = popart.SGD({"defaultMomentum": ov(0.9), "defaultDampening": ov(0.1)})
    _, tensors, graph = run_backend(opt, weights, grads[:1])
    assert tensors.state["w"] == ["Accl___w", "Step___w"]
    assert graph.tensors["Accl___w"].role is TensorRole.OPTIMIZER_STATE
    assert graph.tensors["Step___w"].role is TensorRole.STEP
    assert graph.tensors["Accl___w"].kind is TensorKind.VARIABLE


def test_sgd_velocity_scaling_and_separate_same_trajectory():
    """vs and Separate mode change the stored state, never the weights."""
    weights, grads = _data(1)
    base = {"defaultLearningRate": ov(0.1), "defaultMomentum": ov(0.7)}
    ref, _, _ = run_backend(popart.SGD(base), weights, grads)
    scaled = dict(base, defaultVelocityScaling=ov(0.25))
    for mode in popart.SGDAccumulatorAndMomentum:
        got, _, _ = run_backend(popart.SGD(scaled, accumulatorAndMomentum=mode), weights, grads)
        assert_same(got, [{n: v.astype(np.float64) for n, v in s.items()} for s in ref])


def test_sgd_insert_specific_and_non_const_update():
    """Per-weight values and updateOptimizerFromHost of non-const values between steps."""
    weights, grads = _data(2)
    opt = popart.SGD({"defaultLearningRate": ov(0.1, False), "defaultMomentum": ov(0.5)})
    opt.insertSpecific("b", {"learningRate": (0.02, False)})
    new = popart.SGD({"defaultLearningRate": ov(0.05, False), "defaultMomentum": ov(0.5)})
    new.insertSpecific("b", {"learningRate": (0.01, False)})
    got, tensors, _ = run_backend(opt, weights, grads, updates={3: new})
    assert tensors.hyper_params == {"learningRate___default": ("learningRate", None),
                                    "learningRate___specific___b": ("learningRate", "b")}
    params = {n: torch.tensor(w, requires_grad=True) for n, w in weights.items()}
    topt = torch.optim.SGD([{"params": [params["w"]], "lr": 0.1},
                            {"params": [params["b"]], "lr": 0.02}], lr=0.1, momentum=0.5)
    for step, grad in enumerate(grads):
        if step == 3:
            topt.param_groups[0]["lr"], topt.param_groups[1]["lr"] = 0.05, 0.01
        for name, p in params.items():
            p.grad = torch.tensor(grad[name])
        topt.step()
        for name, p in params.items():
            np.testing.assert_allclose(got[step][name], p.detach().numpy(), RTOL, ATOL)


@pytest.mark.parametrize("const", [True, False], ids=["const_ls", "variable_ls"])
def test_sgd_loss_scaling(const):
    """Gradients arrive multiplied by lossScaling; the update divides it out."""
    weights, grads = _data(3)
    ls = 128.0
    opt = popart.SGD({"defaultLearningRate": ov(0.1), "defaultMomentum": ov(0.9),
                      "lossScaling": (ls, const)})
    got, tensors, graph = run_backend(opt, weights, grads, grad_scale=1 / ls if const else 1.0,
                                      feed_scale=ls)
    if not const:
        assert tensors.hyper_params == {"lossScaling_FLOAT": ("lossScaling", None)}
    want = run_torch(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), weights, grads)
    assert_same(got, want)


@pytest.mark.parametrize("ls", [1.0, 64.0])
def test_sgd_clip_norm(ls):
    """ClipNormSettings clips like torch.nn.utils.clip_grad_norm_ (on un-scaled gradients)."""
    weights, grads = _data(4)
    opt = popart.SGD({"defaultLearningRate": ov(0.1), "defaultMomentum": ov(0.9),
                      "lossScaling": (ls, False)},
                     clip_norm_settings=[popart.ClipNormSettings(["w", "b"], 0.5)])
    got, _, graph = run_backend(opt, weights, grads, feed_scale=ls)
    assert len(list(graph.ops_of_type("GlobalNormClipFactor"))) == 1
    want = run_torch(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), weights, grads,
                     clip=(["w", "b"], 0.5))
    assert_same(got, want)


def test_clip_norm_one_weight_only():
    weights, grads = _data(5)
    opt = popart.SGD(0.1, clip_norm_settings=[popart.ClipNormSettings(["w"], 0.3)])
    got, _, _ = run_backend(opt, weights, grads)
    want = run_torch(lambda p: torch.optim.SGD(p, lr=0.1), weights, grads, clip=(["w"], 0.3))
    assert_same(got, want)


# --- Adam ---------------------------------------------------------------------------------------

ADAM_VALUES = {"defaultLearningRate": ov(0.01), "defaultBeta1": ov(0.8),
               "defaultBeta2": ov(0.95), "defaultEps": ov(1e-5)}
ADAM_TORCH = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-5)


@pytest.mark.parametrize("wd", [0.0, 0.1])
@pytest.mark.parametrize("decay_mode", list(WeightDecayMode))
def test_adam_matches_torch(decay_mode, wd):
    """Adam + L2Regularization = torch Adam(weight_decay); Adam + Decay = torch AdamW."""
    weights, grads = _data(6)
    values = dict(ADAM_VALUES, defaultWeightDecay=ov(wd))
    opt = popart.Adam(values, AdamMode.Adam, decay_mode)
    got, tensors, graph = run_backend(opt, weights, grads)
    assert tensors.state["w"] == ["Accl1___w", "Accl2___w", "Step___w"]
    cls = torch.optim.AdamW if decay_mode is WeightDecayMode.Decay else torch.optim.Adam
    want = run_torch(lambda p: cls(p, weight_decay=wd, **ADAM_TORCH), weights, grads)
    assert_same(got, want)


@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_adamax_matches_torch(wd):
    weights, grads = _data(7)
    values = dict(ADAM_VALUES, defaultWeightDecay=ov(wd))
    opt = popart.Adam(values, AdamMode.AdaMax, WeightDecayMode.L2Regularization)
    got, _, _ = run_backend(opt, weights, grads)
    want = run_torch(lambda p: torch.optim.Adamax(p, weight_decay=wd, **ADAM_TORCH),
                     weights, grads)
    assert_same(got, want)


def adam_reference(mode, weights, grads, lr, b1, b2, eps, wd=0.0, decoupled=True, mwn=10.0):
    """float64 numpy Adam-family trajectory written from the formulas of spec §4.3."""
    ws = {n: w.astype(np.float64) for n, w in weights.items()}
    m = {n: np.zeros_like(w) for n, w in ws.items()}
    v = {n: np.zeros_like(w) for n, w in ws.items()}
    out = []
    for t, grad in enumerate(grads, start=1):
        for n in ws:
            g = grad[n].astype(np.float64)
            if wd and not decoupled:
                g = g + wd * ws[n]
            m[n] = b1 * m[n] + (1 - b1) * g
            v[n] = b2 * v[n] + (1 - b2) * g * g
            bias = mode in (AdamMode.Adam, AdamMode.Lamb)
            mh = m[n] / (1 - b1**t) if bias else m[n]
            vh = v[n] / (1 - b2**t) if bias else v[n]
            u = mh / (np.sqrt(vh) + eps)
            if wd and decoupled:
                u = u + wd * ws[n]
            ratio = 1.0
            if mode in (AdamMode.Lamb, AdamMode.LambNoBias):
                r1, r2 = min(np.linalg.norm(ws[n]), mwn), np.linalg.norm(u)
                ratio = r1 / r2 if r1 > 0 and r2 > 0 else 1.0
            ws[n] = ws[n] - lr * ratio * u
        out.append(dict(ws))
    return out


@pytest.mark.parametrize("mode", [AdamMode.AdamNoBias, AdamMode.Lamb, AdamMode.LambNoBias])
@pytest.mark.parametrize("decay_mode", list(WeightDecayMode))
def test_adam_modes_match_formula(mode, decay_mode):
    weights, grads = _data(8)
    values = dict(ADAM_VALUES, defaultWeightDecay=ov(0.1), defaultMaxWeightNorm=ov(1.2))
    got, _, _ = run_backend(popart.Adam(values, mode, decay_mode), weights, grads)
    want = adam_reference(mode, weights, grads, 0.01, 0.8, 0.95, 1e-5, wd=0.1,
                          decoupled=decay_mode is WeightDecayMode.Decay, mwn=1.2)
    assert_same(got, want)


def test_lamb_zero_norm_ratio_is_one():
    """A zero weight has ‖w‖ = 0: the trust ratio is 1 (plain Adam step)."""
    weights = {"w": np.zeros((2, 3), np.float32)}
    grads = [{"w": np.full((2, 3), 0.5, np.float32)}]
    got, _, _ = run_backend(popart.Adam(ADAM_VALUES, AdamMode.Lamb), weights, grads)
    want = adam_reference(AdamMode.Adam, weights, grads, 0.01, 0.8, 0.95, 1e-5)
    assert_same(got, want)


@pytest.mark.parametrize("scaled", [False, True])
def test_adam_loss_scaling_clip_and_non_const(scaled):
    """Loss scaling (optionally with scaled optimizer state), clip norm and a changed
    non-const learning rate all match torch Adam with clip_grad_norm_."""
    weights, grads = _data(9)
    ls = 256.0
    values = dict(ADAM_VALUES, defaultLearningRate=ov(0.01, False), lossScaling=(ls, True))
    clip = [popart.ClipNormSettings.clipAllWeights(0.4)]
    opt = popart.Adam(values, AdamMode.Adam, WeightDecayMode.L2Regularization,
                      clip_norm_settings=clip, scaled_optimizer_state=scaled)
    new = popart.Adam(dict(values, defaultLearningRate=ov(0.02, False)), AdamMode.Adam,
                      WeightDecayMode.L2Regularization, clip_norm_settings=clip,
                      scaled_optimizer_state=scaled)
    got, _, _ = run_backend(opt, weights, grads, grad_scale=1 / ls, feed_scale=ls,
                            updates={2: new})
    want = run_torch(lambda p: torch.optim.Adam(p, **ADAM_TORCH), weights, grads,
                     clip=(["w", "b"], 0.4), updates={2: {"lr": 0.02}})
    assert_same(got, want)


# --- Adaptive -------------------------------------------------------------------------------------


@pytest.mark.parametrize("centered", [False, True])
@pytest.mark.parametrize("momentum", [0.0, 0.5])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_rmsprop_matches_torch(centered, momentum, wd):
    weights, grads = _data(10)
    mode = AdaptiveMode.CenteredRMSProp if centered else AdaptiveMode.RMSProp
    values = {"defaultLearningRate": ov(0.01), "defaultAlpha": ov(0.9), "defaultEps": ov(1e-4),
              "defaultMomentum": ov(momentum), "defaultWeightDecay": ov(wd)}
    opt = popart.Adaptive(values, mode, WeightDecayMode.L2Regularization)
    got, _, _ = run_backend(opt, weights, grads)
    want = run_torch(lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-4,
                                                   momentum=momentum, weight_decay=wd,
                                                   centered=centered), weights, grads)
    assert_same(got, want)


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adagrad_matches_torch(wd):
    weights, grads = _data(11)
    values = {"defaultLearningRate": ov(0.1), "defaultEps": ov(1e-6),
              "defaultWeightDecay": ov(wd, False)}
    opt = popart.Adaptive(values, AdaptiveMode.AdaGrad, WeightDecayMode.L2Regularization)
    got, _, _ = run_backend(opt, weights, grads)
    want = run_torch(lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-6, weight_decay=wd),
                     weights, grads)
    assert_same(got, want)


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adadelta_matches_torch(wd):
    weights, grads = _data(12)
    values = {"defaultLearningRate": ov(1.0), "defaultAlpha": ov(0.9), "defaultEps": ov(1e-6),
              "defaultWeightDecay": ov(wd)}
    opt = popart.Adaptive(values, AdaptiveMode.AdaDelta, WeightDecayMode.L2Regularization)
    got, tensors, _ = run_backend(opt, weights, grads)
    assert tensors.state["w"] == ["Accl1___w", "Accl2___w"]
    want = run_torch(lambda p: torch.optim.Adadelta(p, lr=1.0, rho=0.9, eps=1e-6,
                                                    weight_decay=wd), weights, grads)
    assert_same(got, want)


def rmsprop_reference(weights, grads, lr, alpha, eps, momentum=0.0, wd=0.0, tf=False):
    """float64 RMSProp with decoupled weight decay; ``tf``: ε inside the root, a1 starts at 1."""
    ws = {n: w.astype(np.float64) for n, w in weights.items()}
    a1 = {n: np.full_like(w, 1.0 if tf else 0.0) for n, w in ws.items()}
    buf = {n: np.zeros_like(w) for n, w in ws.items()}
    out = []
    for grad in grads:
        for n in ws:
            g = grad[n].astype(np.float64)
            a1[n] = alpha * a1[n] + (1 - alpha) * g * g
            u = g / (np.sqrt(a1[n] + eps) if tf else np.sqrt(a1[n]) + eps)
            if momentum:
                buf[n] = momentum * buf[n] + u
                u = buf[n]
            ws[n] = ws[n] * (1 - lr * wd) - lr * u
        out.append(dict(ws))
    return out


@pytest.mark.parametrize("tf", [False, True], ids=["torch_form", "tf_variant"])
def test_rmsprop_decay_mode_and_tf_variant(tf):
    weights, grads = _data(13)
    values = {"defaultLearningRate": ov(0.01), "defaultAlpha": ov(0.9), "defaultEps": ov(1e-4),
              "defaultMomentum": ov(0.3), "defaultWeightDecay": ov(0.1)}
    opt = popart.Adaptive(values, AdaptiveMode.RMSProp, WeightDecayMode.Decay,
                          rmsprop_tf_variant=tf)
    got, _, _ = run_backend(opt, weights, grads)
    want = rmsprop_reference(weights, grads, 0.01, 0.9, 1e-4, momentum=0.3, wd=0.1, tf=tf)
    assert_same(got, want)


def test_adaptive_loss_scaling_non_const():
    weights, grads = _data(14)
    values = {"defaultLearningRate": ov(0.01, False), "defaultAlpha": ov(0.9),
              "lossScaling": (32.0, False)}
    opt = popart.Adaptive(values, AdaptiveMode.RMSProp)
    got, tensors, _ = run_backend(opt, weights, grads, feed_scale=32.0)
    assert set(tensors.hyper_params) == {"learningRate___default", "lossScaling_FLOAT"}
    want = run_torch(lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-6),
                     weights, grads)
    assert_same(got, want)


# --- op level -----------------------------------------------------------------------------------


def test_update_ops_are_in_place_and_named():
    weights, grads = _data()
    ir = Ir()
    graph = ir.main
    graph.add_tensor("w", TensorInfo.of(weights["w"]), TensorKind.VARIABLE, weights["w"])
    graph.add_const("Gradient___w", grads[0]["w"])
    popart.Adam(ADAM_VALUES).apply(ir, {"w": "Gradient___w"},
                                   ExecutionContext.AccumulateOuterFragment, 1.0)
    (op,) = graph.ops.values()
    assert op.op_type == "AdamUpdate" and op.domain == "ai.graphcore"
    assert op.settings.name == "AdamUpdate___w"
    assert op.settings.execution_context is ExecutionContext.AccumulateOuterFragment
    assert op.modifies_inputs == (0, 2, 3, 4)
    assert [t.id if t else None for t in op.inputs] == [
        "w", "Gradient___w", "Accl1___w", "Accl2___w", "Step___w", None]
    plan = ExecutionPlan(graph, keep=["w"])
    before = plan.get_value("w")
    plan.execute()
    assert plan.get_value("w") is before  # written in place
    assert float(plan.get_value("Step___w")) == 1.0
    assert not math.isclose(float(before[0, 0]), float(weights["w"][0, 0]))


def test_update_op_rejects_wrong_gradient_shape():
    ir = Ir()
    graph = ir.main
    graph.add_tensor("w", TensorInfo.of(np.zeros((2, 2), np.float32)), TensorKind.VARIABLE,
                     np.zeros((2, 2), np.float32))
    graph.add_const("g", np.zeros((3,), np.float32))
    with pytest.raises(popart.popart_exception, match="SGDUpdate.*gradient"):
        popart.SGD(0.1).apply(ir, {"w": "g"}, ExecutionContext.Normal, 1.0)


def _ir_with(weights):
    ir = Ir()
    for name, value in weights.items():
        ir.main.add_tensor(name, TensorInfo.of(value), TensorKind.VARIABLE, value)
        ir.main.add_const("Gradient___" + name, np.ones_like(value))
    return ir, {name: "Gradient___" + name for name in weights}


@pytest.mark.parametrize("clip, match", [
    ([popart.ClipNormSettings(["x"], 1.0)], r"names \['x'\], which are not trained"),
    ([popart.ClipNormSettings(["w"], 1.0), popart.ClipNormSettings(["w", "b"], 2.0)],
     "more than one ClipNormSettings"),
])
def test_apply_rejects_bad_clip_settings(clip, match):
    ir, weight_grads = _ir_with(_data()[0])
    with pytest.raises(popart.popart_exception, match=match):
        popart.SGD(0.1, clip).apply(ir, weight_grads, ExecutionContext.Normal, 1.0)


def test_apply_rejects_non_variable():
    ir, _ = _ir_with({})
    ir.main.add_const("c", np.ones(2, np.float32))
    with pytest.raises(popart.popart_exception, match="'c' is const, not a variable"):
        popart.SGD(0.1).apply(ir, {"c": "c"}, ExecutionContext.Normal, 1.0)


def test_graph_verifies_and_prints():
    from popart_backend.ir import format_graph, verify

    ir, weight_grads = _ir_with(_data()[0])
    popart.Adaptive({"defaultLearningRate": (0.1, False), "defaultMomentum": (0.5, True)},
                    AdaptiveMode.CenteredRMSProp,
                    clip_norm_settings=[popart.ClipNormSettings.clipAllWeights(1.0)]
                    ).apply(ir, weight_grads, ExecutionContext.Normal, 0.5)
    verify(ir.main)
    text = format_graph(ir.main)
    assert "AdaptiveUpdate(w, Gradient___w, Accl1___w, Accl2___w, Accl3___w, clipFactor___0" in text


def test_fp16_weight_with_fp32_adam_state():
    """An f16 weight keeps f32 moments (accl1/accl2 FLOAT) and follows torch's f32 Adam."""
    weights, grads = _data(15)
    half = {n: w.astype(np.float16) for n, w in weights.items()}
    got, tensors, graph = run_backend(popart.Adam(ADAM_VALUES), half,
                                      [{n: g.astype(np.float16) for n, g in s.items()}
                                       for s in grads])
    assert graph.tensors["Accl1___w"].info.dtype is popart.DataType.FLOAT
    assert got[0]["w"].dtype == np.float16
    ref_w = {n: w.astype(np.float32) for n, w in half.items()}
    ref_g = [{n: g.astype(np.float16).astype(np.float32) for n, g in s.items()} for s in grads]
    want = run_torch(lambda p: torch.optim.AdamW(p, weight_decay=0.0, **ADAM_TORCH), ref_w, ref_g)
    assert_same(got, want, rtol=1e-3, atol=2e-3)
