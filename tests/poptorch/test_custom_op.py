"""poptorch_lite.custom_op (P61): a backend custom op (popart.md §7) inside a traced model.

The op is the spec's LeakyRelu, registered in popart_backend.custom; the reference is the same
model in eager torch with ``torch.nn.functional.leaky_relu``.
"""


import numpy as np
import pytest
import torch

import popart_backend as popart
import popart_backend.custom as custom
import poptorch_lite as poptorch
from popart_backend.custom.api import GradOp, GradOpInType, Op
from popart_backend.custom.registration import register_grad_op, register_op
from poptorch_lite.testing import assert_allclose

DOMAIN = "test.poptorch"
LEAKY = popart.OperatorIdentifier(DOMAIN, "LeakyRelu", 1)
LEAKY_GRAD = popart.OperatorIdentifier(DOMAIN, "LeakyReluGrad", 1)


@pytest.fixture(autouse=True)
def leaky_relu_registered():
    @register_op(LEAKY)
    class LeakyRelu(Op):
        def __init__(self, opid, attributes, settings):
            super().__init__(opid, settings)
            self.alpha = float(attributes.get("alpha", 1e-2))

        def setup(self, in_infos):
            return [in_infos[0]]

        def grad_ops(self):
            return [LeakyReluGrad(self)]

        def compute(self, ctx, x):
            return np.where(x < 0, self.alpha * x, x).astype(x.dtype)

    @register_grad_op(LEAKY_GRAD)
    class LeakyReluGrad(GradOp):
        grad_input_info = [(0, 0, GradOpInType.GradOut), (1, 0, GradOpInType.In)]
        grad_out_to_non_grad_in = {0: 0}

        def __init__(self, fwd):
            super().__init__(LEAKY_GRAD, fwd.settings)
            self.alpha = fwd.alpha

        def setup(self, in_infos):
            return [in_infos[0]]

        def compute(self, ctx, dy, x):
            return (dy * np.where(x < 0, self.alpha, 1.0)).astype(dy.dtype)

    yield
    custom.unregister_op(LEAKY)
    custom.unregister_op(LEAKY_GRAD)


class Net(torch.nn.Module):
    def __init__(self, use_custom_op: bool, alpha: float = 0.2):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.use_custom_op = use_custom_op
        self.alpha = alpha

    def forward(self, x, y=None):
        h = self.fc1(x)
        if self.use_custom_op:
            (h,) = poptorch.custom_op([h], "LeakyRelu", DOMAIN, 1, example_outputs=[h],
                                      attributes={"alpha": self.alpha})
        else:
            h = torch.nn.functional.leaky_relu(h, self.alpha)
        out = self.fc2(h)
        if y is None:
            return out
        return out, torch.nn.functional.mse_loss(out, y)


def make_pair():
    torch.manual_seed(0)
    model = Net(use_custom_op=True)
    reference = Net(use_custom_op=False)
    reference.load_state_dict(model.state_dict())
    return model, reference


def test_inference_matches_eager_torch_function():
    model, reference = make_pair()
    wrapper = poptorch.inferenceModel(model.eval())
    x = torch.randn(5, 4)
    assert_allclose(actual=wrapper(x), expected=reference.eval()(x), rtol=1e-5, atol=1e-6)
    # Eagerly on CPU the op runs the registered numpy compute, with its grad ops for autograd.
    x.requires_grad_(True)
    eager = model(x)
    eager.sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    expected = reference(x_ref)
    expected.sum().backward()
    assert_allclose(actual=eager, expected=expected, rtol=1e-5, atol=1e-6)
    assert_allclose(actual=x.grad, expected=x_ref.grad, rtol=1e-5, atol=1e-6)


def test_traced_graph_holds_the_custom_node():
    model, _ = make_pair()
    wrapper = poptorch.inferenceModel(model.eval())
    wrapper(torch.randn(2, 4))
    proto = wrapper._active.traced.proto
    nodes = [n for n in proto.graph.node if n.domain == DOMAIN]
    assert [n.op_type for n in nodes] == ["LeakyRelu"]
    assert {i.domain: i.version for i in proto.opset_import}[DOMAIN] == 1


def test_training_with_sgd_matches_eager_torch_function():
    model, reference = make_pair()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    wrapper = poptorch.trainingModel(model, poptorch.Options(), optimizer)
    try:
        for _ in range(3):
            x, y = torch.randn(4, 4), torch.randn(4, 3)
            _, loss = wrapper(x, y)
            ref_opt.zero_grad()
            _, ref_loss = reference(x, y)
            ref_loss.backward()
            ref_opt.step()
            assert_allclose(actual=loss, expected=ref_loss.detach(), rtol=1e-4, atol=1e-5)
        state = wrapper.state_dict()
        for name, value in reference.state_dict().items():
            assert_allclose(actual=state[name], expected=value, rtol=1e-4, atol=1e-5)
    finally:
        wrapper.destroy()


@pytest.mark.parametrize("attributes, match", [
    ({"alpha": [1, 2.0]}, "mixes types"),
    ({"alpha": "é"}, "not ASCII"),
    ({"alpha": {"a": 1}}, "must be a float, int, str"),
    ({"bad key": 1}, "ASCII identifiers"),
])
def test_bad_attributes_raise_value_error(attributes, match):
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match=match):
        poptorch.custom_op([x], "LeakyRelu", DOMAIN, 1, [x], attributes)


def test_unknown_op_is_an_error_at_compile():
    class Unknown(torch.nn.Module):
        def forward(self, x):
            return poptorch.custom_op([x], "NoSuchOp", DOMAIN, 1, [x])[0]

    wrapper = poptorch.inferenceModel(Unknown())
    with pytest.raises(poptorch.Error, match="NoSuchOp"):
        wrapper(torch.randn(2, 4))
