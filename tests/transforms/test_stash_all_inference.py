"""``SessionOptions.stashAllTensorsInferencePipeline``: in a pipelined inference session every
value leaving its producer's stage for another IPU is stashed on its producer's IPU as well.
Numbers stay those of the run without the option (and of a numpy reference); the memory model
counts the stash buffers; training and unpipelined inference log that it has no effect."""

from __future__ import annotations

import logging

import numpy as np

import popart_backend as popart
from popart_backend.transforms import pipelining as pipelining_pass
from tests.session.pipeline_models import (LAMBDA, MB, D, chain_weights, device, infer, options,
                                           training_session)

LAYERS, IPUS, BPS = 4, 2, 4


def _x() -> np.ndarray:
    return np.random.default_rng(5).standard_normal((BPS, MB, D)).astype(np.float32)


def _numpy_chain(weights, x):
    h = x
    for w in weights:
        h = np.tanh(h @ w)
    return h


def _stash_bytes(session) -> int:
    return sum(m.categories["pipeline stashes"] for m in session._device_model.memory.ipus)


def test_stash_all_keeps_numbers_and_adds_stash_memory():
    weights, x = chain_weights(LAYERS, seed=3), _x()
    off, s_off = infer(weights, x, IPUS, options(IPUS, True), bps=BPS)
    on, s_on = infer(weights, x, IPUS, options(IPUS, True, stashAllTensorsInferencePipeline=True),
                     bps=BPS)
    np.testing.assert_allclose(off, _numpy_chain(weights, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(on, off)
    graph_off, graph_on = s_off.getIr().main, s_on.getIr().main
    assert not list(graph_off.ops_of_type("Stash"))
    stashes = list(graph_on.ops_of_type("Stash"))
    # The one value crossing the stage boundary (layer 1's tanh, to IPU 1), a ring of
    # lastReaderStage - stage + 1 = 2 entries of [MB, D] float32 on IPU 0.
    assert [(op.settings.ipu, op.outputs[0].info.shape) for op in stashes] == [(0, (2, MB, D))]
    copies = list(graph_on.ops_of_type("IpuCopy"))
    assert all(op.inputs[0].id.startswith("Restored___") for op in copies)
    ring_bytes = 2 * MB * D * 4
    assert _stash_bytes(s_off) == 0
    assert _stash_bytes(s_on) >= ring_bytes
    total = [sum(m.total_bytes for m in s._device_model.memory.ipus)
             for s in (s_off, s_on)]
    assert total[1] > total[0]


def test_stash_all_without_pipelining_logs_no_effect(caplog, monkeypatch):
    monkeypatch.setattr(pipelining_pass, "_STASH_ALL_WARNED", [])  # logged once per process
    weights, x = chain_weights(2), _x()
    with caplog.at_level(logging.WARNING, logger="popart:transform"):
        got, _ = infer(weights, x, 1, options(stashAllTensorsInferencePipeline=True), bps=BPS,
                       place=False)
    np.testing.assert_allclose(got, _numpy_chain(weights, x), rtol=1e-5, atol=1e-6)
    assert any("stashAllTensorsInferencePipeline has no effect" in r.getMessage()
               for r in caplog.records)


def test_stash_all_in_training_logs_no_effect_and_changes_nothing(caplog):
    weights, x = chain_weights(IPUS), _x()
    runs = []
    for flag in (False, True):
        opts = options(IPUS, True, stashAllTensorsInferencePipeline=flag)
        with caplog.at_level(logging.WARNING, logger="popart:session"):
            session, loss, _ = training_session(weights, IPUS, opts, BPS)
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({"x": x}, anchors))
        runs.append((anchors[loss], len(list(session.getIr().main.ops_of_type("Stash")))))
    np.testing.assert_array_equal(runs[1][0], runs[0][0])
    assert runs[1][1] == runs[0][1]
    # The first micro-batch's loss against numpy (weights not yet updated).
    want = LAMBDA * np.abs(_numpy_chain(weights, x[0])).mean()
    np.testing.assert_allclose(runs[0][0][0], want, rtol=1e-5)
    logged = [r for r in caplog.records
              if "stashAllTensorsInferencePipeline" in r.getMessage()]
    assert len(logged) == 1 and "no effect" in logged[0].getMessage()


def test_stash_all_with_skip_connections_keeps_numbers():
    """h0 is read on its own IPU two stages later (stashed anyway) and on other IPUs: with the
    option the copies leave from the one stash, whose ring covers the last reader."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    w = [builder.addInitializedInputTensor(v, f"w{k}") for k, v in enumerate(chain_weights(3))]
    h0 = h = x
    for k, (ipu, stage) in enumerate([(0, 0), (1, 1), (0, 2)]):
        with builder.virtualGraph(ipu), builder.pipelineStage(stage):
            h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, w[k]])])
            h0 = h if k == 0 else h0
            h = builder.aiOnnx.add([h, h0]) if k == 2 else h
    with builder.virtualGraph(2), builder.pipelineStage(3):
        out = builder.aiOnnx.add([builder.aiOnnx.sigmoid([h]), h0])
    proto, x_data = builder.getModelProto(), _x()

    def run(opts, ipus):
        flow = popart.DataFlow(BPS, {out: popart.AnchorReturnType("All")})
        session = popart.InferenceSession(proto, flow, device(ipus), userOptions=opts)
        session.prepareDevice()
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({"x": x_data}, anchors))
        return anchors[out], session

    want, _ = run(popart.SessionOptions(), 1)
    got, session = run(options(4, True, stashAllTensorsInferencePipeline=True), 4)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    stashes = {op.inputs[2].id: op.outputs[0].info.shape[0]
               for op in session.getIr().main.ops_of_type("Stash")}
    assert stashes[h0] == 3  # stage 0 to its last reader, stage 2 (its own IPU)
