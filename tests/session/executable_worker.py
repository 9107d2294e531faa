"""A fresh process for ``test_executables.py``: ``python -m tests.session.executable_worker
MODE PATH OUT``.

- ``train EXE OUT``: build the MLP training session, ``loadExecutable(EXE)``, prepare, run
  ``STEPS`` steps and save the losses and final weights to ``OUT`` (npz).
- ``cache DIR OUT``: build the session with the engine cache in ``DIR``, prepare, and write
  the engine cache counters to ``OUT`` (JSON); ``cacheenv``: the folder from
  ``POPART_CACHE_DIR``.
"""

from __future__ import annotations

import json
import sys

import numpy as np

import popart_backend as popart
from popart_backend.executable.session_mixin import engine_cache_stats
from tests.session.training_models import IN, MB, WEIGHTS, mlp_model, mlp_params

STEPS = 2


def make_session(options: popart.SessionOptions | None = None) -> popart.TrainingSession:
    optimizer = popart.SGD({"defaultLearningRate": (0.05, False),
                            "defaultMomentum": (0.9, True)})
    flow = popart.DataFlow(1, {"loss": popart.AnchorReturnType("All")})
    return popart.TrainingSession(mlp_model(mlp_params(0)), flow, "loss", optimizer,
                                  popart.DeviceManager().createCpuDevice(),
                                  userOptions=options or popart.SessionOptions())


def batches(first: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    data = rng.standard_normal((first + count, MB, IN)).astype(np.float32)
    return list(data[first:])


def run_steps(session, data) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    losses = []
    for x in data:
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({"x": x}, anchors))
        losses.append(anchors["loss"].copy())
    session.weightsToHost()
    weights = {k: np.zeros_like(v) for k, v in mlp_params(0).items()}
    session.readWeights(popart.PyWeightsIO(weights))
    return np.array(losses), weights


def main(mode: str, path: str, out: str) -> None:
    if mode == "train":
        session = make_session()
        session.loadExecutable(path)
        session.prepareDevice()
        session.weightsFromHost()
        losses, weights = run_steps(session, batches(STEPS, STEPS))
        np.savez(out, losses=losses, **{k: weights[k] for k in WEIGHTS})
    elif mode in ("cache", "cacheenv"):  # cacheenv: the folder comes from POPART_CACHE_DIR
        options = popart.SessionOptions()
        if mode == "cache":
            options.enableEngineCaching = True
            options.cachePath = path
        make_session(options).prepareDevice()
        with open(out, "w") as f:
            json.dump(engine_cache_stats, f)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
