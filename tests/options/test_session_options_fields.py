"""Every PopART SessionOptions field, struct and enum of the name list (F9), with PopART's
defaults, and the effects of the options that act on the IR and the device model: batch
serialisation, buffering depths, grouped host syncs, merged collectives, split ratios and the
planning dicts. Each effect is checked against the formula of device/option_model.py while the
computed numbers stay equal to the option-off run; the options without effect log a warning."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.options.checks import OPTION_STATUS, BuildState, check_buildable, option_status
from popart_backend.transforms.virtual_graphs import ratio_split
from tests.session.replication_models import options as replication_options
from tests.session.replication_models import params, train

# PopART's defaults of the fields this file covers, typed from the name list (section (b)).
NEW_DEFAULTS = {
    "disableOptimizerStateTensorStreams": False,
    "defaultBufferingDepth": 1,
    "bufferingDepthMap": {},
    "virtualGraphSplitRatios": [],
    "enableVariablesCaching": True,
    "_enableRngStateManagement": False,
    "updatableNamedBuffers": [],
    "serializedPoprithmsAnnealGraphsDir": "",
    "enableEfficientOverlapIOTopoCons": False,
    "ensureFp32LossScaleTensor": False,
    "enableInplaceAmbiguityChecking": False,
    "createImplicitPipeliningFwdOnlyProgram": False,
    "throwIfLog2ScaleTensorNotInRange": True,
    "enableConstantFoldingOfMultipleConsumers": True,
    "useLoopCandidateCreator": False,
    "stashAllTensorsInferencePipeline": False,
}

# Other work owns these; they stay "not built" here.
OWNED_ELSEWHERE = {"enableStochasticRounding",
                   "automaticLossScalingSettings", "executionPhaseSettings",
                   "enableSupportedDataTypeCasting"}
# Not built yet (see docs/options.md): none. autodiffSettings, ensureFp32LossScaleTensor,
# enableSupportedDataTypeCasting, createImplicitPipeliningFwdOnlyProgram and
# stashAllTensorsInferencePipeline are built (tests/options/test_stitch_strategy.py,
# test_fp32_loss_scale.py, tests/session/test_supported_type_casting.py,
# tests/session/test_fwd_only_program.py, tests/transforms/test_stash_all_inference.py).
STILL_PENDING: set[str] = set()


@pytest.mark.parametrize("name,default", sorted(NEW_DEFAULTS.items()))
def test_F9_new_field_exists_with_popart_default(name, default):
    assert getattr(popart.SessionOptions(), name) == default


def test_F9_new_structs_and_enums_have_popart_defaults():
    opts = popart.SessionOptions()
    assert opts.experimentalSettings.createHostTransferableTensorWithOffset is False
    rcs = opts.replicatedCollectivesSettings
    assert (rcs.prepareScheduleForMergingCollectives, rcs.mergeAllReduceCollectives,
            rcs.mergeReduceScatterCollectives, rcs.mergeAllGatherCollectives) == (
        False, False, False, False)
    als = popart.AutomaticLossScalingSettings()
    assert als.updatePeriod == 1
    assert als.gradientTensorTrackingMethod is (
        popart.GradientTensorTrackingMethod.AllNonViewChangingGradientTensors)
    assert {m.name for m in popart.GradientTensorTrackingMethod} == {
        "ConvAndMatmulGradients", "AllNonViewChangingGradientTensors",
        "GradientsOfUserSpecifiedTensors"}
    ctx = popart.BatchSerializationTransformContext
    assert ctx.Forward is ctx.Fwd and ctx.Backward is ctx.Bwd
    assert popart.NumIOTiles() == 0 and popart.NumIOTiles(4) == 4
    opts.numIOTiles = popart.NumIOTiles(2)
    assert opts.numIOTiles == 2
    settings = popart.InputSettings(popart.ReplicatedStreamMode.Replicate)
    assert settings.replicatedStreamMode() is popart.ReplicatedStreamMode.Replicate
    assert settings.tileSet() is popart.TileSet.Compute
    assert popart.InputSettings().replicatedStreamMode() is popart.ReplicatedStreamMode.Replicate


def test_broadcast_stream_mode_is_accepted():
    # Its effect is tested in tests/session/test_broadcast_inputs.py.
    settings = popart.InputSettings(popart.ReplicatedStreamMode.Broadcast)
    assert settings.replicatedStreamMode() is popart.ReplicatedStreamMode.Broadcast
    assert not settings.is_default() and settings != popart.InputSettings()


def test_new_fields_are_type_checked():
    opts = popart.SessionOptions()
    with pytest.raises(popart.popart_exception, match="defaultBufferingDepth expects int"):
        opts.defaultBufferingDepth = "2"
    with pytest.raises(popart.popart_exception, match="mergeAllReduceCollectives expects bool"):
        opts.replicatedCollectivesSettings.mergeAllReduceCollectives = 1
    with pytest.raises(popart.popart_exception, match="updatePeriod expects int"):
        popart.AutomaticLossScalingSettings().updatePeriod = 1.5


def test_deprecated_names_warn_once_and_write_the_new_field(caplog):
    opts = popart.SessionOptions()
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        opts.serializedPoprithmsAnnealGraphsDir = "dir"
        opts.serializedPoprithmsAnnealGraphsDir = "dir2"
    assert opts.serializedPoprithmsShiftGraphsDir == "dir2"
    warnings = [r for r in caplog.records if "serializedPoprithmsAnnealGraphsDir is deprecated"
                in r.getMessage()]
    assert len(warnings) <= 1  # once per process (an earlier test may have warned)
    opts.bufferingDepthMap = {"x": 2}
    assert opts.prefetchBufferingDepthMap == {"x": 2}
    opts.defaultPrefetchBufferingDepth = 3
    assert opts.defaultBufferingDepth == 3


def test_enable_explicit_ir_and_updatable_buffers_alias():
    opts = popart.SessionOptions()
    opts.enableExplicitIR(True)
    assert (opts.useHostCopyOps, opts.enableExplicitMainLoops, opts.explicitRecomputation) == (
        True, True, True)
    opts.enableExplicitIR(False)
    assert not (opts.useHostCopyOps or opts.enableExplicitMainLoops)
    opts.updatableBuffers = ["bn.running_mean"]
    assert opts.updatableNamedBuffers == ["bn.running_mean"] == opts.updatableBuffers


def test_only_the_listed_options_remain_not_built():
    pending = {name for name in OPTION_STATUS for training in (False, True)
               if option_status(name, training).state is BuildState.PENDING}
    # The ones other work owns may be built meanwhile; no other option may be pending.
    assert pending - OWNED_ELSEWHERE == STILL_PENDING


@pytest.mark.parametrize("name,value", [
    ("customCodelets", ["my.cpp"]),
    ("gclOptions", {"useSynclessCollectives": "true"}),
    ("hardwareInstrumentations", {popart.Instrumentation.Inner}),
    ("aliasZeroCopy", True),
    ("throwIfLog2ScaleTensorNotInRange", False),
    ("enableMergeExchange", False),
])
def test_no_effect_options_log_a_warning(name, value, caplog):
    opts = popart.SessionOptions()
    setattr(opts, name, value)
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        check_buildable(opts, training=False)
    assert [r for r in caplog.records
            if f"SessionOptions.{name}" in r.getMessage() and "no effect" in r.getMessage()]


# -- the device-model effects ------------------------------------------------------------------

BATCH, K = 8, 16


def _model(dtype=np.float32):
    """y = Relu(x @ w) + x, x [8, 16] streamed."""
    rng = np.random.default_rng(0)
    b = popart.Builder()
    onnx_type = "FLOAT16" if dtype == np.float16 else "FLOAT"
    x = b.addInputTensor(popart.TensorInfo(onnx_type, [BATCH, K]), "x")
    w = b.addInitializedInputTensor((rng.standard_normal((K, K)) / 4).astype(dtype), "w")
    h = b.aiOnnx.relu([b.aiOnnx.matmul([x, w])])
    y = b.aiOnnx.add([b.aiOnnx.mul([h, h]), x])
    b.addOutputTensor(y)
    return b.getModelProto(), y


def _infer(opts=None, dtype=np.float32, bps=2):
    proto, y = _model(dtype)
    opts = opts or popart.SessionOptions()
    flow = popart.DataFlow(bps, {y: popart.AnchorReturnType("All")})
    device = popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 16})
    s = popart.InferenceSession(proto, flow, device, userOptions=opts)
    s.prepareDevice()
    anchors = s.initAnchorArrays()
    x = np.random.default_rng(1).standard_normal((bps, BATCH, K)).astype(dtype)
    s.run(popart.PyStepIO({"x": x}, anchors))
    return s, anchors[y]


def _batch_serialised(factor):
    opts = popart.SessionOptions()
    opts.batchSerializationSettings.factor = factor
    return opts


def test_F9_batch_serialisation_divides_activations_and_adds_syncs_per_slice():
    off, y_off = _infer()
    on, y_on = _infer(_batch_serialised(4))
    np.testing.assert_array_equal(y_off, y_on)
    spec = off._device_model.spec
    off_t = {t.id: t for t in off._device_model.memory.ipu(0).tensors}
    on_t = {t.id: t for t in on._device_model.memory.ipu(0).tensors}
    serialised = [tid for tid, t in off_t.items()
                  if t.category == "activations" and on_t[tid].num_bytes != t.num_bytes]
    assert serialised  # the batch-dim activations (not the anchor, read back whole)
    for tid in serialised:
        assert on_t[tid].num_bytes == -(-off_t[tid].num_bytes // 4)
    anchors = set(off.getIr().anchors)
    assert not anchors & set(serialised)
    mem_off = off._device_model.memory.ipu(0).categories["activations"]
    mem_on = on._device_model.memory.ipu(0).categories["activations"]
    assert mem_on < mem_off
    # One sync per slice for each serialised op, the rest of the op's cost unchanged.
    slowed = 0
    for a, b in zip(off._device_model.cycles.ops, on._device_model.cycles.ops):
        assert (a.compute_cycles, a.exchange_cycles) == (b.compute_cycles, b.exchange_cycles)
        if b.sync_cycles != a.sync_cycles:
            # (a's own syncs: one per pass of its plan, device/planner.py)
            assert b.sync_cycles == 4 * a.sync_cycles
            assert a.sync_cycles % spec.sync_latency_cycles == 0
            slowed += 1
    assert slowed >= 2
    assert on._device_model.cycle_count() > off._device_model.cycle_count()


@pytest.mark.parametrize("factor,match", [(3, "does not divide the batch size 8"),
                                          (-1, "factor = -1")])
def test_F9_batch_serialisation_factor_is_validated(factor, match):
    with pytest.raises(popart.popart_exception, match=match):
        _infer(_batch_serialised(factor))


def test_F9_buffering_depth_keeps_that_many_input_buffers():
    off, y_off = _infer()
    opts = popart.SessionOptions()
    opts.defaultBufferingDepth = 3
    on, y_on = _infer(opts)
    np.testing.assert_array_equal(y_off, y_on)
    x_bytes = BATCH * K * 4
    assert off._device_model.memory.ipu(0).categories["streams"] == x_bytes
    assert on._device_model.memory.ipu(0).categories["streams"] == 3 * x_bytes
    per_input = popart.SessionOptions()
    per_input.bufferingDepthMap = {"x": 2}
    mapped, _ = _infer(per_input)
    assert mapped._device_model.memory.ipu(0).categories["streams"] == 2 * x_bytes
    # Without prefetching each stream has one buffer.
    opts.enablePrefetchDatastreams = False
    no_prefetch, _ = _infer(opts)
    assert no_prefetch._device_model.memory.ipu(0).categories["streams"] == x_bytes


@pytest.mark.parametrize("name,value,match", [
    ("defaultBufferingDepth", 0, "defaultBufferingDepth = 0"),
    ("bufferingDepthMap", {"nope": 2}, "not streamed inputs"),
])
def test_F9_buffering_depth_is_validated(name, value, match):
    opts = popart.SessionOptions()
    setattr(opts, name, value)
    with pytest.raises(popart.popart_exception, match=match):
        _infer(opts)


def test_F9_group_host_sync_saves_the_anchor_sync():
    off, y_off = _infer()
    opts = popart.SessionOptions()
    opts.groupHostSync = True
    on, y_on = _infer(opts)
    np.testing.assert_array_equal(y_off, y_on)
    spec = off._device_model.spec
    assert (off._device_model.cycles.host_anchor_cycles - on._device_model.cycles.host_anchor_cycles
            == spec.ipu_sync_latency_cycles)
    assert off._device_model.cycle_count() - on._device_model.cycle_count() == spec.ipu_sync_latency_cycles


def test_F9_merged_all_reduces_pay_one_sync():
    p = params()
    x = np.random.default_rng(2).standard_normal((1, 2, 2, 4)).astype(np.float32)
    w_off, _, off = train(p, x, 2, 1, replication_options(rf=2))
    opts = replication_options(rf=2)
    opts.replicatedCollectivesSettings.mergeAllReduceCollectives = True
    w_on, _, on = train(p, x, 2, 1, opts)
    for key in p:
        np.testing.assert_array_equal(w_off[key], w_on[key])
    spec = off._device_model.spec

    def reduces(s):
        return [c for c in s._device_model.cycles.ops if c.op_type == "ReplicatedAllReduce"]

    n = len(reduces(off))
    assert n == 3
    saved = sum(c.collective_cycles for c in reduces(off)) - sum(
        c.collective_cycles for c in reduces(on))
    assert saved == (n - 1) * spec.ipu_sync_latency_cycles
    assert off._device_model.cycle_count() - on._device_model.cycle_count() == saved


def test_F20_split_ratios_share_the_cost_between_ipus():
    # Eight equal costs split 1:3 -> two on IPU 0, six on IPU 1; 1:1 -> four and four.
    assert ratio_split([1.0] * 8, (1.0, 3.0), 2) == [0, 0, 1, 1, 1, 1, 1, 1]
    assert ratio_split([1.0] * 8, (0.5, 0.5), 2) == [0] * 4 + [1] * 4
    with pytest.raises(popart.popart_exception, match="one positive ratio per IPU"):
        ratio_split([1.0], (1.0,), 2)


def test_F20_split_ratios_move_ops_in_auto_mode_with_equal_numbers():
    def run(ratios):
        proto, y = _model()
        opts = popart.SessionOptions()
        opts.virtualGraphMode = popart.VirtualGraphMode.Auto
        opts.virtualGraphSplitRatios = ratios
        device = popart.DeviceManager().createIpuModelDevice({"numIPUs": 2, "tilesPerIPU": 16})
        s = popart.InferenceSession(proto, popart.DataFlow(1, {y: popart.AnchorReturnType("All")}),
                                    device, userOptions=opts)
        s.prepareDevice()
        anchors = s.initAnchorArrays()
        x = np.random.default_rng(1).standard_normal((BATCH, K)).astype(np.float32)
        s.run(popart.PyStepIO({"x": x}, anchors))
        on_ipu0 = sum(1 for op in s.getIr().main.ops.values() if (op.settings.ipu or 0) == 0)
        return on_ipu0, anchors[y]

    small, y_small = run([0.01, 0.99])
    large, y_large = run([0.99, 0.01])
    np.testing.assert_array_equal(y_small, y_large)
    assert small < large


# -- the planning dicts ------------------------------------------------------------------------


def test_matmul_options_partials_type_half_is_partials_type_matmuls_half():
    by_key = popart.SessionOptions()
    by_key.matmulOptions = {"partialsType": "half"}
    by_global = popart.SessionOptions()
    by_global.partialsTypeMatMuls = "half"
    _, y_key = _infer(by_key, np.float16)
    _, y_global = _infer(by_global, np.float16)
    _, y_float = _infer(None, np.float16)
    np.testing.assert_array_equal(y_key, y_global)
    assert not np.array_equal(y_key, y_float)  # float16 accumulation is visible


def test_planning_dict_values_are_checked():
    opts = popart.SessionOptions()
    opts.matmulOptions = {"partialsType": "double"}
    with pytest.raises(popart.popart_exception, match="use \"float\" or \"half\""):
        check_buildable(opts, training=False)
    opts = popart.SessionOptions()
    opts.convolutionOptions = {"availableMemoryProportion": "1.5"}
    with pytest.raises(popart.popart_exception, match="in \\(0, 1\\]"):
        check_buildable(opts, training=False)
    opts = popart.SessionOptions()
    opts.lstmOptions = {"partialsType": "HALF"}  # built: tests/ops/test_lstm_half_partials.py
    check_buildable(opts, training=False)
    opts.lstmOptions = {"partialsType": "quarter"}
    with pytest.raises(popart.popart_exception, match="use \"float\" or \"half\""):
        check_buildable(opts, training=False)
    opts = popart.SessionOptions()
    opts.partialsTypeMatMuls = "float"
    opts.matmulOptions = {"partialsType": "half"}
    with pytest.raises(popart.popart_exception, match="disagree"):
        check_buildable(opts, training=False)


def test_planning_keys_without_effect_are_logged_once(caplog):
    opts = popart.SessionOptions()
    opts.lstmOptions = {"availableMemoryProportion": "0.3", "someUnknownKey": "x1"}
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        check_buildable(opts, training=False)
        check_buildable(opts, training=False)
    unknown = [r for r in caplog.records if "'someUnknownKey'" in r.getMessage()]
    assert len(unknown) == 1


def test_F9_early_var_updates_shorten_the_gradient_lifetimes():
    p = params()
    x = np.random.default_rng(2).standard_normal((1, 4, 4)).astype(np.float32)
    w_late, _, late = train(p, x, 4, 1, replication_options())
    opts = replication_options()
    opts.delayVarUpdates = False
    w_early, _, early = train(p, x, 4, 1, opts)
    for key in p:
        np.testing.assert_array_equal(w_late[key], w_early[key])

    def lifetimes(s):
        memory = {t.id: t for t in s._device_model.memory.ipu(0).tensors}
        # With early updates a gradient that is one matrix product is computed inside its
        # update (transforms/fuse_grad_update.py): made and used by one op, lifetime 1.
        fused = s.getIr().fused_gradients
        return {k: 1 if f"Gradient___{k}" in fused
                else memory[f"Gradient___{k}"].end - memory[f"Gradient___{k}"].start for k in p}

    # Each weight's gradient now dies at its update, the op right after the one making it.
    late_life, early_life = lifetimes(late), lifetimes(early)
    assert all(early_life[k] == 1 < late_life[k] for k in p), (early_life, late_life)
    # The peak cannot rise; here it sits at a gradient matmul's planner temporaries, before the
    # gradients die, so it may stay where it was.
    assert (early._device_model.memory.ipu(0).categories["activations"]
            <= late._device_model.memory.ipu(0).categories["activations"])
