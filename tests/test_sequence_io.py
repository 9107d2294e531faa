"""Sequence and optional values as InferenceSession inputs and outputs, the Optional ops,
SequenceMap, If / Loop over sequences, and the preview-training Gradient op (spec F78, F7,
issue #7), against onnxruntime, the ONNX reference implementation and torch.autograd.

Sequence inputs are fed as python lists, absent optionals as None; their lengths and element
shapes come from InputShapeInfo and are static per compiled session.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import popart_backend as popart
from popart_backend.errors import ShapeError, popart_exception
from tests.helpers import assert_close, rand, run_onnxruntime

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=18, extra_opsets=()):
    graph = helper.make_graph(nodes, "seq_io", inputs, outputs, initializer=list(inits))
    opsets = [helper.make_opsetid("", opset), *[helper.make_opsetid(d, v) for d, v in extra_opsets]]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def _seq(name, elem=F, shape=None):
    return helper.make_tensor_sequence_value_info(name, elem, shape)


def _opt_seq(name, elem=F, shape=None):
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, shape))
    return helper.make_value_info(name, helper.make_optional_type_proto(seq))


def _opt_tensor(name, elem=F, shape=None):
    tensor = helper.make_tensor_type_proto(elem, shape)
    return helper.make_value_info(name, helper.make_optional_type_proto(tensor))


def _session(model, shapes: dict, outputs: list[str]):
    """An InferenceSession of ``model``; ``shapes`` is what InputShapeInfo gets per input."""
    info = popart.InputShapeInfo()
    for name, value in shapes.items():
        if value is None:
            info.add(name, None)
        elif isinstance(value, list):
            info.add(name, [popart.TensorInfo(v) for v in value])
        else:
            info.add(name, popart.TensorInfo(value))
    flow = popart.DataFlow(1, {o: popart.AnchorReturnType("All") for o in outputs})
    session = popart.InferenceSession(model.SerializeToString(), flow,
                                      popart.DeviceManager().createCpuDevice(),
                                      inputShapeInfo=info)
    session.prepareDevice()
    return session


def _run(model, feeds: dict, outputs: list[str], shapes: dict | None = None):
    session = _session(model, feeds if shapes is None else shapes, outputs)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, anchors))
    return anchors


def _reference(model, feeds):
    return dict(zip([o.name for o in model.graph.output],
                    ReferenceEvaluator(model).run(None, feeds)))


def _assert_same(ours, expected, name="output"):
    if expected is None:
        assert ours is None, f"{name}: expected None, got {ours!r}"
        return
    if isinstance(expected, list):
        assert isinstance(ours, list) and len(ours) == len(expected), f"{name}: {ours!r}"
        for i, (a, b) in enumerate(zip(ours, expected)):
            assert_close(a, np.asarray(b), f"{name}[{i}]")
        return
    assert_close(ours, np.asarray(expected), name)


def test_sequence_in_and_out_with_insert_and_identity():
    """A list feeds a sequence input (element shapes from InputShapeInfo); a sequence output
    comes back as a list of arrays, anchored in place, run after run."""
    nodes = [helper.make_node("SequenceInsert", ["s", "t"], ["s2"]),
             helper.make_node("Identity", ["s2"], ["out"]),
             helper.make_node("SequenceLength", ["s2"], ["n"])]
    model = _model(nodes, [_seq("s"), helper.make_tensor_value_info("t", F, [3])],
                   [_seq("out"), helper.make_tensor_value_info("n", TensorProto.INT64, [])])
    seq = [rand(2, 3), rand(4), rand(1, 1, 2)]
    feeds = {"s": seq, "t": rand(3)}
    session = _session(model, feeds, ["out", "n"])
    anchors = session.initAnchorArrays()
    assert isinstance(anchors["out"], list) and len(anchors["out"]) == 4
    for step in range(2):
        feeds = {"s": [v + step for v in seq], "t": rand(3)}
        session.run(popart.PyStepIO(feeds, anchors))
        _assert_same(anchors["out"], feeds["s"] + [feeds["t"]], "out")
        assert anchors["n"] == 4


def test_sequence_input_errors_name_the_input():
    model = _model([helper.make_node("Identity", ["s"], ["out"])], [_seq("s")], [_seq("out")])
    with pytest.raises(ShapeError, match="Sequence input 's'.*InputShapeInfo"):
        _session(model, {}, ["out"])
    with pytest.raises(ShapeError, match="holds float tensors"):
        _session(model, {"s": [np.zeros(2, np.int32)]}, ["out"])
    session = _session(model, {"s": [rand(2), rand(3)]}, ["out"])
    anchors = session.initAnchorArrays()
    with pytest.raises(popart_exception, match="compiled with 2 elements.*a list of 3"):
        session.run(popart.PyStepIO({"s": [rand(2), rand(3), rand(1)]}, anchors))


def test_empty_sequence_input():
    nodes = [helper.make_node("SequenceInsert", ["s", "t"], ["out"])]
    model = _model(nodes, [_seq("s"), helper.make_tensor_value_info("t", F, [2])], [_seq("out")])
    t = rand(2)
    anchors = _run(model, {"s": [], "t": t}, ["out"])
    _assert_same(anchors["out"], [t])


@pytest.mark.parametrize("present", [True, False])
def test_optional_sequence_input_and_ops(present):
    """Optional inputs compile present (a list) or absent (None); OptionalHasElement folds to
    that constant, OptionalGetElement / Optional / Identity pass values through."""
    nodes = [helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("Identity", ["o"], ["same"])]
    outputs = [helper.make_tensor_value_info("has", TensorProto.BOOL, []), _opt_seq("same")]
    if present:
        nodes.append(helper.make_node("OptionalGetElement", ["o"], ["got"]))
        outputs.append(_seq("got"))
    model = _model(nodes, [_opt_seq("o")], outputs)
    value = [rand(3), rand(2, 2)] if present else None
    names = [o.name for o in outputs]
    anchors = _run(model, {"o": value}, names)
    # ONNX semantics written out: the reference evaluator cannot pass an empty optional on.
    expected = {"has": np.array(present), "same": value, "got": value}
    for name in names:
        _assert_same(anchors[name], expected[name], name)
    if present:
        theirs = _reference(model, {"o": value})
        for name in names:
            _assert_same(anchors[name], theirs[name], name)


def test_optional_tensor_ops_every_form():
    """Optional(x) / Optional(type) and OptionalHasElement with an empty input name (18+)."""
    empty_type = helper.make_tensor_type_proto(F, [2])
    nodes = [helper.make_node("Optional", ["x"], ["ox"]),
             helper.make_node("Optional", [], ["none"], type=empty_type),
             helper.make_node("OptionalHasElement", ["ox"], ["has_x"]),
             helper.make_node("OptionalHasElement", ["none"], ["has_none"]),
             helper.make_node("OptionalHasElement", [""], ["has_nothing"]),
             helper.make_node("OptionalGetElement", ["ox"], ["y"]),
             helper.make_node("OptionalGetElement", ["x"], ["y2"])]
    b = TensorProto.BOOL
    outputs = [helper.make_tensor_value_info(n, b, []) for n in ("has_x", "has_none",
                                                                 "has_nothing")]
    outputs += [helper.make_tensor_value_info("y", F, [2]),
                helper.make_tensor_value_info("y2", F, [2]), _opt_tensor("none", F, [2])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2])], outputs)
    x = rand(2)
    anchors = _run(model, {"x": x}, [o.name for o in outputs])
    theirs = _reference(model, {"x": x})
    expected = {"has_x": np.array(True), "has_none": np.array(False),
                "has_nothing": np.array(False), "y": x, "y2": x, "none": None}
    for o in outputs:
        _assert_same(anchors[o.name], expected[o.name], o.name)
        if o.name.startswith("has"):
            _assert_same(anchors[o.name], theirs[o.name], o.name)


def test_optional_get_element_of_absent_is_an_error():
    model = _model([helper.make_node("OptionalGetElement", ["o"], ["y"])],
                   [_opt_tensor("o", F, None)], [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(ShapeError, match="OptionalGetElement.*'o' is empty"):
        _session(model, {"o": None}, ["y"])
    model = _model([helper.make_node("Relu", ["o"], ["y"])],
                   [_opt_tensor("o", F, None)], [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(ShapeError, match="Relu.*reads the optional 'o'"):
        _session(model, {"o": None}, ["y"])


def test_optional_tensor_input_present_from_model_shape():
    model = _model([helper.make_node("OptionalGetElement", ["o"], ["y"])],
                   [_opt_tensor("o", F, [4])], [helper.make_tensor_value_info("y", F, [4])])
    x = rand(4)
    anchors = _run(model, {"o": x}, ["y"], shapes={})
    assert_close(anchors["y"], x)


def test_sequence_map_with_a_sequence_and_a_tensor():
    """SequenceMap runs its body per element (inlined), also with a shared tensor input."""
    body = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Shape", ["a"], ["s"])],
        "body", [helper.make_tensor_value_info("a", F, None),
                 helper.make_tensor_value_info("b", F, None)],
        [helper.make_tensor_value_info("c", F, None),
         helper.make_tensor_value_info("s", TensorProto.INT64, None)])
    node = helper.make_node("SequenceMap", ["xs", "t"], ["ys", "shapes"], body=body)
    model = _model([node], [_seq("xs"), helper.make_tensor_value_info("t", F, [3])],
                   [_seq("ys"), _seq("shapes", TensorProto.INT64)])
    feeds = {"xs": [rand(2, 3), rand(3), rand(4, 1, 3)], "t": rand(3)}
    anchors = _run(model, feeds, ["ys", "shapes"])
    expected = _reference(model, feeds)
    _assert_same(anchors["ys"], expected["ys"], "ys")
    _assert_same(anchors["shapes"], expected["shapes"], "shapes")


def _seq_branch(name, values):
    consts = [helper.make_node("Constant", [], [f"{name}_c{i}"],
                               value=numpy_helper.from_array(v, f"{name}_v{i}"))
              for i, v in enumerate(values)]
    build = helper.make_node("SequenceConstruct", [f"{name}_c{i}" for i in range(len(values))],
                             [f"{name}_out"])
    return helper.make_graph(consts + [build], name, [], [_seq(f"{name}_out")])


def test_if_with_sequence_outputs_and_a_computed_condition():
    """Both branches are inlined and each element selected by the runtime condition."""
    a, b = [rand(2), rand(3)], [rand(2), rand(3)]
    node = helper.make_node("If", ["cond"], ["res"], then_branch=_seq_branch("then", a),
                            else_branch=_seq_branch("else", b))
    model = _model([node], [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                   [_seq("res")])
    session = _session(model, {"cond": np.array(True)}, ["res"])
    anchors = session.initAnchorArrays()
    for cond, want in ((True, a), (False, b)):
        session.run(popart.PyStepIO({"cond": np.array(cond)}, anchors))
        _assert_same(anchors["res"], want, f"cond={cond}")
    node = helper.make_node("If", ["cond"], ["res"], then_branch=_seq_branch("then", a),
                            else_branch=_seq_branch("else", b[:1]))
    model = _model([node], [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                   [_seq("res")])
    with pytest.raises(ShapeError, match="If 'res'.*2 and 1 elements"):
        _session(model, {"cond": np.array(True)}, ["res"])


def _loop_model(trip, cond_in_body="Identity"):
    """Loop appending x[:i+1] to a carried sequence, plus a scan output of i (as float)."""
    x = numpy_helper.from_array(np.arange(1, 6, dtype=np.float32), "x")
    body_nodes = [
        helper.make_node(cond_in_body, ["cond_in"], ["cond_out"]),
        helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(
            np.array([1], np.int64), "one_v")),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(
            np.array([0], np.int64), "zero_v")),
        helper.make_node("Unsqueeze", ["i", "zero"], ["i1"]),
        helper.make_node("Add", ["i1", "one"], ["end"]),
        helper.make_node("Slice", ["x", "zero", "end"], ["part"]),
        helper.make_node("SequenceInsert", ["seq_in", "part"], ["seq_out"]),
        helper.make_node("Cast", ["i"], ["scan"], to=F),
    ]
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), _seq("seq_in")],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _seq("seq_out"),
         helper.make_tensor_value_info("scan", F, [])])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
             helper.make_node("Loop", ["M", "cond"], ["res", "scans"], body=body)]
    nodes[1].input.append("empty")
    inits = [x, numpy_helper.from_array(np.array(trip, np.int64), "M"),
             numpy_helper.from_array(np.array(True), "cond")]
    return _model(nodes, [], [_seq("res"), helper.make_tensor_value_info("scans", F, None)],
                  inits, opset=13)


def test_loop_carrying_a_sequence_is_unrolled():
    model = _loop_model(4)
    anchors = _run(model, {}, ["res", "scans"])
    expected = _reference(model, {})
    _assert_same(anchors["res"], expected["res"], "res")
    # Scan outputs stack along a new axis 0 (the reference evaluator adds a trailing 1).
    _assert_same(anchors["scans"], np.arange(4, dtype=np.float32), "scans")
    assert [a.shape for a in anchors["res"]] == [(1,), (2,), (3,), (4,)]


def test_loop_carrying_a_sequence_needs_a_static_condition():
    model = _loop_model(3, cond_in_body="Not")  # stops after one iteration: still static
    anchors = _run(model, {}, ["res", "scans"])
    _assert_same(anchors["res"], _reference(model, {})["res"])
    model.graph.initializer.pop(1)  # M becomes a graph input
    model.graph.input.append(helper.make_tensor_value_info("M", TensorProto.INT64, []))
    with pytest.raises(ShapeError, match="Loop 'res'.*'M' must be a constant"):
        _session(model, {"M": np.array(3, np.int64)}, ["res"])


def test_sequence_io_matches_onnxruntime():
    """A model mixing tensor and sequence IO against onnxruntime (which takes lists too)."""
    nodes = [helper.make_node("SequenceAt", ["s", "one"], ["second"]),
             helper.make_node("Relu", ["second"], ["r"]),
             helper.make_node("SequenceInsert", ["s", "r"], ["out"])]
    inits = [numpy_helper.from_array(np.array(1, np.int64), "one")]
    model = _model(nodes, [_seq("s")], [_seq("out"), helper.make_tensor_value_info("r", F, None)],
                   inits)
    feeds = {"s": [rand(2), rand(3, 2), rand(1)]}
    ours = _run(model, feeds, ["out", "r"])
    theirs = run_onnxruntime(model, feeds)
    _assert_same(ours["out"], theirs["out"], "out")
    assert_close(ours["r"], theirs["r"], "r")


# --- Gradient (ai.onnx.preview.training) ---------------------------------------------------


def _gradient_model(xs, zs, y, nodes, inputs, outputs):
    grads = [f"d_{x}" for x in xs]
    node = helper.make_node("Gradient", xs + zs, grads, domain="ai.onnx.preview.training",
                            xs=xs, zs=zs, y=y) if zs else helper.make_node(
        "Gradient", xs, grads, domain="ai.onnx.preview.training", xs=xs, y=y)
    outputs = outputs + [helper.make_tensor_value_info(g, F, None) for g in grads]
    return _model(nodes + [node], inputs, outputs, opset=18,
                  extra_opsets=[("ai.onnx.preview.training", 1)])


def test_gradient_op_against_torch_autograd():
    """dy/dW and dy/dx of y = ReduceSum(Tanh(MatMul(x, W)) * z), z held fixed (zs), vs torch."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Mul", ["t", "z"], ["m"]),
             helper.make_node("ReduceSum", ["m"], ["y"], keepdims=0)]
    inputs = [helper.make_tensor_value_info("x", F, [2, 3]),
              helper.make_tensor_value_info("W", F, [3, 4]),
              helper.make_tensor_value_info("z", F, [2, 4])]
    model = _gradient_model(["W", "x"], ["z"], "y", nodes, inputs,
                            [helper.make_tensor_value_info("y", F, [])])
    feeds = {"x": rand(2, 3), "W": rand(3, 4), "z": rand(2, 4)}
    ours = _run(model, feeds, ["y", "d_W", "d_x"])
    x, w = (torch.from_numpy(feeds[k]).double().requires_grad_() for k in ("x", "W"))
    y = (torch.tanh(x @ w) * torch.from_numpy(feeds["z"]).double()).sum()
    y.backward()
    assert_close(ours["y"], np.float32(y.item()), "y")
    assert_close(ours["d_W"], w.grad.numpy().astype(np.float32), "dy/dW", rtol=1e-5, atol=1e-6)
    assert_close(ours["d_x"], x.grad.numpy().astype(np.float32), "dy/dx", rtol=1e-5, atol=1e-6)


def test_gradient_op_of_an_unrelated_input_is_zero_and_errors():
    nodes = [helper.make_node("Mul", ["a", "a"], ["y"])]
    inputs = [helper.make_tensor_value_info("a", F, [3]), helper.make_tensor_value_info("b", F, [3])]
    model = _gradient_model(["a", "b"], [], "y", nodes, inputs,
                            [helper.make_tensor_value_info("y", F, [3])])
    feeds = {"a": rand(3), "b": rand(3)}
    ours = _run(model, feeds, ["d_a", "d_b"])
    assert_close(ours["d_a"], 2 * feeds["a"], "d(a*a)/da (summed over y)")
    assert (ours["d_b"] == 0).all()
    model = _gradient_model(["a"], [], "nope", nodes, inputs[:1],
                            [helper.make_tensor_value_info("y", F, [3])])
    with pytest.raises(popart_exception, match="Gradient.*'nope'.*not tensors"):
        _session(model, {"a": rand(3)}, ["d_a"])
