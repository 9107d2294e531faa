"""Cycle model (device/cost.py; DESIGN decision 8, F56) and per-op cost() formulas."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from popart_backend.device.analysis import analyse
from popart_backend.device.cost import compute_cycles
from popart_backend.device.manager import DeviceManager
from popart_backend.device.op_cost import op_cycles
from popart_backend.device.spec import IpuSpec
from popart_backend.device.transfers import BatchInfo
from popart_backend.errors import popart_exception
from popart_backend.importer.onnx_model import import_model
from popart_backend.ir.op import ExecutionContext

IPU2 = IpuSpec.for_version("ipu2")


def _one_op(op_type, inputs, inits=(), **attrs):
    """A model with one node over float inputs [(name, shape)] and initializers."""
    names = [n for n, _ in inputs] + [n for n, _ in inits]
    graph = helper.make_graph(
        [helper.make_node(op_type, names, ["y"], **attrs)], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.zeros(s, np.float32), n) for n, s in inits],
    )
    ir = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    return ir, next(iter(ir.main.ops.values()))


def _ideal_amp_cycles(flops: float, spec: IpuSpec, dtype: str = "f32") -> float:
    """Cycles of ``flops`` at the AMP peak of every tile (spec Appendix A facts)."""
    peak = spec.peak_flops_f16 if dtype == "f16" else spec.peak_flops_f32
    return flops / peak * spec.clock_hz


def test_matmul_cycles_scale_with_flops():
    _, small = _one_op("MatMul", [("a", [512, 512]), ("b", [512, 512])])
    _, large = _one_op("MatMul", [("a", [1024, 1024]), ("b", [1024, 1024])])
    assert small.cost()[0] == 2 * 512**3 and large.cost()[0] == 2 * 1024**3
    ratio = op_cycles(large, IPU2).cycles / op_cycles(small, IPU2).cycles
    # At most the FLOP ratio; less, since the larger product fills the 1472 tiles better and
    # pays the same fixed sync and setup.
    assert 4.0 < ratio <= 8.0
    for op in (small, large):
        c = op_cycles(op, IPU2)
        ideal = _ideal_amp_cycles(op.cost()[0], IPU2)
        # Never faster than the AMP peak scaled by the inner-loop efficiency.
        assert c.compute_cycles >= ideal / IPU2.amp_efficiency
        assert c.compute_cycles + c.exchange_cycles < 4 * ideal / IPU2.amp_efficiency
        assert c.sync_cycles == IPU2.sync_latency_cycles
    c = op_cycles(small, IPU2)
    # Both operands are computed (streams): each tile receives its pieces of both.
    assert c.exchange_bytes >= 2 * 512 * 512 * 4


def test_fewer_tiles_take_longer():
    _, op = _one_op("MatMul", [("a", [256, 256]), ("b", [256, 256])])
    full = op_cycles(op, IPU2).compute_cycles
    quarter_spec = IpuSpec.for_version("ipu2", 368)
    quarter = op_cycles(op, quarter_spec).compute_cycles
    # A quarter of the tiles: slower, but by less than 4x, since a 256^3 product does not fill
    # the whole chip evenly; never below the quarter chip's peak.
    assert 2 * full < quarter <= 4 * full
    assert quarter >= _ideal_amp_cycles(op.cost()[0], quarter_spec) / IPU2.amp_efficiency


def test_elementwise_ops_run_on_the_vector_units():
    _, relu = _one_op("Relu", [("x", [1024, 1024])])
    assert not relu.uses_amp
    flops, moved = relu.cost()
    assert (flops, moved) == (1024 * 1024, 2 * 1024 * 1024 * 4)
    c = op_cycles(relu, IPU2)
    seconds = max(flops / IPU2.vector_flops("f32"), moved / IPU2.sram_bytes_per_s)
    # A 4 MiB tensor gives every tile a piece long enough for a vertex on each worker thread.
    launch = IPU2.threads_per_tile * IPU2.vertex_launch_cycles
    assert c.compute_cycles == math.ceil(seconds * IPU2.clock_hz) + launch
    assert c.exchange_bytes == 0  # input mapped like the output


@pytest.mark.parametrize("op_type, inputs, inits, attrs, flops", [
    # Conv: 2 · out elements · Cin/group · kernel, + bias.
    ("Conv", [("x", [2, 8, 10, 10])], [("w", [16, 4, 3, 3])], {"group": 2},
     2 * (2 * 16 * 8 * 8) * 4 * 9),
    ("Conv", [("x", [1, 3, 8, 8])], [("w", [4, 3, 3, 3]), ("b", [4])], {"pads": [1, 1, 1, 1]},
     2 * (4 * 8 * 8) * 27 + 4 * 8 * 8),
    ("Gemm", [("a", [8, 32])], [("b", [16, 32]), ("c", [16])], {"transB": 1},
     2 * 8 * 16 * 32 + 8 * 16),
    ("MatMul", [("a", [3, 4, 5])], [("b", [5, 6])], {}, 2 * 3 * 4 * 6 * 5),
    ("MaxPool", [("x", [1, 2, 8, 8])], [], {"kernel_shape": [2, 2], "strides": [2, 2]},
     2 * 4 * 4 * 4),
    ("AveragePool", [("x", [1, 2, 9, 9])], [], {"kernel_shape": [3, 3], "strides": [3, 3]},
     2 * 3 * 3 * 9),
    ("GlobalAveragePool", [("x", [2, 3, 5, 5])], [], {}, 2 * 3 * 25),
    ("Softmax", [("x", [4, 10])], [], {}, 5 * 40),
    ("LayerNormalization", [("x", [4, 10])], [("s", [10]), ("bb", [10])], {}, 7 * 40),
    ("Einsum", [("a", [2, 3, 4]), ("b", [2, 4, 5])], [], {"equation": "bij,bjk->bik"},
     2 * 2 * 3 * 4 * 5),
])
def test_cost_formulas(op_type, inputs, inits, attrs, flops):
    _, op = _one_op(op_type, inputs, inits, **attrs)
    assert op.cost()[0] == flops
    assert op.cost()[1] == sum(t.info.num_bytes for t in (*op.inputs, *op.outputs) if t)


def test_step_cycles_and_throughput():
    ir, _ = _one_op("MatMul", [("x", [8, 64])], [("w", [64, 32])])
    batch = BatchInfo(batches_per_step=3, accumulation_factor=2, replication_factor=2,
                      samples_per_micro_batch=8, input_bytes_per_micro_batch=8 * 64 * 4,
                      anchor_bytes_per_step=6 * 8 * 32 * 4)
    result = compute_cycles(ir.main, ir.main.topo_order(), IPU2, batch)
    op = result.ops[0]
    # The weight is laid out for the MatMul: it exchanges less than with a streamed weight.
    streamed_ir, streamed = _one_op("MatMul", [("x", [8, 64]), ("w", [64, 32])])
    assert 8 * 64 * 4 <= op.exchange_bytes < op_cycles(streamed, IPU2).exchange_bytes
    host_in = math.ceil(8 * 64 * 4 / IPU2.host_link_bytes_per_s * IPU2.clock_hz)
    assert result.host_input_cycles == host_in + IPU2.ipu_sync_latency_cycles
    assert result.micro_batch_cycles == op.cycles + result.host_input_cycles
    assert result.step_cycles == 6 * result.micro_batch_cycles + result.host_anchor_cycles
    seconds = result.step_cycles / IPU2.clock_hz
    assert result.samples_per_second == pytest.approx(3 * 2 * 2 * 8 / seconds)
    assert 0 < result.utilisation() < 1


def test_outer_fragment_runs_once_per_batch():
    ir, op = _one_op("Relu", [("x", [16, 16])])
    op.settings = dataclasses.replace(op.settings,
                                      execution_context=ExecutionContext.AccumulateOuterFragment)
    result = compute_cycles(ir.main, ir.main.topo_order(), IPU2,
                            BatchInfo(batches_per_step=4, accumulation_factor=3))
    assert result.micro_batch_cycles == 0
    assert result.step_cycles == 4 * result.ops[0].cycles


def test_cross_ipu_reads_use_the_links():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    ir = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    sig = ir.main.tensors["y"].producer
    sig.settings = dataclasses.replace(sig.settings, ipu=1)
    result = compute_cycles(ir.main, ir.main.topo_order(), IPU2)
    (link,) = result.links
    assert (link.tensor_id, link.src_ipu, link.dst_ipu) == ("a", 0, 1)
    assert link.cycles == (math.ceil(256 * 256 * 4 / IPU2.ipu_link_bytes_per_s * IPU2.clock_hz)
                           + IPU2.ipu_sync_latency_cycles)
    assert result.step_cycles == sum(o.cycles for o in result.ops) + link.cycles
    assert set(result.ipu_cycles()) == {0, 1}


def test_cycle_count_ids():
    ir, _ = _one_op("Relu", [("x", [4, 4])])
    device = DeviceManager().createIpuModelDevice({"tilesPerIPU": 4})
    model = analyse(ir, ir.main.topo_order(), device)
    assert model.cycle_count() == model.cycles.step_cycles > 0
    assert model.cycle_count("ipu0") == model.cycles.ops[0].cycles
    with pytest.raises(popart_exception, match="unknown cycle counter id 'ipu7'"):
        model.cycle_count("ipu7")
