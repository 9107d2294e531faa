"""SessionOptions, option structs and Patterns (spec §2.2–§2.4, §10.1; F8, F9, F10, F105, F110)
and the build-status table behind ``check_buildable`` ("nothing silently ignored")."""

from __future__ import annotations

import copy
import dataclasses
import logging

import pytest

import popart_backend as popart
from popart_backend.errors import NotImplementedOptionError
from popart_backend.options.checks import (OPTION_STATUS, BuildState, check_buildable,
                                           option_status, pending)
from popart_backend.options.typed import OptionDict
from tests.options.test_session_options_fields import NEW_DEFAULTS

# The defaults as written in spec §2.4, typed out independently of options.py.
SPEC_DEFAULTS = {
    "logDir": "",
    "dotChecks": set(),
    "firstDotOp": 0,
    "finalDotOp": 10000,
    "dotOpNames": False,
    "separateCallOpPdfs": True,
    "exportPoplarComputationGraph": False,
    "exportPoplarVertexGraph": False,
    "enableOutlining": True,
    "enableOutliningCopyCostPruning": True,
    "outlineThreshold": 1.0,
    "outlineSequenceBreakCost": 10000.0,
    "subgraphCopyingStrategy": popart.SubgraphCopyingStrategy.OnEnterAndExit,
    "timeLimitScheduler": 1e9,
    "swapLimitScheduler": 1e9,
    "kahnTieBreaker": "greedy",
    "transitiveClosureOptimizationThreshold": 100000,
    "serializedPoprithmsShiftGraphsDir": "",
    "delayVarUpdates": True,
    "scheduleNonWeightUpdateGradientConsumersEarly": False,
    "decomposeGradSum": False,
    "aliasZeroCopy": False,
    "autoRecomputation": popart.RecomputationType.NoRecompute,
    "explicitRecomputation": False,
    "mergeVarUpdate": popart.MergeVarUpdateType.Off,
    "mergeVarUpdateMemThreshold": 1000000,
    "looseThresholdAtPeak": 8000,
    "rearrangeAnchorsOnHost": True,
    "rearrangeStreamsOnHost": False,
    "enablePrefetchDatastreams": True,
    "defaultPrefetchBufferingDepth": 1,
    "prefetchBufferingDepthMap": {},
    "groupHostSync": False,
    "syntheticDataMode": popart.SyntheticDataMode.Off,
    "useHostCopyOps": False,
    "enableExplicitMainLoops": False,
    "enableMergeExchange": True,
    "numIOTiles": 0,
    "virtualGraphMode": popart.VirtualGraphMode.Off,
    "enablePipelining": False,
    "enableReplicatedGraphs": False,
    "replicatedGraphCount": 1,
    "enableGradientAccumulation": False,
    "accumulationFactor": 1,
    "accumulationAndReplicationReductionType": popart.ReductionType.Sum,
    "meanAccumulationAndReplicationReductionStrategy": popart.MeanReductionStrategy.PostAndLoss,
    "enableDistributedReplicatedGraphs": False,
    "globalReplicationFactor": 1,
    "globalReplicaOffset": 0,
    "tensorLocationSettingsOverride": {},
    "enableNonStableSoftmax": False,
    "enableStableNorm": False,
    "enableStochasticRounding": False,
    "enableFloatingPointChecks": False,
    "partialsTypeMatMuls": "",
    "enableFullyConnectedPass": True,
    "enableSerializedMatmuls": True,
    "groupNormStridedChannelGrouping": False,
    "enableSupportedDataTypeCasting": True,
    "strictOpVersions": True,
    "opxAliasChecking": False,
    "opxModifyChecking": False,
    "enableLoadAndOffloadRNGState": False,
    "customCodelets": [],
    "customCodeletCompileFlags": "",
    "compileEngine": True,
    "constantWeights": True,
    "enableEngineCaching": False,
    "cachePath": "session_cache",
    "instrumentWithHardwareCycleCounter": False,
    "hardwareInstrumentations": {popart.Instrumentation.Outer},
    "disableGradAccumulationTensorStreams": False,
    "compilationProgressLogger": None,
    "compilationProgressTotal": 100,
    "engineOptions": {},
    "convolutionOptions": {},
    "lstmOptions": {},
    "matmulOptions": {},
    "reportOptions": {},
    "gclOptions": {},
}
STRUCT_FIELDS = {
    "executionPhaseSettings",
    "accumulateOuterFragmentSettings",
    "batchSerializationSettings",
    "autodiffSettings",
    "activationTensorLocationSettings",
    "weightTensorLocationSettings",
    "optimizerStateTensorLocationSettings",
    "accumulatorTensorLocationSettings",
    "automaticLossScalingSettings",
    # Their PopART defaults are checked in test_session_options_fields.py.
    "replicatedCollectivesSettings",
    "experimentalSettings",
}
DICT_FIELDS = [
    "engineOptions",
    "convolutionOptions",
    "lstmOptions",
    "matmulOptions",
    "reportOptions",
    "gclOptions",
]


def test_F9_every_field_has_the_spec_default():
    opts = popart.SessionOptions()
    names = {f.name for f in dataclasses.fields(popart.SessionOptions)}
    # The fields PopART added after 2.3 (and their defaults) are in
    # test_session_options_fields.py.
    assert names == set(SPEC_DEFAULTS) | STRUCT_FIELDS | set(NEW_DEFAULTS)
    for name, default in SPEC_DEFAULTS.items():
        value = getattr(opts, name)
        assert value == default, name
        if isinstance(default, bool):
            assert value is default, name


def test_F9_struct_defaults():
    opts = popart.SessionOptions()
    eps = opts.executionPhaseSettings
    assert (eps.phases, eps.stages) == (0, 2)
    assert eps.weightIOSchedule is popart.ExecutionPhaseIOSchedule.Preload
    assert eps.activationIOSchedule is popart.ExecutionPhaseIOSchedule.Preload
    assert eps.accumulatorIOSchedule is popart.ExecutionPhaseIOSchedule.Preload
    assert eps.optimizerStateIOSchedule is popart.ExecutionPhaseIOSchedule.OnDemand
    assert eps.schedule is popart.ExecutionPhaseSchedule.Interleaving
    aof = opts.accumulateOuterFragmentSettings
    assert aof.schedule is popart.AccumulateOuterFragmentSchedule.Serial
    assert aof.excludedVirtualGraphs == []
    bss = opts.batchSerializationSettings
    assert bss.factor == 0
    assert bss.concatOnVirtualGraphChange and bss.concatOnExecutionPhaseChange
    assert bss.concatOnPipelineStageChange
    assert bss.transformContext is popart.BatchSerializationTransformContext.Fwd
    assert bss.method is popart.BatchSerializationMethod.UnrollDynamic
    assert bss.batchSchedule is popart.BatchSerializationBatchSchedule.Isomorphic
    assert (
        opts.autodiffSettings.stitchStrategy is popart.AutodiffStitchStrategy.RecomputeAllNonInputs
    )
    als = opts.automaticLossScalingSettings
    assert (als.enabled, als.binEdgeLocation, als.thresholdUpperCountProportion) == (
        False,
        1.0,
        1e-7,
    )
    assert als.toTrackTensors is None


@pytest.mark.parametrize(
    "name",
    [
        "activationTensorLocationSettings",
        "weightTensorLocationSettings",
        "optimizerStateTensorLocationSettings",
        "accumulatorTensorLocationSettings",
    ],
)
def test_F105_tensor_location_settings_defaults(name):
    settings = getattr(popart.SessionOptions(), name)
    assert settings.minElementsForOffChip == 2
    assert settings.minElementsForReplicatedTensorSharding == 8192
    loc = settings.location
    assert loc.storage is popart.TensorStorage.OnChip
    assert loc.loadTileSet is popart.TileSet.Compute
    assert loc.storageTileSet is popart.TileSet.Compute
    assert loc.replicatedTensorSharding is popart.ReplicatedTensorSharding.Off
    assert loc.shardingDomain == popart.CommGroup(popart.CommGroupType.All, 0)


def test_each_options_object_owns_its_mutable_defaults():
    a, b = popart.SessionOptions(), popart.SessionOptions()
    a.weightTensorLocationSettings.minElementsForOffChip = 7
    a.engineOptions["x"] = "1"
    a.dotChecks.add(popart.DotCheck.Fwd0)
    assert b.weightTensorLocationSettings.minElementsForOffChip == 2
    assert b.engineOptions == {} and b.dotChecks == set()


def test_F106_F110_tensor_location_overloads():
    S, R, T = popart.TensorStorage, popart.ReplicatedTensorSharding, popart.TileSet
    group = popart.CommGroup(popart.CommGroupType.Consecutive, 4)
    assert popart.TensorLocation(S.OffChip).storage is S.OffChip
    loc = popart.TensorLocation(S.OffChip, R.On)
    assert (loc.storage, loc.replicatedTensorSharding) == (S.OffChip, R.On)
    assert popart.TensorLocation(S.OffChip, R.On, group).shardingDomain == group
    loc = popart.TensorLocation(S.OnChip, T.IO, T.Compute, R.On)
    assert (loc.loadTileSet, loc.storageTileSet, loc.replicatedTensorSharding) == (
        T.IO,
        T.Compute,
        R.On,
    )
    assert popart.TensorLocation(S.OnChip, T.IO, T.IO, R.Off, group).shardingDomain == group
    settings = popart.TensorLocationSettings(S.OffChip, 4, 16)
    assert settings.location == popart.TensorLocation(S.OffChip)
    assert (settings.minElementsForOffChip, settings.minElementsForReplicatedTensorSharding) == (
        4,
        16,
    )
    assert popart.CommGroupType.Ungrouped in popart.CommGroupType
    with pytest.raises(popart.popart_exception, match="TensorLocation.shardingDomain expects"):
        popart.TensorLocation(S.OffChip, R.On, T.IO)


def test_F105_rts_recipe_mutates_in_place():
    opts = popart.SessionOptions()
    opts.weightTensorLocationSettings.minElementsForReplicatedTensorSharding = 4
    opts.weightTensorLocationSettings.location.replicatedTensorSharding = (
        popart.ReplicatedTensorSharding.On
    )
    loc = opts.weightTensorLocationSettings.location
    assert loc.replicatedTensorSharding is popart.ReplicatedTensorSharding.On
    assert opts.weightTensorLocationSettings.minElementsForReplicatedTensorSharding == 4


@pytest.mark.parametrize("name", DICT_FIELDS)
def test_F10_backend_dicts_write_through(name):
    opts = popart.SessionOptions()
    getattr(opts, name)["k"] = "v"
    assert getattr(opts, name) == {"k": "v"}
    setattr(opts, name, {"a": "1"})
    getattr(opts, name)["b"] = "2"
    getattr(opts, name).update(c="3")
    assert dict(getattr(opts, name)) == {"a": "1", "b": "2", "c": "3"}
    with pytest.raises(popart.popart_exception, match=rf"SessionOptions.{name}\['x'\] expects str"):
        getattr(opts, name)["x"] = True


def test_F107_tensor_location_override_write_through():
    opts = popart.SessionOptions()
    opts.tensorLocationSettingsOverride["w"] = popart.TensorLocation(popart.TensorStorage.OffChip)
    assert opts.tensorLocationSettingsOverride["w"].storage is popart.TensorStorage.OffChip
    with pytest.raises(popart.popart_exception, match="expects TensorLocation"):
        opts.tensorLocationSettingsOverride["w"] = popart.TensorStorage.OffChip


def test_assigned_dict_is_copied():
    user = {"autoReport.all": "true"}
    opts = popart.SessionOptions()
    opts.engineOptions = user
    user["other"] = "x"
    assert opts.engineOptions == {"autoReport.all": "true"}
    assert isinstance(opts.engineOptions, OptionDict)


def test_unknown_option_name_raises_with_suggestion():
    opts = popart.SessionOptions()
    match = "no option 'enablePipeline'.*enablePipelining"
    with pytest.raises(popart.popart_exception, match=match):
        opts.enablePipeline = True
    with pytest.raises(popart.popart_exception, match="TensorLocationSettings has no option"):
        opts.weightTensorLocationSettings.minElementsForOfChip = 3


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("enablePipelining", 1, "bool"),
        ("replicatedGraphCount", "2", "int"),
        ("replicatedGraphCount", True, "int"),
        ("replicatedGraphCount", 2.0, "int"),
        ("virtualGraphMode", 1, "VirtualGraphMode"),
        ("logDir", None, "str"),
        ("dotChecks", {"Fwd0"}, r"set\[DotCheck\]"),
        ("customCodelets", "a.cpp", r"list\[str\]"),
        ("weightTensorLocationSettings", popart.TensorStorage.OffChip, "TensorLocationSettings"),
        ("engineOptions", [("a", "b")], r"dict\[str, str\]"),
    ],
)
def test_wrong_type_raises_naming_field_and_type(name, value, expected):
    opts = popart.SessionOptions()
    with pytest.raises(popart.popart_exception, match=rf"SessionOptions.{name} expects {expected}"):
        setattr(opts, name, value)
    assert getattr(opts, name) == getattr(popart.SessionOptions(), name)


def test_accepted_conversions():
    opts = popart.SessionOptions()
    opts.outlineThreshold = 3  # int for a float field
    assert opts.outlineThreshold == 3.0 and type(opts.outlineThreshold) is float
    opts.dotChecks = [popart.DotCheck.Fwd0, popart.DotCheck.Final]
    assert opts.dotChecks == {popart.DotCheck.Fwd0, popart.DotCheck.Final}
    opts.automaticLossScalingSettings.toTrackTensors = ("a", "b")
    assert opts.automaticLossScalingSettings.toTrackTensors == ["a", "b"]
    opts.compilationProgressLogger = lambda done, total: None
    opts.prefetchBufferingDepthMap["x"] = 3
    assert opts.prefetchBufferingDepthMap == {"x": 3}


def test_deepcopy_keeps_values_and_checks():
    opts = popart.SessionOptions()
    opts.engineOptions["k"] = "v"
    opts.replicatedGraphCount = 2
    clone = copy.deepcopy(opts)
    assert clone == opts and clone.engineOptions is not opts.engineOptions
    clone.engineOptions["k2"] = "v2"
    assert "k2" not in opts.engineOptions
    with pytest.raises(popart.popart_exception):
        clone.engineOptions["bad"] = 1


def test_F74_global_replication_factor():
    opts = popart.SessionOptions()
    assert opts.getGlobalReplicationFactor() == 1
    opts.replicatedGraphCount = 2
    assert opts.getGlobalReplicationFactor() == 1  # not enabled
    opts.enableReplicatedGraphs = True
    assert opts.getGlobalReplicationFactor() == 2
    opts.enableDistributedReplicatedGraphs = True
    opts.globalReplicationFactor = 8
    assert opts.getGlobalReplicationFactor() == 8


def test_F75_accumulation_factor_and_its_error():
    opts = popart.SessionOptions()
    assert opts.getAccumulationFactor() == 1
    opts.accumulationFactor = 4
    with pytest.raises(
        popart.popart_exception,
        match="enableGradientAccumulation is false, but accumulationFactor > 1",
    ):
        opts.getAccumulationFactor()
    opts.enableGradientAccumulation = True
    assert opts.getAccumulationFactor() == 4


def test_explicit_pipelining_needs_all_three_flags():
    opts = popart.SessionOptions()
    opts.enablePipelining = True
    assert not opts.explicitPipeliningEnabled() and opts.implicitPipeliningEnabled()
    opts.useHostCopyOps = True
    assert not opts.explicitPipeliningEnabled()
    opts.enableExplicitMainLoops = True
    assert opts.explicitPipeliningEnabled() and not opts.implicitPipeliningEnabled()


# -- Patterns (F8) -----------------------------------------------------------------------------

PATTERN_PROPERTIES = [
    "PreUniRepl",
    "PostNRepl",
    "SoftMaxGradDirect",
    "NlllWithSoftMaxGradDirect",
    "OpToIdentity",
    "SubtractArg1GradOp",
    "MulArgGradOp",
    "MatMulOp",
    "MatMulLhsGradOp",
    "MatMulRhsGradOp",
    "InPlace",
]


def test_F8_pattern_levels():
    default = popart.Patterns()
    assert default == popart.Patterns(popart.PatternsLevel.Default)
    assert all(getattr(default, p) for p in PATTERN_PROPERTIES)
    none = popart.Patterns(popart.PatternsLevel.NoPatterns)
    assert not any(getattr(none, p) for p in PATTERN_PROPERTIES)
    assert all(getattr(popart.Patterns(popart.PatternsLevel.All), p) for p in PATTERN_PROPERTIES)
    minimal = popart.Patterns(popart.PatternsLevel.Minimal)
    assert set(minimal.enabledPatterns()) < set(default.enabledPatterns())


def test_F8_pattern_names_properties_and_errors():
    patterns = popart.Patterns(["InPlace", "MatMulOp"])
    assert patterns.enabledPatterns() == ["MatMulOp", "InPlace"]
    assert patterns.isPatternEnabled("InPlace") and not patterns.PreUniRepl
    patterns.PreUniRepl = True
    assert patterns.isPatternEnabled("PreUniRepl")
    patterns.enablePattern("InPlace", False)
    assert not patterns.InPlace
    with pytest.raises(popart.popart_exception, match="Unknown pattern 'Inplace'"):
        patterns.isPatternEnabled("Inplace")
    with pytest.raises(popart.popart_exception, match="Unknown pattern"):
        popart.Patterns(["NoSuchPattern"])
    assert patterns.runtimeAssertsOn
    patterns.enableRuntimeAsserts(False)
    assert not patterns.runtimeAssertsOn


# -- build status and check_buildable ----------------------------------------------------------


def test_every_field_has_a_status_with_an_issue_or_reason():
    assert set(OPTION_STATUS) == {f.name for f in dataclasses.fields(popart.SessionOptions)}
    for name in OPTION_STATUS:
        for training in (False, True):
            status = option_status(name, training)
            if status.state is BuildState.PENDING:
                assert status.issue in (3, 5, 6, 8, None) and status.note, name
            elif status.state is BuildState.NO_EFFECT:
                assert status.note, name


@pytest.mark.parametrize("training", [False, True])
def test_defaults_are_buildable(training):
    check_buildable(popart.SessionOptions(), training)


def test_check_buildable_lists_every_offending_field_at_once(monkeypatch):
    # Every option is built now: two are marked pending here to check the mechanism.
    monkeypatch.setitem(OPTION_STATUS, "createImplicitPipeliningFwdOnlyProgram",
                        pending(5, "a forward-only program of an implicitly pipelined training "
                                   "session"))
    monkeypatch.setitem(OPTION_STATUS, "enableStochasticRounding",
                        pending(None, "stochastic rounding"))
    opts = popart.SessionOptions()
    opts.enableSupportedDataTypeCasting = False
    opts.createImplicitPipeliningFwdOnlyProgram = True
    opts.enableStochasticRounding = True
    opts.mergeVarUpdate = popart.MergeVarUpdateType.All  # built: not listed
    opts.decomposeGradSum = True  # built: not listed
    opts.customCodelets = ["my.cpp"]  # no effect: logged, not listed
    # Replicated tensor sharding is built (transforms/rts.py): not listed.
    opts.weightTensorLocationSettings.location.replicatedTensorSharding = (
        popart.ReplicatedTensorSharding.On)
    set_names = ("enableSupportedDataTypeCasting", "createImplicitPipeliningFwdOnlyProgram",
                 "enableStochasticRounding")
    listed = [n for n in set_names if option_status(n, True).state is BuildState.PENDING]
    assert listed == ["createImplicitPipeliningFwdOnlyProgram", "enableStochasticRounding"]
    with pytest.raises(NotImplementedOptionError) as info:
        check_buildable(opts, training=True)
    text = str(info.value)
    assert "2 SessionOptions value(s)" in text
    for name in listed:
        assert f"{name} = " in text
    assert ("createImplicitPipeliningFwdOnlyProgram = True (default False): a forward-only "
            "program of an implicitly pipelined training session, not built yet") in text
    for name in ("mergeVarUpdate", "decomposeGradSum", "customCodelets",
                 "replicatedTensorSharding"):
        assert name not in text


def test_accumulation_is_built_for_inference_and_training():
    opts = popart.SessionOptions()
    opts.enableGradientAccumulation = True
    opts.accumulationFactor = 4
    opts.accumulationAndReplicationReductionType = popart.ReductionType.Mean
    opts.meanAccumulationAndReplicationReductionStrategy = popart.MeanReductionStrategy.Running
    check_buildable(opts, training=False)  # the session itself rejects it with the spec message
    check_buildable(opts, training=True)


def test_replication_is_built_for_inference_and_training():
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = 2
    opts.enableDistributedReplicatedGraphs = True
    opts.globalReplicationFactor = 4
    opts.globalReplicaOffset = 2
    check_buildable(opts, training=False)
    check_buildable(opts, training=True)


def test_built_options_pass():
    opts = popart.SessionOptions()
    opts.constantWeights = False
    opts.strictOpVersions = False
    opts.syntheticDataMode = popart.SyntheticDataMode.RandomNormal
    opts.logDir = "somewhere"
    opts.compileEngine = False
    check_buildable(opts, training=False)


def test_no_effect_options_pass_with_a_warning():
    opts = popart.SessionOptions()
    opts.outlineThreshold = 5.0
    opts.exportPoplarVertexGraph = True
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("popart:session")
    logger.addHandler(handler)
    try:
        check_buildable(opts, training=False)
    finally:
        logger.removeHandler(handler)
    messages = [r.getMessage() for r in records]
    assert any("outlineThreshold = 5.0 (default 1.0) has no effect" in m for m in messages)
    assert any("exportPoplarVertexGraph" in m for m in messages)


def test_check_buildable_rejects_non_options():
    with pytest.raises(popart.popart_exception, match="userOptions must be a SessionOptions"):
        check_buildable({"enablePipelining": True}, training=False)
