"""Prepacked weights of float32 linear products in inference plans (ops/weight_cache.py):
MatMul, Gemm and LinearBias with a variable weight and few rows read an MKL-packed weight,
kept per op and replica and repacked whenever the weight was written since. Compared with
onnxruntime and eager torch; weight writes between runs give the new weights' answers."""

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
from popart_backend.ops.weight_cache import PackedLinear
from tests.helpers import assert_close, run_onnxruntime
from tests.transforms.test_fusions import const, make_model, randn

pytestmark = pytest.mark.skipif(not weight_cache._MKL_PACKED,
                                reason="this torch build has no MKL packed sgemm")

M, K, N = 16, 32, 64  # rows (2 x 8), inner, columns: within the packing bounds


def _model():
    """LinearBias (MatMul [K, N] weight + Add + Relu), Gemm(transB) and a 3-D MatMul by the
    Transpose of a [N, K] variable (the exporters' nn.Linear without bias)."""
    feeds = {"x": randn(2, 8, K)}
    inits = [const("w1", randn(K, N)), const("b1", randn(N)), const("w2", randn(N, N)),
             const("b2", randn(N)), const("w3", randn(N, N))]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["h1"]),
        helper.make_node("Reshape", ["h1", "shape2d"], ["h2d"]),
        helper.make_node("Gemm", ["h2d", "w2", "b2"], ["g"], transB=1),
        helper.make_node("Reshape", ["g", "shape3d"], ["g3"]),
        helper.make_node("Transpose", ["w3"], ["w3t"], perm=[1, 0]),
        helper.make_node("MatMul", ["g3", "w3t"], ["y"]),
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


def _packed_ops(session):
    return {op.op_type: op._packed for op in session._program.schedule
            if getattr(op, "_packed", None) is not None}


def _with_initializers(model, values):
    model = copy.deepcopy(model)
    for init in model.graph.initializer:
        if init.name in values:
            init.CopyFrom(const(init.name, values[init.name]))
    return model


def test_packed_products_match_onnxruntime_and_fire():
    model, feeds = _model()
    session = _session(model)
    packed = _packed_ops(session)
    assert set(packed) == {"LinearBias", "Gemm", "MatMul"}
    assert all(p.rows == M for p in packed.values())
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, anchors))
    assert_close(anchors["y"], run_onnxruntime(model, feeds)["y"], "y", rtol=1e-5, atol=1e-4)
    assert all(p.packs == 1 for p in packed.values())


def test_steady_runs_reuse_the_pack_and_call_the_packed_kernel():
    """After the first run: no repacking (no pack allocation), one packed product per op."""
    model, feeds = _model()
    session = _session(model)
    io = popart.PyStepIO(feeds, session.initAnchorArrays())
    session.run(io)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            session.run(io)
    names = [e.name for e in prof.events()]
    assert names.count("mkl::_mkl_reorder_linear_weight") == 0
    assert names.count("mkl::_mkl_linear") == 3 * 3
    assert not any(n in ("aten::addmm", "aten::mm", "aten::matmul") for n in names)
    assert all(p.packs == 1 for p in _packed_ops(session).values())


def test_weight_writes_repack_and_give_the_new_answers():
    """writeWeights + weightsFromHost between runs: the next run repacks (never stale)."""
    model, feeds = _model()
    session = _session(model)
    anchors = session.initAnchorArrays()
    io = popart.PyStepIO(feeds, anchors)
    session.run(io)
    old = anchors["y"].copy()
    new = {"w1": randn(K, N), "w2": randn(N, N), "w3": randn(N, N), "b2": randn(N)}
    session.writeWeights(popart.PyWeightsIO(new))
    session.weightsFromHost()
    for _ in range(2):
        session.run(io)
        want = run_onnxruntime(_with_initializers(model, new), feeds)["y"]
        assert_close(anchors["y"], want, "y", rtol=1e-5, atol=1e-4)
    assert not np.allclose(anchors["y"], old, atol=1e-2)
    assert all(p.packs == 2 for p in _packed_ops(session).values())


def test_replicas_keep_their_own_packs():
    model, feeds = _model()
    session = _session(model, replicas=2)
    x = np.stack([feeds["x"], feeds["x"] * 2])
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    session.run(popart.PyStepIO({"x": x}, anchors))
    for r in range(2):
        want = run_onnxruntime(model, {"x": x[r]})["y"]
        assert_close(anchors["y"][r], want, f"y[{r}]", rtol=1e-5, atol=1e-4)
    assert all(p.packs == 2 for p in _packed_ops(session).values())  # one per replica


def test_copies_of_a_packed_op_start_empty():
    """The packed tensors have no storage to copy: a deep copy (fromIr) keeps the plan, not
    the packs."""
    model, feeds = _model()
    session = _session(model)
    session.run(popart.PyStepIO(feeds, session.initAnchorArrays()))
    op = next(op for op in session._program.schedule if op.op_type == "Gemm")
    clone = copy.deepcopy(op)
    assert clone._packed.rows == M and clone._packed.packs == 0


def _shapes_model(rows, columns):
    feeds = {"x": randn(rows, K)}
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)]
    return make_model(nodes, feeds, ["y"], [const("w", randn(columns, K)),
                                            const("b", randn(columns))]), feeds


@pytest.mark.parametrize("rows, columns", [(weight_cache.PACK_MAX_ROWS + 1, N),
                                           (M, weight_cache.PACK_MIN_COLUMNS - 1)])
def test_products_outside_the_measured_bounds_keep_addmm(rows, columns):
    model, feeds = _shapes_model(rows, columns)
    session = _session(model)
    assert not _packed_ops(session)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, anchors))
    assert_close(anchors["y"], run_onnxruntime(model, feeds)["y"], "y", rtol=1e-5, atol=1e-4)


def test_packed_kernel_matches_the_unpacked_one_within_float_tolerance():
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g) for s in ((64, 784), (512, 784), (512,)))
    packed = PackedLinear(64)
    got = packed.linear(x, w, w, b)
    torch.testing.assert_close(got, torch.addmm(b, x, w.t()), rtol=1e-5, atol=1e-4)
    # Not the packed rows, or an inference-mode weight: the caller's own kernel runs.
    assert packed.linear(x[:8], w, w, b) is None
    with torch.inference_mode():
        frozen = w.clone()
    assert packed.linear(x, frozen, frozen, b) is None


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
              if getattr(op, "_packed", None) is not None]
    assert len(layers) == 2  # the two hidden layers; the 10-class head keeps addmm

    wrapper.load_state_dict(_scramble(net, 1))
    torch.testing.assert_close(wrapper(x), net(x).detach(), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        net.net[2].weight.mul_(-0.5)
    wrapper.copyWeightsToDevice()
    for _ in range(2):
        torch.testing.assert_close(wrapper(x), net(x).detach(), rtol=1e-5, atol=1e-5)
    assert [op._packed.packs for op in layers] == [3, 3]


def test_training_plans_keep_the_unpacked_kernels():
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
    assert not _packed_ops(wrapper._active.session)
