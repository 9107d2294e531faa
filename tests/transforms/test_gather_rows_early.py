"""GatherRowsEarly (transforms/gather_rows_early.py): a Gather of constant rows moves above the
row-wise ops that made its data (a BERT pooler's ``x[:, 0]`` after the last layer's
feed-forward block). Numbers against torch, equal with the pass off, training against eager,
and the cases it must leave alone (rows also read elsewhere, a layer norm over the gathered
axis, a broadcast along it)."""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import poptorch_lite as poptorch
from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.importer.onnx_model import import_model
from popart_backend.transforms.fuse_gelu import FuseGelu
from popart_backend.transforms.fuse_layer_norm import FuseLayerNorm
from popart_backend.transforms.fuse_matmul_add import FuseMatMulAdd
from popart_backend.transforms.gather_rows_early import GatherRowsEarly
from onnx import TensorProto, helper, numpy_helper
from tests.poptorch.training_helpers import compare_training

B, S, D, H = 2, 5, 4, 8


def _onnx(index, ln_axis=-1, bias_shape=(D,), also_out=False):
    """y = Gather(LN(Gelu(x @ W1 + b1) @ W2 + b2 + x + c), index, axis=1)."""
    rng = np.random.default_rng(0)
    arrays = {"W1": rng.standard_normal((D, H)), "b1": rng.standard_normal(H),
              "W2": rng.standard_normal((H, D)), "b2": rng.standard_normal(D), "c": rng.standard_normal(bias_shape),
              "g": rng.standard_normal(D if ln_axis == -1 else (S, D)),
              "bt": rng.standard_normal(D if ln_axis == -1 else (S, D)),
              "idx": np.array(index, np.int64)}
    arrays = {k: v.astype(np.float32) if k != "idx" else v for k, v in arrays.items()}
    n = helper.make_node
    nodes = [n("MatMul", ["x", "W1"], ["m1"]), n("Add", ["m1", "b1"], ["h1"]),
             n("Gelu", ["h1"], ["a"], domain=""),
             n("MatMul", ["a", "W2"], ["m2"]), n("Add", ["m2", "b2"], ["h2"]),
             n("Add", ["h2", "x"], ["r"]),
             n("Add", ["r", "c"], ["rc"]),
             n("LayerNormalization", ["rc", "g", "bt"], ["ln"], axis=ln_axis),
             n("Gather", ["ln", "idx"], ["y"], axis=1)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if also_out:
        outputs.append(helper.make_tensor_value_info("ln", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, D])],
        outputs, initializer=[numpy_helper.from_array(v, k) for k, v in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model, {k: torch.from_numpy(v) for k, v in arrays.items()}


def _reference(x, w, ln_axis=-1):
    h = F.gelu(x @ w["W1"] + w["b1"]) @ w["W2"] + w["b2"] + x + w["c"]
    shape = (D,) if ln_axis == -1 else (S, D)
    ln = F.layer_norm(h, shape, w["g"], w["bt"])
    idx = w["idx"]
    return ln[:, idx % S] if idx.ndim else ln[:, int(idx) % S]


def _run(index, on=True, **kwargs):
    model, weights = _onnx(index, **kwargs)
    ir = import_model(model)
    for p in (FuseMatMulAdd(), FuseGelu(), FuseLayerNorm()):
        p.run(ir)
    fired = GatherRowsEarly().run(ir) if on else False
    x = np.random.default_rng(1).standard_normal((B, S, D)).astype(np.float32)
    plan = ExecutionPlan(ir.main, keep=["y"])
    plan.set_value("x", to_torch(x))
    plan.execute()
    row_shapes = Counter((type(op).__name__, op.outputs[0].info.shape)
                         for op in ir.main.ops.values())
    want = _reference(torch.from_numpy(x), weights, kwargs.get("ln_axis", -1))
    return plan.get_value("y").numpy(), want.numpy(), fired, row_shapes


def test_scalar_row_moves_to_the_top_and_matches_torch():
    ours, want, fired, shapes = _run(0)
    assert fired
    # Every op of the block runs on the B gathered rows; the one Gather reads the input.
    assert shapes[("LinearBias", (B, H))] == 1 and shapes[("LinearBias", (B, D))] == 1
    assert shapes[("LayerNormalization", (B, D))] == 1
    assert shapes[("Gather", (B, D))] == 1 and sum(
        n for (kind, _), n in shapes.items() if kind == "Gather") == 1
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)
    off, _, off_fired, _ = _run(0, on=False)
    assert not off_fired
    np.testing.assert_allclose(ours, off, rtol=1e-6, atol=1e-6)


def test_several_and_negative_rows_match_torch():
    ours, want, fired, shapes = _run([[-1, 2], [0, 0]])
    assert fired and shapes[("LinearBias", (B, 2, 2, H))] == 1
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)


def test_layer_norm_over_the_gathered_axis_stops_the_move():
    ours, want, fired, shapes = _run(1, ln_axis=1)
    # It still moves nothing above the layer norm, which mixes the rows.
    assert not fired and shapes[("LinearBias", (B, S, H))] == 1
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)


def test_broadcast_along_the_gathered_axis_stops_the_move():
    ours, want, fired, shapes = _run(3, bias_shape=(1, 1, D))
    # rc = r + c with c [1, 1, D]: the gather moves above the layer norm only.
    assert fired and shapes[("LinearBias", (B, S, H))] == 1
    assert shapes[("LayerNormalization", (B, D))] == 1
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)


def test_rows_read_elsewhere_stay_whole():
    model, weights = _onnx(0, also_out=True)
    ir = import_model(model)
    for p in (FuseMatMulAdd(), FuseGelu(), FuseLayerNorm()):
        p.run(ir)
    assert not GatherRowsEarly().run(ir)


class _Pooled(nn.Module):
    """A post-norm transformer feed-forward block pooled at token 0, with a loss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(D, H), nn.Linear(H, D)
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, 3)

    def forward(self, x, labels):
        x = self.ln(x + self.fc2(F.gelu(self.fc1(x))))
        logits = self.head(x[:, 0])
        return logits, F.cross_entropy(logits, labels)


def test_training_with_rows_moved_matches_eager():
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(B, S, D, generator=g), torch.randint(0, 3, (B,), generator=g))
               for _ in range(2)]
    wrapper, _, _ = compare_training(
        _Pooled(), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), batches,
        rtol=1e-4, atol=1e-5)
    ir = next(iter(wrapper._executables.values())).session._ir
    kinds = Counter((type(op).__name__, op.outputs[0].info.shape)
                    for op in ir.main.ops.values() if op.outputs and op.outputs[0] is not None)
    assert kinds[("LinearBias", (B, H))] == 1 and kinds[("LinearBias", (B, D))] == 1
    # The moved layer norm keeps its saved statistics for the backward (no second pass).
    norms = [op for op in ir.main.ops.values() if type(op).__name__ == "LayerNormalization"]
    assert len(norms) == 1 and norms[0].outputs[0].info.shape == (B, D)
    assert all(t is not None and t.consumers for t in norms[0].outputs[1:3])


def test_inference_with_rows_moved_matches_torch():
    net = _Pooled().eval()
    x, labels = torch.randn(B, S, D), torch.tensor([0, 2])
    model = poptorch.inferenceModel(copy.deepcopy(net))
    ours = model(x, labels)
    with torch.no_grad():
        want = net(x, labels)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
