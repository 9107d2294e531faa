"""Kept contiguous weights of float32 linear products in inference plans
(ops/weight_cache.py): MatMul, Gemm and LinearBias with a variable weight read transposed and
few rows read a contiguous [K, N] copy, kept per op and replica and copied again whenever the
weight was written since. Compared with onnxruntime and eager torch; weight writes between runs
give the new weights' answers."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from onnx import helper
from torch.profiler import ProfilerActivity, profile

import popart_backend as popart
import poptorch_lite as poptorch
from popart_backend.ops import weight_cache
from popart_backend.ops.weight_cache import KeptWeight
from tests.helpers import assert_close, run_onnxruntime
from tests.transforms.test_fusions import const, make_model, randn

M, K, N = 16, 32, 64  # rows (2 x 8), inner, columns: within the bounds


def _model():
    """LinearBias (MatMul by the Transpose of a [N, K] variable + Add + Relu: the exporters'
    nn.Linear), Gemm(transB) and a 3-D MatMul by a Transpose; a last MatMul reads its [N, N]
    weight as stored (contiguous: nothing to keep)."""
    feeds = {"x": randn(2, 8, K)}
    inits = [const("w1", randn(N, K)), const("b1", randn(N)), const("w2", randn(N, N)),
             const("b2", randn(N)), const("w3", randn(N, N)), const("w4", randn(N, N))]
    nodes = [
        helper.make_node("Transpose", ["w1"], ["w1t"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "w1t"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["h1"]),
        helper.make_node("Reshape", ["h1", "shape2d"], ["h2d"]),
        helper.make_node("Gemm", ["h2d", "w2", "b2"], ["g"], transB=1),
        helper.make_node("Reshape", ["g", "shape3d"], ["g3"]),
        helper.make_node("Transpose", ["w3"], ["w3t"], perm=[1, 0]),
        helper.make_node("MatMul", ["g3", "w3t"], ["m3"]),
        helper.make_node("MatMul", ["m3", "w4"], ["y"]),
    ]
    inits += [helper.make_tensor("shape2d", 7, [2], [M, N]),
              helper.make_tensor("shape3d", 7, [3], [2, 8, N])]
    return make_model(nodes, feeds, ["y"], inits), feeds


def _session(model, replicas=1):
    opts = popart.SessionOptions()
    opts.constantWeights = False
    if replicas > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = replicas
    session = popart.InferenceSession(
        fnModel=model.SerializeToString(),
        dataFlow=popart.DataFlow(1, {"y": popart.AnchorReturnType("All")}),
        deviceInfo=popart.DeviceManager().createIpuModelDevice({"numIPUs": replicas}),
        userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    return session


def _kept_ops(session):
    return {op.op_type: op._kept for op in session._program.schedule
            if getattr(op, "_kept", None) is not None}


def _with_initializers(model, values):
    model = copy.deepcopy(model)
    for init in model.graph.initializer:
        if init.name in values:
            init.CopyFrom(const(init.name, values[init.name]))
    return model


def _copies(session):
    return sorted((op.op_type, op._kept.copies) for op in session._program.schedule
                  if getattr(op, "_kept", None) is not None)


FIRED = [("Gemm", 1), ("LinearBias", 1), ("MatMul", 0), ("MatMul", 1)]


def test_kept_weights_match_onnxruntime_and_fire():
    model, feeds = _model()
    session = _session(model)
    assert _copies(session) == [(t, 0) for t, _ in FIRED]
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, anchors))
    assert_close(anchors["y"], run_onnxruntime(model, feeds)["y"], "y", rtol=1e-5, atol=1e-4)
    # The transposed weights were copied once; the contiguous one is read as it is.
    assert _copies(session) == FIRED


def test_steady_runs_copy_no_weight_and_multiply_contiguous_operands():
    """After the first run: no copy of any weight, and every product reads contiguous
    operands (no transposed view reaches the GEMM)."""
    model, feeds = _model()
    session = _session(model)
    io = popart.PyStepIO(feeds, session.initAnchorArrays())
    session.run(io)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            session.run(io)
    names = [e.name for e in prof.events()]
    assert names.count("aten::clone") == names.count("aten::contiguous") == 0
    copied = [e.input_shapes[0] for e in prof.events() if e.name == "aten::copy_"]
    assert not [s for s in copied if s in ([N, K], [K, N], [N, N])], copied  # no weight
    assert _copies(session) == FIRED


def test_weight_writes_copy_again_and_give_the_new_answers():
    """writeWeights + weightsFromHost between runs: the next run copies again (never stale)."""
    model, feeds = _model()
    session = _session(model)
    anchors = session.initAnchorArrays()
    io = popart.PyStepIO(feeds, anchors)
    session.run(io)
    old = anchors["y"].copy()
    new = {"w1": randn(N, K), "w2": randn(N, N), "w3": randn(N, N), "b2": randn(N)}
    session.writeWeights(popart.PyWeightsIO(new))
    session.weightsFromHost()
    for _ in range(2):
        session.run(io)
        want = run_onnxruntime(_with_initializers(model, new), feeds)["y"]
        assert_close(anchors["y"], want, "y", rtol=1e-5, atol=1e-4)
    assert not np.allclose(anchors["y"], old, atol=1e-2)
    assert _copies(session) == [(t, 2 * c) for t, c in FIRED]


def test_replicas_keep_their_own_copies():
    model, feeds = _model()
    session = _session(model, replicas=2)
    x = np.stack([feeds["x"], feeds["x"] * 2])
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    session.run(popart.PyStepIO({"x": x}, anchors))
    for r in range(2):
        want = run_onnxruntime(model, {"x": x[r]})["y"]
        assert_close(anchors["y"][r], want, f"y[{r}]", rtol=1e-5, atol=1e-4)
    assert _copies(session) == [(t, 2 * c) for t, c in FIRED]  # one per replica


def test_copies_of_an_op_start_empty():
    """A deep copy (fromIr) keeps the plan, not the kept operands of the original's weights."""
    model, feeds = _model()
    session = _session(model)
    session.run(popart.PyStepIO(feeds, session.initAnchorArrays()))
    op = next(op for op in session._program.schedule if op.op_type == "Gemm")
    assert op._kept.copies == 1
    clone = copy.deepcopy(op)
    assert clone._kept is not None and clone._kept.copies == 0 and not clone._kept._kept


def test_products_with_more_rows_read_the_view():
    feeds = {"x": randn(weight_cache.KEEP_MAX_ROWS + 1, K)}
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)]
    model = make_model(nodes, feeds, ["y"], [const("w", randn(N, K)), const("b", randn(N))])
    session = _session(model)
    assert not _kept_ops(session)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, anchors))
    assert_close(anchors["y"], run_onnxruntime(model, feeds)["y"], "y", rtol=1e-5, atol=1e-4)


def test_operand_is_the_view_for_contiguous_or_inference_mode_weights():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=g)
    kept = KeptWeight()
    operand = kept.operand(w, True)
    assert operand.is_contiguous() and torch.equal(operand, w.t())
    assert kept.operand(w, True) is operand and kept.copies == 1
    with torch.no_grad():
        w.mul_(2)  # an in-place write: the kept copy is stale
    assert torch.equal(kept.operand(w, True), w.t()) and kept.copies == 2
    # A view made anew each run (an exporter's Transpose) is found by its base and geometry.
    views = KeptWeight()
    operand = views.operand(w.t(), False)
    assert views.operand(w.t(), False) is operand and views.copies == 1
    wkn = torch.randn(K, N, generator=g)
    assert kept.operand(wkn, False) is wkn  # already contiguous
    with torch.inference_mode():
        frozen = w.clone()
    assert kept.operand(frozen, True).data_ptr() == frozen.data_ptr()  # no version: the view
    assert kept.copies == 2


# --- through the frontend ---------------------------------------------------------------------

class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(K, N), torch.nn.ReLU(),
                                       torch.nn.Linear(N, N), torch.nn.ReLU(),
                                       torch.nn.Linear(N, 10))

    def forward(self, x):
        return self.net(x)


def _scramble(model, seed):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def test_frontend_weight_writes_are_never_stale():
    """load_state_dict through the wrapper, and copyWeightsToDevice after an in-place edit of
    the module: each next call answers with the new weights, as eager does."""
    torch.manual_seed(0)
    net = _Mlp().eval()
    x = torch.randn(M, K)
    wrapper = poptorch.inferenceModel(net, poptorch.Options().showCompilationProgressBar(False))
    torch.testing.assert_close(wrapper(x), net(x).detach(), rtol=1e-5, atol=1e-5)
    layers = [op for op in wrapper._active.session._program.schedule
              if getattr(op, "_kept", None) is not None]
    assert len(layers) == 3

    wrapper.load_state_dict(_scramble(net, 1))
    torch.testing.assert_close(wrapper(x), net(x).detach(), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        net.net[2].weight.mul_(-0.5)
    wrapper.copyWeightsToDevice()
    for _ in range(2):
        torch.testing.assert_close(wrapper(x), net(x).detach(), rtol=1e-5, atol=1e-5)
    assert [op._kept.copies for op in layers] == [3, 3, 3]


def test_training_plans_read_the_views():
    torch.manual_seed(0)
    net = _Mlp()

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x, t):
            y = self.net(x)
            return y, torch.nn.functional.cross_entropy(y, t)

    wrapper = poptorch.trainingModel(WithLoss(),
                                     poptorch.Options().showCompilationProgressBar(False),
                                     torch.optim.SGD(net.parameters(), lr=0.1))
    wrapper(torch.randn(M, K), torch.randint(0, 10, (M,)))
    assert not _kept_ops(wrapper._active.session)
