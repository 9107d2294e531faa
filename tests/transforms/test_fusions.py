"""Compile-time fusion passes (DESIGN decision 9): each rewrites the IR as its docstring shows
and the fused graph still computes what onnxruntime computes on the original model."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.errors import ModelError
from popart_backend.importer.onnx_model import import_model
from popart_backend.ir.verify import verify
from popart_backend.transforms.fuse_attention import FuseAttention
from popart_backend.transforms.fuse_conv_act import FuseConvActivation
from popart_backend.transforms.fuse_conv_bn import FoldBatchNormIntoConv
from popart_backend.transforms.fuse_gelu import FuseGelu
from popart_backend.transforms.fuse_layer_norm import FuseLayerNorm
from popart_backend.transforms.fuse_matmul_add import FuseMatMulAdd
from popart_backend.transforms.pipeline import inference_passes, run_passes
from tests.helpers import assert_close, run_onnxruntime

RNG = np.random.default_rng(0)


def randn(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def const(name, value):
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def make_model(nodes, inputs: dict[str, np.ndarray], outputs, initializers=(), opset=18):
    graph = helper.make_graph(
        nodes, "fusion_test",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape))
         for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 9)
    return model


def fuse_and_run(model, feeds, passes=None, constant_weights=True, anchors=()):
    """Import, run the passes, verify the IR, execute; returns (op type counts, outputs)."""
    ir = import_model(model, constant_weights=constant_weights)
    ir.anchors = list(anchors)
    run_passes(ir, passes if passes is not None else inference_passes(), debug=True)
    verify(ir.main)
    keep = list(ir.main.outputs) + list(anchors)
    plan = ExecutionPlan(ir.main, keep=keep)
    for name in plan.stream_ids:
        plan.set_value(name, to_torch(feeds[name]))
    plan.execute()
    values = {}
    for name in keep:
        value = plan.get_value(name)
        values[name] = value.numpy() if value is not None else ir.main.tensors[name].data
        assert values[name].shape == ir.main.tensors[name].info.shape
    return Counter(op.op_type for op in ir.main.ops.values()), values


def check_against_ort(model, feeds, ours, rtol=1e-5, atol=1e-5):
    expected = run_onnxruntime(model, feeds)
    for name, value in expected.items():
        assert_close(ours[name], value, name, rtol=rtol, atol=atol)


# --- MatMul + Add (+ Relu) --------------------------------------------------------------------


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("bias_shape", [(32,), (1, 1, 32)])
def test_matmul_add_becomes_linear(relu, bias_shape):
    feeds = {"x": randn(2, 8, 16)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["b", "m"], ["y" if not relu else "s"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["s"], ["y"]))
    inits = [const("w", randn(16, 32)), const("b", randn(*bias_shape))]
    model = make_model(nodes, feeds, ["y"], inits)
    ops, ours = fuse_and_run(model, feeds, [FuseMatMulAdd()])
    assert ops == Counter({"LinearBias": 1})
    check_against_ort(model, feeds, ours)


def test_matmul_add_not_fused_when_add_is_not_a_bias_or_result_is_read():
    feeds = {"x": randn(4, 16), "r": randn(4, 32)}
    w = const("w", randn(16, 32))
    # The Add's other operand is a full activation, not a bias.
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                        helper.make_node("Add", ["m", "r"], ["y"])], feeds, ["y"], [w])
    ops, ours = fuse_and_run(model, feeds, [FuseMatMulAdd()])
    assert ops == Counter({"MatMul": 1, "Add": 1})
    check_against_ort(model, feeds, ours)
    # The MatMul result is also a graph output (and anchored): it must stay.
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                        helper.make_node("Add", ["m", "b"], ["y"])],
                       {"x": feeds["x"]}, ["y", "m"], [w, const("b", randn(32))])
    ops, ours = fuse_and_run(model, {"x": feeds["x"]}, [FuseMatMulAdd()], anchors=["m"])
    assert ops == Counter({"MatMul": 1, "Add": 1})
    check_against_ort(model, {"x": feeds["x"]}, ours)


def test_gemm_relu_becomes_linear_with_variable_weights():
    feeds = {"x": randn(4, 16)}
    model = make_model(
        [helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1),
         helper.make_node("Relu", ["g"], ["y"])],
        feeds, ["y"], [const("w", randn(32, 16)), const("b", randn(32))])
    ops, ours = fuse_and_run(model, feeds, [FuseMatMulAdd()], constant_weights=False)
    assert ops == Counter({"LinearBias": 1})
    check_against_ort(model, feeds, ours)


# --- Conv + BatchNormalization, Conv + (Add) + Relu -------------------------------------------


def _bn_initializers(c):
    return [const("scale", RNG.uniform(0.5, 1.5, c)), const("beta", randn(c)),
            const("mean", randn(c, scale=0.3)), const("var", RNG.uniform(0.5, 1.5, c))]


@pytest.mark.parametrize("conv_bias", [True, False])
def test_batchnorm_folds_into_conv(conv_bias):
    feeds = {"x": randn(2, 3, 8, 8)}
    conv_inputs = ["x", "w", "cb"] if conv_bias else ["x", "w"]
    inits = [const("w", randn(4, 3, 3, 3)), *_bn_initializers(4)]
    if conv_bias:
        inits.append(const("cb", randn(4)))
    model = make_model(
        [helper.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["y"],
                          epsilon=1e-3)],
        feeds, ["y"], inits)
    ops, ours = fuse_and_run(model, feeds, [FoldBatchNormIntoConv()])
    assert ops == Counter({"Conv": 1})
    check_against_ort(model, feeds, ours, rtol=1e-5, atol=1e-5)


def test_batchnorm_not_folded_when_weights_are_variables():
    feeds = {"x": randn(2, 3, 8, 8)}
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"]),
         helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["y"])],
        feeds, ["y"], [const("w", randn(4, 3, 3, 3)), *_bn_initializers(4)])
    ops, ours = fuse_and_run(model, feeds, [FoldBatchNormIntoConv()], constant_weights=False)
    assert ops == Counter({"Conv": 1, "BatchNormalization": 1})
    check_against_ort(model, feeds, ours)


def test_conv_relu_fuses_unless_the_conv_output_is_read_elsewhere():
    feeds = {"x": randn(2, 3, 8, 8)}
    inits = [const("w", randn(4, 3, 3, 3)), const("b", randn(4))]
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2]),
                        helper.make_node("Relu", ["c"], ["y"])], feeds, ["y"], inits)
    ops, ours = fuse_and_run(model, feeds, [FuseConvActivation()])
    assert ops == Counter({"ConvBiasAct": 1})
    check_against_ort(model, feeds, ours)
    # The in-place ReLU would clobber 'c', which the host also reads.
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2]),
                        helper.make_node("Relu", ["c"], ["y"])], feeds, ["y", "c"], inits)
    ops, ours = fuse_and_run(model, feeds, [FuseConvActivation()])
    assert ops == Counter({"Conv": 1, "Relu": 1})
    check_against_ort(model, feeds, ours)


def test_conv_bn_relu_and_residual_block_fuse():
    """Conv+BN+Relu, then Conv+BN+Add(shortcut)+Relu: a ResNet basic block."""
    feeds = {"x": randn(2, 4, 8, 8)}
    bn = _bn_initializers(4)
    model = make_model(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c1", "scale", "beta", "mean", "var"], ["n1"]),
         helper.make_node("Relu", ["n1"], ["h"]),
         helper.make_node("Conv", ["h", "w2"], ["c2"], pads=[1, 1, 1, 1]),
         helper.make_node("Add", ["c2", "x"], ["s"]),
         helper.make_node("Relu", ["s"], ["y"])],
        feeds, ["y"], [const("w1", randn(4, 4, 3, 3)), const("b1", randn(4)),
                       const("w2", randn(4, 4, 3, 3)), *bn])
    ops, ours = fuse_and_run(model, feeds)
    assert ops == Counter({"ConvBiasAct": 2})
    # Outputs reach ~10 in magnitude; folding BN into the weights reorders float32 rounding, so
    # near-zero elements differ by ~1e-5 absolute (1e-6 of the tensor's scale).
    check_against_ort(model, feeds, ours, rtol=1e-4, atol=1e-4)


# --- GELU ---------------------------------------------------------------------------------------


def _erf_gelu_nodes(variant):
    scale = (helper.make_node("Div", ["x", "sqrt2"], ["u"]) if variant != "mul_scale"
             else helper.make_node("Mul", ["inv_sqrt2", "x"], ["u"]))
    def mul(a, b, out):
        return helper.make_node("Mul", [a, b], [out])

    head = [scale, helper.make_node("Erf", ["u"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["a"])]
    if variant in ("dynamo", "mul_scale"):  # x * (0.5 * a)
        tail = [mul("half", "a", "h"), mul("x", "h", "y")]
    elif variant == "x_first":  # (x * a) * 0.5
        tail = [mul("x", "a", "h"), mul("h", "half", "y")]
    else:  # (x * 0.5) * a
        tail = [mul("x", "half", "hx"), mul("hx", "a", "y")]
    return head + tail


@pytest.mark.parametrize("variant", ["dynamo", "mul_scale", "x_first", "half_first"])
def test_erf_gelu_becomes_one_op(variant):
    feeds = {"x": randn(4, 32, scale=3.0)}
    inits = [const("sqrt2", math.sqrt(2)), const("inv_sqrt2", 1 / math.sqrt(2)),
             const("one", 1.0), const("half", 0.5)]
    model = make_model(_erf_gelu_nodes(variant), feeds, ["y"], inits)
    ops, ours = fuse_and_run(model, feeds, [FuseGelu()])
    assert ops == Counter({"Gelu": 1})
    check_against_ort(model, feeds, ours)


def test_tanh_gelu_becomes_one_op():
    feeds = {"x": randn(4, 32, scale=3.0)}
    nodes = [
        helper.make_node("Mul", ["half", "x"], ["hx"]),
        helper.make_node("Pow", ["x", "three"], ["p"]),
        helper.make_node("Mul", ["p", "k"], ["kp"]),
        helper.make_node("Add", ["x", "kp"], ["inner"]),
        helper.make_node("Mul", ["inner", "c"], ["ci"]),
        helper.make_node("Tanh", ["ci"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["a"]),
        helper.make_node("Mul", ["hx", "a"], ["y"]),
    ]
    inits = [const("half", 0.5), const("three", 3.0), const("k", 0.044715),
             const("c", math.sqrt(2 / math.pi)), const("one", 1.0)]
    model = make_model(nodes, feeds, ["y"], inits)
    ops, ours = fuse_and_run(model, feeds, [FuseGelu()])
    assert ops == Counter({"Gelu": 1})
    check_against_ort(model, feeds, ours, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("anchor", ["u", "e", "a"])
def test_gelu_not_fused_when_an_intermediate_is_anchored(anchor):
    feeds = {"x": randn(4, 32)}
    inits = [const("sqrt2", math.sqrt(2)), const("inv_sqrt2", 1 / math.sqrt(2)),
             const("one", 1.0), const("half", 0.5)]
    model = make_model(_erf_gelu_nodes("dynamo"), feeds, ["y"], inits)
    ops, ours = fuse_and_run(model, feeds, [FuseGelu()], anchors=[anchor])
    assert "Gelu" not in ops and ops["Erf"] == 1
    check_against_ort(model, feeds, ours)


def test_gelu_not_fused_with_wrong_constant():
    feeds = {"x": randn(4, 32)}
    inits = [const("sqrt2", 1.5), const("inv_sqrt2", 0.7), const("one", 1.0), const("half", 0.5)]
    model = make_model(_erf_gelu_nodes("dynamo"), feeds, ["y"], inits)
    ops, ours = fuse_and_run(model, feeds, [FuseGelu()])
    assert "Gelu" not in ops
    check_against_ort(model, feeds, ours)


# --- LayerNorm ----------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [13, 18])
def test_decomposed_layer_norm_becomes_one_op(opset):
    feeds = {"x": randn(2, 5, 16, scale=2.0)}
    inits = [const("two", 2.0), const("eps", 1e-5), const("g", randn(16)), const("b", randn(16))]
    if opset >= 18:  # axes became an input
        inits.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes"))

    def mean(x, out):
        if opset >= 18:
            return helper.make_node("ReduceMean", [x, "axes"], [out])
        return helper.make_node("ReduceMean", [x], [out], axes=[-1])

    nodes = [
        mean("x", "m"), helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["p"]), mean("p", "v"),
        helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["n"]), helper.make_node("Mul", ["n", "g"], ["t"]),
        helper.make_node("Add", ["t", "b"], ["y"]),
    ]
    model = make_model(nodes, feeds, ["y"], inits, opset=opset)
    ops, ours = fuse_and_run(model, feeds, [FuseLayerNorm()])
    assert ops == Counter({"LayerNorm": 1})
    check_against_ort(model, feeds, ours, rtol=1e-5, atol=1e-5)


# --- the internal domain ------------------------------------------------------------------------


def test_importer_rejects_the_fused_domain():
    node = helper.make_node("Gelu", ["x"], ["y"], domain="popart.fused")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("popart.fused", 1)])
    with pytest.raises(ModelError, match="internal domain 'popart.fused'"):
        import_model(model)


# --- attention ----------------------------------------------------------------------------------


def _int64(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _attention_model(guard: bool, mask_kind: str, key_chain: bool, post_scale: bool):
    """softmax(q @ k^T * scale + mask) @ v written the way the exporters write it."""
    b, h, s, e = 2, 2, 4, 8
    feeds = {"q": randn(b, h, s, e), "k": randn(b, h, s, e), "v": randn(b, h, s, e)}
    inits = [const("c", (1 / math.sqrt(e)) ** 0.5), const("d", math.sqrt(e)), const("zero", 0.0)]
    nodes = []
    if key_chain:  # K^T via Reshape/Transpose/Reshape, as the dynamo exporter writes it
        inits += [_int64("s3", [b * h, s, e]), _int64("s4", [b, h, e, s])]
        nodes += [helper.make_node("Reshape", ["k", "s3"], ["k3"]),
                  helper.make_node("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
                  helper.make_node("Reshape", ["k3t", "s4"], ["kt"])]
    else:
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))
    if post_scale:  # eager attention: (q @ k^T) / sqrt(e)
        nodes += [helper.make_node("MatMul", ["q", "kt"], ["raw"]),
                  helper.make_node("Div", ["raw", "d"], ["scores"])]
    else:  # dynamo: both operands scaled by sqrt(scale)
        nodes += [helper.make_node("Mul", ["q", "c"], ["qs"]),
                  helper.make_node("Mul", ["kt", "c"], ["ks"]),
                  helper.make_node("MatMul", ["qs", "ks"], ["scores"])]
    mask = np.zeros((b, 1, 1, s), dtype=np.float32)
    mask[1, :, :, 2:] = -1e9
    if mask_kind == "input":
        mask[0] = -np.inf  # every key of sample 0 masked: the guard turns its NaNs into zeros
        feeds["mask"] = mask
    elif mask_kind == "const":
        inits.append(const("mask", mask))
    if mask_kind != "none":
        nodes.append(helper.make_node("Add", ["scores", "mask"], ["masked"]))
    nodes.append(helper.make_node("Softmax", ["masked" if mask_kind != "none" else "scores"], ["p"],
                                  axis=-1))
    if guard:
        nodes += [helper.make_node("IsNaN", ["p"], ["nan"]),
                  helper.make_node("Where", ["nan", "zero", "p"], ["g"])]
    nodes.append(helper.make_node("MatMul", ["g" if guard else "p", "v"], ["y"]))
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.mark.parametrize("guard, mask_kind, key_chain, post_scale", [
    (True, "input", True, False),   # the dynamo export of scaled_dot_product_attention
    (True, "input", False, False),
    (False, "const", False, True),  # eager attention with a constant mask
    (False, "none", True, True),
])
def test_attention_becomes_one_op(guard, mask_kind, key_chain, post_scale):
    model, feeds = _attention_model(guard, mask_kind, key_chain, post_scale)
    ops, ours = fuse_and_run(model, feeds, [FuseAttention()])
    expected_ops = Counter({"Attention": 1})
    if not key_chain:
        expected_ops["Transpose"] = 1  # a plain K^T stays; the fused op reads it as a view
    assert ops == expected_ops
    check_against_ort(model, feeds, ours, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fully_masked", [True, False])
def test_attention_without_guard_and_input_mask_keeps_nan_rows(fully_masked):
    """Without Where(IsNaN) a fully masked row is NaN in ONNX but zeros in torch's kernel: the
    inference fusion restores the NaN rows (sample 0 of the mask is all -inf)."""
    model, feeds = _attention_model(False, "input", False, True)
    if not fully_masked:
        feeds["mask"][0] = 0.0
    ops, ours = fuse_and_run(model, feeds, [FuseAttention()])
    assert ops["Attention"] == 1 and "Softmax" not in ops
    assert np.isnan(ours["y"][0]).all() == fully_masked and not np.isnan(ours["y"][1]).any()
    check_against_ort(model, feeds, ours)


@pytest.mark.parametrize("fully_masked", [True, False])
def test_attention_without_guard_and_input_mask_keeps_nan_rows_in_training(fully_masked):
    """The training fusion (flash kernel with saved log-sum-exp) restores the NaN rows too;
    its gradients against torch, NaN rows included, are in test_training_fusions.py."""
    model, feeds = _attention_model(False, "input", False, True)
    if not fully_masked:
        feeds["mask"][0] = 0.0
    ops, ours = fuse_and_run(model, feeds, [FuseAttention(training=True)])
    assert ops["Attention"] == 1 and "Softmax" not in ops
    assert np.isnan(ours["y"][0]).all() == fully_masked and not np.isnan(ours["y"][1]).any()
    check_against_ort(model, feeds, ours)
