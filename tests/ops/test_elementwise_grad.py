"""Gradients of the elementwise families (issue #3 item 2; F78 ops): unary math, activations,
broadcasting arithmetic, variadic Sum/Mean/Max/Min, Where and Cast, against torch.autograd
(or central differences where torch has no equivalent op). One representative version per
distinct semantics; inputs stay at least 0.05 away from kinks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.errors import popart_exception
from popart_backend.importer.onnx_model import import_model
from popart_backend.ops.base import ElementwiseUnary
from popart_backend.ops.registry import _REGISTRY
from popart_backend.transforms.autodiff import Autodiff
from tests.helpers import assert_close, check_grad, one_op_model

SHAPE = (2, 3, 4)
MARGIN = 0.05


def data(*shape, low=-1.0, high=1.0, kinks=(), seed=0) -> np.ndarray:
    """Seeded uniform float32 values at least MARGIN away from every point in ``kinks``."""
    x = np.random.default_rng(seed).uniform(low, high, shape)
    for k in kinks:
        near = np.abs(x - k) < MARGIN
        x[near] = k + np.where(x[near] >= k, MARGIN, -MARGIN)
    return x.astype(np.float32)


def positive(*shape, seed=0):
    return data(*shape, low=0.5, high=2.0, seed=seed)


# (id, op, inputs, attrs, opset, ref); ref None = central differences of our kernel.
UNARY = [
    ("Abs", "Abs", [data(*SHAPE, kinks=(0,))], {}, 13, torch.abs),
    ("Neg", "Neg", [data(*SHAPE)], {}, 13, torch.neg),
    ("Exp", "Exp", [data(*SHAPE)], {}, 13, torch.exp),
    ("Log", "Log", [positive(*SHAPE)], {}, 13, torch.log),
    ("Sqrt", "Sqrt", [positive(*SHAPE)], {}, 13, torch.sqrt),
    ("Reciprocal", "Reciprocal", [data(*SHAPE, low=-2, high=2, kinks=(-0.3, 0, 0.3))], {}, 13,
     torch.reciprocal),
    ("Sin", "Sin", [data(*SHAPE, low=-3, high=3)], {}, 7, torch.sin),
    ("Cos", "Cos", [data(*SHAPE, low=-3, high=3)], {}, 7, torch.cos),
    ("Tan", "Tan", [data(*SHAPE)], {}, 7, torch.tan),
    ("Asin", "Asin", [data(*SHAPE, low=-0.9, high=0.9)], {}, 7, torch.asin),
    ("Acos", "Acos", [data(*SHAPE, low=-0.9, high=0.9)], {}, 7, torch.acos),
    ("Atan", "Atan", [data(*SHAPE, low=-3, high=3)], {}, 7, torch.atan),
    ("Sinh", "Sinh", [data(*SHAPE, low=-2, high=2)], {}, 9, torch.sinh),
    ("Cosh", "Cosh", [data(*SHAPE, low=-2, high=2)], {}, 9, torch.cosh),
    ("Asinh", "Asinh", [data(*SHAPE, low=-3, high=3)], {}, 9, torch.asinh),
    ("Acosh", "Acosh", [data(*SHAPE, low=1.2, high=3)], {}, 9, torch.acosh),
    ("Atanh", "Atanh", [data(*SHAPE, low=-0.9, high=0.9)], {}, 9, torch.atanh),
    ("Erf", "Erf", [data(*SHAPE, low=-2, high=2)], {}, 13, torch.erf),
    ("Tanh", "Tanh", [data(*SHAPE, low=-3, high=3)], {}, 13, torch.tanh),
    ("Sigmoid", "Sigmoid", [data(*SHAPE, low=-3, high=3)], {}, 13, torch.sigmoid),
    ("HardSigmoid", "HardSigmoid", [data(*SHAPE, low=-3, high=3, kinks=(-4 / 3, 2))],
     {"alpha": 0.3, "beta": 0.4}, 6, lambda x: torch.clamp(x * 0.3 + 0.4, 0, 1)),
    ("HardSwish", "HardSwish", [data(*SHAPE, low=-4, high=4, kinks=(-3, 3))], {}, 14,
     F.hardswish),
    ("Relu", "Relu", [data(*SHAPE, kinks=(0,))], {}, 14, torch.relu),
    ("LeakyRelu", "LeakyRelu", [data(*SHAPE, kinks=(0,))], {"alpha": 0.2}, 16,
     lambda x: F.leaky_relu(x, 0.2)),
    ("Elu", "Elu", [data(*SHAPE, low=-2, high=2, kinks=(0,))], {"alpha": 0.7}, 6,
     lambda x: F.elu(x, 0.7)),
    ("Selu", "Selu", [data(*SHAPE, low=-2, high=2, kinks=(0,))], {}, 6, F.selu),
    ("Celu", "Celu", [data(*SHAPE, low=-2, high=2, kinks=(0,))], {"alpha": 0.8}, 12,
     lambda x: F.celu(x, 0.8)),
    ("ThresholdedRelu", "ThresholdedRelu", [data(*SHAPE, kinks=(0.3,))], {"alpha": 0.3}, 10,
     lambda x: torch.where(x > 0.3, x, 0.0)),
    ("Softplus", "Softplus", [data(*SHAPE, low=-4, high=4)], {}, 1, F.softplus),
    ("Softsign", "Softsign", [data(*SHAPE, low=-3, high=3, kinks=(0,))], {}, 1, F.softsign),
    ("Gelu-none", "Gelu", [data(*SHAPE, low=-3, high=3)], {}, 20, F.gelu),
    ("Gelu-tanh", "Gelu", [data(*SHAPE, low=-3, high=3)], {"approximate": "tanh"}, 20,
     lambda x: F.gelu(x, approximate="tanh")),
    ("Mish", "Mish", [data(*SHAPE, low=-3, high=3)], {}, 18, F.mish),
    ("Shrink", "Shrink", [data(*SHAPE, kinks=(-0.4, 0.4))], {"bias": 0.1, "lambd": 0.4}, 9,
     None),
    ("Clip-6", "Clip", [data(*SHAPE, kinks=(-0.5, 0.6))], {"min": -0.5, "max": 0.6}, 6,
     lambda x: torch.clamp(x, -0.5, 0.6)),
]


@pytest.mark.parametrize("case", UNARY, ids=[c[0] for c in UNARY])
def test_unary_grad(case):
    _, op_type, inputs, attrs, opset, ref = case
    check_grad(op_type, inputs, attrs, opset=opset, ref=ref)


def test_softplus_linear_region_grad():
    """Above the threshold (20) Softplus is x itself: gradient 1, as torch."""
    check_grad("Softplus", [np.array([19.0, 21.0, 30.0], np.float32)], ref=F.softplus)


@pytest.mark.parametrize("slope_shape", [(4,), (3, 1), SHAPE, ()], ids=str)
def test_prelu_grad(slope_shape):
    """The slope gradient is summed over the axes it was broadcast along."""
    x = data(*SHAPE, kinks=(0,), seed=1)
    slope = data(*slope_shape, low=0.1, high=0.5, seed=2)
    check_grad("PRelu", [x, slope], opset=16, ref=lambda x, s: torch.where(x < 0, x * s, x))


@pytest.mark.parametrize("bounds", ["both", "min", "max", "none"])
def test_clip_grad(bounds):
    """Clip-13 with tensor bounds: x passes the gradient inside them, each bound gets the
    gradient of the elements it clipped."""
    x = data(*SHAPE, kinks=(-0.4, 0.5), seed=3)
    low = np.array(-0.4, np.float32) if bounds in ("both", "min") else None
    high = np.array(0.5, np.float32) if bounds in ("both", "max") else None

    def ref(x, low, high):
        return torch.clamp(x, low, high) if bounds != "none" else x.clone()

    check_grad("Clip", [x, low, high], opset=13, ref=ref)


@pytest.mark.parametrize("op_type", ["Floor", "Ceil", "Round", "Sign"])
def test_zero_gradient_ops(op_type):
    """Piecewise-constant ops add nothing: d(op(x) + x)/dx is the seed itself."""
    x = data(*SHAPE, low=-3, high=3)
    nodes = [helper.make_node(op_type, ["x"], ["f"]), helper.make_node("Add", ["f", "x"], ["y"])]
    grads, seed = _two_node_grads(nodes, x)
    assert_close(grads["x"], seed, f"{op_type} + x")


BROADCAST = [(SHAPE, SHAPE), (SHAPE, (4,)), (SHAPE, (3, 1)), ((3, 1), SHAPE), ((), SHAPE)]
BINARY = {
    "Add": (lambda s, k: data(*s, seed=k), torch.add),
    "Sub": (lambda s, k: data(*s, seed=k), torch.sub),
    "Mul": (lambda s, k: data(*s, seed=k), torch.mul),
    "Div": (lambda s, k: data(*s, seed=k) if k == 10 else positive(*s, seed=k), torch.div),
    "Pow": (lambda s, k: positive(*s, seed=k) if k == 10 else data(*s, low=-1, high=2, seed=k),
            torch.pow),
}


@pytest.mark.parametrize("shapes", BROADCAST, ids=lambda s: f"{list(s[0])}x{list(s[1])}")
@pytest.mark.parametrize("op_type", list(BINARY))
def test_binary_grad(op_type, shapes):
    """Both inputs, un-broadcast to their own shapes (opset 14/15)."""
    make, ref = BINARY[op_type]
    a, b = make(shapes[0], 10), make(shapes[1], 11)
    check_grad(op_type, [a, b], opset=15 if op_type == "Pow" else 14, ref=ref)


def test_pow_integer_exponent_grad():
    """Pow-15 with an int32 exponent: only the base has a gradient."""
    a = data(*SHAPE, low=-2, high=2, seed=4)
    b = np.random.default_rng(5).integers(0, 4, (4,)).astype(np.int32)
    check_grad("Pow", [a, b], opset=15, ref=lambda a, b: torch.pow(a, b))


def test_pow_zero_base_grad():
    """At a == 0 the exponent gradient is 0 (not NaN) for b >= 0, as torch."""
    a = np.array([0.0, 0.0, 1.5, 2.0], np.float32)
    b = np.array([2.0, 0.0, 0.5, 3.0], np.float32)
    check_grad("Pow", [a, b], opset=15, ref=torch.pow)


def test_mod_grad():
    """Float Mod (fmod=1): da = dy, db = -dy * trunc(a / b), with broadcasting."""
    a = data(*SHAPE, low=-3, high=3, seed=6)
    b = data(4, low=0.7, high=1.3, seed=7)
    check_grad("Mod", [a, b], {"fmod": 1}, opset=13, ref=torch.fmod)


@pytest.mark.parametrize("op_type, axis, b_shape", [("Add", 1, (3,)), ("Sub", 0, (2, 3)),
                                                     ("Mul", 1, (3,)), ("Div", None, (4,)),
                                                     ("Pow", 1, (3, 4))])
def test_legacy_broadcast_grad(op_type, axis, b_shape):
    """Opset 6 broadcast=1 with ``axis``: B aligns at axis, its gradient sums the rest."""
    a = positive(*SHAPE, seed=8)
    b = positive(*b_shape, seed=9)
    attrs = {"broadcast": 1} | ({} if axis is None else {"axis": axis})
    start = len(SHAPE) - len(b_shape) if axis is None else axis
    pad = len(SHAPE) - start - len(b_shape)
    fn = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div,
          "Pow": torch.pow}[op_type]
    check_grad(op_type, [a, b], attrs, opset=6,
               ref=lambda a, b: fn(a, b.reshape(b.shape + (1,) * pad)))


VARIADIC_SHAPES = [SHAPE, (3, 1), (4,)]


def _fold(fn):
    def ref(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out

    return ref


@pytest.mark.parametrize("op_type, ref", [
    ("Sum", _fold(torch.add)),
    ("Mean", lambda *xs: _fold(torch.add)(*xs) / len(xs)),
    ("Max", _fold(torch.maximum)),
    ("Min", _fold(torch.minimum)),
])
@pytest.mark.parametrize("count", [1, 3])
def test_variadic_grad(op_type, ref, count):
    """Sum/Mean/Max/Min-13 over broadcasting inputs (distinct values: no ties)."""
    xs = [data(*s, seed=20 + k) for k, s in enumerate(VARIADIC_SHAPES[:count])]
    check_grad(op_type, xs, opset=13, ref=ref)


@pytest.mark.parametrize("op_type", ["Max", "Min"])
def test_variadic_ties_split_evenly(op_type):
    """Tied inputs share the gradient: torch.maximum's 1/2 for two inputs, and torch.amax over
    the stacked inputs (1/k among k tied) for more."""
    a = data(*SHAPE, seed=30)
    b = np.where(np.arange(4) % 2 == 0, a, data(*SHAPE, seed=31)).astype(np.float32)
    pair = torch.maximum if op_type == "Max" else torch.minimum
    check_grad(op_type, [a, b], opset=13, ref=pair)
    stacked = torch.amax if op_type == "Max" else torch.amin
    check_grad(op_type, [a, a.copy(), b], opset=13,
               ref=lambda *xs: stacked(torch.stack(xs), 0))


def test_where_grad():
    """Where-16: the gradient goes to X where the condition holds and to Y elsewhere, each
    summed back to its shape; the condition has none."""
    cond = np.random.default_rng(40).random(SHAPE) > 0.5
    x = data(4, seed=41)
    y = data(3, 1, seed=42)
    check_grad("Where", [cond, x, y], opset=16, ref=torch.where)


@pytest.mark.parametrize("to", [TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.FLOAT])
def test_cast_grad(to):
    """Cast between float types: the gradient is cast back to the source type."""
    check_grad("Cast", [data(*SHAPE)], {"to": to}, opset=13, ref=lambda x: x)


def test_castlike_grad():
    """CastLike: x gets the gradient cast back; ``like`` only lends its dtype."""
    like = np.zeros((1,), np.float64)
    check_grad("CastLike", [data(*SHAPE), like], opset=15, wrt=[0], ref=lambda x, like: x)


# --- paths without a gradient ------------------------------------------------------------------


def _two_node_grads(nodes, x: np.ndarray, output: str = "y"):
    """Gradient of weight ``x`` through ``nodes`` seeded with random dy at ``output``."""
    graph = helper.make_graph(
        nodes, "grad_test", [],
        [helper.make_empty_tensor_value_info(output)],
        initializer=[helper.make_tensor("x", TensorProto.FLOAT, x.shape, x.reshape(-1))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = min(model.ir_version, 10)
    ir = import_model(model, constant_weights=False)
    info = ir.main.tensors[output].info
    seed = np.random.default_rng(50).uniform(-1, 1, info.shape).astype(np.float32)
    autodiff = Autodiff(None, output_grads={output: seed})
    autodiff.run(ir)
    grads = dict(autodiff.variable_grads)
    plan = ExecutionPlan(ir.main, keep=list(grads.values()))
    for name in plan.stream_ids:
        plan.set_value(name, to_torch(x))
    plan.execute()
    return {k: plan.get_value(v).numpy() for k, v in grads.items()}, seed


def test_argmax_cast_cuts_the_path():
    """ArgMax's integer output carries no gradient (as in torch): casting it back to float
    feeds nothing to x, and autodiff does not complain."""
    nodes = [helper.make_node("ArgMax", ["x"], ["i"], axis=1),
             helper.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT)]
    grads, _ = _two_node_grads(nodes, data(*SHAPE))
    assert grads == {}


class _NoGrad(ElementwiseUnary):
    """A float -> float op without grad(), registered only inside the test below."""

    op_type = "NoGradOp"
    domain = "test.nograd"
    versions = (1,)

    def kernel(self, x):
        return x * 2


def test_op_without_grad_on_the_path_raises(monkeypatch):
    """A differentiable path through an op without grad() makes autodiff name the op."""
    monkeypatch.setitem(_REGISTRY, ("test.nograd", "NoGradOp"), {1: _NoGrad})
    model, _ = one_op_model("NoGradOp", [data(*SHAPE)], domain="test.nograd", const_inputs=[0])
    model.graph.node[0].name = "doubler"
    ir = import_model(model, constant_weights=False)
    seed = np.ones(SHAPE, np.float32)
    with pytest.raises(popart_exception, match=r"NoGradOp 'doubler' has no gradient.*'in0'"):
        Autodiff(None, output_grads={"out0": seed}).run(ir)


def test_every_differentiable_op_has_a_grad():
    """Each ai.onnx op of these families has grad(), unless all its outputs are int/bool."""
    from popart_backend.ir.op import Op
    from popart_backend.ops import activations, cast, elementwise, logic, reduce, unary
    from popart_backend.ops.registry import AI_ONNX, all_registered

    modules = {m.__name__ for m in (activations, cast, elementwise, logic, reduce, unary)}
    integer_outputs = {"IsNaN", "IsInf", "ArgMax", "ArgMin"}
    missing = sorted({
        op_type for domain, op_type, _, cls in all_registered()
        if domain == AI_ONNX and cls.__module__ in modules and cls.grad is Op.grad
        and cls.__module__ != logic.__name__ and op_type not in integer_outputs
    })
    assert not missing, f"ops without grad(): {missing}"
