"""The static memory plan (device/arena.py): op outputs placed in per-dtype arenas by liveness,
written by the ops' into-kernels (``Op.kernel_into``), allocated once and reused every step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch.profiler import ProfilerActivity, profile

import popart_backend as popart
from popart_backend.device import arena
from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.importer.onnx_model import import_model

N = 24  # elements of each tensor of the chain models


def _chain_model(nodes, inits=()):
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _plan(model, x):
    ir = import_model(model, constant_weights=False)
    plan = ExecutionPlan(ir.main, keep=["y"])
    plan.set_value("x", to_torch(x))
    return plan


def _storage(plan, tensor_id):
    return plan.values[plan.buffer_slots[plan.slot[tensor_id]]].data_ptr()


def test_non_overlapping_intermediates_share_storage_overlapping_ones_do_not():
    """x -> Relu a -> Sigmoid b -> Tanh c -> Relu d -> y = d + x: a lives over [0, 1], b over
    [1, 2], c over [2, 3]. a and c may share bytes, a and b, b and c may not."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["b"]),
             helper.make_node("Tanh", ["b"], ["c"]), helper.make_node("Relu", ["c"], ["d"]),
             helper.make_node("Add", ["d", "x"], ["y"])]
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    plan = _plan(_chain_model(nodes), x)
    assert {"a", "b", "c", "d"} <= {t for t, s in plan.slot.items() if s in plan.buffer_slots}
    assert "y" not in plan.slot or plan.slot["y"] not in plan.buffer_slots  # kept: fresh
    assert _storage(plan, "a") == _storage(plan, "c")
    assert _storage(plan, "b") == _storage(plan, "d")
    assert _storage(plan, "a") != _storage(plan, "b")
    assert plan.arena.sizes[torch.float32] < 4 * N  # two live buffers, not four
    for _ in range(2):  # the second run reuses the buffers the first one wrote
        plan.execute()
        t = torch.from_numpy(x)
        expected = torch.relu(torch.tanh(torch.sigmoid(torch.relu(t)))) + t
        torch.testing.assert_close(plan.get_value("y"), expected, rtol=0, atol=0)


def test_a_buffer_is_not_reused_while_a_view_of_it_is_alive():
    """a = Relu(x) is read only by a Reshape (a view), whose output r is read last: a's bytes
    stay a's until then, so b and c (made meanwhile) get other bytes."""
    shape = np.array([4, 6], np.int64)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "s"], ["r"]),
             helper.make_node("Sigmoid", ["x"], ["b"]), helper.make_node("Tanh", ["b"], ["c"]),
             helper.make_node("Add", ["c", "r"], ["y"])]
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    plan = _plan(_chain_model(nodes, [("s", shape)]), x)
    a = plan.slot["a"]
    assert a in plan.buffer_slots and plan.slot["r"] not in plan.buffer_slots
    end = plan.arena.buffers[a].end
    reader = max(i for i, step in enumerate(plan.steps) if plan.slot["r"] in step[1])
    assert end == reader
    assert _storage(plan, "a") not in {_storage(plan, "b"), _storage(plan, "c")}
    plan.execute()
    t = torch.from_numpy(x)
    torch.testing.assert_close(plan.get_value("y"), torch.tanh(torch.sigmoid(t)) + torch.relu(t),
                               rtol=0, atol=0)


def test_kept_tensors_and_their_views_get_no_buffer():
    """y is an anchor (kept) and a view v of an intermediate is kept too: neither y nor the
    viewed intermediate may be overwritten by a later step."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "s"], ["v"]),
             helper.make_node("Tanh", ["x"], ["y"])]
    model = _chain_model(nodes, [("s", np.array([4, 6], np.int64))])
    ir = import_model(model, constant_weights=False)
    plan = ExecutionPlan(ir.main, keep=["y", "v"])
    assert not plan.buffer_slots


# --- a small MLP trained for 10 steps --------------------------------------------------------

B, IN, H, OUT = 16, 32, 64, 4


def _params():
    rng = np.random.default_rng(0)
    return {"w1": rng.standard_normal((IN, H)).astype(np.float32) * 0.3,
            "b1": rng.standard_normal(H).astype(np.float32) * 0.1,
            "w2": rng.standard_normal((H, H)).astype(np.float32) * 0.3,
            "b2": rng.standard_normal(H).astype(np.float32) * 0.1,
            "w3": rng.standard_normal((H, OUT)).astype(np.float32) * 0.3,
            "b3": rng.standard_normal(OUT).astype(np.float32) * 0.1}


def _mlp_session():
    """loss = 0.5 · mean|tanh(relu(x·w1 + b1)·w2 + b2)·w3 + b3|, SGD with momentum."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a0"]),
             helper.make_node("Add", ["a0", "b1"], ["a1"]), helper.make_node("Relu", ["a1"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["h0"]),
             helper.make_node("Add", ["h0", "b2"], ["h1"]), helper.make_node("Tanh", ["h1"], ["h"]),
             helper.make_node("MatMul", ["h", "w3"], ["y0"]),
             helper.make_node("Add", ["y0", "b3"], ["y"]),
             helper.make_node("L1", ["y"], ["loss"], domain="ai.graphcore", reduction=1,
                              **{"lambda": 0.5})]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, IN])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(v, k) for k, v in _params().items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("ai.graphcore", 1)])
    model.ir_version = 8
    session = popart.TrainingSession(
        model, popart.DataFlow(1, {"loss": popart.AnchorReturnType("All")}), "loss",
        popart.SGD({"defaultLearningRate": (0.05, False), "defaultMomentum": (0.9, False)}),
        popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    return session


def _torch_loss(x):
    p = {k: torch.from_numpy(v) for k, v in _params().items()}
    h = torch.tanh(torch.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])
    return 0.5 * (h @ p["w3"] + p["b3"]).abs().mean()


def _allocations(prof) -> int:
    """CPU allocations in a profile: memory events with no allocating child (an allocation
    shows in every enclosing op's inclusive usage too)."""
    allocating = [e for e in prof.events() if e.cpu_memory_usage > 0]
    parents = {id(e.cpu_parent) for e in allocating if e.cpu_parent is not None}
    return sum(id(e) not in parents for e in allocating)


def _train(use_arena: bool):
    """(loss per step, final weights, allocations over steps 2..11, arena buffers)."""
    previous = arena.enabled
    arena.enabled = use_arena
    try:
        session = _mlp_session()
    finally:
        arena.enabled = previous
    x = np.random.default_rng(2).standard_normal((B, IN)).astype(np.float32)
    anchors = session.initAnchorArrays()
    io = popart.PyStepIO({"x": x}, anchors)
    losses = []
    session.run(io)  # the first step touches the arena's pages
    losses.append(float(anchors["loss"]))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(10):
            session.run(io)
            losses.append(float(anchors["loss"]))
    plan = session._device.plan
    weights = {k: plan.get_value(k).clone() for k in _params()}
    return losses, weights, _allocations(prof), len(plan.arena.buffers), x


@pytest.fixture(scope="module")
def trained():
    return _train(True), _train(False)


def test_training_results_identical_with_and_without_the_arena(trained):
    (on_losses, on_weights, _, buffers, x), (off_losses, off_weights, *_rest) = trained
    assert buffers > 0
    torch.testing.assert_close(torch.tensor(on_losses[0]), _torch_loss(torch.from_numpy(x)),
                               rtol=1e-6, atol=1e-6)
    assert on_losses == off_losses  # bit-identical
    for name in on_weights:
        assert torch.equal(on_weights[name], off_weights[name]), name
    assert on_losses[-1] < on_losses[0]


def test_steady_state_training_steps_allocate_only_in_kernels_without_out(trained):
    """Ten steps after the first: with the arena, every forward product, bias, ReLU, Tanh and
    every gradient product, bias sum, ReLU and Tanh gradient writes into its arena buffer.
    What still allocates, per step, is what has no into-kernel: the L1 loss (abs, mean and its
    scalar division, the multiply by lambda) and its gradient (sign, two multiplies with their
    scalar casts), and a couple of blocks outside any op (the profiler's unattributed
    ``[memory]`` events). SGD's updates write in place (one fused call at the end of the run,
device/update_tail.py)."""
    (_, _, on, buffers, _), (_, _, off, *_rest) = trained
    steps = 10
    # Each buffer saves its output's allocation every step (measured: exactly that, 9 per
    # step left of 23); slack for the profiler's unattributed blocks.
    assert on <= off - steps * (buffers - 2)
    assert on * 2 < off
    assert on / steps <= 12


def test_fused_sgd_tail_updates_every_weight_in_place_without_allocating():
    session = _mlp_session()
    assert session._device._tail is not None and len(session._device._tail.steps) == 6
    io = popart.PyStepIO({"x": np.ones((B, IN), np.float32)}, session.initAnchorArrays())
    session.run(io)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(3):
            session.run(io)
    fused = [e for e in prof.events() if e.name == "aten::_fused_sgd_"]
    assert len(fused) == 3  # one call per step for all six weights
    assert all(e.cpu_memory_usage <= 0 for e in fused)


# --- every into-kernel against its kernel ------------------------------------------------------

def _f(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


INTO_CASES = [
    ("MatMul", [_f(5, 7), _f(7, 3, seed=1)], {}, {}),
    ("MatMul", [_f(2, 5, 7), _f(7, 3, seed=1)], {}, {}),
    ("MatMul", [_f(2, 1, 5, 7), _f(3, 7, 4, seed=1)], {}, {}),
    ("Gemm", [_f(5, 7), _f(3, 7, seed=1), _f(3, seed=2)], {"transB": 1}, {}),
    ("Gemm", [_f(7, 5), _f(7, 3, seed=1), _f(5, 3, seed=2)],
     {"transA": 1, "alpha": 0.5, "beta": 2.0}, {}),
    ("Gemm", [_f(5, 7), _f(7, 3, seed=1)], {"alpha": 3.0}, {}),
    ("Add", [_f(4, 6), _f(6, seed=1)], {}, {}),
    ("Sub", [_f(4, 6), _f(4, 1, seed=1)], {}, {}),
    ("Mul", [_f(4, 6), _f(4, 6, seed=1)], {}, {}),
    ("Div", [_f(4, 6), _f(6, seed=1) + 3], {}, {}),
    ("Div", [np.arange(-12, 12, dtype=np.int32).reshape(4, 6), np.full(6, 5, np.int32)], {}, {}),
    ("Sum", [_f(4, 6), _f(4, 6, seed=1)], {}, {}),
    ("Sum", [_f(4, 6), _f(4, 6, seed=1), _f(6, seed=2)], {}, {}),
    ("Relu", [_f(4, 6)], {}, {}),
    ("Sigmoid", [_f(4, 6)], {}, {}),
    ("Tanh", [_f(4, 6)], {}, {}),
    ("Gelu", [_f(4, 6)], {"approximate": "tanh"}, {"opset": 20}),
    ("ReduceSum", [_f(4, 6, 3), np.array([0, 2], np.int64)], {"keepdims": 0}, {"const": [1]}),
    ("ReduceMean", [_f(4, 6, 3)], {"axes": [1]}, {}),
    # Integer index inputs do not keep a float output out of the arena.
    ("Gather", [_f(7, 5), np.array([[3, -1, 0], [6, 6, 2]], np.int64)], {"axis": 0}, {}),
    ("Gather", [_f(4, 7, 2), np.array([1, 5, -7], np.int32)], {"axis": 1}, {}),
    ("Concat", [_f(4, 2, 3), _f(4, 5, 3, seed=1), _f(4, 1, 3, seed=2)], {"axis": 1}, {}),
    ("Softmax", [_f(4, 6, 3)], {"axis": 1}, {}),
    ("Softmax", [_f(4, 6, 3)], {"axis": 1}, {"opset": 11}),  # coerced to 2-D
    ("LogSoftmax", [_f(4, 6)], {"axis": -1}, {}),
    # Scratch kernels (Op.scratch_infos): a 0-d factor / count instead of a wrapped scalar.
    ("Scale", [_f(4, 6)], {"scale": -0.37}, {"domain": "ai.graphcore"}),
    ("ReduceMean", [_f(4, 6, 5)], {"axes": [0, 2], "keepdims": 0}, {}),
    ("Gather", [_f(7, 5), np.array([[3, 1, 0], [6, 6, 2]], np.int64)], {"axis": 0}, {}),
    # Without a negative index the into-kernels use the indices as they are.
    ("GatherGrad", [_f(2, 3, 5), np.array([[3, -1, 0], [6, 6, 2]], np.int64)],
     {"axis": 0, "shape": [7, 5]}, {"domain": "ai.graphcore"}),
    ("GatherGrad", [_f(4, 3, 2), np.array([1, 5, 1], np.int32)],
     {"axis": 1, "shape": [4, 7, 2]}, {"domain": "ai.graphcore"}),
]


@pytest.mark.parametrize("op_type, inputs, attrs, extra", INTO_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(INTO_CASES)])
def test_into_kernel_matches_the_kernel_bit_for_bit(op_type, inputs, attrs, extra):
    """op -> t -> Neg -> y: t lives in the arena; the results with and without it must be
    equal bit for bit, and equal to the op's numpy/torch reference."""
    opset = extra.get("opset", 13)
    const = extra.get("const", [])
    names = [f"in{i}" for i in range(len(inputs))]
    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
             np.dtype(np.int64): TensorProto.INT64}
    node = helper.make_node(op_type, names, ["t"], domain=extra.get("domain", ""), **attrs)
    graph = helper.make_graph(
        [node, helper.make_node("Neg", ["t"], ["y"])], "one",
        [helper.make_tensor_value_info(n, types[v.dtype], v.shape)
         for i, (n, v) in enumerate(zip(names, inputs)) if i not in const],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        initializer=[numpy_helper.from_array(v, n) for i, (n, v) in enumerate(zip(names, inputs))
                     if i in const])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("ai.graphcore", 1)])
    model.ir_version = 8
    results = []
    for use_arena in (True, False):
        previous, arena.enabled = arena.enabled, use_arena
        try:
            ir = import_model(model, constant_weights=False)
            plan = ExecutionPlan(ir.main, keep=["y"])
        finally:
            arena.enabled = previous
        assert bool(plan.buffer_slots) == use_arena
        for i, (n, v) in enumerate(zip(names, inputs)):
            if i not in const:
                plan.set_value(n, to_torch(v))
        plan.execute()
        plan.execute()  # the second run writes into the buffer the first one left
        if use_arena:  # the into-kernel wrote into its buffer (no silent fallback)
            fn, ins, *_rest = next(s for s in plan.steps if s[5].op_type == op_type)
            written = fn(*[plan.values[i] if i >= 0 else None for i in ins])
            assert written.data_ptr() == plan.values[ins[0]].data_ptr()
        results.append(plan.get_value("y").clone())
    assert results[0].dtype == results[1].dtype and torch.equal(results[0], results[1])
    reference = _reference(op_type, [torch.from_numpy(v) for v in inputs], attrs, opset)
    torch.testing.assert_close(results[0], -reference, rtol=1e-6, atol=1e-6)


def _reference(op_type, xs, attrs, opset=13):
    if op_type == "MatMul":
        return torch.from_numpy(np.matmul(xs[0].numpy(), xs[1].numpy()))
    if op_type == "Gemm":
        a = xs[0].T if attrs.get("transA") else xs[0]
        b = xs[1].T if attrs.get("transB") else xs[1]
        y = attrs.get("alpha", 1.0) * (a.double() @ b.double())
        return (y + attrs.get("beta", 1.0) * xs[2] if len(xs) > 2 else y).float()
    if op_type == "Div" and xs[0].dtype == torch.int32:
        return torch.div(xs[0], xs[1], rounding_mode="trunc")
    simple = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div,
              "Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh}
    if op_type in simple:
        return simple[op_type](*xs)
    if op_type == "Sum":
        return sum(xs[1:], xs[0])
    if op_type == "Gelu":
        return torch.nn.functional.gelu(xs[0], approximate=attrs["approximate"])
    if op_type == "ReduceSum":
        return xs[0].sum(dim=tuple(xs[1].tolist()))
    if op_type == "Gather":
        data, index = xs
        axis = attrs["axis"]
        index = torch.where(index < 0, index + data.shape[axis], index).long()
        return torch.from_numpy(np.take(data.numpy(), index.numpy(), axis=axis))
    if op_type == "GatherGrad":
        dy, index = xs
        axis, shape = attrs["axis"], attrs["shape"]
        index = torch.where(index < 0, index + shape[axis], index).long().reshape(-1)
        rows = shape[:axis] + [index.numel()] + shape[axis + 1:]
        return torch.zeros(shape).index_add_(axis, index, dy.reshape(rows))
    if op_type == "Scale":
        return xs[0].double().mul(attrs["scale"]).float()
    if op_type == "Concat":
        return torch.from_numpy(np.concatenate([x.numpy() for x in xs], axis=attrs["axis"]))
    if op_type == "Softmax":  # along axis 1 of a 3-D input
        x = xs[0].numpy().astype(np.float64)
        if opset < 13:  # coerced to 2-D: one softmax over the flattened trailing dims
            rows = x.reshape(x.shape[0], -1)
            e = np.exp(rows - rows.max(1, keepdims=True))
            return torch.from_numpy((e / e.sum(1, keepdims=True)).reshape(x.shape).astype(np.float32))
        e = np.exp(x - x.max(1, keepdims=True))
        return torch.from_numpy((e / e.sum(1, keepdims=True)).astype(np.float32))
    if op_type == "LogSoftmax":
        x = xs[0].numpy().astype(np.float64)
        shifted = x - x.max(-1, keepdims=True)
        return torch.from_numpy((shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)))
                                .astype(np.float32))
    if "axes" in attrs and len(attrs["axes"]) > 1:
        return xs[0].double().mean(dim=tuple(attrs["axes"])).float()
    return xs[0].mean(dim=1, keepdim=True)
