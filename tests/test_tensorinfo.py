"""Public TensorInfo, InputShapeInfo and InputSettings (spec §3.3, F7, F13, F102)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import popart_backend as popart
from popart_backend.dtypes import DataType
from popart_backend.importer.onnx_model import import_model
from popart_backend.ir.tensor import TensorInfo as IrTensorInfo
from popart_backend.tensorinfo import input_settings_from_model


@pytest.mark.parametrize(
    "np_dtype, name, lcase",
    [
        (np.uint8, "UINT8", "uint8"),
        (np.int8, "INT8", "int8"),
        (np.uint16, "UINT16", "uint16"),
        (np.int16, "INT16", "int16"),
        (np.int32, "INT32", "int32"),
        (np.int64, "INT64", "int64"),
        (np.uint32, "UINT32", "uint32"),
        (np.uint64, "UINT64", "uint64"),
        (np.bool_, "BOOL", "bool"),
        (np.float16, "FLOAT16", "float16"),
        (np.float32, "FLOAT", "float32"),
        (np.float64, "DOUBLE", "float64"),
    ],
)
def test_f13_numpy_dtype_mapping(np_dtype, name, lcase):
    """F13: TensorInfo(ndarray) maps numpy dtypes to PopART's names (spec §3.3)."""
    array = np.zeros((2, 5), dtype=np_dtype)
    info = popart.TensorInfo(array)
    assert info.data_type() == name
    assert info.data_type_lcase() == lcase
    assert info.shape() == [2, 5]
    assert info.nbytes() == array.nbytes
    assert info == popart.TensorInfo(name, [2, 5]) == popart.TensorInfo(lcase, (2, 5))


def test_f13_methods_and_repr():
    """F13: shape/data_type/nelms/nbytes/rank and value semantics."""
    info = popart.TensorInfo("FLOAT16", [3, 4, 5])
    assert info.shape() == [3, 4, 5]
    assert info.rank() == 3
    assert info.nelms() == 60
    assert info.nbytes() == 120
    assert repr(info) == "TensorInfo('FLOAT16', [3, 4, 5])"
    assert popart.TensorInfo(DataType.INT32, []).shape() == []
    assert popart.TensorInfo(DataType.INT32, []).nelms() == 1
    assert info != popart.TensorInfo("FLOAT", [3, 4, 5])
    assert len({info, popart.TensorInfo("float16", [3, 4, 5])}) == 1
    assert popart.TensorInfo(np.float32(1.0)).shape() == []


def test_f13_ir_conversion_round_trip():
    """The public class wraps the IR's frozen TensorInfo both ways."""
    ir_info = IrTensorInfo(DataType.INT64, (7, 1))
    public = popart.TensorInfo.from_ir(ir_info)
    assert public.to_ir() is ir_info
    assert public.data_type() == "INT64"
    assert popart.TensorInfo("INT64", [7, 1]).to_ir() == ir_info
    assert public == ir_info


@pytest.mark.parametrize(
    "args, match",
    [
        (("FLOATY", [2]), "Unknown data type string 'FLOATY'"),
        (("FLOAT", [2, -1]), "negative dimensions"),
        (("FLOAT", "ab"), "shape must be a list of integers"),
        (("FLOAT",), "give a data type and a shape"),
        ((3.5, [2]), "data type must be a string"),
    ],
)
def test_f13_errors(args, match):
    with pytest.raises(popart.popart_exception, match=match):
        popart.TensorInfo(*args)


def test_f7_input_shape_info_feeds_the_importer():
    """F7: InputShapeInfo gives static shapes to inputs with symbolic dims."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])

    shapes = popart.InputShapeInfo()
    assert not shapes.has("x")
    shapes.add("x", popart.TensorInfo("FLOAT", [4, 3]))
    assert shapes.has("x")
    assert shapes.get("x") == popart.TensorInfo("FLOAT", [4, 3])
    assert list(shapes) == ["x"] and len(shapes) == 1
    assert shapes.to_ir() == {"x": IrTensorInfo(DataType.FLOAT, (4, 3))}
    ir = import_model(model, input_shape_info=shapes.to_ir())
    assert ir.main.tensors["y"].info.shape == (4, 3)

    with pytest.raises(popart.popart_exception, match="no entry for 'z'"):
        shapes.get("z")
    with pytest.raises(popart.popart_exception, match="expected a TensorInfo"):
        shapes.add("z", [4, 3])


def test_f102_input_settings():
    """F102: InputSettings defaults, getters and the TileSet/ExchangeStrategy enums."""
    default = popart.InputSettings()
    assert default.tileSet() is popart.TileSet.Compute
    assert default.exchangeStrategy() is popart.ExchangeStrategy.JustInTime
    io = popart.InputSettings(popart.TileSet.IO, popart.ExchangeStrategy.OverlapInnerLoop)
    assert io.tileSet() is popart.TileSet.IO
    assert io.exchangeStrategy() is popart.ExchangeStrategy.OverlapInnerLoop
    assert io == popart.InputSettings(tileSet=popart.TileSet.IO,
                                      exchangeStrategy=popart.ExchangeStrategy.OverlapInnerLoop)
    assert set(popart.ExchangeStrategy.__members__) == {
        "JustInTime", "OverlapInnerLoop", "OverlapLoops", "OverlapStep"}
    assert set(popart.TileSet.__members__) == {"Compute", "IO"}
    with pytest.raises(popart.popart_exception, match="tileSet must be a TileSet"):
        popart.InputSettings("IO")


def test_f102_input_settings_travel_in_the_model():
    """F102: non-default InputSettings given to addInputTensor are readable from the model."""
    builder = popart.Builder()
    settings = popart.InputSettings(popart.TileSet.IO, popart.ExchangeStrategy.OverlapLoops)
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2]), settings, "x")
    y = builder.addInputTensor(popart.TensorInfo("FLOAT", [2]), "y")
    builder.addOutputTensor(builder.aiOnnx.add([x, y]))
    model = popart_model(builder)
    assert input_settings_from_model(model) == {"x": settings}


def popart_model(builder):
    import onnx

    return onnx.load_from_string(builder.getModelProto())
