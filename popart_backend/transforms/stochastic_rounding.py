"""``SessionOptions.enableStochasticRounding``: float16 results rounded stochastically.

``StochasticRounding`` marks (``OpSettings.stochastic_rounding``) every op whose class
``supports_stochastic_rounding`` (the optimizer updates, MatMul) and that writes a float16
tensor, and appends the session's ``randomSeed___`` variable as its last input (creating the
variable when no op needed it yet). Their kernels then compute in float32 and round each
float16 result to one of its two float16 neighbours at random, unbiased (ops/rounding.py). It
runs after the optimizer (whose updates it marks) and before WireRandomSeed.

Before:  UpdatedVar___w = SGDUpdate(w, Gradient___w)            # w float16
After:   UpdatedVar___w = SGDUpdate(w, Gradient___w, randomSeed___)  # settings.stochastic_rounding
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..dtypes import DataType
from ..ir.ir import Ir
from ..ir.tensor import TensorInfo, TensorKind, TensorRole
from .random_seed import RANDOM_SEED_ID


class StochasticRounding:
    """Pass: mark the float16 ops that round stochastically and give them the random seed."""

    name = "stochastic_rounding"

    def run(self, ir: Ir) -> bool:
        graph = ir.main
        ops = [op for op in graph.topo_order()
               if op.supports_stochastic_rounding and not op.settings.stochastic_rounding
               and any(t is not None and t.info.dtype is DataType.FLOAT16 for t in op.outputs)]
        if not ops:
            return False
        if RANDOM_SEED_ID not in graph.tensors:
            value = np.zeros(2, np.int64)
            seed = graph.add_tensor(RANDOM_SEED_ID, TensorInfo.of(value), TensorKind.VARIABLE,
                                    value)
            seed.role = TensorRole.STEP
        for op in ops:
            op.settings = dataclasses.replace(op.settings, stochastic_rounding=True)
            graph.append_input(op, RANDOM_SEED_ID)
        return True
