"""Tiny models shared by the poptorch_lite tests (exports cost ~1 s each: keep them few)."""

import pytest
import torch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 2 * 2, 5)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(torch.flatten(y, 1))


def make_mlp(seed=0):
    torch.manual_seed(seed)
    return MLP().eval()


def make_cnn(seed=0):
    torch.manual_seed(seed)
    model = CNN()
    # Non-trivial running statistics so eval-mode BatchNorm is not an identity.
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
    return model.eval()


@pytest.fixture
def mlp():
    return make_mlp()
