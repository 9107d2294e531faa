"""The memory remedies lower what the memory model reports and leave results alone (device-model
issue acceptance; spec §5.2, §10, F70, F105, F109): optimizer state off chip, replicated tensor
sharding and recomputation, each compared with the plain run of the same deep MLP trained with
Adam. Recomputation is also checked through ``recompute_late_order``, the order the liveness
walk uses.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.device import memory
from popart_backend.device.memory import compute_memory, recompute_late_order
from popart_backend.ir.op import RecomputeType
from popart_backend.options.enums import ReplicatedTensorSharding

LAYERS, D, MB = 8, 32, 8
R = popart.RecomputationType


def _mlp(ipus: int = 1, manual: tuple[int, ...] = ()):
    """``LAYERS`` x tanh(h @ w_k), then an L1 loss. With ``ipus`` > 1, layer k on IPU and
    pipeline stage k * ipus // LAYERS; ``manual`` layers' outputs are marked Recompute."""
    b = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    h = b.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    rng = np.random.default_rng(0)
    ids = []
    for k in range(LAYERS):
        w = b.addInitializedInputTensor(
            (rng.standard_normal((D, D)) * 0.4).astype(np.float32), f"w{k}")
        ids.append(w)
        ipu = k * ipus // LAYERS
        if ipus > 1:
            with b.virtualGraph(ipu), b.pipelineStage(ipu):
                h = b.aiOnnx.tanh([b.aiOnnx.matmul([h, w])])
        else:
            h = b.aiOnnx.tanh([b.aiOnnx.matmul([h, w])])
        if k in manual:
            b.recomputeOutputInBackwardPass(h)
    if ipus > 1:
        with b.virtualGraph(ipus - 1), b.pipelineStage(ipus - 1):
            loss = b.aiGraphcore.l1loss([h], 0.5)
    else:
        loss = b.aiGraphcore.l1loss([h], 0.5)
    return b.getModelProto(), loss, ids


def _options(rf: int = 1, ipus: int = 1, af: int = 1,
             recompute: R = R.NoRecompute) -> popart.SessionOptions:
    opts = popart.SessionOptions()
    opts.autoRecomputation = recompute
    if ipus > 1:
        opts.virtualGraphMode = popart.VirtualGraphMode.Manual
        opts.enablePipelining = True
    if af > 1:
        opts.enableGradientAccumulation = True
        opts.accumulationFactor = af
    if rf > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = rf
    return opts


def _train(opts: popart.SessionOptions, rf: int = 1, ipus: int = 1, af: int = 1,
           manual: tuple[int, ...] = ()):
    """One run of two batches per step; returns (weights by id, losses, session)."""
    proto, loss, ids = _mlp(ipus, manual)
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": rf * ipus,
                                                          "tilesPerIPU": 8})
    optimizer = popart.Adam({"defaultLearningRate": (0.01, False)})
    s = popart.TrainingSession(proto, popart.DataFlow(2, {loss: popart.AnchorReturnType("All")}),
                               loss, optimizer, device, userOptions=opts)
    s.prepareDevice()
    s.weightsFromHost()
    shape = (2, *((af,) if af > 1 else ()), *((rf,) if rf > 1 else ()), MB, D)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    anchors = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": x}, anchors))
    s.weightsToHost()
    weights = {i: np.zeros((D, D), np.float32) for i in ids}
    s.readWeights(popart.PyWeightsIO(weights))
    return weights, anchors[loss], s


def _memory(s):
    return s._device_model.memory


def _total(s, *categories: str) -> int:
    """Bytes over the IPUs of one replica: the given categories, or everything."""
    return sum(sum(m.categories[c] for c in categories) if categories else m.total_bytes
               for m in _memory(s).ipus)


def _assert_same(got, want, rtol: float = 0.0) -> None:
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=1e-7 if rtol else 0,
                                   err_msg=key)


def test_F105_optimizer_state_off_chip_lowers_memory_and_keeps_results():
    want, want_loss, plain = _train(_options())
    opts = _options()
    opts.optimizerStateTensorLocationSettings = popart.TensorLocationSettings(
        popart.TensorStorage.OffChip)
    got, got_loss, off = _train(opts)
    _assert_same(got, want)
    np.testing.assert_array_equal(got_loss, want_loss)
    weights = LAYERS * D * D * 4
    assert _total(plain, "optimizer state") == 2 * weights  # Adam: two moments per weight
    assert _total(off, "optimizer state") == 0
    assert _memory(off).ipu(0).streaming_bytes == 2 * weights
    assert _total(off) < _total(plain)


def test_F109_replicated_tensor_sharding_lowers_memory_and_keeps_results():
    want, want_loss, plain = _train(_options(rf=2), rf=2)
    opts = _options(rf=2)
    for kind in ("weight", "optimizerState", "accumulator"):
        settings = getattr(opts, f"{kind}TensorLocationSettings")
        settings.minElementsForReplicatedTensorSharding = 4
        settings.location.replicatedTensorSharding = ReplicatedTensorSharding.On
    got, got_loss, rts = _train(opts, rf=2)
    _assert_same(got, want, rtol=1e-5)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    # Weights stay whole; each replica keeps half of their Adam state.
    assert _total(rts, "weights") == _total(plain, "weights")
    assert _total(rts, "optimizer state") == _total(plain, "optimizer state") // 2
    # The data: at this size the vertex state of the collectives RTS adds (code, on the
    # tiles of the tensors they work on) outweighs the few KiB of Adam state it saves.
    assert _total(rts) - _total(rts, "code") < _total(plain) - _total(plain, "code")


@pytest.mark.parametrize("recompute, ipus, manual", [
    (R.Standard, 1, ()),
    (R.NoRecompute, 1, tuple(range(0, LAYERS, 2))),  # manual Recompute annotations
    (R.Pipeline, 4, ()),
    (R.RecomputeAll, 4, ()),
], ids=["standard", "manual", "pipeline", "recompute-all"])
def test_F70_recomputation_lowers_activation_memory_and_keeps_results(recompute, ipus, manual):
    """Activation memory = activations live at the peak plus pipeline stashes. Unpipelined,
    recomputed activations are not live across the forward -> backward gap; pipelined, only
    stage inputs are stashed."""
    af = 8 if ipus > 1 else 1
    want, want_loss, plain = _train(_options(ipus=ipus, af=af), ipus=ipus, af=af)
    got, got_loss, rec = _train(_options(ipus=ipus, af=af, recompute=recompute), ipus=ipus,
                                af=af, manual=manual)
    _assert_same(got, want)
    np.testing.assert_array_equal(got_loss, want_loss)
    ops = rec.getIr().main.ops.values()
    assert any(op.settings.recompute is RecomputeType.Recomputed for op in ops)
    before = _total(plain, "activations", "pipeline stashes")
    after = _total(rec, "activations", "pipeline stashes")
    assert after < 0.8 * before
    assert _total(rec) < _total(plain)


def _earliest(order):
    """``order`` with every recompute clone moved to just after the last producer of its
    inputs: what an eager scheduler would do."""
    out = [op for op in order if op.settings.recompute is not RecomputeType.Recomputed]
    for op in [op for op in order if op.settings.recompute is RecomputeType.Recomputed]:
        producers = {t.producer.id for t in op.inputs if t is not None and t.producer}
        at = max((i for i, o in enumerate(out) if o.id in producers), default=-1)
        out.insert(at + 1, op)
    return out


def _check_topological(order) -> None:
    seen = set()
    for op in order:
        for t in op.inputs:
            if t is not None and t.producer is not None:
                assert t.producer.id in seen, f"{op.debug_name} before {t.producer.debug_name}"
        seen.add(op.id)


def test_liveness_places_recompute_clones_just_before_their_readers(monkeypatch):
    _, _, s = _train(_options(recompute=R.Standard))
    ir = s.getIr()
    planned = list(s._device.plan.order)
    early = _earliest(planned)
    _check_topological(early)
    late = recompute_late_order(early)
    _check_topological(late)
    assert sorted(op.id for op in late) == sorted(op.id for op in planned)
    # Non-clones keep their order; each clone sits right before a reader or another clone.
    plain = [op.id for op in early if op.settings.recompute is not RecomputeType.Recomputed]
    assert [op.id for op in late if op.settings.recompute is not RecomputeType.Recomputed] == plain
    for op, nxt in itertools.pairwise(late):
        if op.settings.recompute is RecomputeType.Recomputed:
            readers = {r.id for t in op.outputs if t is not None for r in t.consumers}
            assert nxt.id in readers or nxt.settings.recompute is RecomputeType.Recomputed
    # The memory model reports the same activation peak whatever the clones' schedule slots.
    spec = s._device_model.spec
    got = compute_memory(ir.main, early, spec, keep=ir.anchors).ipu(0).categories
    want = compute_memory(ir.main, planned, spec, keep=ir.anchors).ipu(0).categories
    assert got["activations"] == want["activations"]
    assert got["activations"] < _total(_train(_options())[2], "activations")
    # Walked in the eager order itself, the clones' outputs would span the gap again.
    monkeypatch.setattr(memory, "recompute_late_order", list)
    eager = compute_memory(ir.main, early, spec, keep=ir.anchors).ipu(0).categories
    assert eager["activations"] > got["activations"]
