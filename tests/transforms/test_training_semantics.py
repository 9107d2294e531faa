"""TrainingSemantics pass: BatchNormalization with batch statistics and running-stat updates,
active seeded Dropout, LayerNormalization statistics for the backward (DESIGN decision 5,
docs/training.md "Randomness"). References: torch BatchNorm2d in train mode, torch.autograd."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.errors import popart_exception
from popart_backend.importer.onnx_model import import_model
from popart_backend.ir.tensor import TensorKind, TensorRole
from popart_backend.ir.verify import verify
from popart_backend.transforms.autodiff import Autodiff
from popart_backend.transforms.training_semantics import RANDOM_SEED_ID, TrainingSemantics
from tests.helpers import assert_close, one_op_model, rand

TOL = dict(rtol=1e-4, atol=1e-5)


def _train_graph(op_type, inputs, attrs, opset=18, num_outputs=1, weights=(), consts=(),
                 grads=True, seed=0):
    """One-op model -> TrainingSemantics -> (optionally) autodiff seeded with random output
    gradients. Returns (ir, plan, output-gradient seeds, autodiff)."""
    model, feeds = one_op_model(op_type, inputs, attrs, opset, num_outputs,
                                const_inputs=set(weights) | set(consts))
    ir = import_model(model, constant_weights=False)
    assert TrainingSemantics().run(ir)
    graph = ir.main
    rng = np.random.default_rng(seed)
    out = graph.tensors["out0"]
    seeds = {"out0": rng.uniform(-1, 1, out.info.shape).astype(np.float32)}
    autodiff = None
    if grads:
        autodiff = Autodiff(None, output_grads=seeds)
        autodiff.run(ir)
    verify(graph)
    keep = list(graph.outputs) + (list(autodiff.variable_grads.values()) if autodiff else [])
    keep += [t.id for op in graph.ops.values() for t in op.outputs if t is not None]
    plan = ExecutionPlan(graph, keep=keep)
    for name in plan.stream_ids:
        plan.set_value(name, to_torch(np.asarray(feeds[name])))
    return ir, plan, seeds, autodiff


def _set_seed(plan, seed, counter):
    if RANDOM_SEED_ID in plan.slot:
        plan.set_value(RANDOM_SEED_ID, torch.tensor([seed, counter], dtype=torch.int64))


# --- BatchNormalization ---------------------------------------------------------------------


@pytest.mark.parametrize("momentum", [0.9, 0.7])
def test_batchnorm_training_matches_torch_train_mode(momentum):
    """Batch statistics in Y; running mean/var after one and two steps equal torch
    BatchNorm2d(momentum=1 - ONNX momentum).train(); gradients equal torch.autograd."""
    x = rand(4, 3, 5, 5, seed=1)
    scale, b = rand(3, seed=2), rand(3, seed=3)
    mean, var = rand(3, seed=4), rand(3, low=0.5, high=1.5, seed=5)
    ir, plan, seeds, autodiff = _train_graph(
        "BatchNormalization", [x, scale, b, mean, var], {"epsilon": 1e-5, "momentum": momentum},
        weights=[1, 2, 3, 4])
    graph = ir.main
    assert [op.op_type for op in graph.ops.values() if op.grad_of is None][0] == \
        "BatchNormalizationTraining"
    assert graph.tensors["in3"].role is TensorRole.RUNNING_STAT
    assert graph.tensors["in4"].role is TensorRole.RUNNING_STAT
    assert set(autodiff.variable_grads) == {"in1", "in2"}  # running stats are not trained

    bn = torch.nn.BatchNorm2d(3, eps=1e-5, momentum=1 - momentum).train()
    with torch.no_grad():
        bn.weight.copy_(torch.from_numpy(scale))
        bn.bias.copy_(torch.from_numpy(b))
        bn.running_mean.copy_(torch.from_numpy(mean))
        bn.running_var.copy_(torch.from_numpy(var))
    xt = torch.from_numpy(x).requires_grad_(True)
    y_ref = bn(xt)
    (y_ref * torch.from_numpy(seeds["out0"])).sum().backward()

    plan.execute()
    assert_close(plan.get_value("out0").numpy(), y_ref.detach().numpy(), "Y", **TOL)
    assert_close(plan.get_value("in3").numpy(), bn.running_mean.numpy(), "running mean", **TOL)
    assert_close(plan.get_value("in4").numpy(), bn.running_var.numpy(), "running var", **TOL)
    grads = {i: plan.get_value(autodiff.variable_grads[f"in{i}"]).numpy() for i in (1, 2)}
    assert_close(grads[1], bn.weight.grad.numpy(), "dscale", **TOL)
    assert_close(grads[2], bn.bias.grad.numpy(), "dbias", **TOL)

    plan.execute()  # a second micro-batch updates the running statistics again
    with torch.no_grad():
        bn(xt)
    assert_close(plan.get_value("in3").numpy(), bn.running_mean.numpy(), "running mean 2", **TOL)
    assert_close(plan.get_value("in4").numpy(), bn.running_var.numpy(), "running var 2", **TOL)


def test_batchnorm_training_input_grad():
    """dX through batch statistics (the statistics depend on X) against torch.autograd."""
    from popart_backend.transforms.autodiff import Autodiff as _Autodiff  # noqa: F401

    x = rand(3, 4, 6, seed=7)
    scale, b, mean, var = rand(4, seed=8), rand(4, seed=9), rand(4, seed=10), np.ones(4, np.float32)
    ir, plan, seeds, autodiff = _train_graph(
        "BatchNormalization", [x, scale, b, mean, var], {}, weights=[0, 1, 2, 3, 4])
    plan.execute()
    leaves = [torch.from_numpy(a.astype(np.float64)).requires_grad_(True) for a in (x, scale, b)]
    y = F.batch_norm(leaves[0], torch.from_numpy(mean).double(), torch.ones(4).double(),
                     leaves[1], leaves[2], True, 0.1, 1e-5)
    (y * torch.from_numpy(seeds["out0"]).double()).sum().backward()
    for i in (0, 1, 2):
        ours = plan.get_value(autodiff.variable_grads[f"in{i}"]).numpy()
        assert_close(ours, leaves[i].grad.numpy().astype(np.float32), f"d input {i}", **TOL)


def test_batchnorm_training_keeps_output_ids_and_running_outputs():
    """Anchored outputs keep their ids; ONNX's running mean/var outputs are the updated stats."""
    x = rand(4, 2, 3, seed=11)
    params = [rand(2, seed=12), rand(2, seed=13), rand(2, seed=14), np.ones(2, np.float32)]
    ir, plan, _, _ = _train_graph("BatchNormalization", [x] + params,
                                  {"training_mode": 1}, opset=15, num_outputs=3,
                                  weights=[1, 2, 3, 4], grads=False)
    assert ir.main.outputs == ["out0", "out1", "out2"]
    plan.execute()
    bn = torch.nn.BatchNorm1d(2, momentum=0.1).train()
    with torch.no_grad():
        bn.weight.copy_(torch.from_numpy(params[0]))
        bn.bias.copy_(torch.from_numpy(params[1]))
        bn.running_mean.copy_(torch.from_numpy(params[2]))
        bn(torch.from_numpy(x))
    assert_close(plan.get_value("out1").numpy(), bn.running_mean.numpy(), **TOL)
    assert_close(plan.get_value("out2").numpy(), bn.running_var.numpy(), **TOL)


def test_batchnorm_training_computed_running_stat_is_an_error():
    model, feeds = one_op_model("BatchNormalization", [rand(2, 3), rand(3), rand(3), rand(3),
                                                       rand(3)], {}, const_inputs={1, 2, 3})
    ir = import_model(model, constant_weights=False)  # 'in4' is a streamed input
    with pytest.raises(popart_exception, match="BatchNormalization.*running var 'in4'"):
        TrainingSemantics().run(ir)


# --- Dropout ---------------------------------------------------------------------------------


def _dropout_run(plan, seed, counter):
    _set_seed(plan, seed, counter)
    plan.execute()
    mask_id = [t.id for t in plan.graph.tensors.values() if t.id.endswith("/mask") or t.id == "out1"]
    return plan.get_value("out0").clone(), plan.get_value(mask_id[0]).clone()


def test_dropout_training_masks_seed_and_statistics():
    x = rand(100, 100, low=0.5, high=1.5, seed=20)
    ir, plan, seeds, autodiff = _train_graph("Dropout", [x, np.array(0.3, np.float32)], {},
                                             opset=13, weights=[0], consts=[1])
    graph = ir.main
    (op,) = [op for op in graph.ops.values() if op.op_type == "DropoutTraining"]
    assert type(op).requires_random_seed
    assert op.inputs[-1].id == RANDOM_SEED_ID
    seed = graph.tensors[RANDOM_SEED_ID]
    assert seed.kind is TensorKind.VARIABLE and seed.role is TensorRole.STEP

    y0, m0 = _dropout_run(plan, 7, 0)
    grad0 = plan.get_value(autodiff.variable_grads["in0"]).clone()
    y1, m1 = _dropout_run(plan, 7, 1)
    y0_again, m0_again = _dropout_run(plan, 7, 0)
    _, m_other_seed = _dropout_run(plan, 8, 0)
    assert m0.dtype == torch.bool
    assert not torch.equal(m0, m1), "masks must differ between micro-batches"
    assert not torch.equal(m0, m_other_seed), "masks must differ between seeds"
    assert torch.equal(m0, m0_again) and torch.equal(y0, y0_again), "same seed+counter replays"
    kept = m0.float().mean().item()
    assert abs(kept - 0.7) < 0.02, kept
    xt = torch.from_numpy(x)
    assert_close(y0.numpy(), (xt * m0 / 0.7).numpy(), "output", **TOL)
    # The backward reuses the forward's mask.
    expected = torch.from_numpy(seeds["out0"]) * m0 / 0.7
    assert_close(grad0.numpy(), expected.numpy(), "d data", **TOL)


@pytest.mark.parametrize("opset,attrs,mask_dtype", [(7, {"ratio": 0.25}, torch.float32),
                                                     (10, {"ratio": 0.25}, torch.bool)])
def test_dropout_training_attribute_ratio(opset, attrs, mask_dtype):
    x = rand(50, 40, low=0.5, high=1.5, seed=21)
    ir, plan, seeds, autodiff = _train_graph("Dropout", [x], attrs, opset=opset,
                                             num_outputs=2, weights=[0])
    y, mask = _dropout_run(plan, 1, 3)
    assert mask.dtype == mask_dtype
    keep = mask.bool()
    assert abs(keep.float().mean().item() - 0.75) < 0.03
    assert_close(y.numpy(), (torch.from_numpy(x) * keep / 0.75).numpy(), **TOL)
    grad = plan.get_value(autodiff.variable_grads["in0"]).numpy()
    assert_close(grad, (torch.from_numpy(seeds["out0"]) * keep / 0.75).numpy(), **TOL)


def test_two_dropouts_draw_different_masks():
    """The per-op seed modifier separates ops reading the same seed in one micro-batch."""
    from onnx import helper

    x = rand(64, 64, seed=22)
    nodes = [helper.make_node("Dropout", ["x"], ["a"], ratio=0.5),
             helper.make_node("Dropout", ["x"], ["b"], ratio=0.5)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [64, 64])],
                              [helper.make_empty_tensor_value_info(n) for n in ("a", "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 7
    ir = import_model(model, constant_weights=False)
    TrainingSemantics().run(ir)
    plan = ExecutionPlan(ir.main, keep=["a", "b"])
    plan.set_value("x", torch.from_numpy(x))
    _set_seed(plan, 3, 0)
    plan.execute()
    assert not torch.equal(plan.get_value("a") != 0, plan.get_value("b") != 0)


# --- LayerNormalization and the pass as a whole ------------------------------------------------


def test_layernorm_gets_statistics_outputs():
    x, scale, b = rand(3, 4, 8, seed=30), rand(8, seed=31), rand(8, seed=32)
    ir, plan, seeds, autodiff = _train_graph("LayerNormalization", [x, scale, b], {}, opset=17,
                                             weights=[0, 1, 2])
    (ln,) = list(ir.main.ops_of_type("LayerNormalization"))
    assert all(t is not None for t in ln.outputs) and len(ln.outputs) == 3
    (grad_op,) = list(ir.main.ops_of_type("LayerNormalizationGrad"))
    assert grad_op.inputs[4] is ln.outputs[1] and grad_op.inputs[5] is ln.outputs[2]
    plan.execute()
    leaves = [torch.from_numpy(a.astype(np.float64)).requires_grad_(True) for a in (x, scale, b)]
    y = F.layer_norm(leaves[0], (8,), leaves[1], leaves[2])
    (y * torch.from_numpy(seeds["out0"]).double()).sum().backward()
    for i in (0, 1, 2):
        ours = plan.get_value(autodiff.variable_grads[f"in{i}"]).numpy()
        assert_close(ours, leaves[i].grad.numpy().astype(np.float32), f"d input {i}", **TOL)


def test_pass_without_session_dependent_ops_changes_nothing():
    model, _ = one_op_model("Relu", [rand(2, 3)])
    ir = import_model(model, constant_weights=False)
    assert TrainingSemantics().run(ir) is False
    assert RANDOM_SEED_ID not in ir.main.tensors
