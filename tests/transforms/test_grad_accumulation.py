"""Gradient-accumulation passes and their ops (spec §5.3, F73, F75): the IR they build for each
reduction type / MeanReductionStrategy, the fragments of the execution plan, and the in-place
Accumulate / AccumulatorScale kernels against numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.device.plan import ExecutionPlan
from popart_backend.errors import ShapeError
from popart_backend.importer.onnx_model import import_model, load_model
from popart_backend.ir.op import ExecutionContext, Op
from popart_backend.ir.tensor import TensorKind, TensorRole
from popart_backend.ops.registry import create_op
from popart_backend.transforms.grad_accumulation import COUNTER_ID, reduction_factors
from popart_backend.transforms.pipeline import ApplyOptimizer, run_passes, training_passes
from popart_backend.transforms.random_seed import RANDOM_SEED_ID, WireRandomSeed
from tests.session.training_models import WEIGHTS, mlp_model, mlp_params

OUTER = ExecutionContext.AccumulateOuterFragment
NORMAL = ExecutionContext.Normal
Mean, Sum = popart.ReductionType.Mean, popart.ReductionType.Sum
S = popart.MeanReductionStrategy


def options(af=4, reduction=Sum, strategy=S.PostAndLoss, enable=True):
    opts = popart.SessionOptions()
    opts.enableGradientAccumulation = enable
    opts.accumulationFactor = af
    opts.accumulationAndReplicationReductionType = reduction
    opts.meanAccumulationAndReplicationReductionStrategy = strategy
    return opts


def build(opts, optimizer=None):
    ir = import_model(load_model(mlp_model(mlp_params())), constant_weights=False)
    passes = training_passes(opts, "loss", optimizer or popart.ConstSGD(0.1),
                             opts.getAccumulationFactor())
    run_passes(ir, passes, debug=True)
    apply = next(p for p in passes if isinstance(p, ApplyOptimizer))
    return ir, apply


def ops_of(ir, op_type):
    return [op for op in ir.main.topo_order() if op.op_type == op_type]


@pytest.mark.parametrize("reduction,strategy", [(Sum, S.Post), (Mean, S.Running), (Mean, S.Post),
                                                (Mean, S.PostAndLoss)])
def test_accumulators_and_fragments_F75(reduction, strategy):
    ir, apply = build(options(4, reduction, strategy))
    graph = ir.main
    for w in WEIGHTS:
        accum = graph.tensors[f"Accum___{w}"]
        assert accum.kind is TensorKind.VARIABLE and accum.role is TensorRole.ACCUMULATOR
        assert accum.info == graph.tensors[w].info and not accum.data.any()
    accumulates = [op for op in ops_of(ir, "Accumulate") if op.inputs[0].id.startswith("Accum")]
    assert len(accumulates) == 4
    assert all(op.settings.execution_context is NORMAL for op in accumulates)
    assert all(op.modifies_inputs == (0,) for op in accumulates)
    updates = ops_of(ir, "SGDUpdate")
    assert all(op.settings.execution_context is OUTER for op in updates)
    resets = [op for op in ops_of(ir, "AccumulatorScale") if op.attrs.factor == 0.0]
    assert all(op.settings.execution_context is OUTER for op in resets)
    assert len(resets) == 4 + (strategy is S.Running and reduction is Mean)
    # The reset of each accumulator runs after the update that reads it.
    order = {op.id: i for i, op in enumerate(graph.topo_order())}
    for update in updates:
        w = update.inputs[0].id
        reset = next(op for op in resets if op.settings.name == f"Accum___{w}/reset")
        assert order[update.id] < order[reset.id]
    assert apply.context is OUTER


def test_running_mean_uses_a_counter_F73():
    ir, apply = build(options(4, Mean, S.Running))
    counter = ir.main.tensors[COUNTER_ID]
    assert counter.role is TensorRole.STEP and counter.info.shape == ()
    means = [op for op in ops_of(ir, "Accumulate") if op.attrs.accumulation_type == "Mean"]
    assert len(means) == 4 and all(op.inputs[2].id == COUNTER_ID for op in means)
    increment = next(op for op in ops_of(ir, "Accumulate") if op.inputs[0].id == COUNTER_ID)
    order = [op.id for op in ir.main.topo_order()]
    assert all(order.index(op.id) < order.index(increment.id) for op in means)
    assert all(op.attrs.grad_scale == 1.0 for op in ops_of(ir, "SGDUpdate"))


def test_post_divides_at_the_optimizer_F73():
    ir, _ = build(options(4, Mean, S.Post))
    assert all(op.attrs.grad_scale == pytest.approx(0.25) for op in ops_of(ir, "SGDUpdate"))
    assert not [op for op in ops_of(ir, "AccumulatorScale") if op.attrs.factor != 0.0]


def test_post_and_loss_scales_the_accumulator_before_the_update_F73():
    ir, _ = build(options(4, Mean, S.PostAndLoss))
    scales = [op for op in ops_of(ir, "AccumulatorScale") if op.attrs.factor != 0.0]
    assert len(scales) == 4 and all(op.attrs.factor == 0.25 for op in scales)
    for update in ops_of(ir, "SGDUpdate"):
        assert update.inputs[1].producer in scales
        assert update.attrs.grad_scale == 1.0


def test_sum_and_loss_scaling_fold_into_grad_scale_F73():
    ir, _ = build(options(2, Sum), popart.ConstSGD(0.1, loss_scaling=8.0))
    assert all(op.attrs.grad_scale == 0.125 for op in ops_of(ir, "SGDUpdate"))
    seed = ir.main.tensors["Gradient___loss"]
    assert seed.is_const and float(seed.data) == 8.0


def test_reduction_factors_table_F73():
    assert reduction_factors(options(4, Sum), 4, 2) == (1.0, 1.0)
    assert reduction_factors(options(4, Mean, S.Running), 4, 2) == (1.0, 0.5)
    assert reduction_factors(options(4, Mean, S.Post), 4, 2) == (1.0, 0.125)
    assert reduction_factors(options(4, Mean, S.PostAndLoss), 4, 2) == (0.5, 1.0)
    # Without accumulation, Post only divides by the replicas.
    assert reduction_factors(options(1, Mean, S.Post, enable=False), 1, 2) == (1.0, 0.5)


def test_no_accumulation_keeps_everything_in_the_normal_fragment():
    ir, apply = build(options(1, Sum, enable=False))
    assert not ops_of(ir, "Accumulate")
    assert all(op.settings.execution_context is NORMAL for op in ir.main.ops.values())
    assert apply.context is NORMAL


def test_plan_fragments_split_by_context():
    ir, _ = build(options(3, Mean, S.Running))
    plan = ExecutionPlan(ir.main, keep=[])
    normal = {step[5].op_type for step in plan.normal_steps}
    outer = [step[5] for step in plan.outer_steps]
    assert "Accumulate" in normal and "SGDUpdate" not in normal
    assert {op.op_type for op in outer} == {"SGDUpdate", "AccumulatorScale"}
    assert len(plan.steps) == len(plan.normal_steps) + len(plan.outer_steps)


# --- the ops ------------------------------------------------------------------------------------


def make(op_type, **attrs) -> Op:
    return create_op(op_type, attrs, domain="ai.graphcore")


def test_accumulate_add_is_in_place():
    accum = torch.zeros(3)
    out = make("Accumulate").kernel(accum, torch.tensor([1.0, 2.0, 3.0]))
    out = make("Accumulate").kernel(out, torch.tensor([1.0, 1.0, 1.0]))
    assert out.data_ptr() == accum.data_ptr()
    np.testing.assert_array_equal(accum.numpy(), [2.0, 3.0, 4.0])


def test_accumulate_mean_is_the_running_mean():
    rng = np.random.default_rng(0)
    updates = rng.standard_normal((5, 4)).astype(np.float32)
    accum, op = torch.full((4,), 7.0), make("Accumulate", accumulation_type="Mean")
    for count, update in enumerate(updates):
        op.kernel(accum, torch.from_numpy(update), torch.tensor(float(count)))
    np.testing.assert_allclose(accum.numpy(), updates.mean(0), rtol=1e-6, atol=1e-6)


def test_accumulator_scale_zero_and_factor():
    accum = torch.tensor([2.0, -4.0])
    make("AccumulatorScale", factor=0.25).kernel(accum)
    np.testing.assert_array_equal(accum.numpy(), [0.5, -1.0])
    make("AccumulatorScale").kernel(accum)
    np.testing.assert_array_equal(accum.numpy(), [0.0, 0.0])


def test_accumulate_checks_its_inputs():
    from popart_backend.dtypes import DataType
    from popart_backend.ir.tensor import TensorInfo

    f32 = lambda *shape: TensorInfo(DataType.FLOAT, shape)  # noqa: E731
    with pytest.raises(ShapeError, match="accumulator's shape"):
        make("Accumulate").infer(f32(3), f32(4))
    with pytest.raises(ShapeError, match="count input"):
        make("Accumulate", accumulation_type="Mean").infer(f32(3), f32(3))
    with pytest.raises(ShapeError, match="not one of"):
        make("Accumulate", accumulation_type="Max").infer(f32(3), f32(3))


def test_wire_random_seed_appends_the_seed_once():
    ir = import_model(load_model(mlp_model(mlp_params())), constant_weights=False)
    relu = next(iter(ir.main.ops_of_type("Relu")))
    type(relu).requires_random_seed = True
    try:
        assert WireRandomSeed().run(ir)
        WireRandomSeed().run(ir)
    finally:
        del type(relu).requires_random_seed
    assert [t.id for t in relu.inputs] == ["h1", RANDOM_SEED_ID]
    seed = ir.main.tensors[RANDOM_SEED_ID]
    assert seed.role is TensorRole.STEP and seed.info.shape == (2,)
    assert not WireRandomSeed().run(import_model(load_model(mlp_model(mlp_params())),
                                                 constant_weights=False))
