"""Non-tensor arguments before tensor ones (P7): graph inputs pair with the tensor arguments only."""

import torch

import poptorch_lite as poptorch


class ScaledBias(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x, scale=2.0, bias=None):
        y = self.fc(x) * scale
        return y + bias if bias is not None else y


def test_scalar_before_a_tensor_argument():
    torch.manual_seed(0)
    model = ScaledBias().eval()
    x, bias = torch.randn(4, 3), torch.randn(4, 2)
    wrapper = poptorch.inferenceModel(model)
    poptorch.testing.assert_allclose(actual=wrapper(x, 2.0, bias), expected=model(x, 2.0, bias),
                                     rtol=1e-5, atol=1e-6)
