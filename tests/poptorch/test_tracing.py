"""Tracing: parameter-name mapping, annotations, unsupported-op report (spec §4.3, P75-P77)."""

import pytest
import torch

import poptorch_lite as poptorch
from poptorch_lite import tracing

from .conftest import make_cnn


def _trace(model, *args):
    leaves, signature = tracing.flatten_inputs(tracing.bind_inputs(model.forward, args, {}))
    return tracing.trace(model, leaves, signature, 1)


@pytest.fixture(scope="module")
def traced_cnn():
    return _trace(make_cnn(), torch.randn(2, 2, 4, 4))


def test_initializers_map_to_parameter_and_buffer_names(traced_cnn):
    model = make_cnn()
    expected = {n for n, _ in model.named_parameters()}
    expected |= {"bn.running_mean", "bn.running_var"}
    assert set(traced_cnn.param_map.values()) == expected
    # optimize=False keeps FQNs as initializer names (P77).
    assert all(k == v for k, v in traced_cnn.param_map.items())


def test_nodes_carry_module_paths_and_user_source_lines(traced_cnn):
    names = [n.name for n in traced_cnn.proto.graph.node]
    assert "conv/Conv" in names and "fc/Gemm" in names
    conv = next(n for n in traced_cnn.proto.graph.node if n.name == "conv/Conv")
    source = next(a.s.decode() for a in conv.attribute if a.name == tracing.SOURCE_ATTR)
    assert source.startswith(__file__.replace("test_tracing.py", "conftest.py") + ":")
    assert "self.conv(x)" in source


def test_begin_block_writes_ipu_annotations():
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 3)
            self.b = torch.nn.Linear(3, 3)

        def forward(self, x):
            with poptorch.Block("first", ipu_id=0):
                x = torch.relu(self.a(x))
            return self.b(x)

    model = Two()
    poptorch.BeginBlock(model.b, "second", ipu_id=1)
    traced = _trace(model, torch.randn(2, 3))
    ipus = {n.name: [a.i for a in n.attribute if a.name == tracing.IPU_ATTR]
            for n in traced.proto.graph.node}
    assert ipus["a/Gemm"] == [0]
    assert ipus["b/Gemm"] == [1]
    with pytest.raises(poptorch.Error, match="already starts a block"):
        poptorch.BeginBlock(model.b, "again", ipu_id=1)
    poptorch.removeBlocks(model)
    poptorch.BeginBlock(model.b, "again", ipu_id=1)


def test_backend_support_probe():
    assert tracing.backend_supports("", "Relu", 18)
    assert tracing.backend_supports("ai.graphcore", "IdentityLoss", 1)
    assert not tracing.backend_supports("", "NoSuchOpAnywhere", 18)


def test_all_unsupported_ops_reported_at_once_with_source_lines(traced_cnn, monkeypatch):
    missing = {"Relu", "MaxPool"}
    real = tracing.backend_supports
    monkeypatch.setattr(tracing, "backend_supports",
                        lambda d, t, v: t not in missing and real(d, t, v))
    with pytest.raises(poptorch.Error) as info:
        tracing.check_supported(traced_cnn)
    err = info.value
    assert err.type == "unsupported_op"
    text = str(err)
    assert "2 op(s)" in text and "ai.onnx::MaxPool" in text and "ai.onnx::Relu" in text
    assert "conftest.py:" in text and "max_pool2d" in text
    assert err.location.startswith(__file__.replace("test_tracing.py", "conftest.py"))


def test_data_dependent_python_fails_loudly():
    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x

    with pytest.raises(poptorch.Error, match="torch.where") as info:
        _trace(Branchy(), torch.randn(2, 3))
    assert info.value.type == "trace_error"


def test_identity_loss_exports_graphcore_node():
    class WithLoss(torch.nn.Module):
        def forward(self, x):
            return poptorch.identity_loss(x * x, reduction="mean")

    traced = _trace(WithLoss(), torch.randn(2, 3))
    node = traced.proto.graph.node[-1]
    assert (node.domain, node.op_type) == ("ai.graphcore", "IdentityLoss")
    assert [a.i for a in node.attribute if a.name == "reduction"] == [1]
    x = torch.randn(3, requires_grad=True)
    poptorch.identity_loss(x, "sum").backward()
    assert torch.equal(x.grad, torch.ones(3))
    with pytest.raises(ValueError, match="reduction"):
        poptorch.identity_loss(x, "max")
