"""The shape-aware matrix-unit plan (device/planner.py): efficiency from the product's shape and
tile split, the available memory proportion's trade of temporary memory against cycles (per op,
and session-wide through matmulOptions / convolutionOptions), and the formulas against the IPU
facts of spec Appendix A (F56)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from popart_backend.device.cost import compute_cycles
from popart_backend.device.memory import PLANNER_TEMPORARIES, compute_memory
from popart_backend.device.option_model import OptionModel, option_model
from popart_backend.device.planner import DEFAULT_PROPORTION, amp_plan
from popart_backend.device.spec import IpuSpec
from popart_backend.importer.onnx_model import import_model
from popart_backend.options.session_options import SessionOptions

IPU2 = IpuSpec.for_version("ipu2")


def _ideal(m: int, k: int, n: int, spec: IpuSpec, dtype: str = "f16") -> float:
    """Cycles of the product at the AMP peak of every tile (spec Appendix A)."""
    peak = spec.peak_flops_f16 if dtype == "f16" else spec.peak_flops_f32
    return 2 * m * k * n / peak * spec.clock_hz


def _plan(m, k, n, proportion=DEFAULT_PROPORTION, dtype="f16", spec=IPU2, tiles=None):
    # float32 partials; float16 outputs (2 bytes), so the partials are a temporary of their own
    return amp_plan(m, k, n, dtype, 4, proportion, spec, tiles or spec.num_tiles,
                    out_bytes=2 if dtype == "f16" else 4)


def _cycles(plan) -> int:
    return plan.compute_cycles + plan.exchange_cycles


def test_F56_efficiency_rises_with_the_size_of_the_product():
    sizes = [64, 128, 256, 512, 1024, 2048]
    eff = [_plan(s, s, s).efficiency for s in sizes]
    assert eff == sorted(eff) and len(set(eff)) == len(eff), eff
    assert eff[0] < 0.1 < 0.3 < eff[-1] <= IPU2.amp_efficiency
    # Efficiency is the ideal cycles over the plan's, as the planner reports it.
    for s, e in zip(sizes, eff):
        assert e == pytest.approx(_ideal(s, s, s, IPU2) / _cycles(_plan(s, s, s)), rel=0.02)


def test_F56_channels_off_the_amp_groups_leave_the_units_idle():
    """7 output channels take the cycles of 8 (the AMP's output group); 15 input channels the
    cycles of 16 (its float16 input group), so the useful work per cycle drops by 7/8, 15/16."""
    rows = 4 * IPU2.num_tiles  # enough rows for every tile to have the same work
    eight, seven = _plan(rows, 16, 8), _plan(rows, 16, 7)
    assert seven.compute_cycles == eight.compute_cycles
    assert seven.efficiency == pytest.approx(eight.efficiency * 7 / 8, rel=0.02)
    sixteen, fifteen = _plan(rows, 16, 64), _plan(rows, 15, 64)
    assert fifteen.compute_cycles == sixteen.compute_cycles
    # An odd size does worse than the round one next to it.
    assert _plan(1024, 1000, 1024).efficiency < _plan(1024, 1024, 1024).efficiency


def test_F56_one_tile_plan_follows_the_ipu_facts():
    """On one tile the plan is the AMP formula: padded MACs over the tile's AMP MACs per cycle
    (peak / 2 / tiles / clock) and the inner-loop efficiency, plus one setup; the inputs
    arrive at the exchange's bytes per tile per cycle (8 TB/s over 1472 tiles at the clock)."""
    m, k, n = 40, 50, 30
    plan = _plan(m, k, n, tiles=1)
    assert plan.grid == (1, 1, 1) and plan.tiles_used == 1 and plan.passes == 1
    macs = 250e12 / 2 / (1472 * 1.33e9)
    kt, nt = 64, 32  # 50 -> 4 groups of 16, 30 -> 4 groups of 8
    assert plan.compute_cycles == math.ceil(m * kt * nt / (macs * IPU2.amp_efficiency)
                                            + IPU2.amp_setup_cycles)
    exchange = 8e12 / (1472 * 1.33e9)
    assert plan.exchange_cycles == math.ceil((m * kt + kt * nt) * 2 / exchange)
    # f16 output elements' partials (4 bytes) and both input pieces are the temporaries.
    assert plan.temporary_bytes == (m * kt + kt * nt) * 2 + m * nt * 4


@pytest.mark.parametrize("shape", [(2048, 2048, 2048), (1024, 1024, 4096),
                                   (18 * 56 * 56, 576, 64)])
def test_F56_lower_proportion_lowers_temporaries_and_raises_cycles(shape):
    proportions = [1.0, 0.6, 0.3, 0.15, 0.05]
    plans = [_plan(*shape, proportion=p) for p in proportions]
    temps = [p.temporary_bytes for p in plans]
    cycles = [_cycles(p) for p in plans]
    assert temps == sorted(temps, reverse=True) and temps[-1] < temps[0]
    assert cycles == sorted(cycles) and cycles[-1] > cycles[0]
    for p, plan in zip(proportions, plans):
        # Within the budget on every tile it uses.
        assert plan.temporary_bytes <= p * IPU2.tile_bytes * plan.tiles_used


def _matmul_ir(proportion=None):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    if proportion is not None:
        nodes[0].attribute.append(helper.make_attribute("__available_memory", proportion))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2048, 2048])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        [numpy_helper.from_array(np.zeros((2048, 2048), np.float16), "w")])
    return import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def _temporaries_and_cycles(ir, effects=None):
    order = ir.main.topo_order()
    memory = compute_memory(ir.main, order, IPU2, keep=["y"], effects=effects).ipu(0)
    cycles = compute_cycles(ir.main, order, IPU2, effects=effects)
    return memory.categories[PLANNER_TEMPORARIES], cycles.step_cycles


def test_F56_per_op_and_session_proportions_reach_the_memory_and_cycle_models():
    default = _temporaries_and_cycles(_matmul_ir())
    low_op = _temporaries_and_cycles(_matmul_ir(0.05))
    assert low_op[0] < default[0] and low_op[1] > default[1]
    # Session-wide: matmulOptions bounds the matmuls without a proportion of their own ...
    ir = _matmul_ir()
    opts = SessionOptions()
    opts.matmulOptions = {"availableMemoryProportion": "0.05"}
    effects = option_model(ir, ir.main.topo_order(), opts)
    assert effects.matmul_proportion == pytest.approx(0.05) and effects.conv_proportion is None
    assert _temporaries_and_cycles(ir, effects) == low_op
    # ... but not the convolutions, and the op's own setting wins.
    assert _temporaries_and_cycles(ir, OptionModel(conv_proportion=0.05)) == default
    assert _temporaries_and_cycles(_matmul_ir(0.6), effects) == default


def test_F56_session_proportion_is_not_logged_as_without_effect(caplog):
    from popart_backend.options.planning import check_planning_options

    opts = SessionOptions()
    opts.matmulOptions = {"availableMemoryProportion": "0.3"}
    opts.convolutionOptions = {"availableMemoryProportion": "0.3"}
    with caplog.at_level(logging.WARNING):
        check_planning_options(opts)
    assert "availableMemoryProportion" not in caplog.text
