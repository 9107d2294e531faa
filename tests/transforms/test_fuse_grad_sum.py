"""FuseSliceGradSum (transforms/fuse_grad_sum.py): the Sum of the SliceGrads of a tensor split
along one axis becomes one Concat of the pieces' gradients. Gradients against torch.autograd,
equal with the pass off, and the pass fires only when the pieces tile the axis."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.importer.onnx_model import import_model
from popart_backend.transforms.autodiff import Autodiff
from popart_backend.transforms.fuse_grad_sum import FuseSliceGradSum

B, S, D = 2, 3, 6


def _model(bounds, w: np.ndarray):
    """y = x @ w, pieces Slice(y, bounds[i]) along the last axis, loss = sum_i piece_i * (i+1)^2
    (each piece scaled differently so a misplaced piece would show)."""
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([2], np.int64), "ax")]
    outs = []
    for i, (start, end) in enumerate(bounds):
        inits += [numpy_helper.from_array(np.array([start], np.int64), f"s{i}"),
                  numpy_helper.from_array(np.array([end], np.int64), f"e{i}"),
                  numpy_helper.from_array(np.array(float((i + 1) ** 2), np.float32), f"c{i}")]
        nodes += [n("Slice", ["y", f"s{i}", f"e{i}", "ax"], [f"p{i}"]),
                  n("Mul", [f"p{i}", f"p{i}"], [f"q{i}"]),
                  n("Mul", [f"q{i}", f"c{i}"], [f"r{i}"]),
                  n("ReduceSum", [f"r{i}"], [f"l{i}"], keepdims=0)]
        outs.append(f"l{i}")
    nodes.append(n("Sum", outs, ["loss"]))
    graph = helper.make_graph(
        nodes, "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, D])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _grad(bounds, fuse: bool):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((D, D)).astype(np.float32)
    x = rng.standard_normal((B, S, D)).astype(np.float32)
    ir = import_model(_model(bounds, w), constant_weights=False)
    autodiff = Autodiff("loss", 1.0)
    autodiff.run(ir)
    fired = FuseSliceGradSum().run(ir) if fuse else False
    grad_id = autodiff.variable_grads["w"]
    plan = ExecutionPlan(ir.main, keep=[grad_id])
    plan.set_value("x", to_torch(x))
    plan.execute()
    ops = Counter(op.op_type for op in ir.main.ops.values())

    wt, xt = torch.tensor(w, requires_grad=True), torch.from_numpy(x)
    y = xt @ wt
    loss = sum(((y[..., a:b] ** 2) * float((i + 1) ** 2)).sum() for i, (a, b) in enumerate(bounds))
    loss.backward()
    return plan.get_value(grad_id).numpy(), wt.grad.numpy(), fired, ops


@pytest.mark.parametrize("bounds", [[(0, 2), (2, 4), (4, 6)], [(4, 6), (0, 1), (1, 4)]])
def test_tiling_slices_fuse_to_concat_and_match_torch(bounds):
    ours, ref, fired, ops = _grad(bounds, fuse=True)
    assert fired and ops["Concat"] == 1 and ops["SliceGrad"] == 0
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
    unfused, _, _, unfused_ops = _grad(bounds, fuse=False)
    assert unfused_ops["SliceGrad"] == len(bounds) and unfused_ops["Concat"] == 0
    np.testing.assert_array_equal(ours, unfused)


@pytest.mark.parametrize("bounds", [
    [(0, 2), (2, 4)],          # the last two columns are never read: no cover
    [(0, 4), (2, 6)],          # overlapping pieces
])
def test_pieces_that_do_not_tile_are_left_alone(bounds):
    ours, ref, fired, ops = _grad(bounds, fuse=True)
    assert not fired and ops["Concat"] == 0 and ops["SliceGrad"] == len(bounds)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
