"""Static ONNX sequences resolved at import (torch.split / chunk exports), against onnxruntime."""

import numpy as np
import pytest
from onnx import helper, numpy_helper, TensorProto

from popart_backend.errors import ShapeError
from tests.helpers import assert_close, rand, run_onnxruntime, run_popart


def _model(nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, "seq", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])


def _out(name):
    return helper.make_empty_tensor_value_info(name)


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("split", [None, np.array(2, np.int64), np.array([1, 3, 2], np.int64)])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_split_to_sequence_and_at(opset, split, keepdims):
    inits = [] if split is None else [numpy_helper.from_array(split, "split")]
    pos = numpy_helper.from_array(np.array(-1, np.int64), "pos")
    first = numpy_helper.from_array(np.array(0, np.int64), "first")
    nodes = [
        helper.make_node("SplitToSequence", ["x"] + ([] if split is None else ["split"]), ["s"],
                         axis=1, keepdims=keepdims),
        helper.make_node("SequenceAt", ["s", "pos"], ["last"]),
        helper.make_node("SequenceAt", ["s", "first"], ["head"]),
        helper.make_node("SequenceLength", ["s"], ["n"]),
    ]
    model = _model(nodes, [X], [_out("last"), _out("head"), _out("n")], inits + [pos, first], opset)
    feeds = {"x": rand(4, 6)}
    ours = run_popart(model, feeds)
    if split is not None and keepdims == 0:
        # ONNX ignores keepdims when split is given; onnxruntime squeezes anyway (and fails on
        # scalar splits), so the reference is the keepdims=1 model.
        next(a for a in model.graph.node[0].attribute if a.name == "keepdims").i = 1
    ref = run_onnxruntime(model, feeds)
    for name in ("last", "head", "n"):
        assert_close(ours[name], ref[name], name)


def test_construct_insert_erase_concat():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("SequenceConstruct", ["x", "r"], ["s"]),
        helper.make_node("SequenceInsert", ["s", "x", "one"], ["s2"]),
        helper.make_node("SequenceErase", ["s2", "zero"], ["s3"]),
        helper.make_node("ConcatFromSequence", ["s3"], ["c"], axis=0),
        helper.make_node("ConcatFromSequence", ["s3"], ["stacked"], axis=1, new_axis=1),
    ]
    inits = [numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array(0, np.int64), "zero")]
    model = _model(nodes, [X], [_out("c"), _out("stacked")], inits)
    feeds = {"x": rand(4, 6)}
    ours, ref = run_popart(model, feeds), run_onnxruntime(model, feeds)
    assert_close(ours["c"], ref["c"])
    assert_close(ours["stacked"], ref["stacked"])


def test_non_constant_position_is_rejected():
    p = helper.make_tensor_value_info("p", TensorProto.INT64, [])
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
             helper.make_node("SequenceAt", ["s", "p"], ["y"])]
    model = _model(nodes, [X, p], [_out("y")])
    with pytest.raises(ShapeError, match="SequenceAt.*must be a constant"):
        run_popart(model, {"x": rand(4, 6), "p": np.array(0, np.int64)})


def test_sequence_graph_output_is_its_elements():
    """A sequence graph output is anchored as its elements s[0], ... (tests/importer/test_sequence_io.py
    runs such models through sessions)."""
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=0)]
    model = _model(nodes, [X], [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)])
    x = rand(4, 6)
    ours = run_popart(model, {"x": x})
    assert sorted(ours) == [f"s[{i}]" for i in range(4)]
    for i in range(4):
        assert_close(ours[f"s[{i}]"], x[i : i + 1])
