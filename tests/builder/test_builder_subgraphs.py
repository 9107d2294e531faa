"""Builder subgraph ops (spec §3.1, F12, F23): createSubgraphBuilder, addInputTensorFromParentGraph,
addUntypedInputTensor, aiOnnx.logical_if / loop / scan (opset 8 and 9+), aiGraphcore.call.
Models built here run on the backend and match onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import popart_backend as popart
from popart_backend.errors import popart_exception
from tests.helpers import assert_close, rand, run_onnxruntime, run_popart


def check_against_onnxruntime(builder, feeds):
    model = onnx.load_from_string(builder.getModelProto())
    ours = run_popart(model, feeds)
    ref = run_onnxruntime(model, feeds)
    for name, value in ref.items():
        assert_close(ours[name], value, name)
    return ours


def _branch(builder, op, x, y):
    sub = builder.createSubgraphBuilder()
    sub.addInputTensorFromParentGraph(x)
    sub.addInputTensorFromParentGraph(y)
    sub.addOutputTensor(getattr(sub.aiOnnx, op)([x, y]))
    return sub


@pytest.mark.parametrize("opset", [10, 11, 13, 21])
@pytest.mark.parametrize("cond", [True, False])
def test_logical_if(opset, cond):
    b = popart.Builder(opsets={"ai.onnx": opset})
    x = b.addInputTensor("FLOAT", [2, 3])
    y = b.addInputTensor("FLOAT", [2, 3])
    c = b.addInputTensor("BOOL", [])
    out = b.aiOnnx.logical_if([c], 1, _branch(b, "sub", x, y), _branch(b, "add", x, y))
    assert isinstance(out, list) and len(out) == 1
    b.addOutputTensor(out[0])
    assert b.getTensorShape(out[0]) == [2, 3]
    check_against_onnxruntime(b, {x: rand(2, 3), y: rand(2, 3), c: np.array(cond)})


@pytest.mark.parametrize("opset", [10, 11, 16, 21])
def test_loop_with_carried_and_scan_outputs(opset):
    b = popart.Builder(opsets={"ai.onnx": opset})
    a = b.addInputTensor("FLOAT", [3])
    w = b.addInitializedInputTensor(rand(3, seed=1), "w")
    body = b.createSubgraphBuilder()
    body.addInputTensor("INT64", [])  # iteration number
    cond_in = body.addInputTensor("BOOL", [])
    a_in = body.addInputTensor("FLOAT", [3])
    body.addInputTensorFromParentGraph(w)
    a_out = body.aiOnnx.mul([body.aiOnnx.add([a_in, w]), w])
    body.addOutputTensor(body.aiOnnx.identity([cond_in]))
    body.addOutputTensor(a_out)
    body.addOutputTensor(body.aiOnnx.sigmoid([a_out]))
    m = b.aiOnnx.constant(np.array(5, np.int64))
    true = b.aiOnnx.constant(np.array(True))
    final, scanned = b.aiOnnx.loop([m, true, a], 2, body)
    b.addOutputTensor(final)
    b.addOutputTensor(scanned)
    assert b.getTensorShape(scanned) == [5, 3]
    check_against_onnxruntime(b, {a: rand(3)})


def test_scan_opset_9_signature():
    b = popart.Builder(opsets={"ai.onnx": 11})
    s0 = b.addInputTensor("FLOAT", [2])
    xs = b.addInputTensor("FLOAT", [2, 4])
    body = b.createSubgraphBuilder()
    s = body.addInputTensor("FLOAT", [2])
    x = body.addInputTensor("FLOAT", [2])
    s_out = body.aiOnnx.add([s, x])
    body.addOutputTensor(s_out)
    body.addOutputTensor(body.aiOnnx.mul([s_out, x]))
    outs = b.aiOnnx.scan([s0, xs], 2, body, 1, scan_input_axes=[1], scan_input_directions=[1],
                         scan_output_axes=[0], scan_output_directions=[1])
    for t in outs:
        b.addOutputTensor(t)
    check_against_onnxruntime(b, {s0: rand(2), xs: rand(2, 4)})


def test_scan_opset_8_signature():
    b = popart.Builder(opsets={"ai.onnx": 8})
    s0 = b.addInputTensor("FLOAT", [3, 2])
    xs = b.addInputTensor("FLOAT", [3, 4, 2])
    body = b.createSubgraphBuilder()
    s = body.addInputTensor("FLOAT", [2])
    x = body.addInputTensor("FLOAT", [2])
    s_out = body.aiOnnx.add([s, x])
    body.addOutputTensor(s_out)
    body.addOutputTensor(body.aiOnnx.neg([s_out]))
    outs = b.aiOnnx.scan(["", s0, xs], 2, body, 1, directions=[1])
    for t in outs:
        b.addOutputTensor(t)
    check_against_onnxruntime(b, {s0: rand(3, 2), xs: rand(3, 4, 2)})


def test_call_runs_in_an_inference_session():
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor("FLOAT", [2, 3])
    callee = b.createSubgraphBuilder()
    arg = callee.addUntypedInputTensor()
    callee.addOutputTensor(callee.aiOnnx.relu([arg]))
    (out,) = b.aiGraphcore.call([x], 1, callee, debugName="relu_call")
    b.addOutputTensor(out)
    assert b.getTensorShape(out) == [2, 3]
    session = popart.InferenceSession(
        b.getModelProto(), popart.DataFlow(1, [out]),
        popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    data = rand(2, 3)
    session.run(popart.PyStepIO({x: data}, anchors))
    assert_close(anchors[out], np.maximum(data, 0), "call")


def test_subgraph_reads_parent_without_declaring_it():
    # ONNX scoping: an enclosing tensor is readable by id; the declaration is optional here.
    b = popart.Builder(opsets={"ai.onnx": 13})
    x = b.addInputTensor("FLOAT", [4])
    c = b.addInputTensor("BOOL", [])
    then = b.createSubgraphBuilder()
    then.addOutputTensor(then.aiOnnx.exp([x]))
    other = b.createSubgraphBuilder()
    other.addOutputTensor(other.aiOnnx.neg([x]))
    (out,) = b.aiOnnx.logical_if([c], 1, other, then)
    b.addOutputTensor(out)
    check_against_onnxruntime(b, {x: rand(4), c: np.array(True)})


def test_errors():
    b = popart.Builder()
    x = b.addInputTensor("FLOAT", [2])
    with pytest.raises(popart_exception, match="has no parent"):
        b.addInputTensorFromParentGraph(x)
    sub = b.createSubgraphBuilder()
    with pytest.raises(popart_exception, match="parent builder has no tensor 'nope'"):
        sub.addInputTensorFromParentGraph("nope")
    inner = sub.aiOnnx.relu([x])
    with pytest.raises(popart_exception, match="not tensors of this builder"):
        b.aiOnnx.relu([inner])  # a subgraph's tensor is not visible outside it
    empty = b.createSubgraphBuilder()
    c = b.addInputTensor("BOOL", [])
    with pytest.raises(popart_exception, match="has no outputs"):
        b.aiOnnx.logical_if([c], 1, empty, empty)
    with pytest.raises(popart_exception, match="expects a subgraph builder"):
        b.aiOnnx.logical_if([c], 1, "else", "then")


def test_ids_are_unique_across_subgraphs():
    b = popart.Builder()
    x = b.addInputTensor("FLOAT", [2], debugContext="t")
    sub = b.createSubgraphBuilder()
    y = sub.addInputTensor("FLOAT", [2], debugContext="t")
    assert x != y
    assert sub.aiOnnx.relu([y]) != b.aiOnnx.relu([x])
