"""GraphTransformer (spec §1): each rewrite of the ModelProto, checked by running the result in
onnxruntime against the original model; plus the Builder's smaller PopART methods
(embedReplicationFactor, aiOnnxOpsetVersion, _createSubgraphBuilder, VariableSettings)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart


def _ort(model_bytes, feeds, base_dir=None):
    model = onnx.load_from_string(model_bytes)
    if base_dir is not None:
        onnx.load_external_data_for_model(model, str(base_dir))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _typed_model(elem, np_dtype, values=(1, 2, 3)):
    """y = (x + c) * w: x an input, c a Constant node, w an initializer, all of type ``elem``;
    plus a Cast of y to the same type (the 'to' attribute must follow)."""
    x = helper.make_tensor_value_info("x", elem, [3])
    y = helper.make_tensor_value_info("z", elem, [3])
    c = numpy_helper.from_array(np.array(values, np_dtype), "c_value")
    w = numpy_helper.from_array(np.array([2, 1, 3], np_dtype), "w")
    nodes = [helper.make_node("Constant", [], ["c"], value=c),
             helper.make_node("Add", ["x", "c"], ["s"]),
             helper.make_node("Mul", ["s", "w"], ["y"]),
             helper.make_node("Cast", ["y"], ["z"], to=elem)]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


CASES = [
    ("convertFloatsToHalfs", TensorProto.FLOAT, np.float32, np.float16, ()),
    ("convertDoublesToFloats", TensorProto.DOUBLE, np.float64, np.float32, ()),
    ("convertDoublesToHalfs", TensorProto.DOUBLE, np.float64, np.float16, ()),
    ("convertUINT8ToINT32", TensorProto.UINT8, np.uint8, np.int32, ()),
    ("convertUINT16ToINT32", TensorProto.UINT16, np.uint16, np.int32, ()),
    ("convertINT8ToINT32", TensorProto.INT8, np.int8, np.int32, ()),
    ("convertINT16ToINT32", TensorProto.INT16, np.int16, np.int32, ()),
    ("convertINT64ToINT32", TensorProto.INT64, np.int64, np.int32, ()),
]


@pytest.mark.parametrize("method, elem, src, dst, args", CASES, ids=[c[0] for c in CASES])
def test_type_conversions_run_like_the_original(method, elem, src, dst, args):
    """The converted model computes (x + c) * w in the new type: onnxruntime runs it and
    matches the formula evaluated in float64 (onnxruntime has no Add for the small ints, so
    the original model is not run)."""
    model = _typed_model(elem, src)
    x = np.array([4, 5, 6], src)
    want = (x.astype(np.float64) + [1, 2, 3]) * [2, 1, 3]
    transformer = popart.GraphTransformer(model)
    getattr(transformer, method)(*args)
    converted = transformer.getModelProto()
    proto = onnx.load_from_string(converted)
    new_elem = popart.DataType.from_numpy(dst).onnx
    assert proto.graph.input[0].type.tensor_type.elem_type == new_elem
    assert proto.graph.node[-1].attribute[0].i == new_elem  # Cast's "to" follows
    (got,) = _ort(converted, {"x": x.astype(dst)})
    assert got.dtype == dst
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-3)


def test_bfloat16_to_float32():
    model = _typed_model(TensorProto.BFLOAT16, np.float32)  # placeholder, rebuilt below
    proto = onnx.load_from_string(model)
    for init in proto.graph.initializer:
        init.CopyFrom(helper.make_tensor(init.name, TensorProto.BFLOAT16, [3], [2.0, 1.0, 3.0]))
    proto.graph.node[0].attribute[0].t.CopyFrom(
        helper.make_tensor("c_value", TensorProto.BFLOAT16, [3], [1.0, 2.0, 3.0]))
    transformer = popart.GraphTransformer(proto)
    transformer.convertBFloats16ToFloat32()
    x = np.array([4, 5, 6], np.float32)
    (got,) = _ort(transformer.getModelProto(), {"x": x})
    np.testing.assert_allclose(got, (x + [1, 2, 3]) * [2, 1, 3])


def test_int64_out_of_range_raises_or_clips():
    big = 2**40
    model = _typed_model(TensorProto.INT64, np.int64, values=(big, -big, 1))
    with pytest.raises(popart.popart_exception, match="clip=True"):
        popart.GraphTransformer(model).convertINT64ToINT32()
    transformer = popart.GraphTransformer(model)
    transformer.convertINT64ToINT32(clip=True)
    x = np.array([0, 0, 1], np.int32)
    (got,) = _ort(transformer.getModelProto(), {"x": x})
    info = np.iinfo(np.int32)
    constant = np.array([info.max, info.min, 1], np.int64)  # the clipped values
    want = (x + constant) * np.array([2, 1, 3])
    np.testing.assert_array_equal(got, want.astype(np.int32))


def _weights_model():
    """y = x @ w + b with an unused input u and an int initializer k (Reshape's shape)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    u = helper.make_tensor_value_info("u", TensorProto.FLOAT, [5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([4, 2], np.int64), "k")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Reshape", ["a", "k"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x, u], [y], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


X = np.arange(6, dtype=np.float32).reshape(2, 3) / 6


def test_remove_unused_inputs():
    model = _weights_model()
    (want,) = _ort(model, {"x": X, "u": np.zeros(5, np.float32)})
    transformer = popart.GraphTransformer(model)
    transformer.removeUnusedInputs()
    proto = onnx.load_from_string(transformer.getModelProto())
    assert [i.name for i in proto.graph.input] == ["x"]
    (got,) = _ort(transformer.getModelProto(), {"x": X})
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_initializers_to_constants():
    model = _weights_model()
    (want,) = _ort(model, {"x": X, "u": np.zeros(5, np.float32)})
    transformer = popart.GraphTransformer(model)
    transformer.convertAllFixedPointInitializersToConstants()
    transformer.convertInitializersToConstants(["b"])
    proto = onnx.load_from_string(transformer.getModelProto())
    assert [i.name for i in proto.graph.initializer] == ["w"]
    assert [n.op_type for n in proto.graph.node[:2]] == ["Constant", "Constant"]
    (got,) = _ort(transformer.getModelProto(), {"x": X, "u": np.zeros(5, np.float32)})
    np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(popart.popart_exception, match="not initializers"):
        transformer.convertInitializersToConstants(["b"])


def test_save_initializers_externally(tmp_path):
    model = _weights_model()
    (want,) = _ort(model, {"x": X, "u": np.zeros(5, np.float32)})
    transformer = popart.GraphTransformer(model)
    transformer.saveInitializersExternally(["w", "b"], str(tmp_path / "weights.bin"))
    proto = onnx.load_from_string(transformer.getModelProto())
    external = [i.name for i in proto.graph.initializer
                if i.data_location == TensorProto.EXTERNAL]
    assert external == ["w", "b"] and (tmp_path / "weights.bin").stat().st_size == 4 * 16
    (got,) = _ort(transformer.getModelProto(), {"x": X, "u": np.zeros(5, np.float32)}, tmp_path)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_prepare_nodes_for_training():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 2, 2])
    inits = [numpy_helper.from_array(np.full(3, v, np.float32), n)
             for n, v in (("s", 1.0), ("bias", 0.0), ("mean", 0.0), ("var", 1.0))]
    node = helper.make_node("BatchNormalization", ["x", "s", "bias", "mean", "var"], ["y"])
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], initializer=inits),
                              opset_imports=[helper.make_opsetid("", 9)])
    transformer = popart.GraphTransformer(model)
    transformer.prepareNodesForTraining()
    out = onnx.load_from_string(transformer.getModelProto()).graph.node[0].output
    assert list(out) == ["y", "y_mean", "y_var", "y_saved_mean", "y_saved_var"]


# --- Builder ----------------------------------------------------------------------------------

def test_embed_replication_factor(caplog):
    builder = popart.Builder()
    builder.embedReplicationFactor(4)
    builder.embedReplicationFactor(2)
    props = {p.key: p.value for p in onnx.load_from_string(builder.getModelProto()).metadata_props}
    assert props["replicationFactor"] == "2"
    with pytest.raises(popart.popart_exception, match="positive int"):
        builder.embedReplicationFactor(0)


def test_ai_onnx_opset_version():
    builder = popart.Builder()
    builder.aiOnnxOpsetVersion(9)
    assert isinstance(builder.aiOnnx, popart.AiOnnxOpset9)
    with pytest.raises(popart.popart_exception, match="already defined as 9"):
        builder.aiOnnxOpsetVersion(11)


def test_create_subgraph_builder_binding():
    builder = popart.Builder()
    child = builder._createSubgraphBuilder()
    assert isinstance(child, popart.Builder) and child._parent is builder


def test_initialized_input_with_variable_settings():
    array = np.ones((2, 2), np.float32)
    builder = popart.Builder()
    default = builder.addInitializedInputTensor(array, popart.VariableSettings(), "w")
    reduced = builder.addInitializedInputTensor(
        array, popart.VariableSettings(popart.VariableRetrievalMode.AllReduceReplicas), "v")
    assert (default, reduced) == ("w", "v")
    assert builder.isInitializer("w") and builder.isInitializer("v")
    # Replica-grouped settings are recorded in the model for the session (which knows the
    # replication factor); the default ones leave the model as it was.
    grouped = popart.VariableSettings(popart.CommGroup(popart.CommGroupType.Consecutive, 2))
    assert builder.addInitializedInputTensor(array, grouped, "g") == "g"
    every = popart.VariableSettings(popart.VariableRetrievalMode.AllReplicas)
    builder.addInitializedInputTensor(array, every, "e")
    proto = onnx.load_from_string(builder.getModelProto())
    props = {p.key: p.value for p in proto.metadata_props if "variable_settings" in p.key}
    consecutive = popart.CommGroupType.Consecutive.value
    all_mode = popart.VariableRetrievalMode.AllReplicas.value
    reduce_mode = popart.VariableRetrievalMode.AllReduceReplicas.value
    assert props == {"__variable_settings:g": f"{consecutive},2,0,0",
                     "__variable_settings:v": f"0,0,0,{reduce_mode}",
                     "__variable_settings:e": f"0,0,0,{all_mode}"}
    with pytest.raises(popart.popart_exception, match="must be a VariableSettings"):
        builder.addInitializedInputTensor(array, variableSettings=3)
