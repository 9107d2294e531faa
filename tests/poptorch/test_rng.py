"""Device RNG seeding (P29, P64): an unset randomSeed derives from torch.initial_seed(),
identical runs draw identical masks, replicas draw different values."""

import torch

import poptorch_lite as poptorch


class Noisy(torch.nn.Module):
    def forward(self, x):
        return x + torch.rand_like(x)


class DropoutLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(16))
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        out = self.drop(x * self.w)
        return out, out.sum()


def _noisy_run(seed=None, options=None):
    if seed is not None:
        torch.manual_seed(seed)
    wrapper = poptorch.inferenceModel(Noisy(), options)
    try:
        return wrapper(torch.zeros(2, 8))
    finally:
        wrapper.destroy()


def test_unset_random_seed_follows_torch_manual_seed():
    first, again, other = _noisy_run(5), _noisy_run(5), _noisy_run(6)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    assert not torch.equal(first, other)
    # The same stream as an explicit randomSeed with that value.
    torch.testing.assert_close(_noisy_run(options=poptorch.Options().randomSeed(5)), first,
                               rtol=0, atol=0)
    assert ((first >= 0) & (first < 1)).all()


def _dropout_masks(seed):
    torch.manual_seed(seed)
    model = DropoutLoss()
    wrapper = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.0))
    try:
        return [wrapper(torch.ones(4, 16))[0] != 0 for _ in range(2)]
    finally:
        wrapper.destroy()


def test_identical_runs_give_identical_dropout_masks():
    first, again = _dropout_masks(3), _dropout_masks(3)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], first[1])  # each step draws a new mask
    kept = torch.stack(first).float().mean().item()
    assert abs(kept - 0.5) < 0.15  # p = 0.5 on 128 values: ±3.4σ
    assert not torch.equal(first[0], _dropout_masks(4)[0])


def test_replicas_draw_different_values():
    out = _noisy_run(1, poptorch.Options().replicationFactor(2))
    assert out.shape == (2, 8)
    assert not torch.equal(out[0], out[1])
    # The whole replicated run replays with the same seed.
    torch.testing.assert_close(_noisy_run(1, poptorch.Options().replicationFactor(2)), out,
                               rtol=0, atol=0)


def test_rng_state_round_trips_on_a_training_wrapper():
    torch.manual_seed(0)
    model = DropoutLoss()
    wrapper = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.0))
    x = torch.ones(4, 16)
    wrapper.compile(x)
    state = wrapper.rng_state
    assert isinstance(state, list) and all(isinstance(v, int) for v in state)
    first = wrapper(x)[0]
    assert wrapper.rng_state != state
    wrapper.rng_state = state
    assert wrapper.rng_state == state
    torch.testing.assert_close(wrapper(x)[0], first, rtol=0, atol=0)
    wrapper.destroy()
