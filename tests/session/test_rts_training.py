"""Training with replicated tensor sharding equals the unsharded run, each replica stores only
its shard, the host sees whole tensors, and the memory model counts shards (spec §10.3, §10.4;
F109-F111). The IR rewrite is tested in tests/transforms/test_rts.py."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.device.memory import format_bytes, memory_summary
from popart_backend.options.enums import CommGroupType, ReplicatedTensorSharding
from popart_backend.options.structs import CommGroup
from tests.session import replication_models as rm

MB, BPS = 2, 2
KINDS = ("weight", "optimizerState", "accumulator")


def _rts(opts, kinds=KINDS, domain=None, min_elements=4):
    for kind in kinds:
        settings = getattr(opts, f"{kind}TensorLocationSettings")
        settings.minElementsForReplicatedTensorSharding = min_elements
        settings.location.replicatedTensorSharding = ReplicatedTensorSharding.On
        if domain is not None:
            settings.location.shardingDomain = domain
    return opts


def _adam():
    return popart.Adam({"defaultLearningRate": (0.02, False), "defaultWeightDecay": (0.01, True)})


def _data(rf, af, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BPS, af, rf, MB, rm.D_IN)).astype(np.float32)


def _state(s, ids):
    s.weightsToHost()
    out = {t: np.zeros(s.getIr().sharded_variables[t].full_info.shape, np.float32)
           for t in ids}
    s.readWeights(popart.PyWeightsIO(out))
    return out


@pytest.mark.parametrize("make_optimizer", [rm.momentum_sgd, _adam], ids=["sgd", "adam"])
@pytest.mark.parametrize("rf, af", [(2, 1), (4, 1), (2, 3), (4, 2)])
def test_F110_sharded_training_equals_the_unsharded_run(make_optimizer, rf, af):
    p, x = rm.params(), _data(rf, af)
    want, _, plain = rm.train(p, x, MB, BPS, rm.options(rf, af), optimizer=make_optimizer())
    got, _, s = rm.train(p, x, MB, BPS, _rts(rm.options(rf, af)), optimizer=make_optimizer())
    rm.assert_weights_close(got, want, rtol=0, atol=1e-6)
    state = [t for t in s.getIr().sharded_variables if t.startswith("Accl")]
    assert state
    # Optimizer state reads back whole and equal too.
    plain.weightsToHost()
    ref = {t: np.zeros(rm.params()[t.split("___")[1]].shape, np.float32) for t in state}
    plain.readWeights(popart.PyWeightsIO(ref))
    rm.assert_weights_close(_state(s, state), ref)


@pytest.mark.parametrize("kinds, af", [(("accumulator",), 3), (("optimizerState",), 1),
                                       (("weight",), 2)])
def test_F110_sharding_one_kind_of_tensor_equals_the_unsharded_run(kinds, af):
    p, x = rm.params(), _data(2, af)
    want, _, _ = rm.train(p, x, MB, BPS, rm.options(2, af))
    got, _, _ = rm.train(p, x, MB, BPS, _rts(rm.options(2, af), kinds))
    rm.assert_weights_close(got, want)


def test_F111_consecutive_domain_equals_the_unsharded_run():
    p, x = rm.params(), _data(4, 2)
    want, _, _ = rm.train(p, x, MB, BPS, rm.options(4, 2), optimizer=_adam())
    opts = _rts(rm.options(4, 2), domain=CommGroup(CommGroupType.Consecutive, 2))
    got, _, s = rm.train(p, x, MB, BPS, opts, optimizer=_adam())
    rm.assert_weights_close(got, want)
    assert s.getIr().sharded_variables["Accl1___w0"].num_shards == 2


def _lamb(mode=popart.AdamMode.Lamb, clip=None):
    return popart.Adam({"defaultLearningRate": (0.05, False), "defaultWeightDecay": (0.01, True),
                        "defaultMaxWeightNorm": (0.9, True)}, mode=mode,
                       clip_norm_settings=[clip] if clip is not None else [])


def _adam_clipped():
    return popart.Adam({"defaultLearningRate": (0.02, False)},
                       clip_norm_settings=[popart.ClipNormSettings.clipAllWeights(0.05)])


def _sgd_clip_w0():
    return popart.SGD({"defaultLearningRate": (0.1, True), "defaultMomentum": (0.9, True)},
                      clip_norm_settings=[popart.ClipNormSettings.clipWeights(["w0"], 0.05)])


# Lamb (whole-weight trust ratio; maxWeightNorm below ||w0|| so the cap is exercised) and
# clipping by global norm (a small maxNorm so it clips) run on shards with all-reduced sums of
# squares; the unsharded run computes the norms on whole tensors.
@pytest.mark.parametrize("make_optimizer", [
    _lamb, lambda: _lamb(popart.AdamMode.LambNoBias), _adam_clipped, _sgd_clip_w0,
    lambda: _lamb(clip=popart.ClipNormSettings.clipAllWeights(0.05))],
    ids=["lamb", "lamb_no_bias", "adam_clip", "sgd_clip_one", "lamb_clip"])
@pytest.mark.parametrize("rf, af", [(2, 1), (2, 3)])
def test_F110_norm_based_updates_on_shards_equal_the_unsharded_run(make_optimizer, rf, af):
    p, x = rm.params(), _data(rf, af, seed=3)
    want, _, _ = rm.train(p, x, MB, BPS, rm.options(rf, af), optimizer=make_optimizer())
    got, _, s = rm.train(p, x, MB, BPS, _rts(rm.options(rf, af)), optimizer=make_optimizer())
    rm.assert_weights_close(got, want)
    assert not np.allclose(got["w0"], p["w0"])  # it trained
    sharded = s.getIr().sharded_variables
    assert "w0" not in sharded and any(t.startswith("Accl") for t in sharded)


@pytest.mark.parametrize("make_optimizer", [_lamb, _adam_clipped], ids=["lamb", "adam_clip"])
def test_F111_norm_based_updates_on_a_consecutive_domain_equal_the_unsharded_run(make_optimizer):
    p, x = rm.params(), _data(4, 2, seed=4)
    want, _, _ = rm.train(p, x, MB, BPS, rm.options(4, 2), optimizer=make_optimizer())
    opts = _rts(rm.options(4, 2), domain=CommGroup(CommGroupType.Consecutive, 2))
    got, _, s = rm.train(p, x, MB, BPS, opts, optimizer=make_optimizer())
    rm.assert_weights_close(got, want)
    assert s.getIr().sharded_variables["Accl1___w0"].num_shards == 2


def test_F109_memory_model_counts_lamb_state_as_shards():
    s, _ = _spec_example_session(optimizer=_lamb())
    entries = {t.id: t for t in s._device_model.memory.ipu(0).tensors}
    assert entries["w"].num_bytes == 30 * 4  # the weight stays whole
    for tid in ("Accl1___w", "Accl2___w"):
        assert entries[tid].num_bytes == 8 * 4, tid  # ceil(30 / 4) f32 elements, not 30


def _spec_example_session(rf=4, optimizer=None, shard=True):
    """loss = l1(x * w) with w f32[5,2,3]: 30 elements over 4 replicas (spec §10.3)."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, 5, 2, 3]), "x")
    w0 = np.arange(1, 31, dtype=np.float32).reshape(5, 2, 3) / 10
    w = builder.addInitializedInputTensor(w0, "w")
    loss = builder.aiGraphcore.l1loss([builder.aiOnnx.mul([x, w])], 0.1)
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs, opts.replicatedGraphCount = True, rf
    opts.engineOptions = {"autoReport.all": "true"}
    if shard:
        _rts(opts, min_elements=rf)
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": rf})
    s = popart.TrainingSession(builder.getModelProto(), popart.DataFlow(1, [loss]), loss,
                               optimizer or rm.momentum_sgd(), device, userOptions=opts)
    s.prepareDevice()
    s.weightsFromHost()
    return s, w0


def _device_value(s, tid, replica):
    device = s._device  # the simulated device's per-replica slots
    return device.plan.replica_values[replica][device.plan.slot[tid]].numpy()


def test_F109_each_replica_stores_its_state_shard_with_the_spec_padding_and_the_whole_weight():
    s, w0 = _spec_example_session()
    for r in range(4):
        np.testing.assert_array_equal(_device_value(s, "w", r), w0)
    # The momentum state, written from the host, is split with the spec's padding.
    flat = np.arange(30, dtype=np.float32) + 1
    s.writeWeights(popart.PyWeightsIO({"Accl___w": flat.reshape(5, 2, 3)}))
    s.weightsFromHost()
    expected = [flat[0:8], flat[8:16], np.append(flat[16:23], 0), np.append(flat[23:30], 0)]
    for r in range(4):
        np.testing.assert_array_equal(_device_value(s, "Accl___w", r), expected[r])
    out = {"Accl___w": np.zeros((5, 2, 3), np.float32)}
    s.weightsToHost()
    s.readWeights(popart.PyWeightsIO(out))
    np.testing.assert_array_equal(out["Accl___w"].reshape(-1), flat)


def test_F109_spec_example_trains_like_the_unsharded_weight_and_pads_stay_zero():
    x = np.random.default_rng(3).standard_normal((4, MB, 5, 2, 3)).astype(np.float32)
    weights = {}
    for shard in (False, True):
        s, w0 = _spec_example_session(optimizer=_adam(), shard=shard)
        for _ in range(2):
            s.run(popart.PyStepIO({"x": x}, s.initAnchorArrays()))
        weights[shard] = {"w": np.zeros_like(w0)}
        s.weightsToHost()
        s.readWeights(popart.PyWeightsIO(weights[shard]))
    assert not np.array_equal(weights[True]["w"], w0)
    rm.assert_weights_close(weights[True], weights[False])
    for state in ("Accl1___w", "Accl2___w"):
        assert _device_value(s, state, 2)[-1] == 0 and _device_value(s, state, 3)[-1] == 0


def test_F109_memory_model_counts_shards():
    s, _ = _spec_example_session()
    model = s._device_model
    entries = {t.id: t for t in model.memory.ipu(0).tensors}
    assert entries["w"].num_bytes == 30 * 4  # weights stay whole
    assert entries["Accl___w"].num_bytes == 8 * 4  # ceil(30 / 4) f32 elements, not 30
    location = model.locations["Accl___w"]
    assert location.location.replicatedTensorSharding is ReplicatedTensorSharding.On
    assert "4 shards of 8" in location.reason
    # The gathered updated weight is a transient, once per update; the state is 1/4 of it.
    assert entries["w/gathered"].num_bytes == 30 * 4
    assert entries["w/gathered"].start is not None
    plain, _ = _spec_example_session(shard=False)
    whole = {t.id: t for t in plain._device_model.memory.ipu(0).tensors}
    assert whole["Accl___w"].num_bytes == 30 * 4 and whole["w"].num_bytes == 30 * 4


def test_F109_anchoring_a_weight_under_rts_streams_it_whole():
    opts = _rts(rm.options(2))
    proto, loss = rm.model(rm.params(), MB)
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": 2})
    flow = popart.DataFlow(1, [loss, "w0"])
    s = popart.TrainingSession(proto, flow, loss, rm.momentum_sgd(), device, userOptions=opts)
    assert s.getIr().main.tensors["w0"].info.shape == rm.params()["w0"].shape


def test_F109_inference_keeps_variable_weights_whole():
    p = rm.params()
    proto, loss = rm.model(p, MB)
    x = _data(2, 1)[0, 0]  # [rf, mb, D_IN]
    outputs = {}
    for shard in (False, True):
        opts = rm.options(2)
        opts.constantWeights = False
        if shard:
            _rts(opts, ("weight",))
        builder_out = loss
        device = popart.DeviceManager().createIpuModelDevice({"numIPUs": 2})
        s = popart.InferenceSession(proto, popart.DataFlow(1, [builder_out]), device,
                                    userOptions=opts)
        s.prepareDevice()
        s.weightsFromHost()
        out = s.initAnchorArrays()
        s.run(popart.PyStepIO({"x": x}, out))
        outputs[shard] = out[builder_out]
        if shard:  # no weight update to shard: the weights stay whole
            assert s._ir.sharded_variables == {}
    np.testing.assert_array_equal(outputs[True], outputs[False])


@pytest.mark.parametrize("rf", [2, 4])
def test_F109_memory_report_shows_optimizer_state_divided_by_the_replicas(rf):
    """Weights count whole; the optimizer state of each replica is 1/R of the unsharded one (up
    to the one pad element per shard)."""
    sessions = {shard: _spec_example_session(rf=rf, optimizer=_adam(), shard=shard)[0]
                for shard in (False, True)}
    cats = {shard: s._device_model.memory.ipu(0).categories for shard, s in sessions.items()}
    assert cats[True]["weights"] == cats[False]["weights"] == 30 * 4
    shard_elems = -(-30 // rf)
    assert cats[False]["optimizer state"] == 2 * 30 * 4  # Adam: two state tensors
    assert cats[True]["optimizer state"] == 2 * shard_elems * 4
    summary = memory_summary(sessions[True]._device_model.memory)
    assert f"optimizer state {format_bytes(2 * shard_elems * 4)}" in summary


def test_F110_device_model_times_the_sharded_update_and_its_collectives():
    """The update works on 1/R of the weight (its flops and bytes), the gradient reduce-scatter
    and the all-gather cross the IPU-Links, the local slice does not."""
    sessions = {shard: _spec_example_session(rf=4, optimizer=_adam(), shard=shard)[0]
                for shard in (False, True)}
    cycles = {}
    for shard, s in sessions.items():
        cycles[shard] = {c.op_type + ("/local" if c.op_type == "ReplicatedReduceScatter"
                                      and s.getIr().main.ops[c.op_id].attrs.local else ""): c
                         for c in s.getReport().model.cycles.ops}
    whole, split = cycles[False]["AdamUpdate"], cycles[True]["AdamUpdate"]
    assert split.flops * 30 == whole.flops * 8  # 8 of 30 elements per replica
    assert split.bytes_moved < whole.bytes_moved / 3
    assert cycles[True]["ReplicatedReduceScatter"].collective_cycles > 0
    assert cycles[True]["ReplicatedAllGather"].collective_cycles > 0
    assert cycles[True]["ReplicatedReduceScatter/local"].collective_cycles == 0
    assert "ReplicatedAllGather" not in cycles[False]


def test_F110_off_chip_sharded_optimizer_state_equals_the_unsharded_run():
    """The released BERT configuration's setting: optimizer state off chip and sharded. Each
    replica's streaming memory holds its state shards; the weights stay on chip, whole."""
    rf, af = 2, 2
    p, x = rm.params(), _data(rf, af)
    want, _, _ = rm.train(p, x, MB, BPS, rm.options(rf, af), optimizer=_adam())
    opts = rm.options(rf, af)
    opts.optimizerStateTensorLocationSettings = popart.TensorLocationSettings(
        popart.TensorLocation(popart.TensorStorage.OffChip, ReplicatedTensorSharding.On), 0, 4)
    got, _, s = rm.train(p, x, MB, BPS, opts, optimizer=_adam())
    rm.assert_weights_close(got, want, rtol=0, atol=1e-6)
    memory = s._device_model.memory.ipu(0)
    state = {t for t in s.getIr().sharded_variables if t.startswith("Accl")}
    assert state and state <= set(memory.streaming_tensors)
    shard_bytes = sum(s.getIr().main.tensors[t].info.num_bytes for t in state)
    whole_bytes = sum(2 * v.nbytes for v in p.values() if v.size >= 4)
    assert memory.streaming_bytes == shard_bytes and shard_bytes <= whole_bytes // rf + 8 * len(state)
    assert memory.categories["weights"] == sum(v.nbytes for v in p.values())
