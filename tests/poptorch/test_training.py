"""Training wrappers: loss discovery and SGD-momentum parity with eager torch (P3, P51, P57)."""

import copy

import pytest
import torch

import poptorch_lite as poptorch
from poptorch_lite.testing import assert_allclose


class MLPWithLoss(torch.nn.Module):
    def __init__(self, use_identity_loss=False):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.use_identity_loss = use_identity_loss

    def forward(self, x, y):
        out = self.fc2(torch.relu(self.fc1(x)))
        if self.use_identity_loss:
            return out, poptorch.identity_loss(((out - y) ** 2).sum(1), reduction="mean")
        return out, torch.nn.functional.mse_loss(out, y)


@pytest.mark.parametrize("use_identity_loss", [False, True], ids=["mse", "identity_loss"])
def test_sgd_momentum_matches_eager(use_identity_loss):
    torch.manual_seed(0)
    model = MLPWithLoss(use_identity_loss)
    reference = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    wrapper = poptorch.trainingModel(model, opts, optimizer)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    B = 4
    try:
        for _ in range(3):
            x, y = torch.randn(2 * B, 4), torch.randn(2 * B, 3)
            _, loss = wrapper(x, y)
            ref_losses = []
            for step in range(2):  # deviceIterations = 2 optimizer steps per call
                ref_opt.zero_grad()
                _, ref_loss = reference(x[step * B:(step + 1) * B], y[step * B:(step + 1) * B])
                ref_loss.backward()
                ref_opt.step()
                ref_losses.append(ref_loss.detach())
            # Training default output mode is Final: the last micro-batch's loss.
            assert_allclose(actual=loss, expected=ref_losses[-1], rtol=1e-4, atol=1e-5)
        state = wrapper.state_dict()  # pulls device weights first
        for name, value in reference.state_dict().items():
            assert_allclose(actual=state[name], expected=value, rtol=1e-4, atol=1e-4)
    finally:
        wrapper.destroy()


def test_no_loss_found_is_an_error():
    class NoLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(x)

    wrapper = poptorch.trainingModel(NoLoss())
    with pytest.raises(poptorch.Error, match="no loss found"):
        wrapper(torch.randn(2, 2))
