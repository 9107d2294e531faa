"""A fresh process for ``test_executables.py``: ``python -m tests.poptorch.executable_worker
MODE PATH OUT``.

- ``load FILE OUT``: ``poptorch_lite.load(FILE)``, run ``STEPS`` training steps, save the
  losses and the final state to ``OUT`` (npz).
- ``loadexe FILE OUT``: the same through a new wrapper (other initial weights) and
  ``loadExecutable(FILE)``.
- ``cache DIR OUT``: an inference wrapper with ``enableExecutableCaching(DIR)``, one call;
  the cache counters to ``OUT`` (JSON). ``cacheenv``: the same with the folder given by
  ``POPTORCH_CACHE_DIR``.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

import poptorch_lite as poptorch
from poptorch_lite.executor.executable import cache_stats

STEPS = 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.drop = torch.nn.Dropout(0.3)  # device RNG: its state is saved with executables

    def forward(self, x, labels=None):
        logits = self.fc2(self.drop(torch.relu(self.fc1(x))))
        if labels is None:
            return logits
        return logits, torch.nn.functional.cross_entropy(logits, labels)


def net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def options() -> poptorch.Options:
    return poptorch.Options().showCompilationProgressBar(False).randomSeed(5)


def training_wrapper(seed: int = 0):
    model = net(seed).train()
    return poptorch.trainingModel(model, options(),
                                  poptorch.optim.Adam(model.parameters(), lr=0.01))


def batches(first: int, count: int):
    g = torch.Generator().manual_seed(11)
    data = [(torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g))
            for _ in range(first + count)]
    return data[first:]


def run_steps(wrapper, data) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    losses = [wrapper(x, y)[1].detach().numpy().copy() for x, y in data]
    state = {k: v.detach().numpy().copy() for k, v in wrapper.state_dict().items()}
    return np.array(losses), state


def main(mode: str, path: str, out: str) -> None:
    if mode in ("load", "loadexe"):
        if mode == "load":
            wrapper = poptorch.load(path)
        else:
            wrapper = training_wrapper(seed=1)
            wrapper.loadExecutable(path)
        losses, state = run_steps(wrapper, batches(STEPS, STEPS))
        np.savez(out, losses=losses, **state)
    elif mode in ("cache", "cacheenv"):  # cacheenv: the folder comes from POPTORCH_CACHE_DIR
        model = net().eval()
        opts = options() if mode == "cacheenv" else options().enableExecutableCaching(path)
        wrapper = poptorch.inferenceModel(model, opts)
        wrapper(torch.ones(6, 4))
        with open(out, "w") as f:
            json.dump(cache_stats, f)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
