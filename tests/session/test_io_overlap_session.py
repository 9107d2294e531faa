"""Overlapped host IO through the sessions (spec §9, F100-F104): InputSettings and
AnchorReturnType tile sets and exchange strategies compile and run, give results bit-identical to
JustInTime, shorten the simulated step (getCycleCount) and put the stream buffers on the IO tiles;
the option checks fire at session construction."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest

import popart_backend as popart

ES, TS = popart.ExchangeStrategy, popart.TileSet
ROWS, K = 16, 512
TILES, IO_TILES = 16, 2


def _options(num_io_tiles=IO_TILES, **values) -> popart.SessionOptions:
    opts = popart.SessionOptions()
    opts.numIOTiles = num_io_tiles
    opts.virtualGraphMode = popart.VirtualGraphMode.Auto
    opts.useHostCopyOps = True
    opts.enableExplicitMainLoops = True
    opts.instrumentWithHardwareCycleCounter = True
    opts.engineOptions = {"autoReport.all": "true"}
    for key, value in values.items():
        setattr(opts, key, value)
    return opts


def _device(tiles=TILES):
    return popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": tiles})


def _inference_model(settings: popart.InputSettings):
    """y = Relu(x @ w), x f32[16, 512] streamed with ``settings``."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [ROWS, K]), settings, "x")
    w = b.addInitializedInputTensor(
        np.random.default_rng(0).standard_normal((K, K)).astype(np.float32) / 16, "w")
    y = b.aiOnnx.relu([b.aiOnnx.matmul([x, w])])
    b.addOutputTensor(y)
    return b.getModelProto(), y


def _infer(strategy, tile_set=TS.IO, bps=8, options=None):
    proto, y = _inference_model(popart.InputSettings(tile_set, strategy))
    flow = popart.DataFlow(bps, {y: popart.AnchorReturnType("All", tile_set, strategy)})
    session = popart.InferenceSession(proto, flow, _device(),
                                      userOptions=options or _options())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    x = np.random.default_rng(1).standard_normal((bps, ROWS, K)).astype(np.float32)
    session.run(popart.PyStepIO({"x": x}, anchors))
    return session, anchors[y]


def test_F102_F103_overlap_gives_identical_results_and_a_shorter_step():
    jit, y_jit = _infer(ES.JustInTime)
    inner, y_inner = _infer(ES.OverlapInnerLoop)
    loops, y_loops = _infer(ES.OverlapLoops)
    np.testing.assert_array_equal(y_jit, y_inner)
    np.testing.assert_array_equal(y_jit, y_loops)
    assert inner.getCycleCount() < jit.getCycleCount()
    # Inference has no accumulation loop: both strategies overlap 8 - 2 of 8 transfers.
    assert loops.getCycleCount() == inner.getCycleCount()
    overlap = inner._device_model.cycles.overlap
    assert (overlap.inner_iterations, overlap.outer_iterations) == (8, 1)
    assert overlap.hidden_transfers == 2 * 6  # x and y


def test_F100_io_tiles_hold_the_prefetch_buffers():
    jit, _ = _infer(ES.JustInTime)
    loops, _ = _infer(ES.OverlapLoops)
    stream = ROWS * K * 4
    jit_mem, loops_mem = jit._device_model.memory.ipu(0), loops._device_model.memory.ipu(0)
    assert jit_mem.categories["IO tile buffers"] == 2 * stream  # one buffer each for x and y
    assert loops_mem.categories["IO tile buffers"] == 2 * 3 * stream
    assert (loops_mem.num_compute_tiles, loops_mem.num_io_tiles) == (TILES - IO_TILES, IO_TILES)
    assert "tiles: 14 compute, 2 IO" in loops.getSummaryReport()


def test_F104_strategy_on_compute_tiles_runs_without_speed_up(caplog):
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        compute, y = _infer(ES.OverlapInnerLoop, tile_set=TS.Compute, options=_options(0))
    assert "no speed-up" in caplog.text
    plain, y_plain = _infer(ES.JustInTime, tile_set=TS.Compute, options=_options(0))
    np.testing.assert_array_equal(y, y_plain)
    assert compute.getCycleCount() == plain.getCycleCount()


# -- training: OverlapLoops prefetches across the accumulation and batch loops -----------------


def _training_model():
    b = popart.Builder()
    settings = popart.InputSettings(TS.IO, ES.JustInTime)
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [ROWS, 64]), settings, "x")
    rng = np.random.default_rng(2)
    w1 = b.addInitializedInputTensor(rng.standard_normal((64, 64)).astype(np.float32) / 16,
                                     "w1")
    w2 = b.addInitializedInputTensor(rng.standard_normal((64, 8)).astype(np.float32) / 16, "w2")
    y = b.aiOnnx.matmul([b.aiOnnx.relu([b.aiOnnx.matmul([x, w1])]), w2])
    loss = b.aiGraphcore.l1loss([y], 0.5)
    return b, loss, (w1, w2)


def _train(strategy, bps=3, af=4):
    b, loss, weights = _training_model()
    proto = b.getModelProto()
    if strategy is not None:  # rewrite the stream's settings in the model metadata
        model = onnx.load_from_string(proto)
        for prop in model.metadata_props:
            if prop.key == "__input_settings:x":
                prop.value = f"IO,{strategy.name}"
        proto = model.SerializeToString()
    opts = _options(enableGradientAccumulation=True, accumulationFactor=af)
    session = popart.TrainingSession(
        proto, popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")}), loss,
        popart.SGD({"defaultLearningRate": (0.05, False)}), _device(), userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    x = np.random.default_rng(4).standard_normal((bps, af, ROWS, 64)).astype(np.float32)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    session.weightsToHost()
    out = {w: np.zeros(session.getInfo(w).shape(), np.float32) for w in weights}
    session.readWeights(popart.PyWeightsIO(out))
    return session, anchors[loss], out


def test_F104_overlap_loops_hides_more_than_overlap_inner_loop_in_training():
    jit, loss_jit, w_jit = _train(ES.JustInTime)
    inner, loss_inner, w_inner = _train(ES.OverlapInnerLoop)
    loops, loss_loops, w_loops = _train(ES.OverlapLoops)
    for loss, weights in ((loss_inner, w_inner), (loss_loops, w_loops)):
        np.testing.assert_array_equal(loss, loss_jit)
        for name in w_jit:
            np.testing.assert_array_equal(weights[name], w_jit[name])
    # M = 3 weight updates of N = 4 micro-batches: M (N - 2) = 6 and M N - 2 = 10 hidden.
    assert inner._device_model.cycles.overlap.hidden_transfers == 6
    assert loops._device_model.cycles.overlap.hidden_transfers == 10
    assert loops.getCycleCount() < inner.getCycleCount() < jit.getCycleCount()


# -- construction checks -----------------------------------------------------------------------


def test_F104_overlap_step_is_rejected_by_the_session():
    proto, y = _inference_model(popart.InputSettings(TS.IO, ES.OverlapStep))
    with pytest.raises(popart.popart_exception,
                       match=r"^ExchangeStrategy::OverlapStep is not yet supported\. Input 'x'"):
        popart.InferenceSession(proto, popart.DataFlow(1, [y]), _device(),
                                userOptions=_options())


def test_F101_session_checks_the_loop_flags():
    proto, y = _inference_model(popart.InputSettings())
    opts = _options(0, useHostCopyOps=False)
    with pytest.raises(popart.popart_exception,
                       match="^enableExplicitMainLoops requires useHostCopyOps"):
        popart.InferenceSession(proto, popart.DataFlow(1, [y]), _device(), userOptions=opts)
    proto, y = _inference_model(popart.InputSettings(TS.IO, ES.OverlapInnerLoop))
    opts = _options(enableExplicitMainLoops=False)
    with pytest.raises(popart.popart_exception,
                       match="Input 'x' uses ExchangeStrategy.OverlapInnerLoop, which needs "
                             "enableExplicitMainLoops = True"):
        popart.InferenceSession(proto, popart.DataFlow(1, [y]), _device(), userOptions=opts)


def test_F100_session_checks_num_io_tiles_against_the_device():
    proto, y = _inference_model(popart.InputSettings())
    with pytest.raises(popart.popart_exception, match="numIOTiles = 4 leaves no compute tiles"):
        popart.InferenceSession(proto, popart.DataFlow(1, [y]), _device(4),
                                userOptions=_options(4))
    with pytest.raises(popart.popart_exception, match="numIOTiles = 2 needs virtual graphs"):
        popart.InferenceSession(proto, popart.DataFlow(1, [y]), _device(),
                                userOptions=_options(virtualGraphMode=popart.VirtualGraphMode.Off))
