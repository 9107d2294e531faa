"""Cycles of the fused matmul/conv ops (device/op_cost.py, ops/fused.py; F56): LinearBias, its
input and weight gradients and ConvBiasAct run their product on the matrix units and their
epilogue on the vector units, so each costs about what the chain it replaced costs in the same
model (less the syncs and temporaries the fusion saves), never the vector units' 16× more."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from popart_backend.device.op_cost import op_cycles
from popart_backend.device.spec import IpuSpec
from popart_backend.importer.onnx_model import import_model
from popart_backend.ops.fused import LinearBiasInputGrad, LinearBiasWeightGrad
from popart_backend.transforms.fuse_conv_act import FuseConvActivation
from popart_backend.transforms.fuse_matmul_add import FuseMatMulAdd

IPU2 = IpuSpec.for_version("ipu2")
F16 = TensorProto.FLOAT16


def _ir(nodes, inputs, inits, dtype=F16):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, dtype, s) for n, s in inputs],
        [helper.make_tensor_value_info(nodes[-1].output[0], dtype, None)],
        [numpy_helper.from_array(np.zeros(s, np.float16), n) for n, s in inits])
    return import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def _cycles(ops) -> int:
    return sum(op_cycles(op, IPU2).cycles for op in ops)


def _fused_vs_chain(ir, fusion, fused_type):
    chain = ir.main.topo_order()
    unfused = _cycles(chain)
    assert fusion.run(ir)
    [fused] = [op for op in ir.main.ops.values() if op.op_type == fused_type]
    assert len(ir.main.ops) == 1
    return op_cycles(fused, IPU2).cycles, unfused


@pytest.mark.parametrize("relu", [False, True])
def test_linear_bias_costs_its_matmul_plus_epilogue(relu):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["y"], ["r"]))
    ir = _ir(nodes, [("x", [512, 1024])], [("w", [1024, 1024]), ("b", [1024])])
    fused, unfused = _fused_vs_chain(ir, FuseMatMulAdd(), "LinearBias")
    assert 0.5 * unfused <= fused <= 1.2 * unfused, (fused, unfused)


def test_conv_bias_act_costs_its_conv_plus_epilogue():
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "r"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    ir = _ir(nodes, [("x", [8, 64, 28, 28]), ("r", [8, 64, 28, 28])],
             [("w", [64, 64, 3, 3]), ("b", [64])])
    conv = next(op for op in ir.main.ops.values() if op.op_type == "Conv")
    conv_flops = conv.cost()[0]
    fused, unfused = _fused_vs_chain(ir, FuseConvActivation(), "ConvBiasAct")
    op = next(iter(ir.main.ops.values()))
    assert op.cost()[0] == conv_flops + 2 * 8 * 64 * 28 * 28  # the conv's, + add and relu
    assert 0.5 * unfused <= fused <= 1.2 * unfused, (fused, unfused)


@pytest.mark.parametrize("grad_type, other", [(LinearBiasInputGrad, "w"),
                                              (LinearBiasWeightGrad, "x")])
def test_linear_bias_grads_cost_their_matmul(grad_type, other):
    """dX = dY @ W^T and dW = X^T @ dY against the MatMul of the same product."""
    m, k, n = 512, 1024, 768
    if grad_type is LinearBiasInputGrad:
        reference = [helper.make_node("MatMul", ["dy", "wt"], ["y"])]
        ref_ir = _ir(reference, [("dy", [m, n])], [("wt", [n, k])])
        inputs, infos = [("dy", [m, n])], [("w", [k, n])]
    else:
        reference = [helper.make_node("MatMul", ["xt", "dy"], ["y"])]
        ref_ir = _ir(reference, [("xt", [k, m]), ("dy", [m, n])], [])
        inputs, infos = [("dy", [m, n]), ("x", [m, k])], []
    matmul = _cycles(ref_ir.main.ops.values())
    ir = _ir([helper.make_node("Identity", ["dy"], ["d"])], inputs, infos)
    graph = ir.main
    grad = grad_type(grad_type.Attrs(), None)
    graph.add_op(grad, ["dy", other], ["g"])
    cycles = op_cycles(grad, IPU2).cycles
    assert grad.cost()[0] == 2 * m * n * k
    assert 0.8 * matmul <= cycles <= 1.25 * matmul, (cycles, matmul)


def test_linear_bias_keeps_the_matmuls_available_memory_proportion():
    """The fused op plans its product as the MatMul asked (builder.setAvailableMemoryProportion),
    so the planner's temporaries and passes still apply to it."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], __available_memory=0.1),
             helper.make_node("Add", ["m", "b"], ["y"])]
    ir = _ir(nodes, [("x", [512, 1024])], [("w", [1024, 1024]), ("b", [1024])])
    assert FuseMatMulAdd().run(ir)
    [fused] = ir.main.ops.values()
    assert fused.op_type == "LinearBias"
    assert fused.settings.available_memory_proportion == pytest.approx(0.1)  # a float32 attr
