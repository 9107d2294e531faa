"""Builder: ONNX models built by hand, run here and in onnxruntime (spec §3, F11–F24)."""

from __future__ import annotations

import inspect
import re
import warnings

import numpy as np
import onnx
import pytest
import torch

import popart_backend as popart
from popart_backend.importer.onnx_model import import_model
from popart_backend.ir.op import RecomputeType
from popart_backend.ir.tensor import TensorInfo as IrTensorInfo
from popart_backend.ops import registry
from popart_backend.ops.base import ElementwiseUnary
from tests.helpers import assert_close, rand, run_onnxruntime, run_popart


def proto(builder: popart.Builder) -> onnx.ModelProto:
    return onnx.load_from_string(builder.getModelProto())


def node_of(model: onnx.ModelProto, output: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if output in n.output)


def attrs_of(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def compare_with_onnxruntime(builder, feeds):
    """Run the builder's model here and in onnxruntime; every output must agree."""
    model = proto(builder)
    ours = run_popart(builder.getModelProto(), feeds)
    theirs = run_onnxruntime(model, feeds)
    assert set(ours) == set(theirs) == set(builder.getOutputTensorIds())
    for name, value in theirs.items():
        assert_close(ours[name], value, name)
    return ours


# --- building and running (F12, F14–F17) -----------------------------------------------------


@pytest.mark.parametrize("opset", [6, 7, 9, 10, 11, 13, 14, 16, 18, 21, 25])
def test_f17_graph_per_opset_matches_onnxruntime(opset):
    """F12, F14-F17: the same graph built with aiOnnxOpsetN runs like onnxruntime."""
    builder = popart.Builder()
    ops = getattr(builder, f"aiOnnxOpset{opset}")
    # Opset 6 Add broadcasts only with the legacy attributes, so keep equal shapes there.
    b_shape = [2, 3] if opset < 7 else [3]
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    b = builder.addInputTensor("FLOAT", b_shape, debugContext="b")
    w = builder.addInitializedInputTensor(rand(2, 3, seed=1), "w")
    s = ops.add([x, b])
    s = ops.add([s, w], debugContext="second")
    r = ops.relu([s])
    lk = ops.leakyrelu([s], alpha=0.3)
    sg = ops.sigmoid([lk])
    for out in (r, sg):
        builder.addOutputTensor(out)
    if opset >= 11:  # Equal accepts floats from opset 11
        eq = ops.equal([r, s])  # true where the sum is positive
        builder.addOutputTensor(eq)
    assert builder.aiOnnx is ops
    assert proto(builder).opset_import[0].version == opset
    feeds = {"x": rand(2, 3, seed=2), "b": rand(*b_shape, seed=3)}
    total = feeds["x"] + feeds["b"] + rand(2, 3, seed=1)
    expected = {r: np.maximum(total, 0),
                sg: 1 / (1 + np.exp(-np.where(total > 0, total, 0.3 * total)))}
    if opset >= 11:
        expected[eq] = total > 0
    if opset >= 7:
        ours = compare_with_onnxruntime(builder, feeds)
    else:  # onnxruntime has no kernels for opset-6 Add
        ours = run_popart(builder.getModelProto(), feeds)
    for name, value in expected.items():
        assert_close(ours[name], value.astype(ours[name].dtype), name, rtol=1e-5, atol=1e-6)


def _numpy_conv(x, w, pad):
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, wd = xp.shape
    oc, _, kh, kw = w.shape
    out = np.zeros((n, oc, h - kh + 1, wd - kw + 1), np.float64)
    for i in range(out.shape[2]):
        for j in range(out.shape[3]):
            out[:, :, i, j] = np.einsum("nchw,ochw->no", xp[:, :, i:i + kh, j:j + kw], w)
    return out.astype(np.float32)


def test_f17_generated_ops_are_valid_onnx():
    """F17: generated methods write valid nodes for ops with attributes, optional inputs and
    variable outputs; onnxruntime runs them and agrees with numpy, and so do we."""
    builder = popart.Builder(opsets={"ai.onnx": 11})
    ops = builder.aiOnnx
    x = builder.addInputTensor("FLOAT", [1, 2, 5, 5], debugContext="x")
    w = builder.addInitializedInputTensor(rand(3, 2, 3, 3, seed=4), "w")
    conv = ops.conv([x, w], dilations=[1, 1], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                    strides=[1, 1], debugContext="conv")
    pooled = ops.maxpool([conv], num_outputs=1, kernel_shape=[2, 2], strides=[2, 2])
    assert isinstance(pooled, list) and len(pooled) == 1
    parts = ops.split([conv], num_outputs=3, axis=1, split=[1, 1, 1])
    assert len(parts) == 3
    values, indices = ops.topk([ops.flatten([conv], axis=1),
                                builder.aiOnnx.constant(np.array([4], np.int64))], axis=-1)
    summed = ops.reducesum([conv], axes=[2, 3], keepdims=0)
    flat = builder.reshape_const(ops, [conv], [1, 75])
    cat = ops.concat(parts[::-1], axis=1)
    for out in (pooled[0], parts[2], values, indices, summed, flat, cat):
        builder.addOutputTensor(out)

    feeds = {"x": rand(1, 2, 5, 5, seed=5)}
    got = run_onnxruntime(proto(builder), feeds)
    ours = run_popart(proto(builder), feeds)
    for name, value in got.items():
        assert_close(ours[name], value, f"popart {name}", rtol=1e-5, atol=1e-5)
    ref = _numpy_conv(feeds["x"], rand(3, 2, 3, 3, seed=4), 1)
    pooled_ref = ref[:, :, :4, :4].reshape(1, 3, 2, 2, 2, 2).max(axis=(3, 5))
    assert_close(got[pooled[0]], pooled_ref, "maxpool", rtol=1e-4, atol=1e-5)
    assert_close(got[parts[2]], ref[:, 2:3], "split", rtol=1e-4, atol=1e-5)
    assert_close(got[summed], ref.sum(axis=(2, 3)), "reducesum", rtol=1e-4, atol=1e-4)
    assert_close(got[flat], ref.reshape(1, 75), "reshape_const", rtol=1e-4, atol=1e-5)
    assert_close(got[cat], ref[:, ::-1], "concat", rtol=1e-4, atol=1e-5)
    top = np.sort(ref.reshape(1, -1), axis=1)[:, ::-1][:, :4]
    assert_close(got[values], top, "topk", rtol=1e-4, atol=1e-5)
    assert got[indices].dtype == np.int64


def test_f17_methods_follow_the_schema_of_each_opset():
    """F17: the op set and signatures come from onnx.defs for the chosen opset."""
    b10, b13, b20 = (popart.Builder(opsets={"ai.onnx": v}) for v in (10, 13, 20))
    assert "axes" in inspect.signature(b10.aiOnnx.reducesum).parameters
    assert "axes" not in inspect.signature(b13.aiOnnx.reducesum).parameters
    assert "num_outputs" in inspect.signature(b10.aiOnnx.dropout).parameters
    assert not hasattr(b10.aiOnnx, "gelu") and hasattr(b20.aiOnnx, "gelu")
    assert hasattr(b10.aiOnnx, "logical_not") and hasattr(b10.aiOnnx, "logical_if")
    params = inspect.signature(b10.aiOnnx.gather).parameters
    assert list(params) == ["args", "axis", "debugContext"] and params["axis"].default == 0
    with pytest.raises(AttributeError, match="no op 'gelu'.*opset 10"):
        b10.aiOnnx.gelu


def test_f17_reducesum_axes_as_input_from_opset_13():
    """ReduceSum's axes moved from attribute to input in opset 13; both build and run."""
    data = rand(2, 3, 4, seed=6)
    for opset in (11, 13):
        builder = popart.Builder(opsets={"ai.onnx": opset})
        x = builder.addInputTensor("FLOAT", [2, 3, 4], debugContext="x")
        if opset == 11:
            out = builder.aiOnnx.reducesum([x], axes=[1], keepdims=0)
        else:
            axes = builder.aiOnnx.constant(np.array([1], np.int64))
            out = builder.aiOnnx.reducesum([x, axes], keepdims=0)
        builder.addOutputTensor(out)
        assert builder.getTensorShape(out) == [2, 4]
        got = run_onnxruntime(proto(builder), {"x": data})[out]
        assert_close(got, data.sum(axis=1), f"reducesum-{opset}", rtol=1e-5, atol=1e-6)
        ours = run_popart(proto(builder), {"x": data})[out]
        assert_close(ours, data.sum(axis=1), f"popart reducesum-{opset}", rtol=1e-5, atol=1e-6)


def test_f17_split_18_num_outputs_attribute():
    """Split-18's num_outputs attribute is filled from the method's num_outputs when no sizes
    input is given."""
    builder = popart.Builder(opsets={"ai.onnx": 18})
    x = builder.addInputTensor("FLOAT", [6, 2], debugContext="x")
    halves = builder.aiOnnx.split([x], 2)
    sizes = builder.aiOnnx.constant(np.array([1, 5], np.int64))
    parts = builder.aiOnnx.split([x, sizes], num_outputs=2, axis=0)
    for out in halves + parts:
        builder.addOutputTensor(out)
    model = proto(builder)
    assert attrs_of(node_of(model, halves[0])) == {"num_outputs": 2}
    assert attrs_of(node_of(model, parts[0])) == {}
    data = rand(6, 2, seed=12)
    got = run_onnxruntime(model, {"x": data})
    ours = run_popart(model, {"x": data})
    for out, expected in zip(halves + parts, [data[:3], data[3:], data[:1], data[1:]]):
        assert_close(got[out], expected, out)
        assert_close(ours[out], expected, f"popart {out}")


def test_f17_return_values_and_ids():
    """F17: one id, or a list for variable or multiple outputs; PopART-style unique ids."""
    builder = popart.Builder()
    x = builder.addInputTensor("FLOAT", [4, 2])
    y = builder.addInputTensor("FLOAT", [4, 2])
    assert (x, y) == ("input", "input/1")
    a1 = builder.aiOnnx.add([x, y])
    a2 = builder.aiOnnx.add([x, y])
    assert (a1, a2) == ("Add:0", "Add:0/1")
    g = builder.aiOnnx.gather([x, builder.aiOnnx.constant(np.array([1], np.int64), False)],
                              axis=1, debugContext="My-Gather")
    assert g == "My-Gather:0"
    assert builder.aiOnnx.relu([x], debugPrefix="old") == "old:0"
    outs = builder.aiOnnx.dropout([x], num_outputs=2, ratio=0.5)
    assert outs == ["Dropout:0", "Dropout:1"]
    bn = builder.aiOnnx.batchnormalization(
        [x] + [builder.addInitializedInputTensor(np.ones(2, np.float32)) for _ in range(4)],
        num_outputs=1, epsilon=1e-3)
    assert isinstance(bn, list) and len(bn) == 1
    model = proto(builder)
    assert node_of(model, g).name == "My-Gather"
    assert attrs_of(node_of(model, bn[0])) == {"epsilon": pytest.approx(1e-3)}
    assert "ratio" not in attrs_of(node_of(model, outs[0]))  # defaults are not written


# --- errors (F17, F18) -----------------------------------------------------------------------


def test_f18_one_onnx_opset_per_builder():
    """F18: the first opset used (or the opsets argument) fixes ai.onnx; others raise."""
    builder = popart.Builder()
    builder.aiOnnxOpset9.relu([builder.addInputTensor("FLOAT", [2])])
    assert builder.aiOnnx.version == 9
    with pytest.raises(RuntimeError, match=re.escape(
            "Invalid opset 'aiOnnxOpset11' selected. Opset for domain ai.onnx already "
            "defined as 9")):
        builder.aiOnnxOpset11

    defaulted = popart.Builder()
    assert defaulted.aiOnnx.version == 10
    with pytest.raises(popart.popart_exception, match=re.escape(
            "Invalid opset 'aiOnnxOpset8' selected. Opset for domain ai.onnx already "
            "defined as 10")):
        defaulted.aiOnnxOpset8

    fixed = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    assert fixed.aiOnnx is fixed.aiOnnxOpset11
    assert fixed.aiGraphcore is fixed.aiGraphcoreOpset1
    with pytest.raises(AttributeError, match="opsets 6..28"):
        fixed.aiOnnxOpset5
    with pytest.raises(popart.popart_exception, match="ai.graphcore opset 2 does not exist"):
        popart.Builder(opsets={"ai.graphcore": 2})


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda b, x: b.aiOnnx.conv([x, x], foo=1),
         r"aiOnnxOpset10.conv: unknown argument 'foo'. Conv .* accepts attributes \['auto_pad'"),
        (lambda b, x: b.aiOnnx.add([x]), r"aiOnnxOpset10.add: Add-10 takes 2 inputs, got 1"),
        (lambda b, x: b.aiOnnx.split([x]), r"num_outputs \(1..\d+\) must be given"),
        (lambda b, x: b.aiOnnx.dropout([x], 3), r"num_outputs=3, but Dropout-10 has 1..2"),
        (lambda b, x: b.aiOnnx.leakyrelu([x], alpha="big"), "'alpha' expects a float"),
        (lambda b, x: b.aiOnnx.cast([x]), "attribute 'to' must be given"),
        (lambda b, x: b.aiOnnx.relu(x), "args must be a list of tensor ids"),
        (lambda b, x: b.aiOnnx.relu(["nope"]), r"input\(s\) \['nope'\] are not tensors"),
        (lambda b, x: b.aiOnnx.relu([x], "dbg", 3), "at most 2 positional arguments"),
        (lambda b, x: b.aiOnnx.transpose([x], perm=[0, 1], debugContext=3),
         "debugContext must be a string"),
        (lambda b, x: b.aiOnnx.logical_if([x], 1), "attribute 'else_branch' must be given"),
        (lambda b, x: b.aiGraphcore.call([x], 1), "attribute 'callee' must be given"),
        (lambda b, x: b.aiGraphcore.scale([x]), "attribute 'scale' must be given"),
        (lambda b, x: b.aiOnnx.loop(["", "", x], 1, "body"), "expects a subgraph builder"),
    ],
)
def test_f17_call_validation(call, match):
    """F17: arguments are checked against the op's schema with clear messages."""
    builder = popart.Builder()
    x = builder.addInputTensor("FLOAT", [2, 3])
    with pytest.raises(popart.popart_exception, match=match):
        call(builder, x)


# --- ai.graphcore and custom ops (F17, F80, F91) ---------------------------------------------


def test_f17_graphcore_nodes():
    """aiGraphcore methods write ai.graphcore nodes with every attribute explicit."""
    builder = popart.Builder()
    x = builder.addInputTensor("FLOAT", [4, 3])
    labels = builder.addInputTensor("INT32", [4])
    scaled = builder.aiGraphcore.scale([x], 2.0)
    loss = builder.aiGraphcore.identityloss([scaled])
    nll = builder.aiGraphcore.nllloss([builder.aiOnnx.softmax([x]), labels], reduction="Sum",
                                      ignoreIndex=1)
    l1 = builder.aiGraphcore.l1loss([x], 0.1)
    init = builder.aiGraphcore.init([2, 2], "FLOAT", 1)
    median = builder.aiGraphcore.reducemedian([x], axes=[1])
    ctc = builder.aiGraphcore.ctcloss([x, labels, labels, labels])
    assert isinstance(median, list) and len(median) == 2 and isinstance(ctc, str)
    model = proto(builder)
    assert {(o.domain, o.version) for o in model.opset_import} == {
        ("", 10), ("ai.graphcore", 1)}
    node = node_of(model, scaled)
    assert (node.domain, node.op_type, attrs_of(node)) == ("ai.graphcore", "Scale",
                                                           {"scale": 2.0})
    assert attrs_of(node_of(model, loss)) == {"reduction": 1}
    assert attrs_of(node_of(model, nll)) == {"reduction": 0, "ignoreIndex": 1,
                                             "inputIsLogProbability": 0}
    assert attrs_of(node_of(model, l1))["lambda"] == pytest.approx(0.1)
    assert attrs_of(node_of(model, init)) == {"shape": [2, 2], "data_type": 1, "init_type": 1,
                                              "batch_axis": -1}
    assert len(node_of(model, ctc).output) == 2


def test_f17_graphcore_nodes_take_popart_enums():
    """ReductionType, CommGroup and TensorLocation objects become the node's int attributes."""
    builder = popart.Builder()
    x = builder.addInputTensor("FLOAT", [4])
    loss = builder.aiGraphcore.identityloss([x], reduction=popart.ReductionType.Sum)
    reduced = builder.aiGraphcore.replicatedallreduce(
        [x], commGroup=popart.CommGroup(popart.CommGroupType.Consecutive, 2))
    builder.outputTensorLocation(loss, popart.TensorLocation(popart.TensorStorage.OffChip))
    with builder.commGroup(popart.CommGroupType.Orthogonal, 2):
        r = builder.aiOnnx.relu([x])
    model = proto(builder)
    assert attrs_of(node_of(model, loss)) == {"reduction": 0,
                                              "__output_tensor_location": [1, 0, 0, 0, 0, 0]}
    assert attrs_of(node_of(model, reduced)) == {"__collectiveCommGroup": [1, 2]}
    assert attrs_of(node_of(model, r)) == {"__collectiveCommGroup": [2, 2]}


def test_f17_onnx_ml_opset():
    builder = popart.Builder()
    x = builder.addInputTensor("FLOAT", [2, 3])
    y = builder.aiOnnxMlOpset1.normalizer([x], norm="L1")
    builder.addOutputTensor(y)
    model = proto(builder)
    assert ("ai.onnx.ml", 1) in {(o.domain, o.version) for o in model.opset_import}
    data = rand(2, 3, seed=13)
    got = run_onnxruntime(model, {x: data})[y]
    assert_close(got, data / np.abs(data).sum(axis=1, keepdims=True), "normalizer",
                 rtol=1e-5, atol=1e-6)


@pytest.fixture
def registered_graphcore_test_op():
    """A test-only ai.graphcore op, registered for one test and removed afterwards."""

    @registry.register_op("BuilderTestTwice", versions=1, domain="ai.graphcore")
    class BuilderTestTwice(ElementwiseUnary):
        def kernel(self, x):
            return x * 2

    yield "BuilderTestTwice"
    registry._REGISTRY.pop(("ai.graphcore", "BuilderTestTwice"))


def test_f19_tensor_shape_and_dtype():
    """F19: getTensorShape/getTensorDtypeString from ONNX shape inference."""
    builder = popart.Builder(opsets={"ai.onnx": 13})
    x = builder.addInputTensor("FLOAT", [2, 1, 3])
    y = builder.addInputTensor("FLOAT16", [4, 1])
    w = builder.addInitializedInputTensor(np.zeros((5,), np.int32))
    s = builder.aiOnnx.add([x, builder.aiOnnx.cast([y], to=1)])
    r = builder.reshape_const(builder.aiOnnx, [s], [-1, 3])
    shape = builder.aiOnnx.shape([r])
    assert builder.getTensorShape(x) == [2, 1, 3]
    assert builder.getTensorShape(w) == [5] and builder.getTensorDtypeString(w) == "int32"
    assert builder.getTensorDtypeString(y) == "float16"
    assert builder.getTensorShape(s) == [2, 4, 3]
    assert builder.getTensorShape(r) == [8, 3]
    assert builder.getTensorShape(shape) == [2]
    assert builder.getTensorDtypeString(shape) == "int64"
    with pytest.raises(popart.popart_exception, match="'nope' is not in this builder's model"):
        builder.getTensorShape("nope")


def test_f19_tensor_shape_of_graphcore_op(registered_graphcore_test_op):
    """F19: ONNX cannot infer ai.graphcore ops; the backend's own inference answers."""
    builder = popart.Builder()
    x = builder.addInputTensor("FLOAT", [3, 2])
    twice = builder.customOp(registered_graphcore_test_op, 1, "ai.graphcore", [x])[0]
    after = builder.aiOnnx.relu([twice])
    assert builder.getTensorShape(after) == [3, 2]
    assert builder.getTensorDtypeString(twice) == "float32"
    builder.addOutputTensor(after)
    feeds = {x: rand(3, 2, seed=7)}
    assert_close(run_popart(builder.getModelProto(), feeds)[after],
                 np.maximum(feeds[x] * 2, 0), "twice")

    unknown = builder.customOp("NoSuchBuilderTestOp", 1, "ai.graphcore", [x])[0]
    with pytest.raises(popart.UnsupportedOpError,
                       match=r"getTensorShape\('NoSuchBuilderTestOp:0'\).*NoSuchBuilderTestOp"):
        builder.getTensorShape(unknown)
    # Only the part of the model a tensor depends on is imported.
    assert builder.getTensorShape(twice) == [3, 2]


def test_f91_custom_op_attributes():
    builder = popart.Builder()
    x = builder.addInputTensor("FLOAT", [2])
    outs = builder.customOp("MyOp", 2, "com.acme", [x],
                            {"i": 3, "f": 0.5, "s": "hi", "ii": [1, 2], "ff": [0.5], "ss": ["a"]},
                            numOutputs=2, name="mine")
    assert outs == ["mine:0", "mine:1"]
    model = proto(builder)
    assert ("com.acme", 2) in {(o.domain, o.version) for o in model.opset_import}
    assert attrs_of(node_of(model, outs[0])) == {
        "i": 3, "f": 0.5, "s": b"hi", "ii": [1, 2], "ff": [0.5], "ss": [b"a"]}
    with pytest.raises(popart.popart_exception, match="Invalid opset 3 for domain com.acme"):
        builder.customOp("Other", 3, "com.acme", [x])


# --- introspection, saving, loading (F11, F12, F19) ------------------------------------------


def test_f19_id_listings():
    builder = popart.Builder()
    x = builder.addInputTensor("FLOAT", [2])
    w = builder.addInitializedInputTensor(np.ones(2, np.float32))
    a = builder.aiOnnx.add([x, w])
    r = builder.aiOnnx.relu([a])
    builder.addOutputTensor(r)
    builder.setGraphName("my_graph")
    assert builder.getInputTensorIds() == [x]
    assert builder.getTrainableTensorIds() == [w]
    assert builder.getOutputTensorIds() == [r]
    assert builder.getValueTensorIds() == [a]
    assert builder.isInitializer(w) and not builder.isInitializer(x)
    assert proto(builder).graph.name == "my_graph"
    with pytest.raises(popart.popart_exception, match="already an output"):
        builder.addOutputTensor(r)


def test_f19_save_model_and_external_initializers(tmp_path):
    """F19: saveInitializersExternally writes the data next to the model, which still runs."""
    builder = popart.Builder(opsets={"ai.onnx": 13})
    x = builder.addInputTensor("FLOAT", [2, 3], debugContext="x")
    w = builder.addInitializedInputTensor(rand(2, 3, seed=8), "w")
    out = builder.aiOnnx.add([x, w])
    builder.addOutputTensor(out)
    builder.saveInitializersExternally([w], tmp_path / "weights.bin")
    assert (tmp_path / "weights.bin").stat().st_size == 24
    assert proto(builder).graph.initializer[0].data_location == onnx.TensorProto.EXTERNAL
    with pytest.raises(popart.popart_exception, match="must sit in that folder"):
        builder.saveModelProto(tmp_path / "elsewhere" / "model.onnx")
    path = tmp_path / "model.onnx"
    builder.saveModelProto(path)
    feeds = {"x": rand(2, 3, seed=9)}
    expected = feeds["x"] + rand(2, 3, seed=8)
    assert_close(run_popart(str(path), feeds)[out], expected, "from file")
    assert_close(run_onnxruntime(onnx.load(str(path)), feeds)[out], expected, "ort")
    assert builder.getTensorShape(out) == [2, 3]


def _torch_model_file(tmp_path):
    class AddRelu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.linspace(-1, 1, 3))

        def forward(self, x):
            return torch.relu(x + self.w)

    path = tmp_path / "torch_model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(AddRelu(), (torch.zeros(2, 3),), str(path), dynamo=False,
                          opset_version=13, input_names=["x"], output_names=["y"])
    return path


def test_f11_extend_a_torch_exported_model(tmp_path):
    """F11, F12: Builder(path) of a torch export, plus an op and an output, runs correctly."""
    path = _torch_model_file(tmp_path)
    for source in (str(path), path.read_bytes()):
        builder = popart.Builder(source)
        assert builder.aiOnnx.version == 13
        with pytest.raises(popart.popart_exception, match="already defined as 13"):
            builder.aiOnnxOpset10
        assert builder.getInputTensorIds() == ["x"]
        assert builder.getOutputTensorIds() == ["y"]
        assert builder.getTensorShape("y") == [2, 3]
        loss_input = builder.aiOnnx.sigmoid(["y"])
        builder.addOutputTensor(loss_input)
        feeds = {"x": rand(2, 3, seed=10)}
        got = compare_with_onnxruntime(builder, feeds)
        expected = torch.sigmoid(torch.relu(torch.from_numpy(feeds["x"])
                                            + torch.linspace(-1, 1, 3))).numpy()
        assert_close(got[loss_input], expected, "sigmoid")
    with pytest.raises(popart.ModelError, match="does not exist"):
        popart.Builder(str(tmp_path / "missing.onnx"))


# --- annotations (F20, F22, F24, F62; spec §3.4–3.6) -----------------------------------------


def test_f20_f62_f24_annotations_reach_op_settings():
    """Placement annotations written by the builder become OpSettings after import."""
    builder = popart.Builder()
    x = builder.addInputTensor("FLOAT", [2, 2])
    with builder.virtualGraph(0), builder.pipelineStage(0):
        a = builder.aiOnnx.relu([x])
        assert builder.hasVirtualGraph() and builder.getVirtualGraph() == 0
        with builder.virtualGraph(1), builder.schedulePriority(2.5):
            b = builder.aiOnnx.sigmoid([a])
            assert builder.getVirtualGraph() == 1
    assert not builder.hasVirtualGraph() and not builder.hasPipelineStage()
    c = builder.aiOnnx.add([a, b])
    builder.virtualGraph(c, 1)
    builder.pipelineStage([c], 1)
    builder.executionPhase(c, 3)
    builder.recomputeOutputInBackwardPass(c)
    with builder.recomputeOutput(RecomputeType.Checkpoint):
        d = builder.aiOnnx.relu([c])
    builder.addOutputTensor(d)

    assert builder.getVirtualGraph(b) == 1 and builder.getVirtualGraph(c) == 1
    assert builder.getPipelineStage(a) == 0 and builder.getPipelineStage(c) == 1
    assert builder.getExecutionPhase(c) == 3
    assert builder.getRecomputeOutputInBackwardPass(c)
    assert not builder.getRecomputeOutputInBackwardPass(d)
    assert builder.getFloatNodeAttribute("__schedule_priority", b) == 2.5

    graph = import_model(builder.getModelProto()).main
    settings = {t: graph.tensors[t].producer.settings for t in (a, b, c, d)}
    assert (settings[a].ipu, settings[a].pipeline_stage) == (0, 0)
    assert (settings[b].ipu, settings[b].pipeline_stage, settings[b].schedule_priority) == (
        1, 0, 2.5)
    assert (settings[c].ipu, settings[c].pipeline_stage, settings[c].execution_phase) == (1, 1, 3)
    assert settings[c].recompute is RecomputeType.Recompute
    assert settings[d].recompute is RecomputeType.Checkpoint and settings[d].ipu is None
    compare_with_onnxruntime(builder, {x: rand(2, 2, seed=11)})


def test_f24_checkpoint_output():
    builder = popart.Builder()
    x = builder.addInputTensor("FLOAT", [2])
    r = builder.aiOnnx.relu([x])
    (cp,) = builder.checkpointOutput([r])
    node = node_of(proto(builder), cp)
    assert node.op_type == "Identity" and list(node.input) == [r]
    assert attrs_of(node) == {"__recompute_output_in_backward_pass": 1}
    with pytest.raises(popart.popart_exception, match="graph input or initializer"):
        builder.virtualGraph(x, 1)


def test_name_scopes():
    """nameScope prefixes ids and node names, nests, and gives the op its scope on import."""
    builder = popart.Builder()
    with builder.nameScope("enc"):
        x = builder.addInputTensor("FLOAT", [2])
        with builder.nameScope("layer1"):
            r = builder.aiOnnx.relu([x])
            assert builder.getNameScope("w") == "enc/layer1/w"
            w = builder.addInitializedInputTensor(np.ones(2, np.float32), "w")
        r2 = builder.aiOnnx.relu([r])
    assert builder.getNameScope() == ""
    assert (x, r, w, r2) == ("enc/input", "enc/layer1/Relu:0", "enc/layer1/w", "enc/Relu:0")
    builder.addOutputTensor(r2)
    graph = import_model(builder.getModelProto()).main
    assert graph.tensors[r].producer.settings.scope == "enc/layer1"
    assert graph.tensors[r2].producer.settings.scope == "enc"


def test_f22_node_attribute_api():
    builder = popart.Builder()
    x = builder.addInputTensor("FLOAT", [4, 4])
    m = builder.aiOnnx.matmul([x, x])
    values = {"i": 7, "iv": [1, 2], "f": 0.25, "fv": [0.5, 1.5], "s": "text", "sv": ["a", "b"]}
    for name, value in values.items():
        builder.addNodeAttribute(name, value, {m})
    assert builder.getInt64NodeAttribute("i", [m]) == 7
    assert builder.getInt64VectorNodeAttribute("iv", m) == [1, 2]
    assert builder.getFloatNodeAttribute("f", m) == 0.25
    assert builder.getFloatVectorNodeAttribute("fv", m) == [0.5, 1.5]
    assert builder.getStringNodeAttribute("s", m) == "text"
    assert builder.getStringVectorNodeAttribute("sv", m) == ["a", "b"]
    assert builder.getAllNodeAttributeNames(m) == list(values)
    assert builder.nodeHasAttribute("i", m)
    builder.removeNodeAttribute("i", m)
    assert not builder.nodeHasAttribute("i", m)
    with pytest.raises(popart.popart_exception, match="is FLOAT, not INT"):
        builder.getInt64NodeAttribute("f", m)
    with pytest.raises(popart.popart_exception, match="already has attribute 's'"):
        builder.addNodeAttribute("s", "again", m)
    with pytest.raises(popart.popart_exception, match="has no attribute 'i'"):
        builder.removeNodeAttribute("i", m)

    builder.setPartialsType(m, "HALF")
    assert builder.getPartialsType(m) == "half"
    builder.setAvailableMemoryProportion(m, 0.3)
    builder.setSerializeMatMul({m}, "output_channels", 2, keep_precision=True)
    builder.excludePatterns(m, ["MatMulLhsGradOp"])
    builder.setInplacePreferences(m, {"AddLhsInplace": 10.0})
    builder.setEnableConvDithering(m, True)
    builder.outputTensorLocation(m, [1, 0, 0, 0, 0, 0])
    attrs = attrs_of(node_of(proto(builder), m))
    assert attrs["__partials_type"] == b"half"
    assert attrs["__available_memory"] == pytest.approx(0.3)
    assert (attrs["__serialize_matmul_mode"], attrs["__serialize_matmul_factor"],
            attrs["__serialize_matmul_precision"]) == (b"output_channels", 2, 1)
    assert attrs["__exclude_patterns"] == [b"MatMulLhsGradOp"]
    assert (attrs["__inplace_op_names"], attrs["__inplace_op_priorities"]) == (
        [b"AddLhsInplace"], [10.0])
    assert attrs["__enable_conv_dithering"] == 1
    assert attrs["__output_tensor_location"] == [1, 0, 0, 0, 0, 0]

    r = builder.aiOnnx.relu([m])
    assert builder.getPartialsType(r) == "float"
    with pytest.raises(popart.popart_exception, match="is a Relu, not a MatMul"):
        builder.setSerializeMatMul({r}, "input_channels")
    with pytest.raises(popart.popart_exception, match="unsupported mode 'rows'"):
        builder.setSerializeMatMul({m}, "rows")
    with pytest.raises(popart.popart_exception, match=r"not in \(0, 1\]"):
        builder.setAvailableMemoryProportion(m, 1.5)
    with pytest.raises(popart.popart_exception, match="'float' or 'half'"):
        builder.setPartialsType(m, "double")
    with pytest.raises(popart.popart_exception, match="outputs of 2 different nodes"):
        builder.getAllNodeAttributeNames([m, r])


def test_context_annotations_outline_and_comm_group():
    builder = popart.Builder()
    x = builder.addInputTensor("FLOAT", [2])
    with builder.outlineAttributes({"layer": "3"}), builder.commGroup(1, 4):
        r = builder.aiOnnx.relu([x])
    with builder.executionPhase(2):
        s = builder.aiOnnx.sigmoid([r])
    attrs = attrs_of(node_of(proto(builder), r))
    assert attrs == {"__outline": [b"layer", b"3"], "__collectiveCommGroup": [1, 4]}
    assert builder.getExecutionPhase(s) == 2 and not builder.hasExecutionPhase()
    with pytest.raises(popart.popart_exception, match="no value is set"):
        builder.getPipelineStage()


def test_ir_tensor_info_accepted_by_add_input():
    builder = popart.Builder()
    x = builder.addInputTensor(IrTensorInfo(popart.DataType.INT64, (3,)))
    assert builder.getTensorDtypeString(x) == "int64"
    with pytest.raises(popart.popart_exception, match="give the shape too"):
        builder.addInputTensor("FLOAT")
