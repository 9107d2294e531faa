"""Bad step IO and bad session inputs (spec §4.1, §4.2, §4.5, §2.1; F25–F27, F30, F47, F48).

Each case checks the spec exception class and a message naming the tensor or op, then, where it
makes sense, that a correct run on the same session still works.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import external_data_helper

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

BPS = 4
NELMS = int(np.prod(SAMPLE_SHAPE))


@pytest.fixture(scope="module")
def session():
    return make_session({"y": popart.AnchorReturnType("All"),
                         "xw": popart.AnchorReturnType("EveryN", 2)}, bps=BPS)


def good_run(session):
    x = step_input(BPS, seed=1)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    np.testing.assert_allclose(anchors["y"], affine_ref(x), rtol=1e-6)
    np.testing.assert_allclose(anchors["xw"], (x * 2)[[1, 3]], rtol=1e-6)


def test_wrong_input_element_count_F27(session):
    x = step_input(BPS - 1)
    with pytest.raises(popart.popart_runtime_error) as info:
        session.run(popart.PyStepIO({"x": x}, session.initAnchorArrays()))
    assert isinstance(info.value, popart.StepIOError)
    lines = str(info.value).splitlines()
    assert lines[0] == (f"Unexpected number of input elements for Tensor x. Expected "
                        f"{NELMS * BPS}, but received {NELMS * (BPS - 1)}.")
    assert lines[1] == "To disable this check at your own risk, use IStepIO::enableRuntimeAsserts."
    text = str(info.value)
    assert "replication factor: 1" in text and "accumulation factor: 1" in text
    assert f"batches per step: {BPS}" in text and f"tensor nelms: {NELMS}" in text
    good_run(session)


def test_wrong_output_element_count_F27(session):
    anchors = session.initAnchorArrays()
    anchors["xw"] = np.zeros((BPS, *SAMPLE_SHAPE), np.float32)  # EveryN(2) needs BPS/2 chunks
    with pytest.raises(popart.popart_runtime_error) as info:
        session.run(popart.PyStepIO({"x": step_input(BPS)}, anchors))
    lines = str(info.value).splitlines()
    assert lines[0] == (f"Unexpected number of output elements for Tensor xw. Expected "
                        f"{NELMS * BPS // 2}, but received {NELMS * BPS}.")
    assert lines[1] == "To disable this check at your own risk, use IStepIO::enableRuntimeAsserts."
    assert "anchor return type: EveryN" in str(info.value)
    assert "anchor return period: 2" in str(info.value)
    good_run(session)


def test_missing_input(session):
    with pytest.raises(popart.popart_runtime_error,
                       match="^No tensor x provided in PyStepIO's inputs$"):
        session.run(popart.PyStepIO({}, session.initAnchorArrays()))
    good_run(session)


def test_missing_output(session):
    anchors = session.initAnchorArrays()
    del anchors["xw"]
    with pytest.raises(popart.popart_runtime_error,
                       match="^No tensor xw provided in PyStepIO's outputs$"):
        session.run(popart.PyStepIO({"x": step_input(BPS)}, anchors))
    good_run(session)


def test_unknown_input_and_output_ids(session):
    with pytest.raises(popart.StepIOError, match="'xx', which is not an input.*Did you mean 'x'"):
        session.run(popart.PyStepIO({"x": step_input(BPS), "xx": step_input(BPS)},
                                    session.initAnchorArrays()))
    anchors = session.initAnchorArrays()
    anchors["yy"] = np.zeros(3, np.float32)
    with pytest.raises(popart.StepIOError, match="'yy', which is not an anchor"):
        session.run(popart.PyStepIO({"x": step_input(BPS)}, anchors))
    good_run(session)


def test_dtype_mismatch(session):
    x = step_input(BPS).astype(np.float64)
    with pytest.raises(popart.StepIOError, match="tensor 'x'.*float64.*float32"):
        session.run(popart.PyStepIO({"x": x}, session.initAnchorArrays()))
    anchors = session.initAnchorArrays()
    anchors["y"] = anchors["y"].astype(np.float16)
    with pytest.raises(popart.StepIOError, match="tensor 'y'.*float16.*float32"):
        session.run(popart.PyStepIO({"x": step_input(BPS)}, anchors))
    with pytest.raises(popart.StepIOError, match="'x' is a list"):
        session.run(popart.PyStepIO({"x": [1.0] * NELMS * BPS}, session.initAnchorArrays()))
    good_run(session)


def test_non_contiguous_output_array(session):
    anchors = session.initAnchorArrays()
    anchors["y"] = np.zeros((*SAMPLE_SHAPE, BPS), np.float32).transpose(2, 0, 1)
    with pytest.raises(popart.StepIOError, match="anchor 'y' must be C-contiguous"):
        session.run(popart.PyStepIO({"x": step_input(BPS)}, anchors))
    good_run(session)


def test_partial_chunks_with_asserts_disabled(session):
    stepio = popart.PyStepIO({"x": np.zeros(NELMS + 1, np.float32)}, session.initAnchorArrays())
    stepio.enableRuntimeAsserts(False)
    with pytest.raises(popart.StepIOError, match="'x' holds 7 elements"):
        session.run(stepio)
    good_run(session)


def test_callback_returning_wrong_size(session):
    stepio = popart.PyStepIOCallback(
        lambda tid, prefetch: np.zeros(NELMS + 2, np.float32),
        lambda tid: None, lambda tid: np.zeros(SAMPLE_SHAPE, np.float32), lambda tid: None)
    with pytest.raises(popart.StepIOError, match=r"input_callback\('x'\) returned 8 elements"):
        session.run(stepio)
    good_run(session)


def test_run_before_prepare_device():
    session = make_session(["y"], prepare=False)
    with pytest.raises(popart.popart_exception, match="prepareDevice"):
        session.run(popart.PyStepIO({"x": step_input(1)}, session.initAnchorArrays()))
    with pytest.raises(popart.popart_exception, match="prepareDevice"):
        session.weightsFromHost()
    session.prepareDevice()
    good = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": step_input(1)}, good))
    np.testing.assert_allclose(good["y"], affine_ref(step_input(1))[0], rtol=1e-6)


def test_offline_device_cannot_run_F45():
    device = popart.DeviceManager().createOfflineIPUDevice({"numIPUs": 1})
    session = make_session(["y"], device=device)  # prepareDevice compiles only
    with pytest.raises(popart.popart_exception,
                       match="^Offline IPU device is not configured for execution$"):
        session.run(popart.PyStepIO({"x": step_input(1)}, session.initAnchorArrays()))


def test_unknown_anchor_lists_close_matches():
    with pytest.raises(popart.popart_exception) as info:
        make_session(["yy"])
    assert "Anchor 'yy' is not a tensor of the model" in str(info.value)
    assert "Did you mean 'y'" in str(info.value)
    with pytest.raises(popart.popart_exception, match="Gradient___w"):
        make_session([popart.reservedGradientPrefix() + "w"])


def test_malformed_model_bytes():
    with pytest.raises(popart.ModelError, match="Could not parse"):
        make_session(["y"], model=b"\x08\x07 this is not a protobuf \xff\xff")


def test_missing_model_file(tmp_path):
    with pytest.raises(popart.ModelError, match="does not exist"):
        make_session(["y"], model=str(tmp_path / "absent.onnx"))


def test_external_data_outside_model_folder(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    model = affine_model()
    external_data_helper.convert_model_to_external_data(
        model, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    onnx.save_model(model, str(folder / "m.onnx"))
    assert make_session(["y"], model=str(folder / "m.onnx")) is not None  # inside: fine
    # Point the weights one folder up, where a file of that name exists.
    (tmp_path / "x").write_bytes((folder / "weights.bin").read_bytes())
    model = onnx.load(str(folder / "m.onnx"), load_external_data=False)
    for init in model.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = "../x"
    onnx.save_model(model, str(folder / "m_bad.onnx"))
    with pytest.raises(popart.ModelError,
                       match="Initializer 'w'.*'../x', outside the model's folder"):
        make_session(["y"], model=str(folder / "m_bad.onnx"))


def test_unsupported_op_names_the_op():
    model = affine_model()
    model.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(popart.UnsupportedOpError, match="NoSuchOp"):
        make_session(["y"], model=model)


def test_gradient_accumulation_in_inference():
    options = popart.SessionOptions()
    options.enableGradientAccumulation = True
    options.accumulationFactor = 2
    with pytest.raises(popart.popart_exception,
                       match="^Gradient Accumulation only available when training.$"):
        make_session(["y"], options=options)


def test_replication_needs_enough_ipus():
    options = popart.SessionOptions()
    options.enableReplicatedGraphs = True
    options.replicatedGraphCount = 2
    with pytest.raises(popart.popart_exception, match="replicatedGraphCount = 2.*device has 1"):
        make_session(["y"], options=options, device=cpu_device())
    with pytest.raises(popart.popart_exception, match="device has 3"):
        make_session(["y"], options=options, device=ipu_model_device(3))


def test_anchor_on_io_tiles_needs_io_tiles():
    with pytest.raises(popart.popart_exception, match="Anchor 'y'.*TileSet.IO.*numIOTiles = 0"):
        make_session({"y": popart.AnchorReturnType("All", popart.TileSet.IO)})


def test_bad_constructor_arguments():
    with pytest.raises(popart.popart_exception, match="dataFlow must be a DataFlow"):
        popart.InferenceSession(affine_model(), {"y": "All"}, cpu_device())
    with pytest.raises(popart.popart_exception, match="deviceInfo is None"):
        popart.InferenceSession(affine_model(), popart.DataFlow(1, ["y"]), None)
    with pytest.raises(popart.popart_exception, match="userOptions must be a SessionOptions"):
        popart.InferenceSession(affine_model(), popart.DataFlow(1, ["y"]), cpu_device(),
                                userOptions={"constantWeights": False})


def test_input_arrays_are_never_modified(session):
    x = step_input(BPS, seed=21)
    before = x.copy()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    np.testing.assert_array_equal(x, before)


def test_read_only_input_array(session):
    x = step_input(BPS, seed=22)
    x.flags.writeable = False
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    np.testing.assert_allclose(anchors["y"], affine_ref(x), rtol=1e-6)
