"""Stitch strategies AddFwdOutputs and SafeAddFwdOutputs (``autodiffSettings.stitchStrategy``,
transforms/autodiff_stitch.py): the forward values a Call / If gradient reads become extra
outputs of the forward op instead of being recomputed in the gradient body. Trained weights
are checked against torch and against the default (recompute) strategy; the IR, the memory
and the cycle models show the difference; Loop falls back (Safe) or is refused."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.transforms import autodiff_stitch
from tests.helpers import sgd_step

S = popart.AutodiffStitchStrategy
ADD = [S.AddFwdOutputs, S.SafeAddFwdOutputs]
RNG = np.random.default_rng(7)
X0 = RNG.standard_normal((2, 3)).astype(np.float32)
W0 = (RNG.standard_normal((3, 4)) * 0.5).astype(np.float32)
LR = 0.1


@pytest.fixture(autouse=True)
def _fresh_log(monkeypatch):
    monkeypatch.setattr(autodiff_stitch, "_LOGGED", set())  # logged once per process


def _tanh_square(sub, a, b):
    u = sub.aiOnnx.tanh([sub.aiOnnx.matmul([a, b])])
    return sub.aiOnnx.mul([u, u])


def _sigmoid_square(sub, a, b):
    e = sub.aiOnnx.sigmoid([sub.aiOnnx.matmul([a, b])])
    return sub.aiOnnx.mul([e, e])


def _call_model(b, x, w, nested=False):
    callee = b.createSubgraphBuilder()
    a = callee.addUntypedInputTensor()
    c = callee.addUntypedInputTensor()
    if nested:
        inner = callee.createSubgraphBuilder()
        ia, ic = inner.addUntypedInputTensor(), inner.addUntypedInputTensor()
        inner.addOutputTensor(_tanh_square(inner, ia, ic))
        (o,) = callee.aiGraphcore.call([a, c], 1, inner)
    else:
        o = _tanh_square(callee, a, c)
    callee.addOutputTensor(o)
    (out,) = b.aiGraphcore.call([x, w], 1, callee)
    return out


def _if_model(b, x, w):
    cond = b.addInputTensor(popart.TensorInfo("BOOL", []), "cond")
    branches = []  # PopART's order: else_branch, then_branch
    for body in (_sigmoid_square, _tanh_square):
        sub = b.createSubgraphBuilder()
        sub.addInputTensorFromParentGraph(x)
        sub.addInputTensorFromParentGraph(w)
        sub.addOutputTensor(body(sub, x, w))
        branches.append(sub)
    (out,) = b.aiOnnx.logical_if([cond], 1, *branches)
    return out


def _loop_model(b, x, w):
    body = b.createSubgraphBuilder()
    body.addInputTensor("INT64", [])
    cond_in = body.addInputTensor("BOOL", [])
    carried = body.addInputTensor("FLOAT", [2, W0.shape[1]])
    body.addInputTensorFromParentGraph(w)
    body.addOutputTensor(body.aiOnnx.identity([cond_in]))
    body.addOutputTensor(body.aiOnnx.tanh([body.aiOnnx.add([carried, carried])]))
    start = b.aiOnnx.matmul([x, w])
    m = b.aiOnnx.constant(np.array(2, np.int64))
    true = b.aiOnnx.constant(np.array(True))
    (out,) = b.aiOnnx.loop([m, true, start], 1, body)
    return b.aiOnnx.mul([out, out])


def _scan_model(b, x, w):
    body = b.createSubgraphBuilder()
    state = body.addInputTensor("FLOAT", [W0.shape[1]])
    step = body.addInputTensor("FLOAT", [W0.shape[1]])
    body.addOutputTensor(body.aiOnnx.tanh([body.aiOnnx.add([state, step])]))
    start = b.aiOnnx.constant(np.zeros(W0.shape[1], np.float32))
    (final,) = b.aiOnnx.scan([start, b.aiOnnx.matmul([x, w])], 1, body, 1)
    return b.aiOnnx.mul([final, final])


def _train(strategy, kind: str, cond: bool = True, nested: bool = False, x0=X0, w0=W0):
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", list(x0.shape)), "x")
    w = b.addInitializedInputTensor(w0, "w")
    out = {"call": lambda: _call_model(b, x, w, nested), "if": lambda: _if_model(b, x, w),
           "loop": lambda: _loop_model(b, x, w), "scan": lambda: _scan_model(b, x, w)}[kind]()
    loss = b.aiGraphcore.l1loss([out], 1.0, reduction=popart.ReductionType.Sum)
    feeds = {x: x0}
    if kind == "if":
        feeds["cond"] = np.array(cond)
    return sgd_step(b.getModelProto(), loss, feeds, w, w0, LR, _options(strategy))


def _options(strategy) -> popart.SessionOptions:
    opts = popart.SessionOptions()
    opts.autodiffSettings = popart.AutodiffSettings(stitchStrategy=strategy)
    return opts


def _torch_reference(cond: bool = True, x0=X0, w0=W0) -> np.ndarray:
    w = torch.tensor(w0, dtype=torch.float64, requires_grad=True)
    h = torch.tensor(x0, dtype=torch.float64) @ w
    u = torch.tanh(h) if cond else torch.sigmoid(h)
    (u * u).abs().sum().backward()
    return (w - LR * w.grad).detach().numpy()


def _subgraph_ops(session):
    """(forward op, its gradient op) of the model's one Call / If."""
    main = session.getIr().main
    forward = next(op for op in main.ops.values()
                   if op.op_type in ("Call", "If") and op.grad_of is None)
    grad = next(op for op in main.ops.values() if op.grad_of is forward)
    return forward, grad


@pytest.mark.parametrize("strategy", ADD, ids=[s.name for s in ADD])
def test_call_gradient_reads_forward_outputs(strategy):
    got, session = _train(strategy, "call")
    want, baseline = _train(S.RecomputeAllNonInputs, "call")
    np.testing.assert_allclose(got, _torch_reference(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    fwd, grad = _subgraph_ops(session)
    base_fwd, base_grad = _subgraph_ops(baseline)
    body = fwd.attrs.callee.graph
    # The forward Call returns the values the backward reads: tanh(x @ w) (and x @ w if
    # tanh's gradient reads it); the recompute run's Call returns only the model's output.
    assert len(base_fwd.outputs) == 1 and len(fwd.outputs) > 1
    extra = [t.id for t in fwd.outputs[1:]]
    assert all(t.consumers == [grad] for t in fwd.outputs[1:]), extra
    assert set(extra) <= set(grad.inputs[t].id for t in range(len(grad.inputs)))
    # The gradient body has no copy of the forward ops: it has that many ops fewer.
    forward_types = sorted(op.op_type for op in body.ops.values())
    assert forward_types == ["MatMul", "Mul", "Tanh"]
    grad_ops = grad.attrs.callee.graph.ops.values()
    base_grad_ops = base_grad.attrs.callee.graph.ops.values()
    assert len(grad_ops) == len(base_grad_ops) - len(forward_types)
    assert not any(op.op_type == "Tanh" for op in grad_ops)
    assert any(op.op_type == "Tanh" for op in base_grad_ops)


@pytest.mark.parametrize("cond", [True, False])
@pytest.mark.parametrize("strategy", ADD, ids=[s.name for s in ADD])
def test_if_branches_return_their_forward_values(strategy, cond):
    got, session = _train(strategy, "if", cond)
    want, baseline = _train(S.RecomputeAllNonInputs, "if", cond)
    np.testing.assert_allclose(got, _torch_reference(cond), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    fwd, grad = _subgraph_ops(session)
    base_fwd, base_grad = _subgraph_ops(baseline)
    # Both branches return every branch's values (zeros in the other branch's places).
    then, other = fwd.attrs.then_branch.graph, fwd.attrs.else_branch.graph
    assert len(then.outputs) == len(other.outputs) == len(fwd.outputs) > len(base_fwd.outputs)
    for name in ("then_branch", "else_branch"):
        stitched = getattr(grad.attrs, name).graph.ops.values()
        recomputed = getattr(base_grad.attrs, name).graph.ops.values()
        assert len(stitched) == len(recomputed) - 3  # MatMul, Tanh / Sigmoid, Mul
        assert not any(op.op_type in ("Tanh", "Sigmoid") for op in stitched)


@pytest.mark.parametrize("kind", ["call", "if"])
def test_forward_values_live_until_the_gradient_and_save_cycles(kind):
    """The device model: the extra outputs are live from the forward op to its gradient op
    (memory report), and the gradient body computes less (fewer cycles)."""
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((16, 64)).astype(np.float32)
    w0 = (rng.standard_normal((64, 64)) * 0.1).astype(np.float32)
    got, session = _train(S.SafeAddFwdOutputs, kind, x0=x0, w0=w0)
    want, baseline = _train(S.RecomputeAllNonInputs, kind, x0=x0, w0=w0)
    np.testing.assert_allclose(got, _torch_reference(True, x0, w0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    model, base = session._device_model, baseline._device_model
    fwd, grad = _subgraph_ops(session)
    position = {c.op_id: c.position for c in model.cycles.ops}
    spans = {t.id: (t.start, t.end) for t in model.memory.ipu(0).tensors}
    for t in fwd.outputs[1:]:
        assert spans[t.id] == (position[fwd.id], position[grad.id]), t.id
        assert t.id not in {s.id for s in base.memory.ipu(0).tensors}
    grad_cycles = {c.op_id: c for c in model.cycles.ops}[grad.id]
    _, base_grad = _subgraph_ops(baseline)
    base_grad_cycles = {c.op_id: c for c in base.cycles.ops}[base_grad.id]
    assert grad_cycles.flops < base_grad_cycles.flops
    assert grad_cycles.compute_cycles < base_grad_cycles.compute_cycles
    assert model.cycles.step_cycles < base.cycles.step_cycles


def test_nested_subgraph_recomputes_in_its_own_gradient_body(caplog):
    with caplog.at_level(logging.WARNING, logger="popart:transform"):
        got, session = _train(S.AddFwdOutputs, "call", nested=True)
        _train(S.AddFwdOutputs, "call", nested=True)
    want, baseline = _train(S.RecomputeAllNonInputs, "call", nested=True)
    np.testing.assert_allclose(got, _torch_reference(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert caplog.text.count("sits inside the body of another subgraph op") == 1
    # The outer gradient body holds the inner Call's gradient (which recomputes the inner
    # body) but no copy of the inner forward Call; it needs only the outer arguments.
    calls = {}
    for name, s in (("stitched", session), ("recomputed", baseline)):
        fwd, grad = _subgraph_ops(s)
        assert len(fwd.outputs) == 1
        calls[name] = [op for op in grad.attrs.callee.graph.ops.values() if op.op_type == "Call"]
    assert len(calls["stitched"]) == 1 and len(calls["recomputed"]) == 2
    inner_grad = calls["stitched"][0].attrs.callee.graph
    assert any(op.op_type == "Tanh" for op in inner_grad.ops.values())


@pytest.mark.parametrize("kind", ["loop", "scan"])
def test_safe_add_fwd_outputs_recomputes_a_loop_or_scan_body(kind, caplog):
    with caplog.at_level(logging.WARNING, logger="popart:transform"):
        got, session = _train(S.SafeAddFwdOutputs, kind)
        _train(S.SafeAddFwdOutputs, kind)
    want, _ = _train(S.RecomputeAllNonInputs, kind)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    w = torch.tensor(W0, dtype=torch.float64, requires_grad=True)
    h = torch.tensor(X0, dtype=torch.float64) @ w
    if kind == "loop":
        for _ in range(2):
            h = torch.tanh(h + h)
    else:
        state = torch.zeros(W0.shape[1], dtype=torch.float64)
        for row in h:
            state = torch.tanh(state + row)
        h = state
    (h * h).abs().sum().backward()
    np.testing.assert_allclose(got, (w - LR * w.grad).detach().numpy(), rtol=1e-5, atol=1e-6)
    op_type = kind.capitalize()
    assert caplog.text.count(f"the gradient of {op_type} ops such as") == 1
    assert f"computes are not outputs of the {op_type}" in caplog.text
    op = next(iter(session.getIr().main.ops_of_type(op_type)))
    assert len(op.outputs) == 1


@pytest.mark.parametrize("kind", ["loop", "scan"])
def test_add_fwd_outputs_refuses_a_loop_or_scan_body(kind):
    with pytest.raises(popart.popart_exception, match=f"AddFwdOutputs: the gradient of "
                       f"{kind.capitalize()}.*Use AutodiffStitchStrategy.SafeAddFwdOutputs"):
        _train(S.AddFwdOutputs, kind)


@pytest.mark.parametrize("strategy", ADD, ids=[s.name for s in ADD])
def test_strategy_without_a_differentiated_subgraph_is_logged(strategy, caplog):
    """The model has a Call, but no gradient flows through it (it reads only the input x):
    the strategy stitches nothing, which is said once; the step matches torch."""
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", list(X0.shape)), "x")
    w = b.addInitializedInputTensor(W0, "w")
    callee = b.createSubgraphBuilder()
    a = callee.addUntypedInputTensor()
    callee.addOutputTensor(callee.aiOnnx.tanh([a]))
    (t,) = b.aiGraphcore.call([x], 1, callee)
    loss = b.aiGraphcore.l1loss([b.aiOnnx.matmul([t, w])], 1.0,
                                reduction=popart.ReductionType.Sum)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            got, _ = sgd_step(b.getModelProto(), loss, {x: X0}, w, W0, LR, _options(strategy))
    assert caplog.text.count(f"stitchStrategy = {strategy.name} has no effect") == 1
    assert "no gradient flows through a subgraph op" in caplog.text
    tanh_x = np.tanh(X0.astype(np.float64))
    want = W0 - LR * tanh_x.T @ np.sign(tanh_x @ W0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _train_called_twice(strategy):
    """y = f(f(x, w), w) with one callee f(a, c) = tanh(a @ c)^2 held by both Calls."""
    w_sq = (W0[:, :3] if W0.shape[1] > 3 else W0).copy()
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", list(X0.shape)), "x")
    w = b.addInitializedInputTensor(w_sq, "w")
    callee = b.createSubgraphBuilder()
    a, c = callee.addUntypedInputTensor(), callee.addUntypedInputTensor()
    callee.addOutputTensor(_tanh_square(callee, a, c))
    (h,) = b.aiGraphcore.call([x, w], 1, callee)
    (out,) = b.aiGraphcore.call([h, w], 1, callee)
    loss = b.aiGraphcore.l1loss([out], 1.0, reduction=popart.ReductionType.Sum)
    got, session = sgd_step(b.getModelProto(), loss, {x: X0}, w, w_sq, LR, _options(strategy))
    return got, w_sq, session


@pytest.mark.parametrize("strategy", ADD, ids=[s.name for s in ADD])
def test_one_callee_called_twice(strategy):
    """Two Calls of one subgraph builder: each Call gets its own copy of the body at import,
    so each returns its own forward values to its own gradient; the step equals torch's."""
    got, w_sq, session = _train_called_twice(strategy)
    forward = [op for op in session.getIr().main.ops.values()
               if op.op_type == "Call" and op.grad_of is None]
    assert len(forward) == 2 and all(len(op.outputs) > 1 for op in forward)
    assert forward[0].attrs.callee.graph is not forward[1].attrs.callee.graph
    w = torch.tensor(w_sq, dtype=torch.float64, requires_grad=True)
    h = torch.tensor(X0, dtype=torch.float64)
    for _ in range(2):
        h = torch.tanh(h @ w) ** 2
    h.abs().sum().backward()
    np.testing.assert_allclose(got, (w - LR * w.grad).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_call_gradient_drops_the_arguments_it_no_longer_reads():
    """f(a, c) = tanh(a) * c, trained in c only: once tanh(a) comes from the forward Call,
    the gradient (dc = dy · tanh(a)) reads neither argument, so the gradient Call takes
    neither x nor w (nothing is kept alive until the backward for nothing); the step equals
    torch's."""
    def build():
        b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]), "x")
        w = b.addInitializedInputTensor(W0[:, 0].copy(), "w")
        callee = b.createSubgraphBuilder()
        a, c = callee.addUntypedInputTensor(), callee.addUntypedInputTensor()
        callee.addOutputTensor(callee.aiOnnx.mul([callee.aiOnnx.tanh([a]), c]))
        (out,) = b.aiGraphcore.call([x, w], 1, callee)
        return b, x, w, b.aiGraphcore.l1loss([out], 1.0, reduction=popart.ReductionType.Sum)

    x0, w0 = X0[0], W0[:, 0].copy()
    runs = {}
    for strategy in (S.RecomputeAllNonInputs, S.SafeAddFwdOutputs):
        b, x, w, loss = build()
        runs[strategy] = sgd_step(b.getModelProto(), loss, {x: x0}, w, w0, LR,
                                  _options(strategy))
    want = w0 - LR * np.sign(np.tanh(x0) * w0) * np.tanh(x0)
    for got, _ in runs.values():
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    _, base_grad = _subgraph_ops(runs[S.RecomputeAllNonInputs][1])
    _, grad = _subgraph_ops(runs[S.SafeAddFwdOutputs][1])
    assert {"x", "w"} <= {t.id for t in base_grad.inputs}
    assert not {"x", "w"} & {t.id for t in grad.inputs}
    assert grad.attrs.callee.formal == []
