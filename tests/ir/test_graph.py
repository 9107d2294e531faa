"""IR: Graph edits keep edges in sync, topological order, verify, printer, folding."""

import numpy as np
import pytest

from popart_backend.dtypes import DataType
from popart_backend.errors import ShapeError, popart_exception, popart_internal_exception
from popart_backend.ir import Ir, OpSettings, TensorInfo, TensorKind, format_graph, verify
from popart_backend.ops.activations import Relu
from popart_backend.ops.elementwise import Add
from popart_backend.transforms.const_fold import try_fold

F32 = DataType.FLOAT


def _graph():
    ir = Ir({"ai.onnx": 18})
    g = ir.main
    g.add_tensor("x", TensorInfo(F32, (2, 3)), TensorKind.STREAM)
    g.add_tensor("w", TensorInfo(F32, (3,)), TensorKind.VARIABLE, np.ones(3, np.float32))
    g.inputs.append("x")
    add = g.add_op(Add(settings=OpSettings(name="add", ipu=1, pipeline_stage=0)), ["x", "w"], ["y"])
    relu = g.add_op(Relu(settings=OpSettings(name="relu")), ["y"], ["z"])
    g.outputs.append("z")
    return g, add, relu


def test_add_op_infers_and_links():
    g, add, relu = _graph()
    assert g.tensors["y"].info == TensorInfo(F32, (2, 3))
    assert g.tensors["y"].producer is add and g.tensors["y"].consumers == [relu]
    assert g.tensors["x"].consumers == [add]
    assert [op.op_type for op in g.topo_order()] == ["Add", "Relu"]
    verify(g)


def test_same_tensor_twice_counts_per_edge():
    g, add, relu = _graph()
    twice = g.add_op(Add(), ["z", "z"], ["zz"])
    assert g.tensors["z"].consumers == [twice, twice]
    assert g.topo_order()[-1] is twice
    g.remove_op(twice)
    assert g.tensors["z"].consumers == []


def test_replace_all_uses_moves_consumers_and_outputs():
    g, add, relu = _graph()
    g.add_tensor("y2", TensorInfo(F32, (2, 3)), TensorKind.STREAM)
    g.replace_all_uses(g.tensors["y"], g.tensors["y2"])
    assert relu.inputs[0].id == "y2" and g.tensors["y"].consumers == []
    assert g.tensors["y2"].consumers == [relu]
    g.replace_all_uses(g.tensors["z"], g.tensors["y2"])
    assert g.outputs == ["y2"]


def test_shape_error_names_op_and_shapes():
    g, _, _ = _graph()
    g.add_tensor("v", TensorInfo(F32, (4,)), TensorKind.STREAM)
    with pytest.raises(ShapeError, match=r"Add 'bad'.*\[2, 3\].*\[4\]"):
        g.add_op(Add(settings=OpSettings(name="bad")), ["x", "v"], ["q"])


def test_duplicate_tensor_and_missing_tensor():
    g, _, _ = _graph()
    with pytest.raises(popart_exception, match="already"):
        g.add_tensor("x", TensorInfo(F32, (1,)), TensorKind.STREAM)
    with pytest.raises(popart_exception, match="Did you mean 'x'"):
        g.tensor("xx")


def test_verify_reports_broken_edge_with_context():
    g, add, relu = _graph()
    g.tensors["y"].consumers.remove(relu)  # break an edge behind the Graph's back
    with pytest.raises(popart_internal_exception, match=r"Relu 'relu'.*does not list it"):
        verify(g)


def test_printer_one_op_per_line():
    g, _, _ = _graph()
    text = format_graph(g)
    assert "y = Add(x, w)  # f32[2,3] ipu1 stage0" in text
    assert "z = Relu(y)  # f32[2,3]" in text


def test_fold_constant_op():
    ir = Ir({"ai.onnx": 18})
    g = ir.main
    g.add_const("a", np.array([1.0, -2.0], np.float32))
    op = g.add_op(Relu(), ["a"], ["r"])
    assert try_fold(g, op)
    assert g.tensors["r"].kind is TensorKind.CONST
    np.testing.assert_array_equal(g.tensors["r"].data, [1.0, 0.0])
    assert not g.ops


def test_cycle_detected():
    g, add, relu = _graph()
    # Rewire Add to read Relu's output: a cycle.
    g.replace_all_uses(g.tensors["x"], g.tensors["z"])
    with pytest.raises(popart_exception, match="cycle"):
        g.topo_order()
