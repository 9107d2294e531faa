"""One instance of a globally replicated training run (spec §5.3, F74), started by
``test_global_replication.py`` with torchrun-style environment variables (MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE) and ``python -m tests.session.global_replication_worker OUT
LOCAL GLOBAL AF``. It trains on its local replicas' share of a fixed global input and saves
the final weights and its loss anchor to ``OUT`` (npz)."""

from __future__ import annotations

import os
import sys

import numpy as np

from tests.session.replication_models import D_IN, options, params, read_weights, session

MB, BPS = 2, 2


def global_inputs(global_replicas: int, af: int) -> np.ndarray:
    """The whole job's input, [bps, af, grf, mb, D]."""
    rng = np.random.default_rng(7)
    return rng.standard_normal((BPS, af, global_replicas, MB, D_IN)).astype(np.float32)


def main(out: str, local: int, global_replicas: int, af: int) -> None:
    rank = int(os.environ["RANK"])
    opts = options(rf=local, af=af)
    opts.enableDistributedReplicatedGraphs = True
    opts.globalReplicationFactor = global_replicas
    opts.globalReplicaOffset = rank * local
    p = params()
    s, loss = session(p, MB, BPS, opts)
    x = global_inputs(global_replicas, af)[:, :, rank * local:(rank + 1) * local]
    anchors = s.initAnchorArrays()
    import popart_backend as popart

    s.run(popart.PyStepIO({"x": np.ascontiguousarray(x)}, anchors))
    np.savez(out, loss=anchors[loss], **read_weights(s, p))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
