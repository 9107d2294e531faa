"""If, Loop, Scan and Call (spec F23, §6.1) against onnxruntime; If/Call/Loop/Scan gradients
against torch.autograd; the static-shape errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.errors import ShapeError, UnsupportedOpError, popart_exception
from popart_backend.importer.onnx_model import import_model
from popart_backend.ops.registry import registered_versions
from popart_backend.transforms.autodiff import Autodiff
from tests.helpers import assert_close, rand, run_onnxruntime, run_popart

IF_VERSIONS = [1, 11, 13, 16, 19, 21, 23, 24, 25]
LOOP_VERSIONS = [1, 11, 13, 16, 19, 21, 23, 24, 25]
SCAN_VERSIONS = [9, 11, 16, 19, 21, 23, 24, 25]


def vi(name, elem=TP.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, opset, initializers=()):
    """A model importing ai.onnx ``opset``; version 1 of If/Loop is tested at opset 10, where
    it still applies (opset 1 lacks the ops in the bodies)."""
    opset = 10 if opset == 1 else opset
    graph = helper.make_graph(nodes, "g", inputs, [vi(o) for o in outputs],
                              initializer=list(initializers))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def compare(m, feeds, **kw):
    ours = run_popart(m, feeds, **kw)
    ref = run_onnxruntime(m, feeds)
    for name, value in ref.items():
        assert_close(ours[name], value, name)
    return ours


def test_registered_versions():
    assert registered_versions("If") == IF_VERSIONS
    assert registered_versions("Loop") == LOOP_VERSIONS
    assert registered_versions("Scan") == [8, *SCAN_VERSIONS]


# --- If ----------------------------------------------------------------------------------------


def _if_model(opset, const_cond=None):
    then = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["t0"]), helper.make_node("Relu", ["t0"], ["t"])],
        "then", [], [vi("t")])
    other = helper.make_graph([helper.make_node("Mul", ["x", "y"], ["e"])], "else", [], [vi("e")])
    node = helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other)
    inputs = [vi("x", TP.FLOAT, [2, 3]), vi("y", TP.FLOAT, [2, 3])]
    inits = []
    if const_cond is None:
        inputs.append(vi("c", TP.BOOL, []))
    else:
        inits.append(numpy_helper.from_array(np.array(const_cond), "c"))
    return model([node], inputs, ["out"], opset, inits)


@pytest.mark.parametrize("opset", IF_VERSIONS)
@pytest.mark.parametrize("cond", [True, False])
def test_if_runtime_condition(opset, cond):
    feeds = {"x": rand(2, 3), "y": rand(2, 3), "c": np.array(cond)}
    compare(_if_model(opset), feeds)


@pytest.mark.parametrize("cond", [True, False])
def test_if_constant_condition_folds_to_branch(cond):
    m = _if_model(13, const_cond=cond)
    feeds = {"x": rand(2, 3), "y": rand(2, 3)}
    compare(m, feeds)
    ir = import_model(m)
    assert not list(ir.main.ops_of_type("If"))
    assert len(ir.graphs) == 1


def test_if_branch_shapes_must_agree():
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [], [vi("t")])
    other = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["e"], keepdims=0)], "else", [], [vi("e")])
    m = model([helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other)],
              [vi("x", TP.FLOAT, [2, 3]), vi("c", TP.BOOL, [])], ["out"], 11)
    with pytest.raises(ShapeError, match="If .*branches produce different outputs"):
        import_model(m)


def test_if_nested_reads_grandparent_tensor():
    inner_then = helper.make_graph([helper.make_node("Neg", ["x"], ["it"])], "it", [], [vi("it")])
    inner_else = helper.make_graph([helper.make_node("Abs", ["x"], ["ie"])], "ie", [], [vi("ie")])
    then = helper.make_graph(
        [helper.make_node("If", ["c2"], ["t"], then_branch=inner_then, else_branch=inner_else)],
        "then", [], [vi("t")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [vi("e")])
    m = model([helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other)],
              [vi("x", TP.FLOAT, [4]), vi("c", TP.BOOL, []), vi("c2", TP.BOOL, [])], ["out"], 13)
    for c, c2 in [(True, True), (True, False), (False, True)]:
        compare(m, {"x": rand(4), "c": np.array(c), "c2": np.array(c2)})
    op = next(iter(import_model(m).main.ops_of_type("If")))
    assert [t.id for t in op.inputs] == ["c", "c2", "x"]  # captured reads are op inputs


# --- gradients (If, Call) ---------------------------------------------------------------------


def grads_of(m, feeds, weights, outputs):
    """Our gradients of sum_k R_k * out_k w.r.t. ``weights`` (initializers), R_k seeded."""
    ir = import_model(m, constant_weights=False)
    rng = np.random.default_rng(1)
    seeds = {o: rng.uniform(-1, 1, ir.main.tensors[o].info.shape).astype(np.float32)
             for o in outputs}
    autodiff = Autodiff(None, output_grads=seeds)
    autodiff.run(ir)
    ids = {w: autodiff.variable_grads[w] for w in weights}
    plan = ExecutionPlan(ir.main, keep=list(ids.values()))
    for name in plan.stream_ids:
        plan.set_value(name, to_torch(feeds[name]))
    plan.execute()
    return {w: plan.get_value(g).numpy() for w, g in ids.items()}, seeds


@pytest.mark.parametrize("cond", [True, False])
def test_if_gradient(cond):
    then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t0"]), helper.make_node("Tanh", ["t0"], ["t"]),
         helper.make_node("Mul", ["t", "t"], ["t2"])],
        "then", [], [vi("t"), vi("t2")])
    other = helper.make_graph(
        [helper.make_node("Mul", ["x", "v"], ["e"]), helper.make_node("Sigmoid", ["e"], ["e2"])],
        "else", [], [vi("e"), vi("e2")])
    node = helper.make_node("If", ["c"], ["o1", "o2"], then_branch=then, else_branch=other)
    w, v = rand(3, 3, seed=2), rand(2, 3, seed=3)
    m = model([node], [vi("x", TP.FLOAT, [2, 3]), vi("c", TP.BOOL, [])], ["o1", "o2"], 13,
              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(v, "v")])
    feeds = {"x": rand(2, 3, seed=4), "c": np.array(cond)}
    ours, seeds = grads_of(m, feeds, ["w", "v"], ["o1", "o2"])
    tw = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    tv = torch.tensor(v, dtype=torch.float64, requires_grad=True)
    x = torch.tensor(feeds["x"], dtype=torch.float64)
    if cond:
        o1 = torch.tanh(x @ tw)
        o2 = o1 * o1
    else:
        o1 = x * tv
        o2 = torch.sigmoid(o1)
    total = (o1 * torch.from_numpy(seeds["o1"]).double()).sum() + (
        o2 * torch.from_numpy(seeds["o2"]).double()).sum()
    total.backward()
    for name, leaf in [("w", tw), ("v", tv)]:
        expected = leaf.grad.numpy() if leaf.grad is not None else np.zeros(leaf.shape)
        assert_close(ours[name], expected.astype(np.float32), f"d{name}", rtol=1e-4, atol=1e-5)


def _call_model(callee_nodes, callee_inputs, callee_outputs, args, inputs, outputs, inits):
    callee = helper.make_graph(callee_nodes, "callee", callee_inputs, [vi(o) for o in callee_outputs])
    node = helper.make_node("Call", args, outputs, domain="ai.graphcore", callee=callee)
    graph = helper.make_graph([node], "g", inputs, [vi(o) for o in outputs], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                   helper.make_opsetid("ai.graphcore", 1)])


def test_call_forward_and_gradient():
    w = rand(3, 4, seed=5)
    m = _call_model(
        [helper.make_node("MatMul", ["a", "b"], ["ab"]), helper.make_node("Mul", ["ab", "s"], ["r"])],
        [vi("a", TP.FLOAT, [2, 3]), vi("b", TP.FLOAT, [3, 4])], ["r"],
        ["x", "w"], [vi("x", TP.FLOAT, [2, 3]), vi("s", TP.FLOAT, [2, 4])], ["out"],
        [numpy_helper.from_array(w, "w")])
    feeds = {"x": rand(2, 3, seed=6), "s": rand(2, 4, seed=7)}
    out = run_popart(m, feeds)["out"]
    assert_close(out, (feeds["x"] @ w) * feeds["s"], "call", rtol=1e-5, atol=1e-6)
    ours, seeds = grads_of(m, feeds, ["w"], ["out"])
    expected = feeds["x"].T @ (seeds["out"] * feeds["s"])
    assert_close(ours["w"], expected, "dw", rtol=1e-4, atol=1e-5)


# --- Loop --------------------------------------------------------------------------------------


def _loop_body(cond_node):
    nodes = [
        helper.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
        helper.make_node("Add", ["a_in", "fi"], ["a1"]),
        helper.make_node("Mul", ["a1", "w"], ["a_out"]),
        helper.make_node("ReduceSum", ["a_out"], ["total"], keepdims=0),
        cond_node,
        helper.make_node("Identity", ["a_out"], ["scan"]),
    ]
    return helper.make_graph(
        nodes, "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("a_in", TP.FLOAT, [3])],
        [vi("cond_out", TP.BOOL, []), vi("a_out", TP.FLOAT, [3]), vi("scan", TP.FLOAT, [3])])


@pytest.mark.parametrize("opset", LOOP_VERSIONS)
def test_loop_constant_trip_count_with_scan_output(opset):
    body = _loop_body(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    m = model([helper.make_node("Loop", ["M", "cond", "a0"], ["af", "sc"], body=body)],
              [vi("a0", TP.FLOAT, [3]), vi("w", TP.FLOAT, [3])], ["af", "sc"], opset,
              [numpy_helper.from_array(np.array(4, np.int64), "M"),
               numpy_helper.from_array(np.array(True), "cond")])
    ours = compare(m, {"a0": rand(3), "w": rand(3)})
    assert ours["sc"].shape == (4, 3)


def test_loop_data_dependent_condition_carried_only():
    # while sum(a) < 20 and i < 50: a = (a + i) * w, with a runtime trip count M.
    body = _loop_body(helper.make_node("Less", ["total", "limit"], ["cond_out"]))
    body.output.pop()  # no scan output
    limit = numpy_helper.from_array(np.array(20.0, np.float32), "limit")
    m = model([helper.make_node("Loop", ["M", "", "a0"], ["af"], body=body)],
              [vi("a0", TP.FLOAT, [3]), vi("w", TP.FLOAT, [3]), vi("M", TP.INT64, [])], ["af"], 13,
              [limit])
    compare(m, {"a0": np.ones(3, np.float32), "w": np.full(3, 1.5, np.float32),
                "M": np.array(50, np.int64)})


def test_loop_scan_outputs_need_static_trip_count():
    body = _loop_body(helper.make_node("Less", ["total", "limit"], ["cond_out"]))
    m = model([helper.make_node("Loop", ["M", "", "a0"], ["af", "sc"], body=body)],
              [vi("a0", TP.FLOAT, [3]), vi("w", TP.FLOAT, [3])], ["af", "sc"], 13,
              [numpy_helper.from_array(np.array(3, np.int64), "M"),
               numpy_helper.from_array(np.array(20.0, np.float32), "limit")])
    with pytest.raises(UnsupportedOpError, match="Loop .*body computes its condition"):
        import_model(m)


def test_loop_carried_shape_must_not_change():
    body = helper.make_graph(
        [helper.make_node("Concat", ["a_in", "a_in"], ["a_out"], axis=0),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("a_in", TP.FLOAT, [3])],
        [vi("cond_out", TP.BOOL, []), vi("a_out")])
    m = model([helper.make_node("Loop", ["M", "", "a0"], ["af"], body=body)],
              [vi("a0", TP.FLOAT, [3])], ["af"], 13,
              [numpy_helper.from_array(np.array(3, np.int64), "M")])
    with pytest.raises(ShapeError, match="carried value 0 is f32\\[3\\] before"):
        import_model(m)


@pytest.mark.parametrize("trips", [0, 1, 3])
def test_loop_gradient(trips):
    """Loop's unrolled gradient w.r.t. its initial carried value and a captured weight, for the
    final carried value and the scan output, against torch.autograd of the same loop."""
    body = _loop_body(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    a0, w = rand(3, seed=8), rand(3, seed=9)
    m = model([helper.make_node("Loop", ["M", "", "a0"], ["af", "sc"], body=body)],
              [vi("x", TP.FLOAT, [1])], ["af", "sc"], 13,
              [numpy_helper.from_array(np.array(trips, np.int64), "M"),
               numpy_helper.from_array(a0, "a0"), numpy_helper.from_array(w, "w")])
    ours, seeds = grads_of(m, {"x": rand(1)}, ["a0", "w"], ["af", "sc"])
    ta = torch.tensor(a0, dtype=torch.float64, requires_grad=True)
    tw = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    a, scans = ta, []
    for i in range(trips):
        a = (a + i) * tw
        scans.append(a)
    total = (a * torch.from_numpy(seeds["af"]).double()).sum()
    if scans:
        total = total + (torch.stack(scans) * torch.from_numpy(seeds["sc"]).double()).sum()
        total.backward()
    for name, leaf in [("a0", ta), ("w", tw)]:
        if leaf.grad is None:  # zero iterations: af = a0, nothing reaches w
            expected = seeds["af"] if name == "a0" else np.zeros(3)
        else:
            expected = leaf.grad.numpy()
        assert_close(ours[name], expected.astype(np.float32), f"d{name}", rtol=1e-4, atol=1e-5)


def test_loop_gradient_needs_static_trip_count():
    body = _loop_body(helper.make_node("Less", ["total", "limit"], ["cond_out"]))
    body.output.pop()  # no scan output
    m = model([helper.make_node("Loop", ["M", "", "a0"], ["af"], body=body)],
              [vi("a0", TP.FLOAT, [3])], ["af"], 13,
              [numpy_helper.from_array(np.array(2, np.int64), "M"),
               numpy_helper.from_array(np.array(20.0, np.float32), "limit"),
               numpy_helper.from_array(rand(3), "w")])
    with pytest.raises(UnsupportedOpError, match="Loop .*its gradient .*body computes its "
                                                 "condition"):
        grads_of(m, {"a0": rand(3)}, ["w"], ["af"])


# --- Scan --------------------------------------------------------------------------------------


def _scan_body(num_states=1):
    # state s [2]; slices x [2], y [2]: s' = s + x * y; outputs (s', s' * 2, x - y)
    nodes = [
        helper.make_node("Mul", ["x", "y"], ["xy"]),
        helper.make_node("Add", ["s", "xy"], ["s_out"]),
        helper.make_node("Add", ["s_out", "s_out"], ["o1"]),
        helper.make_node("Sub", ["x", "y"], ["o2"]),
    ]
    return helper.make_graph(
        nodes, "body", [vi("s", TP.FLOAT, [2]), vi("x", TP.FLOAT, [2]), vi("y", TP.FLOAT, [2])],
        [vi("s_out", TP.FLOAT, [2]), vi("o1"), vi("o2")])


@pytest.mark.parametrize("opset", SCAN_VERSIONS)
@pytest.mark.parametrize("attrs", [
    {},
    {"scan_input_directions": [1, 0], "scan_output_directions": [0, 1]},
    {"scan_input_axes": [1, 0], "scan_output_axes": [1, 0]},
    {"scan_input_axes": [-1, 0], "scan_output_axes": [-1, 0], "scan_input_directions": [0, 1]},
])
def test_scan_9_and_later(opset, attrs):
    if opset < 11 and any(a < 0 for a in attrs.get("scan_input_axes", [])):
        pytest.skip("negative axes arrived in Scan-11")
    axes = attrs.get("scan_input_axes", [0, 0])
    x = rand(4, 2) if axes[0] == 0 else rand(2, 4)
    m = model([helper.make_node("Scan", ["s0", "x", "y"], ["sf", "o1", "o2"], body=_scan_body(),
                                num_scan_inputs=2, **attrs)],
              [vi("s0", TP.FLOAT, [2]), vi("x", TP.FLOAT, list(x.shape)), vi("y", TP.FLOAT, [4, 2])],
              ["sf", "o1", "o2"], opset)
    compare(m, {"s0": rand(2), "x": x, "y": rand(4, 2)})


@pytest.mark.parametrize("with_lens", [False, True])
@pytest.mark.parametrize("directions", [[0, 0], [1, 0]])
def test_scan_8_batched(with_lens, directions):
    node = helper.make_node("Scan", ["lens" if with_lens else "", "s0", "x", "y"],
                            ["sf", "o1", "o2"], body=_scan_body(), num_scan_inputs=2,
                            directions=directions)
    inputs = [vi("s0", TP.FLOAT, [3, 2]), vi("x", TP.FLOAT, [3, 4, 2]), vi("y", TP.FLOAT, [3, 4, 2])]
    feeds = {"s0": rand(3, 2), "x": rand(3, 4, 2), "y": rand(3, 4, 2)}
    if with_lens:
        inputs.append(vi("lens", TP.INT64, [3]))
        feeds["lens"] = np.array([4, 2, 3], np.int64)
    compare(model([node], inputs, ["sf", "o1", "o2"], 8), feeds)


def test_scan_sequence_lengths_must_agree():
    m = model([helper.make_node("Scan", ["s0", "x", "y"], ["sf", "o1", "o2"], body=_scan_body(),
                                num_scan_inputs=2)],
              [vi("s0", TP.FLOAT, [2]), vi("x", TP.FLOAT, [4, 2]), vi("y", TP.FLOAT, [3, 2])],
              ["sf", "o1", "o2"], 11)
    with pytest.raises(ShapeError, match="Scan .*different sequence lengths"):
        import_model(m)


def test_scan_8_is_not_differentiable():
    node = helper.make_node("Scan", ["", "s0", "x", "y"], ["sf", "o1", "o2"], body=_scan_body(),
                            num_scan_inputs=2)
    m = model([node], [vi("d", TP.FLOAT, [1])], ["sf"], 8,
              [numpy_helper.from_array(v, k) for k, v in
               [("s0", rand(3, 2)), ("x", rand(3, 4, 2)), ("y", rand(3, 4, 2))]])
    with pytest.raises(popart_exception, match="Scan-8 .*not differentiable.*opset 9"):
        grads_of(m, {"d": rand(1)}, ["s0"], ["sf"])


def test_scan_reads_outer_weight_and_its_gradient():
    body = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node("Add", ["s", "xw"], ["s_out"])],
        "body", [vi("s", TP.FLOAT, [2]), vi("x", TP.FLOAT, [2])], [vi("s_out", TP.FLOAT, [2])])
    m = model([helper.make_node("Scan", ["s0", "x"], ["sf"], body=body, num_scan_inputs=1)],
              [vi("s0", TP.FLOAT, [2]), vi("x", TP.FLOAT, [5, 2])], ["sf"], 11,
              [numpy_helper.from_array(rand(2), "w")])
    feeds = {"s0": rand(2), "x": rand(5, 2)}
    compare(m, feeds)
    ours, seeds = grads_of(m, feeds, ["w"], ["sf"])
    # sf = s0 + sum_t x_t * w, so dsf/dw = sum_t x_t.
    assert_close(ours["w"], seeds["sf"] * feeds["x"].sum(0), "dw", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [
    {},
    {"scan_input_directions": [1, 0], "scan_output_directions": [0, 1]},
    {"scan_input_axes": [1, 0], "scan_output_axes": [1, 0]},
])
def test_scan_gradient(attrs):
    """Scan-9+'s unrolled gradient w.r.t. its initial state and both scan inputs, for the final
    state and both scan outputs, against torch.autograd of the same iteration."""
    axes = attrs.get("scan_input_axes", [0, 0])
    s0, y = rand(2, seed=10), rand(4, 2, seed=11)
    x = rand(4, 2, seed=12) if axes[0] == 0 else rand(2, 4, seed=12)
    m = model([helper.make_node("Scan", ["s0", "x", "y"], ["sf", "o1", "o2"], body=_scan_body(),
                                num_scan_inputs=2, **attrs)],
              [vi("d", TP.FLOAT, [1])], ["sf", "o1", "o2"], 16,
              [numpy_helper.from_array(v, k) for k, v in [("s0", s0), ("x", x), ("y", y)]])
    ours, seeds = grads_of(m, {"d": rand(1)}, ["s0", "x", "y"], ["sf", "o1", "o2"])
    leaves = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
              for k, v in [("s0", s0), ("x", x), ("y", y)]}
    in_dirs = attrs.get("scan_input_directions", [0, 0])
    out_dirs = attrs.get("scan_output_directions", [0, 0])
    out_axes = attrs.get("scan_output_axes", [0, 0])
    xs = leaves["x"] if axes[0] == 0 else leaves["x"].T
    xs = xs.flip(0) if in_dirs[0] else xs
    ys = leaves["y"].flip(0) if in_dirs[1] else leaves["y"]
    s, o1, o2 = leaves["s0"], [], []
    for t in range(4):
        s = s + xs[t] * ys[t]
        o1.append(s + s)
        o2.append(xs[t] - ys[t])
    outs = {"sf": s}
    for name, values, direction, axis in [("o1", o1, out_dirs[0], out_axes[0]),
                                          ("o2", o2, out_dirs[1], out_axes[1])]:
        stacked = torch.stack(values)
        stacked = stacked.flip(0) if direction else stacked
        outs[name] = stacked.movedim(0, axis)
    total = sum((v * torch.from_numpy(seeds[k]).double()).sum() for k, v in outs.items())
    total.backward()
    for name, leaf in leaves.items():
        assert_close(ours[name], leaf.grad.numpy().astype(np.float32), f"d{name}", rtol=1e-4,
                     atol=1e-5)


def test_loop_inside_scan_body_and_printing():
    # Scan body runs a 2-step Loop over its state: nested bodies and captured tensors.
    loop_body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "x"], ["v_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "lb", [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []), vi("v_in", TP.FLOAT, [2])],
        [vi("c_out", TP.BOOL, []), vi("v_out", TP.FLOAT, [2])])
    body = helper.make_graph(
        [helper.make_node("Loop", ["two", "", "s"], ["s_out"], body=loop_body)],
        "body", [vi("s", TP.FLOAT, [2]), vi("x", TP.FLOAT, [2])], [vi("s_out", TP.FLOAT, [2])],
        initializer=[numpy_helper.from_array(np.array(2, np.int64), "two")])
    m = model([helper.make_node("Scan", ["s0", "xs"], ["sf"], body=body, num_scan_inputs=1)],
              [vi("s0", TP.FLOAT, [2]), vi("xs", TP.FLOAT, [3, 2])], ["sf"], 13)
    compare(m, {"s0": rand(2), "xs": rand(3, 2)})
    from popart_backend.ir.printer import format_graph

    text = format_graph(import_model(m).main)
    assert "sf = Scan(s0, xs, body='maingraph/" in text
