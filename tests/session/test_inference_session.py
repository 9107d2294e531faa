"""InferenceSession behaviour (spec §2.1, §4.3, §4.5, §4.6, §11).

Features: F2, F5, F7, F36, F37, F45, F47–F52, F54, F56, F71, F112.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import external_data_helper, numpy_helper

import popart_backend as popart

from .session_models import (
    SAMPLE_SHAPE,
    affine_model,
    affine_ref,
    cpu_device,
    ipu_model_device,
    make_session,
    step_input,
)


def variable_options() -> popart.SessionOptions:
    options = popart.SessionOptions()
    options.constantWeights = False
    return options


def run_once(session, x):
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    return anchors


@pytest.mark.parametrize("form", ["path", "bytes", "proto"])
def test_model_from_path_bytes_and_proto_F2_F5(form, tmp_path):
    model = affine_model()
    if form == "path":
        path = tmp_path / "affine.onnx"
        onnx.save_model(model, str(path))
        source = str(path)
    elif form == "bytes":
        source = model.SerializeToString()
    else:
        source = model
    session = make_session(["y"], bps=3, model=source)
    x = step_input(3, seed=2)
    np.testing.assert_allclose(run_once(session, x)["y"], affine_ref(x), rtol=1e-6)


def test_properties_and_get_info_F112():
    options = popart.SessionOptions()
    options.enableReplicatedGraphs = True
    options.replicatedGraphCount = 2
    flow = popart.DataFlow(3, ["y"])
    session = popart.InferenceSession(affine_model(), flow, ipu_model_device(2),
                                      userOptions=options)
    # The session keeps its own copy (DataFlow.setBatchesPerStep changes later sessions only).
    assert session.dataFlow.batchesPerStep() == 3 and session.dataFlow.anchors() == ["y"]
    assert session.replicationFactor == 2
    assert session.accumulationFactor == 1
    info = session.getInfo("y")
    assert isinstance(info, popart.TensorInfo)
    assert info.shape() == list(SAMPLE_SHAPE) and info.data_type() == "FLOAT"
    assert session.getInfo("w").shape() == list(SAMPLE_SHAPE)
    with pytest.raises(popart.popart_exception, match="no tensor 'yy'.*Did you mean 'y'"):
        session.getInfo("yy")
    # Step size = batch size (mb·rf·af) × bps samples: the input holds 3 × 2 micro-batches.
    session.prepareDevice()
    assert session.initAnchorArrays()["y"].shape == (3, 2, *SAMPLE_SHAPE)


def test_replicated_inference_same_weights_own_micro_batch_F71():
    options = variable_options()
    options.enableReplicatedGraphs = True
    options.replicatedGraphCount = 2
    session = make_session({"y": popart.AnchorReturnType("All"),
                            "w": popart.AnchorReturnType("Final")},
                           bps=2, options=options, device=ipu_model_device(4))
    x = step_input(4, seed=4).reshape(2, 2, *SAMPLE_SHAPE)
    anchors = run_once(session, x)
    np.testing.assert_allclose(anchors["y"], affine_ref(x), rtol=1e-6)
    np.testing.assert_array_equal(anchors["w"], np.full((2, *SAMPLE_SHAPE), 2, np.float32))


def test_read_write_weights_round_trip_F37():
    session = make_session(["y"], bps=2, options=variable_options())
    read = popart.PyWeightsIO({"w": np.empty(SAMPLE_SHAPE, np.float32),
                               "b": np.empty(SAMPLE_SHAPE, np.float32)})
    session.readWeights(read)
    np.testing.assert_array_equal(read.weights["w"], np.full(SAMPLE_SHAPE, 2, np.float32))
    np.testing.assert_array_equal(read.weights["b"], np.full(SAMPLE_SHAPE, 1, np.float32))

    new_w = np.arange(6, dtype=np.float32).reshape(SAMPLE_SHAPE)
    session.writeWeights(popart.PyWeightsIO({"w": new_w}))
    x = step_input(2, seed=5)
    # Host weights changed, device weights not yet.
    np.testing.assert_allclose(run_once(session, x)["y"], affine_ref(x), rtol=1e-6)
    session.weightsFromHost()
    np.testing.assert_allclose(run_once(session, x)["y"], x * new_w + 1, rtol=1e-6)

    session.weightsToHost()
    check = popart.PyWeightsIO({"w": np.empty(SAMPLE_SHAPE, np.float32)})
    session.readWeights(check)
    np.testing.assert_array_equal(check.weights["w"], new_w)


def test_weights_io_errors():
    session = make_session(["y"], options=variable_options())
    with pytest.raises(popart.popart_exception, match="'q' is not a weight"):
        session.readWeights(popart.PyWeightsIO({"q": np.empty(3, np.float32)}))
    with pytest.raises(popart.popart_exception, match="'w' is float32\\[3\\]"):
        session.writeWeights(popart.PyWeightsIO({"w": np.empty(3, np.float32)}))
    constant = make_session(["y"])
    with pytest.raises(popart.popart_exception, match="constantWeights is True"):
        constant.readWeights(popart.PyWeightsIO({"w": np.empty(SAMPLE_SHAPE, np.float32)}))


def test_reset_host_weights_F52(tmp_path):
    session = make_session(["y"], options=variable_options())
    x = step_input(1, seed=6)[0]
    other = affine_model(w=3.0, b=-1.0)
    path = tmp_path / "other.onnx"
    onnx.save_model(other, str(path))
    session.resetHostWeights(str(path))
    np.testing.assert_allclose(run_once(session, x)["y"], affine_ref(x), rtol=1e-6)
    session.weightsFromHost()
    np.testing.assert_allclose(run_once(session, x)["y"], affine_ref(x, 3.0, -1.0), rtol=1e-6)

    extra = affine_model(w=5.0)
    extra.graph.initializer.append(numpy_helper.from_array(np.zeros(2, np.float32), "unused"))
    with pytest.raises(popart.popart_exception, match="'unused', which is not a weight"):
        session.resetHostWeights(extra.SerializeToString())
    session.resetHostWeights(extra.SerializeToString(),
                             ignoreWeightsInModelWithoutCorrespondingHostWeight=True)
    session.weightsFromHost()
    np.testing.assert_allclose(run_once(session, x)["y"], affine_ref(x, 5.0, 1.0), rtol=1e-6)


def test_reset_host_weights_blocked_by_constant_weights_F52():
    session = make_session(["y"])
    with pytest.raises(popart.popart_exception,
                       match="^Cannot call resetHostWeights when constantWeights is set$"):
        session.resetHostWeights(affine_model(w=3.0))


def test_model_to_host_writes_device_weights_F51(tmp_path):
    session = make_session(["y"], options=variable_options())
    new_w = np.full(SAMPLE_SHAPE, 7, np.float32)
    session.writeWeights(popart.PyWeightsIO({"w": new_w}))
    session.weightsFromHost()
    path = tmp_path / "saved.onnx"
    session.modelToHost(str(path))
    saved = onnx.load(str(path))
    values = {i.name: numpy_helper.to_array(i) for i in saved.graph.initializer}
    np.testing.assert_array_equal(values["w"], new_w)
    np.testing.assert_array_equal(values["b"], np.ones(SAMPLE_SHAPE, np.float32))
    # The saved model runs with the written weights.
    reloaded = make_session(["y"], model=str(path))
    x = step_input(1, seed=8)[0]
    np.testing.assert_allclose(run_once(reloaded, x)["y"], x * 7 + 1, rtol=1e-6)


def test_model_to_host_rewrites_external_data_F51(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    model = affine_model()
    external_data_helper.convert_model_to_external_data(
        model, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    onnx.save_model(model, str(source / "m.onnx"))
    session = make_session(["y"], model=str(source / "m.onnx"), options=variable_options())
    session.writeWeights(popart.PyWeightsIO({"b": np.full(SAMPLE_SHAPE, -4, np.float32)}))
    session.weightsFromHost()
    target = tmp_path / "dst"
    target.mkdir()
    session.modelToHost(str(target / "m.onnx"))
    assert (target / "weights.bin").is_file()
    saved = onnx.load(str(target / "m.onnx"))  # loads external data from dst/
    values = {i.name: numpy_helper.to_array(i) for i in saved.graph.initializer}
    np.testing.assert_array_equal(values["b"], np.full(SAMPLE_SHAPE, -4, np.float32))
    np.testing.assert_array_equal(values["w"], np.full(SAMPLE_SHAPE, 2, np.float32))


def test_summary_report_and_cycle_count_F54_F56():
    session = make_session(["y"])
    assert "Execution profiling not enabled" in session.getSummaryReport()
    with pytest.raises(popart.popart_exception, match="instrumentWithHardwareCycleCounter"):
        session.getCycleCount()


@pytest.mark.parametrize("mode", ["Zeros", "RandomNormal"])
def test_synthetic_data_ignores_host_inputs(mode):
    options = popart.SessionOptions()
    options.syntheticDataMode = getattr(popart.SyntheticDataMode, mode)
    session = make_session({"x": popart.AnchorReturnType("All"),
                            "y": popart.AnchorReturnType("All")}, bps=3, options=options)
    host_x = np.full((3, *SAMPLE_SHAPE), 100, np.float32)
    first = run_once(session, host_x)
    if mode == "Zeros":
        assert not first["x"].any()
    else:
        assert np.abs(first["x"]).max() < 10 and first["x"].std() > 0.1
        assert not np.array_equal(first["x"][0], first["x"][1])
    np.testing.assert_allclose(first["y"], affine_ref(first["x"]), rtol=1e-6)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({}, anchors))  # host inputs are not needed at all
    if mode == "RandomNormal":
        session.setRandomSeed(123)
        a = run_once(session, host_x)["x"]
        session.setRandomSeed(123)
        b = run_once(session, host_x)["x"]
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, run_once(session, host_x)["x"])


def test_on_demand_device_attaches_at_prepare_device_F45():
    manager = popart.DeviceManager()
    device = manager.acquireAvailableDevice(
        1, connectionType=popart.DeviceConnectionType.OnDemand)
    assert device is not None
    with device:
        assert not device.isAttached
        session = make_session(["y"], device=device, prepare=False)
        assert not device.isAttached
        session.prepareDevice()
        assert device.isAttached
        x = step_input(1, seed=9)[0]
        np.testing.assert_allclose(run_once(session, x)["y"], affine_ref(x), rtol=1e-6)


def test_prepare_device_without_loading_engine_F47():
    session = make_session(["y"], prepare=False)
    session.prepareDevice(loadEngine=False)
    x = step_input(1, seed=10)[0]
    with pytest.raises(popart.popart_exception, match="prepareDevice"):
        run_once(session, x)
    session.loadEngineAndConnectStreams()
    np.testing.assert_allclose(run_once(session, x)["y"], affine_ref(x), rtol=1e-6)


def test_compile_engine_off_builds_only():
    options = popart.SessionOptions()
    options.compileEngine = False
    session = make_session(["y"], options=options)
    with pytest.raises(popart.popart_exception, match="compileEngine is False"):
        run_once(session, step_input(1)[0])


def test_stream_inputs_are_zero_copy_views():
    """The device reads the user's array in place (no host copy per micro-batch)."""
    session = make_session({"x": popart.AnchorReturnType("Final")}, bps=2)
    x = step_input(2, seed=14)
    run_once(session, x)
    fed = session._device.plan.get_value("x").numpy()
    assert np.shares_memory(fed, x)


def test_patterns_argument():
    session = popart.InferenceSession(affine_model(), popart.DataFlow(1, ["y"]), cpu_device(),
                                      patterns=popart.Patterns(popart.PatternsLevel.Minimal))
    session.prepareDevice()
    with pytest.raises(popart.popart_exception, match="patterns must be a Patterns"):
        popart.InferenceSession(affine_model(), popart.DataFlow(1, ["y"]), cpu_device(),
                                patterns="all")


def test_input_shape_info_for_symbolic_dims_F7():
    model = affine_model()
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    dim.ClearField("dim_value")
    dim.dim_param = "batch"
    with pytest.raises(popart.ShapeError, match="'x' has unknown dimension 0"):
        make_session(["y"], model=model)
    shapes = popart.InputShapeInfo()
    shapes.add("x", popart.TensorInfo("FLOAT", list(SAMPLE_SHAPE)))
    session = make_session(["y"], bps=2, model=model, inputShapeInfo=shapes)
    x = step_input(2, seed=15)
    np.testing.assert_allclose(run_once(session, x)["y"], affine_ref(x), rtol=1e-6)


def test_input_used_only_through_its_shape_is_not_required(caplog):
    """A model input whose only use was folded away needs no buffer; one given is ignored with
    a warning (spec §4.1). The folded shape itself is anchorable."""
    model = affine_model()
    model.graph.input.append(
        onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [5, 4]))
    model.graph.node.append(onnx.helper.make_node("Shape", ["z"], ["zs"]))
    session = make_session(["y", "zs"], bps=2, model=model)
    x = step_input(2, seed=16)
    anchors = run_once(session, x)
    np.testing.assert_allclose(anchors["y"], affine_ref(x), rtol=1e-6)
    np.testing.assert_array_equal(anchors["zs"], np.array([[5, 4], [5, 4]], np.int64))
    with caplog.at_level("WARNING", logger="popart:devicex"):
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({"x": x, "z": np.zeros((2, 5, 4), np.float32)}, anchors))
    assert "'z' is not used by the model" in caplog.text


def test_builder_model_end_to_end_F5():
    """The usual PopART flow: Builder -> getModelProto() bytes -> InferenceSession -> run."""
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", list(SAMPLE_SHAPE)))
    w = builder.addInitializedInputTensor(np.full(SAMPLE_SHAPE, 2, np.float32))
    y = builder.aiOnnx.add([builder.aiOnnx.mul([x, w]), x])
    builder.addOutputTensor(y)
    session = popart.InferenceSession(builder.getModelProto(),
                                      popart.DataFlow(5, {y: popart.AnchorReturnType("All")}),
                                      cpu_device())
    session.prepareDevice()
    data = step_input(5, seed=19)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: data}, anchors))
    np.testing.assert_allclose(anchors[y], data * 3, rtol=1e-6)
