"""Optimizer values and numeric SessionOptions are checked for range and finiteness, with the
name and the value in the message (a NaN learning rate used to turn every weight NaN)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import popart_backend as popart

from .models import affine

BAD = [math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("bad", BAD, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("cls,key", [
    (popart.SGD, "defaultLearningRate"), (popart.SGD, "defaultWeightDecay"),
    (popart.SGD, "defaultMomentum"), (popart.Adam, "defaultLearningRate"),
    (popart.Adam, "defaultWeightDecay"), (popart.Adam, "defaultEps"),
    (popart.Adaptive, "defaultLearningRate"), (popart.Adaptive, "defaultWeightDecay"),
    (popart.SGD, "lossScaling"), (popart.Adam, "lossScaling"),
])
def test_optimizer_refuses_non_finite_values(cls, key, bad):
    short = key[len("default"):][:1].lower() + key[len("default"):][1:] if key.startswith(
        "default") else key
    with pytest.raises(popart.popart_exception, match=rf"{short}.*{bad}"):
        cls({key: (bad, False)})


def test_insert_specific_refuses_nan():
    sgd = popart.SGD({"defaultLearningRate": (0.1, False)})
    with pytest.raises(popart.popart_exception, match="weight 'w'.*learningRate.*nan"):
        sgd.insertSpecific("w", {"learningRate": (math.nan, False)})


def test_lamb_max_weight_norm_may_be_infinite():
    """+inf maxWeightNorm means no clipping (PopTorch's max_weight_norm=None)."""
    adam = popart.Adam({"maxWeightNorm": (math.inf, True)}, mode=popart.AdamMode.Lamb)
    assert adam.maxWeightNorms().getDefault().val() == math.inf


@pytest.mark.parametrize("name,value", [
    ("replicatedGraphCount", 0), ("replicatedGraphCount", -1), ("accumulationFactor", 0),
    ("defaultBufferingDepth", 0), ("compilationProgressTotal", 0),
    ("timeLimitScheduler", math.nan), ("outlineThreshold", math.inf),
    ("finalDotOp", -1),
])
def test_session_options_out_of_range_are_refused_with_name_and_value(name, value):
    options = popart.SessionOptions()
    setattr(options, name, value)
    if name == "replicatedGraphCount":
        options.enableReplicatedGraphs = True
    with pytest.raises(popart.popart_exception, match=rf"SessionOptions\.{name} = {value}"):
        popart.InferenceSession(affine().SerializeToString(), popart.DataFlow(1, {}),
                                popart.DeviceManager().createCpuDevice(), userOptions=options)


@pytest.mark.parametrize("path,value", [
    ("automaticLossScalingSettings.binEdgeLocation", math.nan),
    ("automaticLossScalingSettings.thresholdUpperCountProportion", 2.0),
    ("executionPhaseSettings.stages", 0),
    ("batchSerializationSettings.factor", -1),
    ("weightTensorLocationSettings.minElementsForOffChip", -1),
])
def test_nested_numeric_options_are_refused(path, value):
    options = popart.SessionOptions()
    group, field = path.split(".")
    setattr(getattr(options, group), field, value)
    with pytest.raises(popart.popart_exception, match=rf"SessionOptions\.{path} = {value}"):
        popart.InferenceSession(affine().SerializeToString(), popart.DataFlow(1, {}),
                                popart.DeviceManager().createCpuDevice(), userOptions=options)


def test_prefetch_depth_map_values_are_checked():
    options = popart.SessionOptions()
    options.prefetchBufferingDepthMap = {"x": 0}
    with pytest.raises(popart.popart_exception, match=r"prefetchBufferingDepthMap\['x'\] = 0"):
        popart.InferenceSession(affine().SerializeToString(), popart.DataFlow(1, {}),
                                popart.DeviceManager().createCpuDevice(), userOptions=options)


def test_default_options_pass():
    session = popart.InferenceSession(affine().SerializeToString(), popart.DataFlow(
        1, {"y": popart.AnchorReturnType("All")}), popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    out = session.initAnchorArrays()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    session.run(popart.PyStepIO({"x": x}, out))
    np.testing.assert_allclose(out["y"], x * 2 + 1)


def test_replicated_graph_count_without_enable_says_it_has_no_effect(caplog):
    """PopART reads replicatedGraphCount only with enableReplicatedGraphs; we say so."""
    import logging

    from popart_backend import session as session_module

    session_module._LOGGED.discard("replicatedGraphCount")
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2]), "x")
    y = builder.aiOnnx.relu([x])
    builder.addOutputTensor(y)
    opts = popart.SessionOptions()
    opts.replicatedGraphCount = 2
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        session = popart.InferenceSession(
            builder.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}),
            popart.DeviceManager().createCpuDevice(), userOptions=opts)
    assert session.replicationFactor == 1
    assert any("enableReplicatedGraphs is False" in r.getMessage() for r in caplog.records)
