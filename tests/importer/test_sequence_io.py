"""Sequence and optional values as InferenceSession inputs and outputs, the Optional ops,
SequenceMap, If / Loop over sequences, and the preview-training Gradient op (spec F78, F7,
issue #7), against onnxruntime, the ONNX reference implementation and torch.autograd.

Sequence inputs are fed as python lists, absent optionals as None; their lengths and element
shapes come from InputShapeInfo and are static per compiled session. Through a
PyStepIOCallback (F28) a sequence's callbacks take and return one list per micro-batch.
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


def _session(model, shapes: dict, outputs: list[str], bps: int = 1, rf: int = 1):
    """An InferenceSession of ``model``; ``shapes`` is what InputShapeInfo gets per input."""
    info = popart.InputShapeInfo()
    for name, value in shapes.items():
        if value is None:
            info.add(name, None)
        elif isinstance(value, list):
            info.add(name, [popart.TensorInfo(v) for v in value])
        else:
            info.add(name, popart.TensorInfo(value))
    flow = popart.DataFlow(bps, {o: popart.AnchorReturnType("All") for o in outputs})
    options = popart.SessionOptions()
    device = popart.DeviceManager().createCpuDevice()
    if rf > 1:
        options.enableReplicatedGraphs = True
        options.replicatedGraphCount = rf
        device = popart.DeviceManager().createIpuModelDevice({"numIPUs": rf})
    session = popart.InferenceSession(model.SerializeToString(), flow, device,
                                      inputShapeInfo=info, userOptions=options)
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


# --- PyStepIOCallback and multi-batch PyStepIO (F28, F30) -----------------------------------


def _insert_model():
    """out = s + [Relu(t)] (a sequence), r = Relu(t)."""
    nodes = [helper.make_node("Relu", ["t"], ["r"]),
             helper.make_node("SequenceInsert", ["s", "r"], ["out"])]
    return _model(nodes, [_seq("s"), helper.make_tensor_value_info("t", F, [3])],
                  [_seq("out"), helper.make_tensor_value_info("r", F, [3])])


_SHAPES = {"s": [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)],
           "t": np.zeros(3, np.float32)}


def _batches(count, seed):
    """Per micro-batch: the list for s and the array for t."""
    rng = np.random.default_rng(seed)
    seqs = [[rng.standard_normal(a.shape).astype(np.float32) for a in _SHAPES["s"]]
            for _ in range(count)]
    ts = [rng.standard_normal(3).astype(np.float32) for _ in range(count)]
    return seqs, ts


class _Recorder:
    """Callbacks serving one list / array per micro-batch and keeping the output lists."""

    def __init__(self, seqs, ts):
        self.seqs, self.ts = seqs, ts
        self.calls, self.outputs = [], {"out": [], "r": []}

    def input(self, name, prefetch):
        self.calls.append(("in", name))
        served = sum(1 for c in self.calls if c == ("in", name)) - 1
        return (self.seqs if name == "s" else self.ts)[served]

    def input_complete(self, name):
        self.calls.append(("in_done", name))

    def output(self, name):
        self.calls.append(("out", name))
        buffer = ([np.zeros((2, 3), np.float32), np.zeros(4, np.float32),
                   np.zeros(3, np.float32)] if name == "out" else np.zeros(3, np.float32))
        self.outputs[name].append(buffer)
        return buffer

    def output_complete(self, name):
        self.calls.append(("out_done", name))

    def step_io(self):
        return popart.PyStepIOCallback(self.input, self.input_complete, self.output,
                                       self.output_complete)


@pytest.mark.parametrize("rf", [1, 2])
def test_sequence_callbacks_match_pystepio_and_numpy(rf):
    """A sequence input's callback returns one list per micro-batch (per replica), a sequence
    output's callback one list of buffers; complete callbacks follow each; results equal
    PyStepIO's and numpy's, over batchesPerStep = 3 and two runs."""
    bps = 3
    n = bps * rf  # micro-batches per run, in (b, r) order
    seqs, ts = _batches(2 * n, seed=1)
    session = _session(_insert_model(), _SHAPES, ["out", "r"], bps=bps, rf=rf)
    recorder = _Recorder(seqs, ts)
    for _ in range(2):
        session.run(recorder.step_io())
    for k in range(2 * n):
        relu = np.maximum(ts[k], 0)
        _assert_same(recorder.outputs["out"][k], seqs[k] + [relu], f"callback out, batch {k}")
        assert_close(recorder.outputs["r"][k], relu, f"callback r, batch {k}")
    for name, kind in (("s", "in"), ("t", "in"), ("out", "out"), ("r", "out")):
        mine = [c for c in recorder.calls if c[1] == name]
        assert mine == [(kind, name), (f"{kind}_done", name)] * (2 * n), (name, mine)
    # The same data through PyStepIO: one [bps, (rf,) *S] array per element.
    anchors = session.initAnchorArrays()
    for step in range(2):
        part = slice(step * n, (step + 1) * n)
        lead = (bps, rf) if rf > 1 else (bps,)
        feeds = {"s": [np.stack([q[i] for q in seqs[part]]).reshape(*lead, *_SHAPES["s"][i].shape)
                       for i in range(2)],
                 "t": np.stack(ts[part]).reshape(*lead, 3)}
        session.run(popart.PyStepIO(feeds, anchors))
        for k in range(n):
            got = [a.reshape(n, *a.shape[1 + (rf > 1):])[k] for a in anchors["out"]]
            _assert_same(got, recorder.outputs["out"][step * n + k], f"PyStepIO step {step}")


def test_optional_inputs_and_outputs_through_callbacks():
    """A present optional is a tensor (its callback returns an array); an absent optional
    input or output is never called back."""
    nodes = [helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("Identity", ["o"], ["same"]),
             helper.make_node("Neg", ["t"], ["y"])]
    outputs = [helper.make_tensor_value_info("has", TensorProto.BOOL, []), _opt_tensor("same"),
               helper.make_tensor_value_info("y", F, [2])]
    model = _model(nodes, [_opt_tensor("o"), helper.make_tensor_value_info("t", F, [2])],
                   outputs)
    t, o = rand(2), rand(2)
    for present in (True, False):
        shapes = {"o": o if present else None, "t": t}
        session = _session(model, shapes, ["has", "same", "y"])
        calls, got = [], {}

        def output(name, got=got, calls=calls):
            calls.append(name)
            got[name] = np.zeros((2,) if name != "has" else (), np.float32 if name != "has"
                                 else np.bool_)
            return got[name]

        session.run(popart.PyStepIOCallback(
            lambda name, prefetch, calls=calls: calls.append(name) or {"o": o, "t": t}[name],
            lambda name: None, output, lambda name: None))
        expected_calls = ["o", "t", "has", "same", "y"] if present else ["t", "has", "y"]
        assert sorted(calls) == sorted(expected_calls), (present, calls)
        assert got["has"] == np.array(present)
        assert_close(got["y"], -t)
        if present:
            assert_close(got["same"], o)


def test_sequence_callback_errors_name_the_sequence():
    session = _session(_insert_model(), _SHAPES, ["out", "r"])
    good = [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)]
    outputs = {"out": [np.zeros((2, 3), np.float32), np.zeros(4, np.float32),
                       np.zeros(3, np.float32)], "r": np.zeros(3, np.float32)}

    def run(s_value, out_value=None):
        feeds = {"s": s_value, "t": np.zeros(3, np.float32)}
        outs = dict(outputs, out=outputs["out"] if out_value is None else out_value)
        session.run(popart.PyStepIOCallback(lambda name, prefetch: feeds[name],
                                            lambda name: None, lambda name: outs[name],
                                            lambda name: None))

    run(good)
    with pytest.raises(popart_exception, match=r"input_callback\('s'\) returned a list of 3.*"
                                               r"compiled with 2 elements"):
        run(good + [np.zeros(1, np.float32)])
    with pytest.raises(popart_exception, match=r"input_callback\('s'\) returned ndarray"):
        run(good[0])
    with pytest.raises(popart_exception, match=r"'s'\) element 1 has shape \[5\].*\[4\]"):
        run([good[0], np.zeros(5, np.float32)])
    with pytest.raises(popart_exception, match=r"output_callback\('out'\) returned a list of 2"):
        run(good, outputs["out"][:2])
    with pytest.raises(popart_exception, match=r"'out'\) element 2 has shape \[2\]"):
        run(good, outputs["out"][:2] + [np.zeros(2, np.float32)])


def test_sequence_callbacks_in_a_pipeline():
    """Pipelined (Auto virtual graphs, 2 IPUs): list k answers micro-batch k though the
    pipeline fetches ahead of its outputs."""
    nodes = [helper.make_node("SequenceAt", ["s", "zero"], ["e0"]),
             helper.make_node("Relu", ["e0"], ["a"]),
             helper.make_node("SequenceAt", ["s", "one"], ["e1"]),
             helper.make_node("Add", ["a", "e1"], ["y"]),
             helper.make_node("SequenceConstruct", ["a", "y"], ["out"])]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "one")]
    model = _model(nodes, [_seq("s")], [_seq("out")], inits)
    info = popart.InputShapeInfo()
    info.add("s", [popart.TensorInfo("FLOAT", [3])] * 2)
    options = popart.SessionOptions()
    options.enablePipelining = True
    options.virtualGraphMode = popart.VirtualGraphMode.Auto
    bps = 4
    session = popart.InferenceSession(
        model.SerializeToString(), popart.DataFlow(bps, {"out": popart.AnchorReturnType("All")}),
        popart.DeviceManager().createIpuModelDevice({"numIPUs": 2}), inputShapeInfo=info,
        userOptions=options)
    session.prepareDevice()
    seqs, _ = _batches(bps, seed=3)
    seqs = [[q[0][0], q[0][1]] for q in seqs]  # two elements of shape [3]
    recorder = _Recorder(seqs, [])
    recorder.output = lambda name: recorder.outputs["out"].append(
        [np.zeros(3, np.float32), np.zeros(3, np.float32)]) or recorder.outputs["out"][-1]
    session.run(recorder.step_io())
    assert len(recorder.outputs["out"]) == bps
    for k, (got, q) in enumerate(zip(recorder.outputs["out"], seqs)):
        relu = np.maximum(q[0], 0)
        _assert_same(got, [relu, relu + q[1]], f"micro-batch {k}")


def test_element_requests_out_of_order_are_gathered_per_micro_batch():
    """The device may ask for element 0 of later micro-batches before element 1 of earlier
    ones (elements on different pipeline stages): list k still answers the k-th request of
    each element, and completes once every element has completed it."""
    from popart_backend.importer.value_io import ValueIO
    from popart_backend.ir.tensor import TensorInfo

    io = ValueIO(inputs={"s": ["s[0]", "s[1]"]})
    info = TensorInfo.of(np.zeros(1, np.float32))
    lists = [[np.full(1, 10 * k + i, np.float32) for i in range(2)] for k in range(3)]
    calls = []

    def fetch(name, prefetch):
        calls.append(("in", name))
        return lists[sum(1 for c in calls if c[0] == "in") - 1]

    user = popart.PyStepIOCallback(fetch, lambda name: calls.append(("done", name)),
                                   lambda name: None, lambda name: None)
    flat = io.flatten_step_io(user, {"s[0]": info, "s[1]": info})
    order = [("s[0]", 0), ("s[0]", 1), ("s[1]", 0), ("s[0]", 2), ("s[1]", 1), ("s[1]", 2)]
    for tensor_id, k in order:
        assert flat.input_callback(tensor_id, False)[0] == 10 * k + int(tensor_id[2])
        flat.input_complete_callback(tensor_id)
    assert calls == [("in", "s"), ("in", "s"), ("done", "s"), ("in", "s"), ("done", "s"),
                     ("done", "s")]


def test_pystepio_sequence_position_advances_across_runs():
    """Arrays holding several steps (runtime asserts off) are read step after step and wrap,
    for sequence elements exactly as for the plain tensor t, with one PyStepIO over runs."""
    bps, steps = 2, 3
    seqs, ts = _batches(bps * steps, seed=2)
    session = _session(_insert_model(), _SHAPES, ["out", "r"], bps=bps)
    anchors = session.initAnchorArrays()
    feeds = {"s": [np.stack([q[i] for q in seqs]) for i in range(2)], "t": np.stack(ts)}
    stepio = popart.PyStepIO(feeds, anchors)
    stepio.enableRuntimeAsserts(False)
    for run in range(steps + 1):  # the last run wraps to the start
        session.run(stepio)
        for b in range(bps):
            k = (run % steps) * bps + b
            relu = np.maximum(ts[k], 0)
            _assert_same([a[b] for a in anchors["out"]], seqs[k] + [relu], f"run {run}[{b}]")
            assert_close(anchors["r"][b], relu, f"r run {run}[{b}]")


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
    inputs = [helper.make_tensor_value_info("a", F, [3]),
              helper.make_tensor_value_info("b", F, [3])]
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


def test_sequence_ops_keep_their_manual_placement():
    """Sequence nodes annotated with __ipu_number place the ops they become (and the Identities
    that read a sequence output out) on that IPU, so VirtualGraphMode.Manual accepts the model."""
    from onnx import numpy_helper

    def placed(node, ipu):
        node.attribute.append(helper.make_attribute("__ipu_number", ipu))
        return node

    nodes = [placed(helper.make_node("Relu", ["x"], ["r"]), 0),
             placed(helper.make_node("SequenceConstruct", ["r", "x"], ["s"]), 0),
             placed(helper.make_node("SequenceAt", ["s", "one"], ["a"]), 1),
             placed(helper.make_node("Neg", ["a"], ["y"]), 1)]
    element = helper.make_tensor_type_proto(TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_value_info("s", helper.make_sequence_type_proto(element))],
        initializer=[numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    options = popart.SessionOptions()
    options.virtualGraphMode = popart.VirtualGraphMode.Manual
    session = popart.InferenceSession(
        model.SerializeToString(), popart.DataFlow(1, ["y", "s"]),
        popart.DeviceManager().createIpuModelDevice({"numIPUs": 2}), userOptions=options)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    session.run(popart.PyStepIO({"x": x}, anchors))
    np.testing.assert_array_equal(anchors["y"], -x)
    np.testing.assert_array_equal(anchors["s"][0], np.maximum(x, 0))
    np.testing.assert_array_equal(anchors["s"][1], x)
