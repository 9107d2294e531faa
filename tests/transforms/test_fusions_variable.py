"""Inference fusions over *variable* weights (constantWeights = False, as every PopTorch
session): Conv + BatchNormalization folded at run time and refolded after each weight write,
compared with onnxruntime on the original model (and with eager torch through the frontend)."""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

import popart_backend as popart
import poptorch_lite as poptorch
from popart_backend.importer.onnx_model import import_model
from popart_backend.ops.fused_conv import ConvBatchNorm
from popart_backend.transforms.fuse_conv_bn_var import FoldVariableBatchNormIntoConv
from popart_backend.transforms.pipeline import inference_passes, run_passes
from tests.helpers import assert_close, run_onnxruntime
from tests.transforms.test_fusions import (_bn_initializers, check_against_ort, const,
                                           fuse_and_run, make_model, randn)

RNG = np.random.default_rng(7)


def _block_model(conv_bias: bool):
    """Conv+BN+Relu, then Conv+BN+Add(shortcut)+Relu, then Conv+BN alone."""
    feeds = {"x": randn(2, 4, 8, 8)}
    bn1 = [const(n + "1", t) for n, t in zip(("scale", "beta", "mean", "var"),
                                             (numpy_helper.to_array(i) for i in
                                              _bn_initializers(4)))]
    bn2 = [const(n + "2", numpy_helper.to_array(i)) for n, i in
           zip(("scale", "beta", "mean", "var"), _bn_initializers(4))]
    bn3 = [const(n + "3", numpy_helper.to_array(i)) for n, i in
           zip(("scale", "beta", "mean", "var"), _bn_initializers(4))]
    inits = [const("w1", randn(4, 4, 3, 3)), const("w2", randn(4, 4, 3, 3)),
             const("w3", randn(4, 4, 1, 1)), *bn1, *bn2, *bn3]
    first = ["x", "w1", "b1"] if conv_bias else ["x", "w1"]
    if conv_bias:
        inits.append(const("b1", randn(4)))
    nodes = [
        helper.make_node("Conv", first, ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "scale1", "beta1", "mean1", "var1"],
                         ["n1"], epsilon=1e-3),
        helper.make_node("Relu", ["n1"], ["h"]),
        helper.make_node("Conv", ["h", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c2", "scale2", "beta2", "mean2", "var2"],
                         ["n2"]),
        helper.make_node("Add", ["n2", "x"], ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
        helper.make_node("Conv", ["r", "w3"], ["c3"]),
        helper.make_node("BatchNormalization", ["c3", "scale3", "beta3", "mean3", "var3"],
                         ["y"]),
    ]
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.mark.parametrize("conv_bias", [True, False])
def test_variable_batchnorm_becomes_conv_batchnorm(conv_bias):
    model, feeds = _block_model(conv_bias)
    ops, ours = fuse_and_run(model, feeds, constant_weights=False)
    assert ops == Counter({"ConvBatchNorm": 3})
    check_against_ort(model, feeds, ours, rtol=1e-4, atol=1e-4)


def test_variable_batchnorm_left_alone_when_conv_output_is_read():
    model, feeds = _block_model(False)
    ops, ours = fuse_and_run(model, feeds, [FoldVariableBatchNormIntoConv()],
                             constant_weights=False, anchors=["c2"])
    assert ops["ConvBatchNorm"] == 2 and ops["Conv"] == 1 and ops["BatchNormalization"] == 1
    check_against_ort(model, feeds, {"y": ours["y"]}, rtol=1e-4, atol=1e-4)


def _with_initializers(model, values: dict[str, np.ndarray]):
    model = copy.deepcopy(model)
    for init in model.graph.initializer:
        if init.name in values:
            init.CopyFrom(numpy_helper.from_array(values[init.name], init.name))
    return model


def test_folded_weights_follow_weight_writes(monkeypatch):
    """writeWeights + weightsFromHost: the next run refolds (never stale); runs in between
    reuse the folded pair."""
    folds = []
    original = ConvBatchNorm._fold
    monkeypatch.setattr(ConvBatchNorm, "_fold",
                        lambda self, *a: folds.append(self.id) or original(self, *a))
    model, feeds = _block_model(True)
    opts = popart.SessionOptions()
    opts.constantWeights = False
    session = popart.InferenceSession(
        fnModel=model.SerializeToString(),
        dataFlow=popart.DataFlow(1, {"y": popart.AnchorReturnType("All")}),
        deviceInfo=popart.DeviceManager().createCpuDevice(), userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    stepio = popart.PyStepIO(feeds, anchors)
    session.run(stepio)
    assert_close(anchors["y"], run_onnxruntime(model, feeds)["y"], "y", rtol=1e-4, atol=1e-4)
    session.run(stepio)
    assert len(folds) == 3  # once per fused op; the second run reused them

    new = {"w1": randn(4, 4, 3, 3), "b1": randn(4), "scale2": RNG.uniform(0.2, 3.0, 4),
           "mean2": randn(4), "var2": RNG.uniform(0.1, 4.0, 4), "beta3": randn(4)}
    new = {k: np.asarray(v, np.float32) for k, v in new.items()}
    session.writeWeights(popart.PyWeightsIO(new))
    session.weightsFromHost()
    for _ in range(2):
        session.run(stepio)
        want = run_onnxruntime(_with_initializers(model, new), feeds)["y"]
        assert_close(anchors["y"], want, "y", rtol=1e-4, atol=1e-4)
    assert len(folds) == 6  # weightsFromHost wrote every weight: each op refolded once
    # And the old answer is gone (the test would pass with stale weights otherwise).
    assert not np.allclose(anchors["y"], run_onnxruntime(model, feeds)["y"], atol=1e-2)


class _ConvBnNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + h)


def _randomize_bn(net, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for bn in (net.bn1, net.bn2):
            bn.running_mean.copy_(torch.rand(8, generator=g) - 0.5)
            bn.running_var.copy_(torch.rand(8, generator=g) + 0.5)
            bn.weight.copy_(torch.rand(8, generator=g) + 0.5)
            bn.bias.copy_(torch.rand(8, generator=g) - 0.5)


def test_frontend_inference_folds_bn_and_refolds_after_copy_weights_to_device():
    torch.manual_seed(0)
    net = _ConvBnNet().eval()
    _randomize_bn(net, 1)
    x = torch.randn(2, 3, 8, 8)
    model = poptorch.inferenceModel(net, poptorch.Options().showCompilationProgressBar(False))
    with torch.no_grad():
        torch.testing.assert_close(model(x), net(x), rtol=1e-4, atol=1e-4)
    ir = next(iter(model._executables.values())).session._ir
    assert Counter(op.op_type for op in ir.main.ops.values()) == Counter({"ConvBatchNorm": 2})
    _randomize_bn(net, 2)
    with torch.no_grad():
        net.conv1.weight.mul_(-1.5)
        before = model(x)
        model.copyWeightsToDevice()
        after = model(x)
        want = net(x)
    torch.testing.assert_close(after, want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(before, want, atol=1e-2)  # a stale fold would keep 'before'
    model.destroy()


class _TinyAttention(torch.nn.Module):
    """Eager attention as models write it: causal mask buffer (a variable through the
    frontend) or a padding mask computed from an input."""

    def __init__(self, causal: bool, seq: int = 6, d: int = 8, heads: int = 2):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.heads, self.causal = heads, causal
        self.register_buffer("tri", torch.full((seq, seq), float("-inf")).triu(1),
                             persistent=False)

    def forward(self, x, keep):
        b, s, d = x.shape
        q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).split(d, -1))
        mask = self.tri if self.causal else (1.0 - keep[:, None, None, :].float()) * -1e4
        p = (q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5 + mask).softmax(-1)
        return (p @ v).transpose(1, 2).reshape(b, s, d)


@pytest.mark.parametrize("causal", [True, False])
def test_frontend_attention_with_causal_or_padding_mask_fuses(causal):
    torch.manual_seed(0)
    net = _TinyAttention(causal).eval()
    x = torch.randn(2, 6, 8)
    keep = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    model = poptorch.inferenceModel(net, poptorch.Options().showCompilationProgressBar(False))
    with torch.no_grad():
        torch.testing.assert_close(model(x, keep), net(x, keep), rtol=1e-5, atol=1e-5)
    ir = next(iter(model._executables.values())).session._ir
    ops = Counter(op.op_type for op in ir.main.ops.values())
    assert ops["Attention"] == 1 and "Softmax" not in ops
    model.destroy()


def test_conv_batchnorm_costs_what_the_unfused_ops_cost():
    """The device model times what PopART runs on the IPU, where variable BatchNorm weights
    are not folded: the fused op's flops are the sum of the Conv, BatchNormalization, Add and
    Relu it replaced (our CPU kernel folding the statistics is a host speed-up only)."""
    model, _ = _block_model(conv_bias=True)
    plain = import_model(model, constant_weights=False)
    unfused = sum(op.cost()[0] for op in plain.main.ops.values())
    fused_ir = import_model(model, constant_weights=False)
    run_passes(fused_ir, inference_passes())
    fused_ops = list(fused_ir.main.ops.values())
    assert [op.op_type for op in fused_ops] == ["ConvBatchNorm"] * 3
    assert sum(op.cost()[0] for op in fused_ops) == unfused
