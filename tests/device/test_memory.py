"""Memory model (device/memory.py; DESIGN decision 8, spec §4.5, App. A): bytes per category
and IPU against hand counts, activation liveness, in-place aliases, the OOM boundary."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from popart_backend.device.analysis import analyse
from popart_backend.device.manager import DeviceManager
from popart_backend.device.memory import check_fits, compute_memory
from popart_backend.device.spec import IpuSpec
from popart_backend.errors import OutOfMemoryException, popart_exception
from popart_backend.importer.onnx_model import import_model
from popart_backend.ir.tensor import TensorRole
from popart_backend.optim.adam import Adam
from popart_backend.options.session_options import SessionOptions
from popart_backend.transforms.pipeline import run_passes, training_passes

IPU2_4 = IpuSpec.for_version("ipu2", 4)


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, n) for n, v in inits],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _two_layer(k=16, n1=32, n2=8):
    rng = np.random.default_rng(0)
    return _model(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"]),
         helper.make_node("ReduceMean", ["y"], ["loss"], keepdims=0)],
        [("x", [4, k])], ["loss"],
        [("w1", rng.standard_normal((k, n1)).astype(np.float32)),
         ("w2", rng.standard_normal((n1, n2)).astype(np.float32))],
    )


def _place(graph, placement: dict[str, int]) -> None:
    """Put the producer of each named tensor on an IPU."""
    for tid, ipu in placement.items():
        op = graph.tensors[tid].producer
        op.settings = dataclasses.replace(op.settings, ipu=ipu)


def test_weight_bytes_per_ipu_are_exact():
    ir = import_model(_two_layer())
    g = ir.main
    _place(g, {"h": 0, "r": 0, "y": 1, "loss": 1})
    result = compute_memory(g, g.topo_order(), IPU2_4, keep=["loss"])
    assert len(result.ipus) == 2
    assert result.ipu(0).categories["weights"] == 16 * 32 * 4  # w1 only
    assert result.ipu(1).categories["weights"] == 32 * 8 * 4  # w2 only
    assert result.ipu(0).categories["streams"] == 4 * 16 * 4  # x lives where it is read
    assert result.ipu(1).categories["streams"] == 0
    # r (4x32 f32) crosses to IPU 1 and is copied there: it is an activation on both IPUs.
    assert {t.id for t in result.ipu(1).tensors} >= {"r", "w2", "y", "loss"}


def test_adam_state_is_twice_the_weights():
    ir = import_model(_two_layer())
    run_passes(ir, training_passes(SessionOptions(), "loss", Adam({}), 1))
    g = ir.main
    result = compute_memory(g, g.topo_order(), IPU2_4, keep=["loss"])
    cats = result.ipu(0).categories
    weights = (16 * 32 + 32 * 8) * 4
    assert cats["weights"] == weights
    assert cats["optimizer state"] == 2 * weights  # Accl1___w and Accl2___w, f32
    steps = [t for t in g.tensors.values() if t.role is TensorRole.STEP]
    assert cats["step counters"] == sum(t.info.num_bytes for t in steps) > 0
    # The updated weights alias the weights: never counted again.
    ids = {t.id for t in result.ipu(0).tensors}
    assert "UpdatedVar___w1" in g.tensors and "UpdatedVar___w1" not in ids


def test_activation_peak_follows_liveness():
    # a = Relu(x); b = Sigmoid(a); c = Tanh(b); d = Add(a, c). Live (units of 4·64 bytes):
    # pos 0 {a}, pos 1 {a, b}, pos 2 {a, b, c}, pos 3 {a, c, d}: peak 3 units, first at pos 2.
    m = _model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["b"]),
                helper.make_node("Tanh", ["b"], ["c"]), helper.make_node("Add", ["a", "c"], ["d"])],
               [("x", [1, 64])], ["d"])
    ir = import_model(m)
    g = ir.main
    mem = compute_memory(g, g.topo_order(), IPU2_4, keep=["d"]).ipu(0)
    unit = 64 * 4
    assert mem.categories["activations"] == 3 * unit
    assert mem.peak_position == 2 and sorted(mem.peak_live) == ["a", "b", "c"]
    assert "Tanh" in mem.peak_op
    spans = {t.id: (t.start, t.end) for t in mem.tensors if t.start is not None}
    assert spans == {"a": (0, 3), "b": (1, 2), "c": (2, 3), "d": (3, 3)}
    # Per-tile peaks add up to at least the IPU total and spread over the tiles.
    assert mem.tile_peak_bytes.sum() >= mem.total_bytes
    assert mem.worst_tile_bytes < mem.total_bytes


def test_linear_mapping_spreads_a_weight_over_all_tiles():
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [1, 64])], ["y"],
               [("w", np.zeros((64, 1000), np.float32))])
    ir = import_model(m)
    mem = compute_memory(ir.main, ir.main.topo_order(), IPU2_4, keep=["y"]).ipu(0)
    w = next(t for t in mem.tensors if t.id == "w")
    assert (w.first_tile, w.num_tiles) == (0, 4)
    assert w.piece_bytes == 64 * 1000  # 256000 bytes / 4 tiles, a multiple of the 64-byte grain


# The OOM boundary. One MatMul with a weight of 5.5 tiles' worth of room needs 6 tiles:
# room per tile = 624 KiB - 8 KiB code base - 128 bytes of MatMul vertex state = 630656 bytes.
_ROOM = 624 * 1024 - 8 * 1024 - 128
_COLS = 13550  # w: 64 x 13550 f32 = 3468800 bytes; + x 256 + y 54200 = 5.59 x _ROOM


def _big_model():
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [1, 64])], ["y"],
                  [("w", np.zeros((64, _COLS), np.float32))])


def _analyse(tiles: int):
    ir = import_model(_big_model())
    device = DeviceManager().createIpuModelDevice({"tilesPerIPU": tiles})
    return analyse(ir, ir.main.topo_order(), device, SessionOptions(), keep=["y"])


def test_oom_boundary_matches_hand_count():
    data = 64 * _COLS * 4 + 64 * 4 + _COLS * 4
    assert 5 * _ROOM < data <= 6 * _ROOM  # the hand count: 6 tiles
    model = _analyse(6)
    model.check_fits()
    assert model.memory.ipu(0).tiles_needed() == 6
    with pytest.raises(OutOfMemoryException) as info:
        _analyse(5).check_fits()
    text = str(info.value)
    assert "Out of memory on IPU 0" in text
    mem5 = _analyse(5).memory.ipu(0)
    assert f"({mem5.total_bytes} bytes)" in text and f"({5 * 624 * 1024} bytes" not in text
    assert f"{5} tiles x 624.00 KiB" in text
    assert f"fullest tile {mem5.worst_tile} needs" in text
    assert f"({mem5.worst_tile_bytes} bytes)" in text
    assert "'w' f32[64,13550]" in text  # the largest tensor
    assert "{'tilesPerIPU': 6}" in text
    for remedy in ("virtualGraphMode", "enablePipelining", "optimizerStateTensorLocationSettings",
                   "replicatedTensorSharding", "autoRecomputation", "smaller micro-batch"):
        assert remedy in text
    assert isinstance(info.value, popart_exception)
    assert "IPU 0" in info.value.getSummaryReport()


def test_cpu_device_never_runs_out():
    ir = import_model(_big_model())
    device = DeviceManager().createCpuDevice()
    model = analyse(ir, ir.main.topo_order(), device, SessionOptions())
    model.check_fits()
    check_fits(model.memory)
    assert model.memory.ipu(0).num_tiles == 1
