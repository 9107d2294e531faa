"""Pass (training only): switch ops whose semantics follow the session to training behaviour
(DESIGN decision 5, docs/training.md "Randomness").

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
import zlib

import numpy as np

from ..dtypes import DataType
from ..errors import popart_exception
from ..ir.graph import Graph
from ..ir.ir import Ir
from ..ir.op import Op
from ..ir.tensor import Tensor, TensorInfo, TensorKind, TensorRole
from ..ops.registry import AI_GRAPHCORE, AI_ONNX, create_op

RANDOM_SEED_ID = "randomSeed___"
_log = logging.getLogger("popart:transform")


class TrainingSemantics:
    """Pass: BatchNormalization and Dropout behave as in training; see the module docstring."""

    name = "training_semantics"

    def run(self, ir: Ir) -> bool:
        graph = ir.main
        changed = False
        for op in list(graph.ops.values()):
            if op.domain == AI_GRAPHCORE and op.op_type == "ShapedDropout":
                self._shaped_dropout(graph, op)
                changed = True
                continue
            if op.domain != AI_ONNX:
                continue
            if op.op_type == "BatchNormalization":
                self._batch_norm(graph, op)
            elif op.op_type == "Dropout":
                self._dropout(graph, op)
            elif op.op_type == "LayerNormalization" and _missing_stats(op):
                self._layer_norm(graph, op)
            else:
                continue
            changed = True
        return changed

    def _batch_norm(self, graph: Graph, op: Op) -> None:
        for index, what in ((3, "mean"), (4, "var")):
            stat = op.inputs[index]
            if stat.kind is TensorKind.CONST:
                # Training updates it, so it is state from now on (never shared with the host's
                # constant data: the plan copies variables).
                stat.kind = TensorKind.VARIABLE
            if stat.kind is not TensorKind.VARIABLE:
                raise popart_exception(
                    f"{op.debug_name}: the running {what} '{stat.id}' is computed "
                    f"({stat.kind.value}), but training updates it in place. Make it an "
                    f"initializer."
                )
            stat.role = TensorRole.RUNNING_STAT
        attrs = op.attrs
        new = create_op(
            "BatchNormalizationTraining",
            {"epsilon": attrs.epsilon, "momentum": attrs.momentum,
             "spatial": getattr(attrs, "spatial", 1)},
            op.settings, domain=AI_GRAPHCORE, where=op.debug_name,
        )
        base = op.outputs[0].id
        outputs = _padded(op.outputs, 3) + [graph.unique_id(f"{base}/batch_mean"),
                                            graph.unique_id(f"{base}/batch_invstd")]
        _replace(graph, op, new, [t.id for t in op.inputs], outputs)

    def _dropout(self, graph: Graph, op: Op) -> None:
        if op.version >= 12:
            ratio = op.const_input(1)
            ratio = 0.5 if ratio is None else float(np.asarray(ratio))
        else:
            ratio = op.attrs.ratio
        seed = _seed_tensor(graph)
        out = op.outputs[0]
        new = create_op(
            "DropoutTraining",
            {"ratio": ratio, "seed_modifier": zlib.crc32(out.id.encode()),
             "bool_mask": int(op.version >= 10)},
            op.settings, domain=AI_GRAPHCORE, where=op.debug_name,
        )
        outputs = _padded(op.outputs, 2)
        if outputs[1] is None:
            outputs[1] = graph.unique_id(f"{out.id}/mask")
        _replace(graph, op, new, [op.inputs[0].id, seed.id], outputs)

    def _shaped_dropout(self, graph: Graph, op: Op) -> None:
        seed = _seed_tensor(graph)
        out = op.outputs[0]
        new = create_op(
            "ShapedDropoutTraining",
            {"shape": op.attrs.shape, "ratio": op.attrs.ratio,
             "seed_modifier": zlib.crc32(out.id.encode())},
            op.settings, domain=AI_GRAPHCORE, where=op.debug_name,
        )
        _replace(graph, op, new, [op.inputs[0].id, seed.id],
                 [out, graph.unique_id(f"{out.id}/mask")])

    def _layer_norm(self, graph: Graph, op: Op) -> None:
        outputs = _padded(op.outputs, 3)
        base = outputs[0].id
        for i, name in ((1, "mean"), (2, "invstddev")):
            if outputs[i] is None:
                outputs[i] = graph.unique_id(f"{base}/{name}")
        new = type(op)(op.attrs, op.settings, op.version)
        _replace(graph, op, new, [t.id if t is not None else "" for t in op.inputs], outputs)


def _missing_stats(op: Op) -> bool:
    return len(op.outputs) < 3 or any(t is None for t in op.outputs[1:3])


def _padded(outputs: list[Tensor | None], n: int) -> list[Tensor | None]:
    return list(outputs) + [None] * (n - len(outputs))


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
