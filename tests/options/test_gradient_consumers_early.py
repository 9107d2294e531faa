"""SessionOptions.scheduleNonWeightUpdateGradientConsumersEarly (training with accumulation):
the gradient accumulators run right after the gradients they read in the liveness walk, so
each weight gradient is live for fewer schedule positions and the peak does not grow. The
trained weights do not change."""

from __future__ import annotations

import numpy as np
import pytest

from popart_backend.ir.tensor import TensorKind
from tests.session.pipeline_models import D, MB, chain_weights, options, train

AF, LAYERS = 2, 3


def _run(early: bool):
    opts = options(af=AF, scheduleNonWeightUpdateGradientConsumersEarly=early)
    opts.engineOptions = {"autoReport.all": "true"}
    x = np.random.default_rng(4).standard_normal((AF * MB, D)).astype(np.float32)
    weights, _, session = train(chain_weights(LAYERS), x, 1, opts, 1, place=False,
                                stages=False)
    graph = session.getIr().main
    # The weight gradients the accumulators read, and the products they are copied from.
    grads = {t.id for op in graph.ops.values() if op.op_type == "Accumulate"
             for t in op.inputs if t is not None and t.kind is TensorKind.ACT_GRAD}
    grads |= {t.id for g in list(grads) for t in graph.tensors[g].producer.inputs
              if t is not None and t.kind is TensorKind.ACT_GRAD}
    memory = session.getReport().model.memory.ipus[0]
    lifetime = sum(t.end - t.start for t in memory.tensors if t.id in grads)
    return weights, memory, lifetime, grads


@pytest.fixture(scope="module")
def runs():
    return _run(False), _run(True)


def test_gradients_die_earlier_and_numbers_are_unchanged(runs):
    (w_late, mem_late, life_late, grads), (w_early, mem_early, life_early, _) = runs
    assert len(grads) == 2 * LAYERS  # per weight: its gradient and the product it copies
    for k in w_late:
        np.testing.assert_array_equal(w_early[k], w_late[k])
    assert life_early < life_late
    assert mem_early.categories["activations"] <= mem_late.categories["activations"]
