"""FuseTiedGatherGrad (transforms/fuse_tied_gather_grad.py): a tied embedding's gradient - the
LM head product's weight gradient plus the Gather's rows - is one GatherGradAdd adding the rows
into the product's gradient. Gradients against torch.autograd, equal (up to float addition
order) with the pass off, and the pass leaves a product gradient someone else reads alone."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.importer.onnx_model import import_model
from popart_backend.transforms.autodiff import Autodiff
from popart_backend.transforms.fuse_matmul_add import FuseMatMulAdd
from popart_backend.transforms.fuse_tied_gather_grad import FuseTiedGatherGrad

V, D, B, S = 11, 4, 2, 5


def _model(emb: np.ndarray):
    """logits = Gather(E, ids) @ E^T (tied), loss = sum(logits * r)."""
    n = helper.make_node
    r = np.random.default_rng(3).standard_normal((B, S, V)).astype(np.float32)
    nodes = [n("Gather", ["E", "ids"], ["x"], axis=0),
             n("Transpose", ["E"], ["Et"], perm=[1, 0]),
             n("MatMul", ["x", "Et"], ["logits"]),
             n("Mul", ["logits", "r"], ["lr"]),
             n("ReduceSum", ["lr"], ["loss"], keepdims=0)]
    inits = [numpy_helper.from_array(emb, "E"), numpy_helper.from_array(r, "r")]
    graph = helper.make_graph(
        nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [B, S])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, r


def _grad(fuse: bool, anchor_product: bool = False):
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((V, D)).astype(np.float32)
    ids = np.array([[1, 3, 3, 0, 10], [-1, 3, 5, 5, 2]], np.int64)  # repeats and a negative
    model, r = _model(emb)
    ir = import_model(model, constant_weights=False)
    FuseMatMulAdd(training=True).run(ir)
    autodiff = Autodiff("loss", 1.0)
    autodiff.run(ir)
    grad_id = autodiff.variable_grads["E"]
    keep = [grad_id]
    if anchor_product:
        product = next(op for op in ir.main.ops.values()
                       if op.op_type == "LinearBiasWeightGrad").outputs[0].id
        ir.anchors = {product: None}
        keep.append(product)
    fired = FuseTiedGatherGrad().run(ir) if fuse else False
    plan = ExecutionPlan(ir.main, keep=keep)
    plan.set_value("ids", to_torch(ids))
    plan.execute()
    ops = Counter(op.op_type for op in ir.main.ops.values())

    e = torch.tensor(emb, requires_grad=True)
    x = e[torch.from_numpy(ids) % V]
    ((x @ e.T) * torch.from_numpy(r)).sum().backward()
    return plan.get_value(grad_id).numpy(), e.grad.numpy(), fired, ops


def test_tied_embedding_gradient_fuses_and_matches_torch():
    ours, ref, fired, ops = _grad(fuse=True)
    assert fired and ops["GatherGradAdd"] == 1 and ops["GatherGrad"] == 0
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
    unfused, _, _, unfused_ops = _grad(fuse=False)
    assert unfused_ops["GatherGrad"] == 1 and unfused_ops["GatherGradAdd"] == 0
    np.testing.assert_allclose(ours, unfused, rtol=1e-6, atol=1e-6)


def test_observed_product_gradient_is_not_written_in_place():
    ours, ref, fired, ops = _grad(fuse=True, anchor_product=True)
    assert not fired and ops["GatherGradAdd"] == 0
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_gather_grad_add_checks_the_accumulator_shape():
    from popart_backend.errors import ShapeError
    from popart_backend.ir.op import OpSettings
    from popart_backend.ir.tensor import TensorInfo
    from popart_backend.dtypes import DataType
    from popart_backend.ops.registry import create_op

    op = create_op("GatherGradAdd", {"axis": 0, "shape": (V, D)}, OpSettings(),
                   domain="ai.graphcore")
    dy = TensorInfo(DataType.FLOAT, (B, S, D))
    ids = TensorInfo(DataType.INT64, (B, S))
    with pytest.raises(ShapeError, match="accumulated gradient"):
        op.infer(dy, ids, TensorInfo(DataType.FLOAT, (V + 1, D)))
