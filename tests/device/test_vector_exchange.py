"""Vector-unit ops in the device model (F56): worker vertices and their launch overhead in the
cycle model, exchange buffers of broadcast operands, rearrangements and reduction partials in
the memory model (device/vector_exchange.py). Expected values are computed here from the
IpuSpec facts and the layout rules of docs/device_model.md, not read back from the model."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from popart_backend.device.memory import compute_memory
from popart_backend.device.op_cost import op_cycles
from popart_backend.device.spec import IpuSpec
from popart_backend.importer.onnx_model import import_model

EXCHANGE = "exchange buffers"


def _graph(node, inputs, inits=()):
    """A one-node model over float32 stream inputs [(name, shape)] and initializers."""
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in inits],
    )
    ir = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    return ir, next(iter(ir.main.ops.values()))


def _memory(ir, spec):
    return compute_memory(ir.main, ir.main.topo_order(), spec).ipu(0)


def _pieces(num_bytes, tiles, grain):
    """(tile count, piece bytes) of the linear tile mapping (docs/device_model.md §2)."""
    piece = max(grain, math.ceil(math.ceil(num_bytes / tiles) / grain) * grain)
    return min(tiles, math.ceil(num_bytes / piece)), piece


def _receive_cycles(num_bytes, receivers, spec):
    per_tile = spec.exchange_bytes_per_s / spec.num_tiles  # bytes per tile per second
    return math.ceil(num_bytes / receivers / per_tile * spec.clock_hz)


@pytest.mark.parametrize("tiles", [1, 2, 4, 16, 1472])
@pytest.mark.parametrize("elements", [16, 96, 384])
def test_F56_tiny_elementwise_op_pays_its_worker_vertices(tiles, elements):
    spec = IpuSpec.for_version("ipu2", tiles)
    _, relu = _graph(helper.make_node("Relu", ["x"], ["y"]), [("x", [elements])])
    num_bytes = elements * 4
    used = max(1, min(tiles, math.ceil(num_bytes / spec.tile_grain_bytes)))
    piece = _pieces(num_bytes, tiles, spec.tile_grain_bytes)[1]
    vertices = min(spec.threads_per_tile, math.ceil(piece / spec.tile_grain_bytes))
    per_tile_rate = spec.vector_flops_f32 / tiles  # FLOP/s of one tile, all workers busy
    flops, moved = relu.cost()
    seconds = max(flops / (per_tile_rate * used) * spec.threads_per_tile / vertices,
                  moved / (spec.sram_bytes_per_s * used / tiles))
    launch = vertices * spec.vertex_launch_cycles
    c = op_cycles(relu, spec)
    assert c.compute_cycles == math.ceil(seconds * spec.clock_hz) + launch
    assert c.exchange_bytes == 0 and c.sync_cycles == spec.sync_latency_cycles
    # The launch dominates a tiny op: however many tiles share it, it never costs less than
    # one vertex launch, and more worker vertices per tile cost more.
    assert c.compute_cycles >= spec.vertex_launch_cycles
    assert launch > math.ceil(seconds * spec.clock_hz)


def test_F56_more_vertices_per_tile_cost_more_launches():
    spec = IpuSpec.for_version("ipu2", 1)
    cycles = []
    for elements in (16, 32, 64, 96):  # 1, 2, 4 and 6 grains of one tile
        _, relu = _graph(helper.make_node("Relu", ["x"], ["y"]), [("x", [elements])])
        cycles.append(op_cycles(relu, spec).compute_cycles)
    steps = [b - a for a, b in itertools.pairwise(cycles)]
    # Each extra vertex adds its launch; the arithmetic of the extra elements is a few cycles.
    assert steps[0] >= spec.vertex_launch_cycles
    assert steps[1] >= 2 * spec.vertex_launch_cycles
    assert steps[2] >= 2 * spec.vertex_launch_cycles


@pytest.mark.parametrize("tiles", [16, 1472])
@pytest.mark.parametrize("per_row", [False, True])
def test_F56_broadcast_add_holds_exchange_buffers_and_same_layout_add_none(tiles, per_row):
    spec = IpuSpec.for_version("ipu2", tiles)
    rows, cols = 64, 256
    b_shape = [rows, 1] if per_row else [cols]
    bcast_ir, bcast = _graph(helper.make_node("Add", ["x", "b"], ["y"]),
                             [("x", [rows, cols]), ("b", b_shape)])
    same_ir, same = _graph(helper.make_node("Add", ["x", "z"], ["y"]),
                           [("x", [rows, cols]), ("z", [rows, cols])])
    out_bytes = rows * cols * 4
    out_tiles, piece = _pieces(out_bytes, tiles, spec.tile_grain_bytes)
    run = piece // 4  # output elements of one tile's piece
    if per_row:  # a run of `run` elements crosses at most ceil((run-1)/cols)+1 rows
        needed = min(rows, math.ceil((run - 1) / cols) + 1)
    else:  # a run reads one bias value per column it covers
        needed = min(cols, run)
    expected = out_tiles * needed * 4
    m_bcast, m_same = _memory(bcast_ir, spec), _memory(same_ir, spec)
    assert m_bcast.categories[EXCHANGE] == expected
    assert m_same.categories[EXCHANGE] == 0
    # Nothing else differs but the second input's own size (b against z).
    assert (m_bcast.total_bytes - m_same.total_bytes
            == expected + math.prod(b_shape) * 4 - rows * cols * 4)
    c_bcast, c_same = op_cycles(bcast, spec), op_cycles(same, spec)
    assert c_bcast.exchange_bytes == expected and c_same.exchange_bytes == 0
    assert c_bcast.exchange_cycles == _receive_cycles(expected, out_tiles, spec)
    assert c_same.exchange_cycles == 0


@pytest.mark.parametrize("axis", [0, 1])
def test_F56_reduction_gathers_its_partials_in_a_second_superstep(axis):
    spec = IpuSpec.for_version("ipu2", 16)
    rows, cols = 64, 256
    ir, op = _graph(helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0),
                    [("x", [rows, cols])], [("axes", np.array([axis], np.int64))])
    tiles, piece = _pieces(rows * cols * 4, 16, spec.tile_grain_bytes)
    elems = piece // 4
    outputs = cols if axis == 0 else rows
    if axis == 1:  # a tile holds whole rows: one partial per row it touches
        touched = min(outputs, math.ceil(elems / cols) + 1)
    else:  # the reduced axis is outermost: every element of a piece is its own partial
        touched = min(outputs, elems)
    partial_bytes = tiles * touched * 4  # float32 partials
    receivers = min(tiles, _pieces(partial_bytes, 16, spec.tile_grain_bytes)[0])
    c = op_cycles(op, spec)
    assert c.exchange_bytes == partial_bytes
    assert c.exchange_cycles == _receive_cycles(partial_bytes, receivers, spec)
    assert c.sync_cycles == 2 * spec.sync_latency_cycles
    assert _memory(ir, spec).categories[EXCHANGE] == partial_bytes


def test_F56_reduction_on_one_tile_exchanges_nothing():
    spec = IpuSpec.for_version("ipu2", 1)
    ir, op = _graph(helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0),
                    [("x", [8, 8])], [("axes", np.array([0], np.int64))])
    c = op_cycles(op, spec)
    assert c.exchange_bytes == 0 and c.sync_cycles == spec.sync_latency_cycles
    assert _memory(ir, spec).categories[EXCHANGE] == 0


def test_F56_scatter_receives_its_updates_once():
    spec = IpuSpec.for_version("ipu2", 16)
    ir, op = _graph(helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=0),
                    [("data", [64, 256]), ("upd", [4, 256])],
                    [("idx", np.zeros((4, 256), np.int64))])
    # Updates and indices do not broadcast to the output: each element is sent once.
    assert op_cycles(op, spec).exchange_bytes == 4 * 256 * 4 + 4 * 256 * 8
    assert _memory(ir, spec).categories[EXCHANGE] == 4 * 256 * 4 + 4 * 256 * 8


def test_F56_transpose_rearranges_and_reshape_does_not():
    spec = IpuSpec.for_version("ipu2", 16)
    t_ir, transpose = _graph(helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0]),
                             [("x", [64, 256])])
    r_ir, reshape = _graph(helper.make_node("Reshape", ["x", "shape"], ["y"]),
                           [("x", [64, 256])], [("shape", np.array([256, 64], np.int64))])
    assert op_cycles(transpose, spec).exchange_bytes == 64 * 256 * 4  # its output's pieces
    assert _memory(t_ir, spec).categories[EXCHANGE] == 64 * 256 * 4
    assert op_cycles(reshape, spec).exchange_bytes == 0
    assert _memory(r_ir, spec).categories[EXCHANGE] == 0


def test_F56_norm_parameters_broadcast_along_their_axis():
    spec = IpuSpec.for_version("ipu2", 16)
    n, c, h, w = 2, 8, 16, 16
    params = [(name, np.ones(c, np.float32)) for name in ("s", "bias", "mean", "var")]
    ir, bn = _graph(helper.make_node("BatchNormalization", ["x", "s", "bias", "mean", "var"],
                                     ["y"]), [("x", [n, c, h, w])], params)
    out_tiles, piece = _pieces(n * c * h * w * 4, 16, spec.tile_grain_bytes)
    run = piece // 4
    # Each [C] parameter lines up with the channel axis: a piece spans the channels of its
    # run of h·w-element planes.
    per_param = out_tiles * min(c, math.ceil((run - 1) / (h * w)) + 1) * 4
    assert op_cycles(bn, spec).exchange_bytes == 4 * per_param
    assert _memory(ir, spec).categories[EXCHANGE] == 4 * per_param
    ir, ln = _graph(helper.make_node("LayerNormalization", ["x", "s", "bias"], ["y"]),
                    [("x", [64, 256])], [("s", np.ones(256, np.float32)),
                                         ("bias", np.zeros(256, np.float32))])
    out_tiles, piece = _pieces(64 * 256 * 4, 16, spec.tile_grain_bytes)
    assert op_cycles(ln, spec).exchange_bytes == 2 * out_tiles * min(256, piece // 4) * 4


def test_F56_pooling_reads_its_own_pieces():
    spec = IpuSpec.for_version("ipu2", 16)
    ir, pool = _graph(helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2],
                                       strides=[2, 2]), [("x", [1, 4, 32, 32])])
    assert op_cycles(pool, spec).exchange_bytes == 0
    assert _memory(ir, spec).categories[EXCHANGE] == 0
