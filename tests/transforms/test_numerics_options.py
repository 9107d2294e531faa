"""SessionOptions that change how ops compute (transforms/numerics_options.py):
enableNonStableSoftmax against the formula exp(x) / sum(exp(x)), enableFloatingPointChecks
against the IPU's rule (stop at the first NaN / inf computed from finite inputs), and
enableStableNorm as a documented no-effect option."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import popart_backend as popart
from tests.helpers import assert_close, rand


def run(build, feeds, **options):
    """Build with ``build(builder, ops, *input ids)``, run one InferenceSession step."""
    builder = popart.Builder(opsets={"ai.onnx": 13, "ai.graphcore": 1})
    ids = [builder.addInputTensor(popart.TensorInfo("FLOAT", list(v.shape)), name)
           for name, v in feeds.items()]
    out = build(builder, builder.aiOnnx, *ids)
    builder.addOutputTensor(out)
    opts = popart.SessionOptions()
    for name, value in options.items():
        setattr(opts, name, value)
    session = popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, [out]),
                                      popart.DeviceManager().createCpuDevice(), userOptions=opts)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(dict(zip(ids, feeds.values())), anchors))
    return anchors[out]


@pytest.mark.parametrize("op", ["softmax", "logsoftmax"])
def test_non_stable_softmax(op):
    x = rand(3, 5, low=-4, high=4)
    build = lambda b, ops, a: getattr(ops, op)([a], axis=-1)  # noqa: E731
    ref = torch.softmax if op == "softmax" else torch.log_softmax
    expected = ref(torch.from_numpy(x), -1).numpy()
    assert_close(run(build, {"x": x}, enableNonStableSoftmax=True), expected, op,
                 rtol=1e-5, atol=1e-6)
    # Without the maximum subtracted exp(100) overflows float32: the IPU's fast form, and ours,
    # give NaN / -inf where the default (stable) form does not.
    big = x.copy()
    big[0, 0] = 100.0
    assert not np.isfinite(run(build, {"x": big}, enableNonStableSoftmax=True)[0]).all()
    assert np.isfinite(run(build, {"x": big})).all()


def test_non_stable_softmax_is_not_fused_into_attention():
    q, k, v = rand(2, 4, 8, seed=1), rand(2, 4, 8, seed=2), rand(2, 4, 8, seed=3)

    def build(b, ops, a, c, d):
        scores = ops.matmul([a, ops.transpose([c], perm=[0, 2, 1])])
        return ops.matmul([ops.softmax([scores], axis=-1), d])

    tq, tk, tv = (torch.from_numpy(t) for t in (q, k, v))
    expected = (torch.softmax(tq @ tk.transpose(1, 2), -1) @ tv).numpy()
    got = run(build, {"q": q, "k": k, "v": v}, enableNonStableSoftmax=True)
    assert_close(got, expected, "attention", rtol=1e-5, atol=1e-6)


def test_floating_point_checks_stop_at_the_first_exception():
    x, y = rand(2, 3, low=0.5, high=1.0), rand(2, 3, low=0.5, high=1.0, seed=4)
    y[1, 2] = 0.0
    build = lambda b, ops, a, c: ops.relu([ops.div([a, c])])  # noqa: E731
    assert np.isinf(run(build, {"x": x, "y": y})).any()  # off by default: inf flows on
    with pytest.raises(popart.popart_runtime_error,
                       match="Div .*floating-point exception.*1 inf"):
        run(build, {"x": x, "y": y}, enableFloatingPointChecks=True)
    # A non-finite value fed in is no new exception: it propagates.
    x[0, 0] = np.inf
    y[1, 2] = 1.0
    out = run(build, {"x": x, "y": y}, enableFloatingPointChecks=True)
    assert np.isinf(out[0, 0]) and np.isfinite(out.ravel()[1:]).all()


def test_stable_norm_has_no_effect_and_says_why(caplog):
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        out = run(lambda b, ops, a: ops.relu([a]), {"x": rand(2)}, enableStableNorm=True)
    assert out.shape == (2,)
    assert "enableStableNorm" in caplog.text and "stable form" in caplog.text


def test_strided_group_norm_channel_grouping():
    """groupNormStridedChannelGrouping: group g holds channels g, g + G, ...; against torch's
    group norm of the channels gathered into that order (and the result gathered back)."""
    x, w, b = rand(2, 6, 3), rand(6, seed=5), rand(6, seed=6)
    groups = 2

    def build(bld, ops, xi, wi, bi):
        return bld.aiGraphcore.groupnormalization([xi, wi, bi], num_groups=groups)[0]

    order = [g + groups * j for g in range(groups) for j in range(6 // groups)]
    inverse = np.argsort(order)
    tx = torch.from_numpy(x)[:, order]
    expected = torch.group_norm(tx, groups, torch.from_numpy(w)[order],
                                torch.from_numpy(b)[order], 1e-5)[:, inverse].numpy()
    feeds = {"x": x, "w": w, "b": b}
    got = run(build, feeds, groupNormStridedChannelGrouping=True)
    assert_close(got, expected, "strided", rtol=1e-5, atol=1e-5)
    contiguous = torch.group_norm(torch.from_numpy(x), groups, torch.from_numpy(w),
                                  torch.from_numpy(b), 1e-5).numpy()
    assert_close(run(build, feeds), contiguous, "default", rtol=1e-5, atol=1e-5)
    assert not np.allclose(got, contiguous, atol=1e-3)


def test_strided_group_norm_gradients():
    """The strided grouping's backward (the Gathers' gradients around the op's own) against
    torch.autograd of the same gathered group norm."""
    from onnx import TensorProto, helper, numpy_helper

    from popart_backend.device.plan import ExecutionPlan, to_torch
    from popart_backend.importer.onnx_model import import_model
    from popart_backend.transforms.autodiff import Autodiff
    from popart_backend.transforms.numerics_options import StridedGroupNorm

    x, w, b = rand(2, 6, 3), rand(6, seed=5), rand(6, seed=6)
    node = helper.make_node("GroupNormalization", ["x", "w", "b"], ["y", "mean", "rstd"],
                            domain="ai.graphcore", num_groups=3)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("ai.graphcore", 1)])
    ir = import_model(model, constant_weights=False)
    assert StridedGroupNorm().run(ir)
    seed = rand(2, 6, 3, seed=7)
    autodiff = Autodiff(None, output_grads={"y": seed})
    autodiff.run(ir)
    ids = {name: autodiff.variable_grads[name] for name in ("w", "b")}
    plan = ExecutionPlan(ir.main, keep=["y", *ids.values()])
    plan.set_value("x", to_torch(x))
    plan.execute()

    order = [g + 3 * j for g in range(3) for j in range(2)]
    tw = torch.tensor(w, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True)
    y = torch.group_norm(torch.from_numpy(x)[:, order], 3, tw[order], tb[order],
                         1e-5)[:, np.argsort(order)]
    (y * torch.from_numpy(seed)).sum().backward()
    assert_close(plan.get_value("y").numpy(), y.detach().numpy(), "y", rtol=1e-5, atol=1e-5)
    assert_close(plan.get_value(ids["w"]).numpy(), tw.grad.numpy(), "dw", rtol=1e-4, atol=1e-5)
    assert_close(plan.get_value(ids["b"]).numpy(), tb.grad.numpy(), "db", rtol=1e-4, atol=1e-5)
