"""Untrusted models: malformed stored tensors are ModelErrors naming the tensor, and external
data is read only from the model's folder for initializers, Constant attributes and
subgraph initializers alike."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import popart_backend as popart

from .models import SHAPE, load_and_run, make_model, value


def external_tensor(name: str, location: str, count: int = 6) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[count],
                         data_location=TensorProto.EXTERNAL)
    tensor.external_data.add(key="location", value=location)
    return tensor


@pytest.fixture
def secret(tmp_path, monkeypatch):
    """A data file outside the model folder; the current directory is the model folder, where
    onnx's own decoder would resolve the relative location."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.bin").write_bytes(np.arange(6, dtype=np.float32).tobytes())
    folder = tmp_path / "model"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def test_constant_attribute_external_data_outside_the_folder_is_refused(secret):
    const = helper.make_node("Constant", [], ["y"], name="const",
                             value=external_tensor("c", "../outside/secret.bin"))
    onnx.save(make_model([const], outputs=[value("y", None)]), str(secret / "m.onnx"))
    with pytest.raises(popart.popart_exception, match="outside the model's folder"):
        popart.InferenceSession(str(secret / "m.onnx"), popart.DataFlow(1, {}),
                                popart.DeviceManager().createCpuDevice())


def test_subgraph_initializer_external_data_outside_the_folder_is_refused(secret):
    branch = helper.make_graph([helper.make_node("Identity", ["s"], ["t"], name="id")], "then",
                               [], [value("t", [6])],
                               [external_tensor("s", "../outside/secret.bin")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="id2")], "else",
                              [], [value("e", [6])])
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch,
                            else_branch=other)
    model = make_model([node], inputs=[value("x", [6]), value("c", [], TensorProto.BOOL)],
                       outputs=[value("y", [6])])
    onnx.save(model, str(secret / "m.onnx"))
    with pytest.raises(popart.popart_exception, match="outside the model's folder"):
        popart.InferenceSession(str(secret / "m.onnx"), popart.DataFlow(1, {}),
                                popart.DeviceManager().createCpuDevice())


def test_constant_attribute_external_data_inside_the_folder_is_read(secret):
    data = np.arange(6, dtype=np.float32) * 3
    (secret / "c.bin").write_bytes(data.tobytes())
    const = helper.make_node("Constant", [], ["y"], name="const",
                             value=external_tensor("c", "c.bin"))
    onnx.save(make_model([const], outputs=[value("y", [6])]), str(secret / "m.onnx"))
    session = popart.InferenceSession(str(secret / "m.onnx"),
                                      popart.DataFlow(1, {"y": popart.AnchorReturnType("All")}),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    out = session.initAnchorArrays()
    session.run(popart.PyStepIO({}, out))
    np.testing.assert_array_equal(out["y"], data)


def test_initializer_whose_dims_do_not_match_its_data_is_a_model_error():
    init = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[3], float_data=[1.0, 2.0])
    model = make_model([helper.make_node("Identity", ["w"], ["y"])], [init],
                       outputs=[value("y", None)])
    with pytest.raises(popart.ModelError, match="Initializer 'w'.*FLOAT\\[3\\]"):
        load_and_run(model)


def test_raw_data_not_a_multiple_of_the_element_size_is_a_model_error():
    init = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2], raw_data=b"\0" * 7)
    model = make_model([helper.make_node("Identity", ["w"], ["y"])], [init],
                       outputs=[value("y", None)])
    with pytest.raises(popart.ModelError, match="raw_data holds 7 bytes.*needs 8"):
        load_and_run(model)


def test_bad_constant_attribute_names_the_node():
    tensor = TensorProto(name="v", data_type=TensorProto.FLOAT, dims=list(SHAPE),
                         float_data=[1.0])
    model = make_model([helper.make_node("Constant", [], ["y"], name="const", value=tensor)],
                       outputs=[value("y", None)])
    with pytest.raises(popart.ModelError, match="Attribute 'value'"):
        load_and_run(model)


def test_node_errors_from_onnx_or_torch_are_model_errors_naming_the_node():
    """A bad attribute type the op cannot use surfaces as a ModelError naming the node."""
    node = helper.make_node("Transpose", ["x"], ["y"], name="tr")
    node.attribute.add(name="perm", type=onnx.AttributeProto.INTS, ints=[0, 5])
    model = make_model([node], inputs=[value("x")], outputs=[value("y", None)])
    with pytest.raises(popart.popart_exception, match="'tr'"):
        load_and_run(model)
