"""Per-layer recomputation checkpoints with ``RecomputationType.Pipeline`` (F70): only the stage
inputs and the checkpoints are stashed, the backward pass recomputes the forward segment by
segment between checkpoints, so only one segment's recomputed activations are live at a time.
Numbers equal eager torch; memory with per-layer checkpoints is below memory without."""

from __future__ import annotations

import copy
import re

import numpy as np
import torch

import popart_backend as popart
import poptorch_lite as poptorch
from popart_backend.ir.op import RecomputeType
from poptorch_lite.testing import assert_allclose

D, LAYERS, ROWS, AF = 8, 4, 8, 4
R = popart.RecomputationType


# --- a Builder model: 4 layers over 2 pipelined IPUs ------------------------------------------


def _builder_session(checkpoints: bool, recompute=R.Pipeline, seed: int = 0):
    """Layers 0-2 on IPU 0 (stage 0), layer 3 and the loss on IPU 1; each layer is
    tanh(relu(h @ A) @ B) + h; with ``checkpoints`` each layer output of stage 0 is a
    ``checkpointOutput``."""
    rng = np.random.default_rng(seed)
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    h = builder.addInputTensor(popart.TensorInfo("FLOAT", [ROWS, D]), "x")
    weights = {}
    for k in range(LAYERS):
        stage = 0 if k < LAYERS - 1 else 1
        a = rng.standard_normal((D, 4 * D)).astype(np.float32) * 0.3
        b = rng.standard_normal((4 * D, D)).astype(np.float32) * 0.3
        with builder.virtualGraph(stage), builder.pipelineStage(stage):
            a_id = builder.addInitializedInputTensor(a, f"A{k}")
            b_id = builder.addInitializedInputTensor(b, f"B{k}")
            weights[a_id], weights[b_id] = a, b
            inner = builder.aiOnnx.relu([builder.aiOnnx.matmul([h, a_id])])
            h = builder.aiOnnx.add([builder.aiOnnx.tanh([builder.aiOnnx.matmul([inner, b_id])]),
                                    h])
            if checkpoints and stage == 0:
                (h,) = builder.checkpointOutput([h])
    with builder.virtualGraph(1), builder.pipelineStage(1):
        loss = builder.aiGraphcore.l1loss([h], 0.5, reduction=popart.ReductionType.Mean)
    opts = popart.SessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    opts.enablePipelining = True
    opts.enableGradientAccumulation, opts.accumulationFactor = True, AF
    opts.autoRecomputation = recompute
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": 2})
    session = popart.TrainingSession(builder.getModelProto(), popart.DataFlow(1, [loss]), loss,
                                     popart.ConstSGD(0.1), device, userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    return session, weights


def _activations(session, ipu: int = 0) -> int:
    return session._device_model.memory.ipu(ipu).categories["activations"]


def test_F70_per_layer_checkpoints_lower_the_recomputed_activations():
    with_ckpt, _ = _builder_session(True)
    without, _ = _builder_session(False)
    # Both recompute stage 0; only the checkpoints (and the stage input) are stashed.
    for s in (with_ckpt, without):
        assert any(op.settings.recompute is RecomputeType.Recomputed
                   for op in s.getIr().main.ops.values())
    stashed = {op.inputs[-1].producer.op_type if op.inputs[-1].producer else None
               for op in with_ckpt.getIr().main.ops_of_type("Stash")}
    assert stashed <= {None, "Identity"}, stashed  # x, and the checkpoints
    assert _activations(with_ckpt) < _activations(without)
    # Fewer values live at the peak: one segment's recomputed activations, not the stage's.
    peak = {s: s._device_model.memory.ipu(0).peak_live for s in (with_ckpt, without)}
    assert len(peak[with_ckpt]) < len(peak[without])


def test_F70_per_layer_checkpoints_keep_the_numbers():
    x = np.random.default_rng(5).standard_normal((AF, ROWS, D)).astype(np.float32)
    results = {}
    for name, ckpt, rec in (("plain", False, R.NoRecompute), ("ckpt", True, R.Pipeline)):
        session, weights = _builder_session(ckpt, rec)
        session.run(popart.PyStepIO({"x": x}, session.initAnchorArrays()))
        out = {k: np.zeros_like(v) for k, v in weights.items()}
        session.weightsToHost()
        session.readWeights(popart.PyWeightsIO(out))
        results[name] = out
    for key, want in results["plain"].items():
        np.testing.assert_allclose(results["ckpt"][key], want, rtol=1e-6, atol=1e-7, err_msg=key)


# --- PopTorch: recomputationCheckpoint per layer against eager torch -------------------------


class _Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(D, 4 * D)
        self.b = torch.nn.Linear(4 * D, D)

    def forward(self, x):
        return x + self.b(torch.nn.functional.gelu(self.a(x)))


class _Model(torch.nn.Module):
    def __init__(self, checkpoints: bool):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(_Layer() for _ in range(LAYERS))
        self.checkpoints = checkpoints

    def forward(self, x, target):
        for i, layer in enumerate(self.layers):
            with poptorch.Block(ipu_id=0 if i < LAYERS - 1 else 1):
                x = layer(x)
                if self.checkpoints and i < LAYERS - 1:
                    x = poptorch.recomputationCheckpoint(x)
        with poptorch.Block(ipu_id=1):
            loss = torch.nn.functional.mse_loss(x, target)
        return x, loss


def _segment_of(op) -> str:
    match = re.search(r"layers\.(\d)", op.settings.name or "")
    return match.group(1) if match else ""


def test_F70_poptorch_checkpoint_per_layer_trains_like_eager_torch_and_recomputes_per_segment():
    opts = poptorch.Options()
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    opts.Training.gradientAccumulation(AF)
    opts._Popart.set("autoRecomputation", popart.RecomputationType.Pipeline)
    model = _Model(checkpoints=True)
    reference = copy.deepcopy(model)
    wrapper = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    generator = torch.Generator().manual_seed(1)
    x, target = (torch.randn(AF * 2, D, generator=generator),
                 torch.randn(AF * 2, D, generator=generator))
    wrapper(x, target)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    ref_optimizer.zero_grad()
    reference(x, target)[1].backward()
    ref_optimizer.step()
    state = model.state_dict()
    for name, value in reference.state_dict().items():
        assert_allclose(actual=state[name], expected=value, rtol=1e-5, atol=1e-6, msg=name)

    # The executed schedule of the backward stage of IPU 0: layer k's clones run after every
    # gradient op of layer k + 1 and before layer k's gradient ops.
    session = wrapper._active.session
    backward = [op for op in session.getIr().main.topo_order()
                if op.settings.ipu == 0 and op.settings.pipeline_stage == 2 and _segment_of(op)]
    position = {op.id: i for i, op in enumerate(backward)}
    clones = {k: [position[op.id] for op in backward if _segment_of(op) == str(k)
                  and op.settings.recompute is RecomputeType.Recomputed] for k in range(3)}
    grads = {k: [position[op.id] for op in backward if _segment_of(op) == str(k)
                 and op.settings.recompute is not RecomputeType.Recomputed] for k in range(3)}
    for k in range(3):
        assert clones[k] and grads[k], k
        if k < 2:
            assert min(clones[k]) > max(grads[k + 1]), k
    stashed = {op.inputs[-1].id for op in session.getIr().main.ops_of_type("Stash")
               if op.settings.ipu == 0}
    assert len(stashed) == 3  # the stage input and two checkpoints (the third is copied)
