"""SessionOptions.accumulateOuterFragmentSettings (training with accumulation, two IPUs): an
Overlap schedule runs the IPUs' weight updates in parallel, so one outer-fragment run takes
the slowest IPU's op cycles instead of their sum; excludedVirtualGraphs keeps an IPU serial.
The trained weights do not change."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.ir.op import ExecutionContext
from tests.session.pipeline_models import D, MB, chain_weights, options, train

AF, BPS = 2, 1
OUTER = ExecutionContext.AccumulateOuterFragment


def _run(schedule=None, excluded=()):
    opts = options(ipus=2, af=AF)
    opts.engineOptions = {"autoReport.all": "true"}
    if schedule is not None:
        opts.accumulateOuterFragmentSettings = popart.AccumulateOuterFragmentSettings(
            schedule, list(excluded))
    x = np.random.default_rng(2).standard_normal((BPS * AF * MB, D)).astype(np.float32)
    weights, _, session = train(chain_weights(2), x, 2, opts, BPS, stages=False)
    return weights, session.getReport().model.cycles


def _per_ipu_outer(cycles) -> dict[int, int]:
    out: dict[int, int] = {}
    for o in cycles.ops:
        if o.context is OUTER:
            out[o.ipu] = out.get(o.ipu, 0) + o.cycles
    return out


@pytest.fixture(scope="module")
def serial():
    return _run()


def test_overlap_takes_the_slowest_ipu(serial):
    weights_serial, cycles_serial = serial
    weights, cycles = _run(popart.AccumulateOuterFragmentSchedule.OverlapCycleOptimized)
    for k in weights:
        np.testing.assert_array_equal(weights[k], weights_serial[k])
    per_ipu = _per_ipu_outer(cycles)
    assert len(per_ipu) == 2
    assert cycles_serial.outer_cycles - cycles.outer_cycles == (
        sum(per_ipu.values()) - max(per_ipu.values()))
    assert cycles.step_cycles < cycles_serial.step_cycles


def test_excluded_ipu_stays_serial(serial):
    _, cycles_serial = serial
    _, cycles = _run(popart.AccumulateOuterFragmentSchedule.OverlapCycleOptimized, [1])
    assert cycles.outer_cycles == cycles_serial.outer_cycles
