"""Where the patterns apply (F8): the rewrites and InPlace also run in subgraph bodies (Call,
If, Loop), and the builder's ``excludePatterns(tensor, names)`` keeps one op out of a pattern
that stays on for the others. Numbers are checked against numpy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import popart_backend as popart
from tests.options.test_patterns import _RNG, EFFECT_MODELS, _infer, scale_pair  # noqa: F401

# The op type each rewrite replaces (the node excludePatterns is set on).
_REWRITTEN = {"SumToAdd": "Sum", "NegativeOneScale": "Scale", "ExpandCast": "Cast",
              "TransposeToIdentityOrReshapePattern": "Transpose", "SplitOp": "Split",
              "UpsampleToResize": "Upsample", "DecomposeBinaryConstScalar": "Mul",
              "Slice2SliceSubsample": "Slice"}


def _types(graph) -> list[str]:
    return sorted(op.op_type for op in graph.ops.values())


def _body_types(session) -> list[str]:
    ir = session.getIr()
    return sorted(t for g in ir.graphs.values() if g is not ir.main for t in _types(g))


def _patterns(sum_to_add: bool) -> popart.Patterns:
    return popart.Patterns().enablePattern("SumToAdd", sum_to_add)


# --- subgraphs ---------------------------------------------------------------------------------


def _call_model():
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    callee = b.createSubgraphBuilder()
    arg = callee.addUntypedInputTensor()
    callee.addOutputTensor(callee.aiOnnx.sum([arg, callee.aiOnnx.abs([arg])]))
    (out,) = b.aiGraphcore.call([x], 1, callee)
    return b, {x: _RNG.standard_normal((2, 3)).astype(np.float32)}, out, \
        lambda f: f[x] + np.abs(f[x])


def _if_model():
    b = popart.Builder(opsets={"ai.onnx": 11})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    c = b.addInputTensor(popart.TensorInfo("BOOL", []), "c")
    branches = []
    for other in ("neg", "exp"):
        sub = b.createSubgraphBuilder()
        sub.addInputTensorFromParentGraph(x)
        sub.addOutputTensor(sub.aiOnnx.sum([x, getattr(sub.aiOnnx, other)([x])]))
        branches.append(sub)
    (out,) = b.aiOnnx.logical_if([c], 1, branches[1], branches[0])  # else, then
    data = _RNG.standard_normal((2, 3)).astype(np.float32)
    return b, {x: data, c: np.array(True)}, out, lambda f: f[x] - f[x]


def _loop_model():
    b = popart.Builder(opsets={"ai.onnx": 11})
    a = b.addInputTensor(popart.TensorInfo("FLOAT", [3]), "a")
    body = b.createSubgraphBuilder()
    body.addInputTensor(popart.TensorInfo("INT64", []))
    cond_in = body.addInputTensor(popart.TensorInfo("BOOL", []))
    a_in = body.addInputTensor(popart.TensorInfo("FLOAT", [3]))
    body.addOutputTensor(body.aiOnnx.identity([cond_in]))
    body.addOutputTensor(body.aiOnnx.sum([a_in, body.aiOnnx.sin([a_in])]))
    trips = b.aiOnnx.constant(np.array(3, np.int64))
    true = b.aiOnnx.constant(np.array(True))
    (out,) = b.aiOnnx.loop([trips, true, a], 1, body)

    def reference(f):
        v = f[a]
        for _ in range(3):
            v = v + np.sin(v)
        return v
    return b, {a: _RNG.standard_normal(3).astype(np.float32)}, out, reference


@pytest.mark.parametrize("model", [_call_model, _if_model, _loop_model],
                         ids=["Call", "If", "Loop"])
def test_F8_rewrites_apply_in_subgraph_bodies(model):
    builder, feeds, out, reference = model()
    builder.addOutputTensor(out)
    for on in (True, False):
        session, arrays = _infer(builder, [out], feeds, _patterns(on))
        body = _body_types(session)
        present = ("Add", "Sum") if on else ("Sum", "Add")
        assert present[0] in body and present[1] not in body, (on, body)
        np.testing.assert_allclose(arrays[out], reference(feeds), rtol=1e-5, atol=1e-6)


def test_F8_rewrites_in_a_called_body_train_like_numpy():
    """The rewritten body (Add instead of Sum) gets its gradients: one SGD step on w in
    y = call(x * w) with body s = Sum(h, h), loss = sum |s|, matches numpy."""
    w0 = _RNG.standard_normal(3).astype(np.float32)
    x0 = _RNG.standard_normal(3).astype(np.float32)
    results = {}
    for on in (True, False):
        b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]), "x")
        w = b.addInitializedInputTensor(w0, "w")
        callee = b.createSubgraphBuilder()
        arg = callee.addUntypedInputTensor()
        callee.addOutputTensor(callee.aiOnnx.sum([arg, arg]))
        (s,) = b.aiGraphcore.call([b.aiOnnx.mul([x, w])], 1, callee)
        loss = b.aiGraphcore.l1loss([s], 1.0, reduction=popart.ReductionType.Sum)
        session = popart.TrainingSession(
            b.getModelProto(), popart.DataFlow(1, [loss]), loss, popart.ConstSGD(0.1),
            popart.DeviceManager().createCpuDevice(), patterns=_patterns(on))
        assert ("Add" in _body_types(session)) is on
        session.prepareDevice()
        session.weightsFromHost()
        session.run(popart.PyStepIO({x: x0}, session.initAnchorArrays()))
        session.weightsToHost()
        results[on] = {"w": np.zeros(3, np.float32)}
        session.readWeights(popart.PyWeightsIO(results[on]))
    want = w0 - 0.1 * 2 * x0 * np.sign(2 * x0 * w0)
    for on in (True, False):
        np.testing.assert_allclose(results[on]["w"], want, rtol=1e-6, atol=1e-6)


# --- excludePatterns ----------------------------------------------------------------------------


def _node_output(builder, op_type: str) -> str:
    proto = onnx.load_from_string(builder.getModelProto())
    return next(n.output[0] for n in proto.graph.node if n.op_type == op_type)


@pytest.mark.parametrize("name", sorted(EFFECT_MODELS))
def test_F8_exclude_patterns_keeps_the_op(name):
    build, _on_types, off_types = EFFECT_MODELS[name]
    opset = 9 if name == "UpsampleToResize" else 10
    builder = popart.Builder(opsets={"ai.onnx": opset, "ai.graphcore": 1})
    x, y, reference, shape = build(builder)
    builder.addOutputTensor(y)
    builder.excludePatterns(_node_output(builder, _REWRITTEN[name]), [name])
    data = _RNG.standard_normal(shape).astype(np.float16 if name == "ExpandCast" else np.float32)
    patterns = popart.Patterns(popart.PatternsLevel.All)
    assert patterns.isPatternEnabled(name)
    session, out = _infer(builder, [y], {x: data}, patterns)
    assert _types(session.getIr().main) == off_types
    np.testing.assert_allclose(out[y], reference(data), rtol=1e-6, atol=1e-6)
    if name == "ExpandCast":  # the cast still reads the expanded tensor
        casts = [op.inputs[0].info.shape for op in session.getIr().main.ops.values()
                 if op.op_type == "Cast"]
        assert casts == [(64, 3)]


def test_F8_exclude_patterns_acts_on_one_op_only():
    builder = popart.Builder(opsets={"ai.onnx": 11})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    kept = builder.aiOnnx.sum([x, x])
    rewritten = builder.aiOnnx.sum([kept, x])
    builder.addOutputTensor(rewritten)
    builder.excludePatterns(kept, ["SumToAdd"])
    data = _RNG.standard_normal((2, 3)).astype(np.float32)
    session, out = _infer(builder, [rewritten], {x: data}, popart.Patterns())
    ops = {op.outputs[0].id: op.op_type for op in session.getIr().main.ops.values()}
    assert ops == {kept: "Sum", rewritten: "Add"}
    np.testing.assert_allclose(out[rewritten], 3 * data, rtol=1e-6)


def test_F8_exclude_patterns_in_a_subgraph_body():
    builder, feeds, out, reference = _call_model()
    builder.addOutputTensor(out)
    proto = onnx.load_from_string(builder.getModelProto())
    body = next(a.g for n in proto.graph.node for a in n.attribute if a.name == "callee")
    sum_node = next(n for n in body.node if n.op_type == "Sum")
    sum_node.attribute.append(onnx.helper.make_attribute("__exclude_patterns", ["SumToAdd"]))
    session = popart.InferenceSession(
        proto.SerializeToString(), popart.DataFlow(1, [out]),
        popart.DeviceManager().createCpuDevice(), patterns=_patterns(True))
    assert "Sum" in _body_types(session) and "Add" not in _body_types(session)
    session.prepareDevice()
    arrays = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, arrays))
    np.testing.assert_allclose(arrays[out], reference(feeds), rtol=1e-6)


def test_F8_exclude_patterns_refuses_unknown_names():
    builder = popart.Builder(opsets={"ai.onnx": 11})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2]), "x")
    y = builder.aiOnnx.sum([x, x])
    builder.excludePatterns(y, ["SumToAd"])
    with pytest.raises(popart.popart_exception, match=r"Sum '.*': excludePatterns: Unknown "
                       r"pattern 'SumToAd'\. Did you mean 'SumToAdd'\?"):
        popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, [y]),
                                popart.DeviceManager().createCpuDevice())


def test_F8_exclude_inplace_keeps_the_op_out_of_place(scale_pair):  # noqa: F811
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [256]), "x")
    e = builder.aiOnnx.exp([x])
    t = e
    for factor in (2.0, 3.0):
        (t,) = builder.customOp("Times", 1, "test.patterns", [t], {"factor": factor})
    data = _RNG.standard_normal(256).astype(np.float32)
    activations = {}
    for excluded in (False, True):
        if excluded:
            builder.excludePatterns(t, ["InPlace"])
        session, out = _infer(builder, [t, e], {x: data}, popart.Patterns())
        np.testing.assert_allclose(out[t], np.exp(data) * 6, rtol=1e-6)
        kinds = [op.op_type for op in session.getIr().main.topo_order()]
        assert kinds == (["Exp", "Times", "Times"] if excluded else
                         ["Exp", "Times", "TimesInplace"])
        activations[excluded] = session._device_model.memory.ipu(0).categories["activations"]
    assert activations[True] - activations[False] == 256 * 4
