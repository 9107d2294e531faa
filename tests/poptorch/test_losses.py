"""Common torch losses trace and train like eager PyTorch (spec §2.8, P57)."""

import pytest
import torch
import torch.nn.functional as F

from .training_helpers import compare_training

# name -> (loss(out, target), target maker(rows, generator))
LOSSES = {
    "cross_entropy": (F.cross_entropy, lambda n, g: torch.randint(0, 3, (n,), generator=g)),
    "nll": (lambda o, t: F.nll_loss(F.log_softmax(o, 1), t),
            lambda n, g: torch.randint(0, 3, (n,), generator=g)),
    "mse": (F.mse_loss, lambda n, g: torch.randn(n, 3, generator=g)),
    "l1": (F.l1_loss, lambda n, g: torch.randn(n, 3, generator=g)),
    "bce": (lambda o, t: F.binary_cross_entropy(torch.sigmoid(o), t),
            lambda n, g: torch.rand(n, 3, generator=g)),
    "bce_with_logits": (F.binary_cross_entropy_with_logits,
                        lambda n, g: torch.rand(n, 3, generator=g)),
    "smooth_l1": (F.smooth_l1_loss, lambda n, g: 2 * torch.randn(n, 3, generator=g)),
    "kl_div": (lambda o, t: F.kl_div(F.log_softmax(o, 1), t, reduction="batchmean"),
               lambda n, g: torch.softmax(torch.randn(n, 3, generator=g), 1)),
}


class WithLoss(torch.nn.Module):
    def __init__(self, loss):
        super().__init__()
        self.fc = torch.nn.Linear(5, 3)
        self.loss = loss

    def forward(self, x, target):
        out = self.fc(x)
        return out, self.loss(out, target)


@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_trains_like_eager(name):
    loss, make_target = LOSSES[name]
    torch.manual_seed(0)
    model = WithLoss(loss)
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 5, generator=generator), make_target(4, generator))
               for _ in range(2)]
    wrapper, _, _ = compare_training(model, lambda p: torch.optim.SGD(p, lr=0.1), batches)
    wrapper.destroy()
