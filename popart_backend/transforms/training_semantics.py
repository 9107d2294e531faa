"""Pass (training only): switch ops whose semantics follow the session to training behaviour
(DESIGN decision 5, docs/training.md "Randomness"). Each op class says what it becomes
(``Op.training_form``, ops/norm.py and ops/random.py):

- BatchNormalization becomes ``ai.graphcore::BatchNormalizationTraining``: batch statistics,
  running mean/var VARIABLE inputs updated in place (role RUNNING_STAT, so the optimizer, which
  updates only WEIGHT variables, leaves them alone), plus the batch mean and inverse std as
  extra outputs for the backward pass. Momentum keeps ONNX's meaning (see the op).
- Dropout becomes ``ai.graphcore::DropoutTraining``: an active random mask read from the seed
  tensor ``randomSeed___`` (INT64 [2], VARIABLE, role STEP; created here, appended as the last
  input), with a per-op ``seed_modifier`` (a stable hash of the op's output id). Its mask is an
  output, so the backward reuses it.
- ai.graphcore ShapedDropout becomes ``ai.graphcore::ShapedDropoutTraining`` the same way (its
  mask has the op's ``shape``).
- LayerNormalization gets its Mean and InvStdDev outputs, so the backward reuses them instead of
  recomputing.

Output tensors keep their ids, so anchors and later consumers are untouched.

Before:  y = BatchNormalization(x, s, b, m, v)
         z = Dropout(y, ratio=0.3)
After:   y, _, _, y/mean, y/invstd = BatchNormalizationTraining(x, s, b, m, v)  # m, v in place
         z, z/mask = DropoutTraining(y, randomSeed___, ratio=0.3, seed_modifier=...)
"""

from __future__ import annotations

import logging

import numpy as np

from ..dtypes import DataType
from ..ir.graph import Graph
from ..ir.ir import Ir
from ..ir.op import Op
from ..ir.tensor import Tensor, TensorInfo, TensorKind, TensorRole

RANDOM_SEED_ID = "randomSeed___"
_log = logging.getLogger("popart:transform")


class TrainingSemantics:
    """Pass: each op with a training form (``Op.training_form``) is replaced by it; see the
    module docstring."""

    name = "training_semantics"

    def run(self, ir: Ir) -> bool:
        graph = ir.main
        changed = False
        for op in list(graph.ops.values()):
            form = op.training_form(lambda: _seed_tensor(graph).id)
            if form is None:
                continue
            _replace(graph, op, form.op, form.inputs, form.outputs)
            changed = True
        return changed


def _seed_tensor(graph: Graph) -> Tensor:
    """``randomSeed___``: [user seed, micro-batch counter], written by the simulator."""
    if RANDOM_SEED_ID in graph.tensors:
        return graph.tensors[RANDOM_SEED_ID]
    seed = graph.add_tensor(RANDOM_SEED_ID, TensorInfo(DataType.INT64, (2,)), TensorKind.VARIABLE,
                            np.zeros(2, np.int64))
    seed.role = TensorRole.STEP
    return seed


def _replace(graph: Graph, old: Op, new: Op, input_ids: list[str],
             outputs: list[Tensor | str | None]) -> None:
    """Let ``new`` take ``old``'s place. Its outputs: a Tensor of ``old`` (kept under its id),
    a fresh tensor id, or None (absent)."""
    kept = [(i, t) for i, t in enumerate(outputs) if isinstance(t, Tensor)]
    ids = [t if isinstance(t, str) else "" for t in outputs]
    for i, t in kept:
        ids[i] = graph.unique_id(t.id + "__training")
    graph.add_op(new, input_ids, ids)
    for i, t in kept:
        graph.replace_all_uses(t, graph.tensors[ids[i]])
    graph.remove_op(old)
    for i, t in kept:
        graph.remove_tensor(t)
        # Give the new tensor the original id back, so anchors and graph outputs still name it.
        tensor = graph.tensors.pop(ids[i])
        tensor.id = t.id
        graph.tensors[t.id] = tensor
        graph.outputs = [t.id if o == ids[i] else o for o in graph.outputs]
    _log.debug("training_semantics: %s -> %s", old.debug_name, new.debug_name)
