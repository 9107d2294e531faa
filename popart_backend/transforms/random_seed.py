"""Wire the session's random seed into ops that need one (docs/training.md).

Ops whose class sets the ClassVar ``Op.requires_random_seed`` (Dropout in a TrainingSession,
random ops, custom ops) get the variable ``randomSeed___`` (INT64 [2]: the user seed of
``setRandomSeed``, the micro-batch counter) appended as their last input. The simulated device writes both values before every
micro-batch, so a kernel that derives its generator from them (plus a per-op offset) draws new
values each micro-batch and the same values for the same seed.

Before:  y, mask = Dropout(x)              After:  y, mask = Dropout(x, randomSeed___)
"""

from __future__ import annotations

import numpy as np

from ..ir.ir import Ir
from ..ir.tensor import TensorInfo, TensorKind, TensorRole

RANDOM_SEED_ID = "randomSeed___"


class WireRandomSeed:
    """Pass: append ``randomSeed___`` to the inputs of every op that requires a seed."""

    name = "wire_random_seed"

    def run(self, ir: Ir) -> bool:
        graph = ir.main
        ops = [op for op in graph.topo_order() if op.requires_random_seed]
        if not ops:
            return False
        if RANDOM_SEED_ID not in graph.tensors:
            value = np.zeros(2, np.int64)
            seed = graph.add_tensor(RANDOM_SEED_ID, TensorInfo.of(value), TensorKind.VARIABLE,
                                    value)
            seed.role = TensorRole.STEP
        for op in ops:
            if not any(t is not None and t.id == RANDOM_SEED_ID for t in op.inputs):
                graph.append_input(op, RANDOM_SEED_ID)
        return True
