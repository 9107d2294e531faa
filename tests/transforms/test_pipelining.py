"""The pipelining passes (spec §5.1; F62–F67): validation messages, stages after autodiff,
stash/restore ring buffers and inter-IPU copies in the IR, the cycle table, and inference
pipelines equal to the plain run."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.device.simulator import SimulatedDevice
from popart_backend.ir.op import ExecutionContext
from popart_backend.ir.tensor import TensorKind, TensorRole
from tests.session.pipeline_models import (
    MB,
    D,
    chain_weights,
    device,
    infer,
    options,
    training_session,
)


def _x(bps: int, seed: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((bps, MB, D)).astype(np.float32)


def _graph(session):
    return session.getIr().main


# --- validation (F63) -------------------------------------------------------------------------


def _custom_model(placements, second_input_ipu=None):
    """x -> matmul w0 -> tanh -> matmul w1 -> tanh -> l1 loss; ``placements`` gives
    (ipu, stage) per op in that order (None: no annotation). ``second_input_ipu`` adds
    ``+ x`` at the end, read on that IPU (a stream read on two IPUs)."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    w = [builder.addInitializedInputTensor(v, f"w{k}") for k, v in enumerate(chain_weights(2))]
    makers = [lambda h: builder.aiOnnx.matmul([h, w[0]]), lambda h: builder.aiOnnx.tanh([h]),
              lambda h: builder.aiOnnx.matmul([h, w[1]]), lambda h: builder.aiOnnx.tanh([h])]
    h = x
    for make, (ipu, stage) in zip(makers, placements):
        h = make(h)
        if ipu is not None:
            builder.virtualGraph(h, ipu)
        if stage is not None:
            builder.pipelineStage(h, stage)
    if second_input_ipu is not None:
        h = builder.aiOnnx.add([h, x])
        builder.virtualGraph(h, second_input_ipu)
        builder.pipelineStage(h, placements[-1][1])
    loss = builder.aiGraphcore.l1loss([h], 0.5, reduction=popart.ReductionType.Mean)
    ipu, stage = placements[-1]
    builder.virtualGraph(loss, ipu)
    if stage is not None:
        builder.pipelineStage(loss, stage)
    return builder.getModelProto(), loss


def _session(proto, loss, ipus=2, opts=None, bps=4):
    opts = opts if opts is not None else options(ipus, True, af=4)
    flow = popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")})
    return popart.TrainingSession(proto, flow, loss, popart.ConstSGD(0.1), device(ipus),
                                  userOptions=opts)


GOOD = [(0, 0), (0, 0), (1, 1), (1, 1)]


@pytest.mark.parametrize("ipus, mode", [(2, popart.VirtualGraphMode.Off),
                                        (1, popart.VirtualGraphMode.Manual)])
def test_pipelining_needs_several_ipus_and_virtual_graphs_F63(ipus, mode):
    proto, loss = _custom_model(GOOD)
    opts = options(2, True, af=4, mode=mode)
    with pytest.raises(popart.popart_exception, match=(
            "Pipelining requires more than 1 IPU and the 'virtualGraphMode' session option to "
            "not be VirtualGraphMode::Off.")):
        _session(proto, loss, ipus, opts)


def test_all_or_no_ops_have_a_stage_F63():
    proto, loss = _custom_model([(0, 0), (0, None), (1, 1), (1, 1)])
    with pytest.raises(popart.popart_exception,
                       match="Only some ops have had their pipeline stage set"):
        _session(proto, loss)


def test_one_virtual_graph_per_stage_F63():
    proto, loss = _custom_model([(0, 0), (1, 0), (1, 1), (1, 1)])
    with pytest.raises(popart.popart_exception, match=(
            "have the same pipeline stage 0, but different virtual graph ids 0 and 1")):
        _session(proto, loss)


def test_stage_ids_are_contiguous_F63():
    proto, loss = _custom_model([(0, 0), (0, 0), (1, 2), (1, 2)])
    with pytest.raises(popart.popart_exception, match=r"without gaps; the ops use stages \[0, 2\]"):
        _session(proto, loss)


def test_a_stream_is_read_on_one_ipu_F63():
    proto, loss = _custom_model(GOOD, second_input_ipu=1)
    with pytest.raises(popart.popart_exception, match=(
            "the host stream tensor 'x' must be consumed on a single IPU")):
        _session(proto, loss)


def test_depth_must_cover_the_stages_F63():
    proto, loss = _custom_model(GOOD)
    with pytest.raises(popart.popart_exception, match=re_escape(
            "For pipelining, depth (gradient accumulation factor) must equal at least the "
            "number of pipeline stages (3)")):
        _session(proto, loss, opts=options(2, True, af=2))
    with pytest.raises(popart.popart_exception, match=re_escape(
            "For pipelining, depth (batchesPerStep) must equal at least the number of pipeline "
            "stages (3)")):
        _session(proto, loss, opts=options(2, True), bps=2)


def test_tensor_consumed_on_an_earlier_stage_F63_F64():
    # Stages come from the virtual graphs; the second matmul's input comes from IPU 1.
    proto, loss = _custom_model([(0, None), (1, None), (0, None), (1, None)])
    with pytest.raises(popart.popart_exception, match=(
            "is consumed in an earlier pipeline stage than it is produced")):
        _session(proto, loss)


def test_inference_depth_counts_forward_stages_only_F63():
    weights = chain_weights(3)
    with pytest.raises(popart.popart_exception, match=re_escape(
            "depth (batchesPerStep) must equal at least the number of pipeline stages (3)")):
        infer(weights, _x(2), 3, options(3, True), bps=2)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


# --- stages, stashes and copies in the IR (F65, F67) -------------------------------------------


def test_backward_stage_is_2L_minus_s_and_stashes_are_sized_F65_F67():
    session, _, _ = training_session(chain_weights(3), 3, options(3, True, af=5), bps=1)
    graph = _graph(session)
    for op in graph.ops.values():
        forward = op.grad_of
        if forward is not None and forward.settings.pipeline_stage is not None:
            assert op.settings.pipeline_stage == 4 - forward.settings.pipeline_stage, op
    # Stage -> IPU: 0,4 on ipu0; 1,3 on ipu1; 2 on ipu2.
    placement = {op.settings.pipeline_stage: op.settings.ipu for op in graph.ops.values()
                 if op.settings.pipeline_stage is not None}
    assert placement == {0: 0, 1: 1, 2: 2, 3: 1, 4: 0}
    stashes = {op.inputs[2].id: op for op in graph.ops_of_type("Stash")}
    # The host input is read again by stage 4 (ring of 5); stage 1's input copy by stage 3 (3).
    assert stashes["x"].outputs[0].id == "Stashed___x"
    assert stashes["x"].outputs[0].info.shape == (5, MB, D)
    sizes = {tid: op.outputs[0].info.shape[0] for tid, op in stashes.items()}
    assert sorted(sizes.values()) == [3, 3, 5, 5], sizes
    assert all(op.settings.ipu != 2 for op in stashes.values())  # the loss IPU stashes nothing
    restores = list(graph.ops_of_type("Restore"))
    assert {op.outputs[0].id for op in restores} >= {"Restored___x"}
    assert all(op.settings.pipeline_stage in (3, 4) for op in restores)
    copies = list(graph.ops_of_type("IpuCopy"))
    assert {(op.attrs.source_ipu, op.attrs.dest_ipu) for op in copies} == {
        (0, 1), (1, 2), (2, 1), (1, 0)}
    for op in copies:
        for reader in op.outputs[0].consumers:
            assert reader.settings.pipeline_stage == op.settings.pipeline_stage + 1 or (
                reader.op_type == "Stash")
    # Stash buffers are device state without a host copy.
    assert not any(w.startswith("StashBuffer___") for w in session._program.weights)


def test_cycle_table_fill_main_flush_F66():
    session, _, _ = training_session(chain_weights(3), 3, options(3, True, af=5), bps=1)
    cycles = SimulatedDevice(session._program).pipeline_cycles()
    assert len(cycles) == 5 + 5 - 1
    # Spec §5.1 example, IPU0 (stages 0 and 4): PS0(0) .. PS0(4)+PS4(0) .. PS4(4).
    ipu0 = [[(s, i) for s, i in cycle if s in (0, 4)] for cycle in cycles]
    assert ipu0 == [[(0, 0)], [(0, 1)], [(0, 2)], [(0, 3)], [(0, 4), (4, 0)], [(4, 1)],
                    [(4, 2)], [(4, 3)], [(4, 4)]]
    for c, cycle in enumerate(cycles):
        assert cycle == [(s, c - s) for s in range(5) if s <= c < s + 5]


# --- inference pipelines -----------------------------------------------------------------------


@pytest.mark.parametrize("ipus", [2, 4])
def test_inference_pipeline_equals_plain_run_F62(ipus):
    weights, x = chain_weights(2 * ipus, seed=ipus), _x(6)
    want, _ = infer(weights, x, 1, options(), bps=6, place=False)
    got, session = infer(weights, x, ipus, options(ipus, True), bps=6)
    assert session._program.num_stages == ipus
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_inference_pipeline_with_skip_connections():
    """A value read two stages later on another IPU travels by chained copies; one read again
    on its own IPU two stages later is stashed."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    w = [builder.addInitializedInputTensor(v, f"w{k}") for k, v in enumerate(chain_weights(3))]
    place = [(0, 0), (1, 1), (0, 2)]  # stage 2 is back on IPU 0
    h0 = None
    h = x
    for k, (ipu, stage) in enumerate(place):
        with builder.virtualGraph(ipu), builder.pipelineStage(stage):
            h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, w[k]])])
            if k == 0:
                h0 = h
            if k == 2:
                h = builder.aiOnnx.add([h, h0])  # same IPU, two stages later
    with builder.virtualGraph(2), builder.pipelineStage(3):
        out = builder.aiOnnx.add([builder.aiOnnx.sigmoid([h]), h0])  # other IPU, 3 stages later
    proto = builder.getModelProto()
    x_data = _x(5)

    def run(opts, ipus):
        flow = popart.DataFlow(5, {out: popart.AnchorReturnType("All")})
        session = popart.InferenceSession(proto, flow, device(ipus), userOptions=opts)
        session.prepareDevice()
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({"x": x_data}, anchors))
        return anchors[out], session

    want, _ = run(popart.SessionOptions(), 1)
    got, session = run(options(4, True), 4)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    graph = _graph_of(session)
    assert [op.outputs[0].info.shape[0] for op in graph.ops_of_type("Stash")] == [3]
    # Copies go stage to stage; h0 reaches IPU 2 from its stash on IPU 0 at stage 2.
    copies = sorted((op.attrs.source_ipu, op.attrs.dest_ipu, op.settings.pipeline_stage)
                    for op in graph.ops_of_type("IpuCopy"))
    assert copies == [(0, 1, 0), (0, 2, 2), (0, 2, 2), (1, 0, 1)]
    assert any(op.inputs[0].id == f"Restored___{h0}" for op in graph.ops_of_type("IpuCopy"))


def _graph_of(session):
    return session._ir.main


def test_running_mean_counts_micro_batches_per_stage_F73():
    """Pipelined Running mean: one counter per backward stage, read by that stage's running
    means, incremented on that stage after them, reset in the outer fragment (spec §5.3)."""
    opts = options(3, True, af=5,
                   accumulationAndReplicationReductionType=popart.ReductionType.Mean,
                   meanAccumulationAndReplicationReductionStrategy=(
                       popart.MeanReductionStrategy.Running))
    session, _, _ = training_session(chain_weights(3), 3, opts, bps=1)
    graph = _graph(session)
    assert "Counter___accumulation" not in graph.tensors
    order = {op.id: k for k, op in enumerate(graph.topo_order())}
    means = [op for op in graph.ops_of_type("Accumulate")
             if op.attrs.accumulation_type == "Mean"]
    # w2's gradient is on the loss stage 2, w1's on 3, w0's on 4 (2L - s).
    assert sorted((op.inputs[0].id, op.settings.pipeline_stage) for op in means) == [
        ("Accum___w0", 4), ("Accum___w1", 3), ("Accum___w2", 2)]
    for op in means:
        stage, counter = op.settings.pipeline_stage, op.inputs[2]
        assert counter.id == f"Counter___accumulation/stage{stage}"
        assert counter.role is TensorRole.STEP and counter.kind is TensorKind.VARIABLE
        writers = [c for c in counter.consumers if c is not op]
        increment = next(c for c in writers if c.op_type == "Accumulate")
        reset = next(c for c in writers if c.op_type == "AccumulatorScale")
        assert len(writers) == 2
        assert (increment.settings.pipeline_stage, increment.settings.ipu) == (
            stage, op.settings.ipu)
        assert increment.settings.execution_context is ExecutionContext.Normal
        assert order[op.id] < order[increment.id] < order[reset.id]
        assert reset.settings.execution_context is ExecutionContext.AccumulateOuterFragment
        assert reset.attrs.factor == 0.0 and reset.settings.ipu == op.settings.ipu
