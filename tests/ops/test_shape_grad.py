"""Gradients of the shape-manipulation ops (ops/shape.py; issue #3 item 2, F78).

Each differentiable op, at one version per distinct semantics, is differentiated by our
autodiff and compared with torch.autograd of an equivalent torch expression, or with central
differences of the op's own kernel (every op here is linear in its data input, so those are
exact up to rounding).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.importer.onnx_model import import_model
from popart_backend.ir.verify import verify
from popart_backend.transforms.autodiff import Autodiff
from tests.helpers import assert_close, check_grad, one_op_model, rand

I64_MAX = np.iinfo(np.int64).max


def i64(*values):
    return np.array(values, dtype=np.int64)


def x(*shape, seed=0):
    return rand(*shape, seed=seed)


def case(op, inputs, attrs=None, opset=18, const=(), outputs=1, ref=None, name=""):
    return pytest.param(op, inputs, attrs or {}, opset, const, outputs, ref,
                        id=f"{op}-{opset}{'-' + name if name else ''}")


CASES = [
    # Reshape: attribute (1) and constant input (5+, with 0 = copy and -1 = infer).
    case("Reshape", [x(2, 3, 4)], {"shape": [4, 6]}, opset=1,
         ref=lambda a: a.reshape(4, 6)),
    case("Reshape", [x(2, 3, 4), i64(0, -1)], const=[1], opset=14,
         ref=lambda a, s: a.reshape(2, 12)),
    case("Flatten", [x(2, 3, 4)], {"axis": -1}, opset=13, ref=lambda a: a.reshape(6, 4)),
    case("Squeeze", [x(2, 1, 3, 1)], {"axes": [-1, 1]}, opset=11,
         ref=lambda a: a.reshape(2, 3)),
    case("Squeeze", [x(2, 1, 3, 1), i64(1)], const=[1], opset=13,
         ref=lambda a, ax: a.squeeze(1)),
    case("Unsqueeze", [x(2, 3)], {"axes": [0, -1]}, opset=11,
         ref=lambda a: a.reshape(1, 2, 3, 1)),
    case("Unsqueeze", [x(2, 3), i64(1)], const=[1], opset=13, ref=lambda a, ax: a.unsqueeze(1)),
    case("Transpose", [x(2, 3, 4)], {"perm": [1, 2, 0]}, ref=lambda a: a.permute(1, 2, 0)),
    case("Transpose", [x(2, 3, 4)], name="default", ref=lambda a: a.permute(2, 1, 0)),
    case("Identity", [x(3, 2)], ref=lambda a: a),
    case("Concat", [x(2, 3), x(2, 1, seed=1), x(2, 4, seed=2)], {"axis": -1},
         ref=lambda *xs: torch.cat(xs, -1)),
    case("Concat", [x(2, 3)], {"axis": 0}, name="single", ref=lambda a: a),
    case("Split", [x(2, 6)], {"axis": 1}, opset=11, outputs=3, name="even",
         ref=lambda a: list(torch.split(a, 2, 1))),
    case("Split", [x(5, 2), i64(1, 3, 1)], {"axis": -2}, opset=13, const=[1], outputs=3,
         name="sizes", ref=lambda a, s: list(torch.split(a, [1, 3, 1], 0))),
    case("Split", [x(7, 2)], {"axis": 0, "num_outputs": 3}, opset=18, outputs=3,
         name="num_outputs", ref=lambda a: list(torch.split(a, 3, 0))),
    # Slice: attributes (1) and constant inputs (13), negative starts/ends/steps and clamping.
    case("Slice", [x(4, 5)], {"starts": [1, -4], "ends": [3, 100], "axes": [0, 1]}, opset=1,
         ref=lambda a: a[1:3, 1:]),
    case("Slice", [x(4, 6), i64(-1, 0), i64(-I64_MAX, 6), i64(0, 1), i64(-2, 2)], const=[1, 2, 3, 4],
         opset=13, name="neg-step", ref=lambda a, *o: a.flip(0)[0::2, 0:6:2]),
    case("Slice", [x(3, 7), i64(5), i64(0), i64(-1), i64(-3)], const=[1, 2, 3, 4],
         opset=13, name="neg-step-axis", ref=lambda a, *o: a[:, [5, 2]]),
    case("Slice", [x(3, 4), i64(1), i64(1)], const=[1, 2], opset=13, name="empty",
         ref=lambda a, *o: a[1:1]),
    case("Expand", [x(3, 1), i64(2, 1, 4)], const=[1], opset=13,
         ref=lambda a, s: a.expand(2, 3, 4)),
    case("Expand", [x(2, 3), i64(3)], const=[1], opset=13, name="no-broadcast",
         ref=lambda a, s: a),
    case("Tile", [x(2, 3), i64(2, 3)], const=[1], opset=13, ref=lambda a, r: a.repeat(2, 3)),
    case("Tile", [x(2, 3), i64(3), i64(-1)], const=[1, 2], opset=1, name="tile1",
         ref=lambda a, t, ax: a.repeat(1, 3)),
    # Pad: constant (attribute and input versions, negative pads crop), reflect, edge, wrap.
    case("Pad", [x(2, 3)], {"pads": [1, 0, 2, 1], "value": 1.5}, opset=2,
         ref=lambda a: F.pad(a, (0, 1, 1, 2), value=1.5)),
    case("Pad", [x(3, 5), i64(1, -2, -1, 3)], const=[1], opset=13, name="crop",
         ref=lambda a, p: F.pad(a, (-2, 3, 1, -1))),
    case("Pad", [x(1, 2, 5), i64(0, 0, 3, 0, 0, 2)], {"mode": "reflect"}, const=[1], opset=13,
         name="reflect", ref=lambda a, p: F.pad(a, (3, 2), mode="reflect")),
    case("Pad", [x(2, 4), i64(2, 3, 3, -1)], {"mode": "reflect"}, const=[1], opset=13,
         name="reflect-crop"),
    case("Pad", [x(1, 3, 4), i64(0, 2, 1, 0, 1, 3)], {"mode": "edge"}, const=[1], opset=13,
         name="edge", ref=lambda a, p: F.pad(a.unsqueeze(0), (1, 3, 2, 1), mode="replicate")[0]),
    case("Pad", [x(3, 2), i64(4, 1, 2, 3)], {"mode": "wrap"}, const=[1], opset=19, name="wrap"),
    case("Pad", [x(2, 4), i64(1, 2), None, i64(-1)], {"mode": "edge"}, const=[1, 3], opset=18,
         name="axes", ref=lambda a, p, v, ax: F.pad(a.unsqueeze(0), (1, 2), mode="replicate")[0]),
    case("Trilu", [x(2, 4, 5), i64(1)], {"upper": 1}, const=[1], opset=14,
         ref=lambda a, k: torch.triu(a, 1)),
    case("Trilu", [x(4, 3)], {"upper": 0}, opset=14, name="lower",
         ref=lambda a: torch.tril(a)),
    case("DepthToSpace", [x(1, 8, 2, 3)], {"blocksize": 2}, opset=1,
         ref=lambda a: F.pixel_shuffle(
             a.reshape(1, 2, 2, 2, 2, 3).permute(0, 3, 1, 2, 4, 5).reshape(1, 8, 2, 3), 2)),
    case("DepthToSpace", [x(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}, opset=13, name="CRD",
         ref=lambda a: F.pixel_shuffle(a, 2)),
    case("SpaceToDepth", [x(2, 2, 4, 6)], {"blocksize": 2}, opset=13),
]


@pytest.mark.parametrize("op, inputs, attrs, opset, const, outputs, ref", CASES)
def test_shape_op_gradient(op, inputs, attrs, opset, const, outputs, ref):
    check_grad(op, inputs, attrs, opset=opset, const_inputs=const, num_outputs=outputs, ref=ref)


def test_split_output_without_gradient_gets_zeros():
    """Only the middle output of a Split reaches the seed: the others contribute zeros."""
    data = x(6, 2)
    model, _ = one_op_model("Split", [data], {"axis": 0}, opset=13, num_outputs=3,
                            const_inputs=[0])
    ir = import_model(model, constant_weights=False)
    seed = rand(2, 2, seed=3)
    autodiff = Autodiff(None, output_grads={"out1": seed})
    autodiff.run(ir)
    verify(ir.main)
    grad_id = autodiff.variable_grads["in0"]
    plan = ExecutionPlan(ir.main, keep=[grad_id])
    for name in plan.stream_ids:
        plan.set_value(name, to_torch(data))
    plan.execute()
    expected = np.concatenate([np.zeros((2, 2), np.float32), seed, np.zeros((2, 2), np.float32)])
    assert_close(plan.get_value(grad_id).numpy(), expected, "Split d/d input 0")


def test_slice_and_pad_grad_ops_are_dedicated():
    """Slice scatters through SliceGrad; reflect Pad through PadGrad; constant Pad is a Pad."""
    for op_type, inputs, attrs, const, grad_type in [
        ("Slice", [x(4), i64(1), i64(3)], {}, [1, 2], "SliceGrad"),
        ("Pad", [x(4), i64(1, 2)], {"mode": "reflect"}, [1], "PadGrad"),
        ("Pad", [x(4), i64(1, 2)], {}, [1], "Pad"),
    ]:
        model, _ = one_op_model(op_type, inputs, attrs, const_inputs=[0, *const])
        ir = import_model(model, constant_weights=False)
        Autodiff(None, output_grads={"out0": np.ones(ir.main.tensors["out0"].info.shape,
                                                     np.float32)}).run(ir)
        grad_ops = [op.op_type for op in ir.main.ops.values() if op.grad_of is not None]
        assert grad_type in grad_ops, (op_type, grad_ops)
