"""``SessionOptions.enableStochasticRounding``: float16 results rounded stochastically.

``StochasticRounding`` marks (``OpSettings.stochastic_rounding``) every op of the main graph
that writes a float16 tensor, and appends the session's ``randomSeed___`` variable as its last
input (creating the variable when no op needed it yet). Ops whose class
``supports_stochastic_rounding`` (the optimizer updates, MatMul) round in their own kernel;
every other marked op computes in float32 and has its float16 results rounded by the plan's
wrapper (ops/rounding.py ``stochastically_rounded``). Either way each float16 result goes to
one of its two float16 neighbours at random, unbiased. Not marked, because they compute no new
value or already draw from the seed: ops that write an input in place, alias or only move
elements (Identity, Reshape, Gather, Concat ...), inter-IPU copies, collectives, pipeline
stashes, random ops and ops with subgraphs (their bodies' ops are not rounded stochastically).
It runs after the optimizer (whose updates it marks) and before WireRandomSeed.

Before:  UpdatedVar___w = SGDUpdate(w, Gradient___w)            # w float16
After:   UpdatedVar___w = SGDUpdate(w, Gradient___w, randomSeed___)  # settings.stochastic_rounding
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..dtypes import DataType
from ..ir.ir import Ir
from ..ir.op import Op
from ..ir.tensor import TensorInfo, TensorKind, TensorRole
from ..ops.cast import CastBase
from ..ops.control_flow import SubgraphOp
from .random_seed import RANDOM_SEED_ID


class StochasticRounding:
    """Pass: mark the float16 ops that round stochastically and give them the random seed."""

    name = "stochastic_rounding"

    def run(self, ir: Ir) -> bool:
        graph = ir.main
        ops = [op for op in graph.topo_order()
               if (op.supports_stochastic_rounding or _computes_values(op))
               and not op.settings.stochastic_rounding
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


def _computes_values(op: Op) -> bool:
    """An op whose float16 results are new values (so rounded): not an in-place writer, view,
    element mover, copy, collective, stash, random op or subgraph op (module docstring). A
    Cast rounds when it narrows another float type to float16."""
    if isinstance(op, CastBase):
        source = op.inputs[0] if op.inputs else None
        return source is not None and source.info.dtype.is_float \
            and source.info.dtype is not DataType.FLOAT16
    return not (op.modifies_inputs or op.aliases_inputs or op.moves_elements
                or op.strings_as_codes
                or op.runs_between_cycles or op.collective or op.output_persists
                or op.requires_random_seed or isinstance(op, SubgraphOp))
