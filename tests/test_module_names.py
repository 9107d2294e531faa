"""PopART's module-level names (spec §1 and the name list): reserved prefixes, enums, debug
info, TensorInfo helpers, OutOfMemoryError, NumericsReport, VariableSettings and CommGroup
groupings, DeviceManager helpers."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart

# PopART's strings for the prefixes (the name list, from PopART's tensornames.hpp).
PREFIXES = {
    "Accl1": "Accl1___", "Accl2": "Accl2___", "Accl3": "Accl3___",
    "AcclToReduce": "AcclIntoReduce___", "AcclToUpdate": "AcclIntoUpdate___",
    "AcclFinalOut": "AcclOutOfAcclUpdate___", "FinalReducedGrad": "FinalReducedGradient___",
    "AdamUpdater": "AdamUpdater___", "LambR1Sq": "LambR1Sq___", "LambR2Sq": "LambR2Sq___",
    "SeedModifier": "randomSeedModifier___", "RemoteArg": "RemoteArg___",
    "AutomaticLossScale": "AutomaticLossScaleProxy___",
    "DefaultWeightDecayScaleFactor0": "weightDecayScaleFactor0___default___",
    "SpecificScaledLearningRate0": "scaledLearningRate0___specific___",
    "DefaultScaledMomentum1": "scaledMomentum1___default___",
    "SpecificDampeningScaleFactor1": "dampeningScaleFactor1___specific___",
    "DefaultLossScaling": "lossScaling___default___",
    "SpecificMaxWeightNorm": "maxWeightNorm___specific___",
    "DefaultAdamBeta2": "adamBeta2___default___", "SpecificAdamEps": "adamEps___specific___",
    "DefaultStep": "step___default___", "SpecificStep": "step___specific___",
}


@pytest.mark.parametrize("name", sorted(PREFIXES))
def test_reserved_prefixes(name):
    assert getattr(popart, f"reserved{name}Prefix")() == PREFIXES[name]


def test_reserved_prefix_count():
    """All 41 of the list's extra prefixes exist, each a distinct string."""
    names = [n for n in dir(popart) if n.startswith("reserved") and n.endswith("Prefix")]
    values = [getattr(popart, n)() for n in names]
    assert len(names) == 50 and len(set(values)) == 50


def test_enums():
    assert [m.name for m in popart.InitType] == ["NoInit", "Zero"]
    assert [m.name for m in popart.TensorRemapType] == ["FwdBwdReverse", "FwdBwd", "Fwd"]
    assert {m.name for m in popart.ScatterReduction} == {"Sum", "Max", "Min", "Mul",
                                                         "NoReduction"}
    assert popart.IrSerializationFormat.JSON
    assert popart.SyntheticDataMode.RandomUniform
    assert {m.name for m in popart.VariableRetrievalMode} == {"OnePerGroup",
                                                              "AllReduceReplicas", "AllReplicas"}


def _run_builder(builder, outputs, feeds):
    for out in outputs:
        builder.addOutputTensor(out)
    session = popart.InferenceSession(
        builder.getModelProto(), popart.DataFlow(1, outputs),
        popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, anchors))
    return anchors


@pytest.mark.parametrize("init_type", list(popart.InitType))
def test_init_type_in_init_op(init_type):
    """aiGraphcore.init takes the InitType enum; both give zeros in the simulator."""
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    t = builder.aiGraphcore.init([2, 3], popart.DataType.FLOAT, init_type)
    y = builder.aiOnnx.add([x, t])
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(_run_builder(builder, [y], {x: data})[y], data)


@pytest.mark.parametrize("reduction, ref", [
    (popart.ScatterReduction.Sum, np.add.at),
    (popart.ScatterReduction.Max, np.maximum.at),
    (popart.ScatterReduction.Min, np.minimum.at),
])
def test_scatter_reduction_enum(reduction, ref):
    src = np.array([[1.0, -2.0], [3.0, 5.0], [-4.0, 0.5]], np.float32)
    index = np.array([[0, 1], [2, 1], [0, 0]], np.int32)
    builder = popart.Builder()
    s = builder.addInputTensor(popart.TensorInfo("FLOAT", [3, 2]))
    i = builder.addInputTensor(popart.TensorInfo("INT32", [3, 2]))
    y = builder.aiGraphcore.scatterreduce([s, i], axis_size=3, axis=0, reduction=reduction)
    got = _run_builder(builder, [y], {s: src, i: index})[y]
    init = {"sum": 0.0, "max": -np.inf, "min": np.inf}[reduction.value]
    want = np.full((3, 2), init, np.float32)
    ref(want, (index, np.broadcast_to(np.arange(2), (3, 2))), src)
    want[np.isinf(want)] = 0.0  # positions no element reaches are 0
    np.testing.assert_allclose(got, want)


def test_scatter_reduction_no_reduction_assigns():
    src = np.array([[1.0, -2.0], [3.0, 5.0]], np.float32)
    index = np.array([[2, 0], [0, 1]], np.int32)
    builder = popart.Builder()
    s = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 2]))
    i = builder.addInputTensor(popart.TensorInfo("INT32", [2, 2]))
    y = builder.aiGraphcore.scatterreduce([s, i], axis_size=3, axis=0,
                                          reduction=popart.ScatterReduction.NoReduction)
    want = np.zeros((3, 2), np.float32)
    np.put_along_axis(want, index, src, axis=0)
    np.testing.assert_array_equal(_run_builder(builder, [y], {s: src, i: index})[y], want)


def test_scatter_reduction_mul_refused():
    builder = popart.Builder()
    s = builder.addInputTensor(popart.TensorInfo("FLOAT", [3]))
    i = builder.addInputTensor(popart.TensorInfo("INT32", [3]))
    with pytest.raises(popart.popart_exception, match="Mul is not implemented"):
        builder.aiGraphcore.scatterreduce([s, i], axis_size=3,
                                          reduction=popart.ScatterReduction.Mul)


def test_float8_graphcore_types_named_and_refused():
    assert popart.DataType.FLOAT8_143.name == "FLOAT8_143"
    assert popart.DataType.FLOAT8_152.name == "FLOAT8_152"
    with pytest.raises(popart.popart_exception, match="FLOAT8_143.*simulated IPU"):
        popart.TensorInfo(popart.DataType.FLOAT8_143, [2])
    with pytest.raises(popart.popart_exception, match="FLOAT8_152"):
        popart.Builder().addInputTensor("FLOAT8_152", [2])


def test_tensor_info_methods():
    array = np.zeros((2, 3, 4), np.float16)
    info = popart.getTensorInfo(array)
    assert info == popart.TensorInfo("FLOAT16", [2, 3, 4])
    assert info.dataType() is popart.DataType.FLOAT16
    assert [info.dim(i) for i in range(3)] == list(array.shape)
    assert info.strides([2, 3, 4]) == [s // array.itemsize for s in array.strides]
    assert info.metaShape() == []
    info.set(popart.DataType.INT32, [5], [10])
    assert info.dataType() is popart.DataType.INT32 and info.shape() == [5]
    assert info.metaShape() == [10]
    assert popart.TensorInfo("FLOAT", [4], [8]).metaShape() == [8]
    with pytest.raises(popart.popart_exception, match="rank 1"):
        info.dim(1)
    with pytest.raises(popart.popart_exception, match="metaShape"):
        popart.Builder().addInputTensor(info)


def test_class_names_match_builder_objects():
    for version in range(6, 12):  # a builder fixes one ai.onnx opset
        assert isinstance(getattr(popart.Builder(), f"aiOnnxOpset{version}"),
                          getattr(popart, f"AiOnnxOpset{version}"))
    builder = popart.Builder()
    assert isinstance(builder.aiGraphcore, popart.AiGraphcoreOpset1)
    assert isinstance(builder.virtualGraph(0), popart.AttributeContextManager)
    assert isinstance(builder.outlineAttributes({"a": "b"}), popart.KeyValueContextManager)
    scope = builder.nameScope("blk")
    assert isinstance(scope, popart.NameContextManager)
    with scope:
        x = builder.addInputTensor(popart.TensorInfo("FLOAT", [1]))
    assert x.startswith("blk/")
    assert isinstance(popart.PyStepIO({}, {}), popart.IStepIO)
    assert isinstance(popart.PyWeightsIO({}), popart.IWeightsIO)


def test_debug_info_file(tmp_path):
    path = tmp_path / "debug.json"
    popart.initializePoplarDebugInfo(str(path), "json")
    loc = popart.SourceLocation("fn", "file.py", 12)
    parent = popart.DebugInfo(popart.DebugContext("outer", loc), "popart")
    child_ctx = popart.DebugContext(parent, "inner")
    child = popart.DebugInfo(child_ctx, "popart")
    child.setValue("note", [1, 2])
    popart.closePoplarDebugInfo()
    records = json.loads(path.read_text())["contexts"]
    assert [r["name"] for r in records] == ["outer", "inner"]
    assert records[0]["location"] == {"function": "fn", "file": "file.py", "line": 12}
    assert records[1]["parentId"] == parent.getId() != child.getId()
    assert records[1]["note"] == [1, 2]
    # A DebugContext is a name: Builder methods take it as their debugContext.
    builder = popart.Builder()
    assert builder.addInitializedInputTensor(np.ones(2, np.float32), child_ctx) == "inner"
    with pytest.raises(popart.popart_exception, match="no debug-info file is open"):
        popart.closePoplarDebugInfo()
    with pytest.raises(popart.popart_exception, match="cbor"):
        popart.initializePoplarDebugInfo(str(path), "cbor")


def test_out_of_memory_error_status():
    ok = popart.OutOfMemoryError()
    assert ok.isSuccessful() and str(ok) == "" and "successful" in repr(ok)
    exc = popart.OutOfMemoryException("IPU 0 overflow\nmore", "summary", "/p")
    assert isinstance(exc, popart.OutOfMemoryError) and not exc.isSuccessful()
    assert exc.getSummaryReport() == "summary" and exc.getProfilePath() == "/p"
    assert "IPU 0 overflow" in repr(exc) and str(exc).startswith("IPU 0 overflow")


def _oom_session(tiles):
    k = 1024
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, k])
    w = numpy_helper.from_array(np.ones((k, k), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm", [x], [y],
                              initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    device = popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": tiles})
    return popart.InferenceSession(model.SerializeToString(), popart.DataFlow(1, ["y"]), device)


def test_prepare_device_fills_out_of_memory_error():
    """prepareDevice(err=...) fills the status where it would raise OutOfMemoryException."""
    with pytest.raises(popart.OutOfMemoryException) as raised:
        _oom_session(4).prepareDevice()
    err = popart.OutOfMemoryError()
    _oom_session(4).prepareDevice(True, err)
    assert not err.isSuccessful() and str(err) == str(raised.value)
    assert err.getSummaryReport() == raised.value.getSummaryReport()
    fine = popart.OutOfMemoryError()
    _oom_session(16).prepareDevice(True, fine)
    assert fine.isSuccessful()


def _model_with(weights, path):
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    graph = helper.make_graph([], "g", [], [], initializer=inits)
    onnx.save(helper.make_model(graph), str(path))
    return str(path)


def test_numerics_report(tmp_path):
    rng = np.random.default_rng(0)
    a0 = {"w": rng.standard_normal((3, 2)).astype(np.float32),
          "b": rng.standard_normal(2).astype(np.float32)}
    d_a = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in a0.items()}
    d_b = {"w": d_a["w"] * 1.1, "b": -d_a["b"]}
    paths = [_model_with(m, tmp_path / f"{n}.onnx") for n, m in [
        ("a0", a0), ("a1", {k: a0[k] + d_a[k] for k in a0}),
        ("b0", a0), ("b1", {k: a0[k] + d_b[k] for k in a0})]]
    report = popart.NumericsReport(*paths)
    errors = report.getRelativeErrors()
    for k, start in a0.items():  # the updates as the models hold them (float32 rounding)
        da = ((start + d_a[k]) - start).astype(np.float64)
        db = ((start + d_b[k]) - start).astype(np.float64)
        want = np.linalg.norm(da - db) / (np.linalg.norm(da) + np.linalg.norm(db))
        assert errors[k] == pytest.approx(want, rel=1e-5)
    assert errors["b"] == pytest.approx(1.0, rel=1e-5)  # opposite updates
    assert "relative error" in report.report("w") and len(report.fullReport().splitlines()) == 2
    with pytest.raises(popart.popart_exception, match="no such weight"):
        report.report("nope")


def _groups_by_definition(kind, size, n):
    """Groups written out from PopART's CommGroup definitions."""
    if kind is popart.CommGroupType.All:
        return [list(range(n))]
    if kind is popart.CommGroupType.Ungrouped:
        return [[r] for r in range(n)]
    if kind is popart.CommGroupType.Consecutive:
        return [list(range(g * size, (g + 1) * size)) for g in range(n // size)]
    return [list(range(g, n, n // size)) for g in range(n // size)]  # Orthogonal


@pytest.mark.parametrize("kind, size", [
    (popart.CommGroupType.All, 0), (popart.CommGroupType.Ungrouped, 0),
    (popart.CommGroupType.Consecutive, 2), (popart.CommGroupType.Orthogonal, 2),
    (popart.CommGroupType.Orthogonal, 4)])
def test_comm_group_and_variable_settings_groups(kind, size):
    n = 8
    want = _groups_by_definition(kind, size, n)
    grouping = popart.CommGroup(kind, size).toReplicaGrouping(n)
    assert grouping.groups() == want
    for mode in popart.VariableRetrievalMode:
        settings = popart.VariableSettings(popart.CommGroup(kind, size), mode)
        assert settings.groups(n) == want
        assert settings.getGroupCount(n) == len(want)
        assert settings.getRealGroupSize(n) == len(want[0])
        assert [settings.getGroupRepresentative(g) for g in range(len(want))] == [
            g[0] for g in want]
        returning = n if mode is popart.VariableRetrievalMode.AllReplicas else len(want)
        assert settings.numReplicasReturningVariable(n) == returning
        host = settings.shapeOnHost([3, 4], n)
        assert host == ([3, 4] if returning == 1 else [returning, 3, 4])
        assert settings.getCommGroupType() is kind and settings.isUsingCommGroup()
        assert settings.getRetrievalMode() is mode


def test_variable_settings_stride_form():
    settings = popart.VariableSettings(4, 2, popart.VariableRetrievalMode.OnePerGroup)
    assert not settings.isUsingCommGroup()
    assert settings.getStride() == 4 and settings.getGroupSize() == 2
    assert settings.groups(8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert settings.getCommGroupType() is popart.CommGroupType.Orthogonal
    assert settings.shapeOnReplica([4, 3], 8, "w") == [3]
    with pytest.raises(popart.popart_exception, match="leading dimension of 4"):
        settings.shapeOnReplica([3], 8, "w")
    with pytest.raises(popart.popart_exception, match="replicaGroupSize >= 1"):
        popart.VariableSettings(popart.CommGroup(popart.CommGroupType.Consecutive, 0))


def test_device_manager_helpers():
    manager = popart.DeviceManager()
    cpu = manager.createCpuDevice()
    model = manager.createIpuModelDevice({"numIPUs": 2, "tilesPerIPU": 8})
    assert model.ipuVersion == model.version == "ipu2"
    offline = manager.createOfflineIpuFromDeviceInfo(model)
    assert (offline.numIpus, offline.tilesPerIPU, offline.ipuVersion) == (2, 8, "ipu2")
    assert offline.connectionType is popart.DeviceConnectionType.Never
    other = manager.createOfflineIpuFromSystemString("ipu1", 4)
    assert (other.numIpus, other.ipuVersion) == (4, "ipu1")
    assert cpu.ipuVersion == cpu.version
    device = manager.tryAcquireAvailableDevice(1)
    assert device is not None and device.isAttached
    same = manager.tryAcquireDeviceById(device.id)
    assert same is None  # busy
    device.detach()
    again = manager.tryAcquireDeviceById(device.id)
    assert again is not None
    again.detach()
