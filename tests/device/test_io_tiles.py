"""IO tiles and overlapped host IO in the device model (spec §9, F100-F104): option validation,
IO-tile buffers in the memory model and the overlap arithmetic of the cycle model, checked
against hand counts."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from popart_backend.device.cost import compute_cycles
from popart_backend.device.io_overlap import HostIO, HostStream, overlap_io
from popart_backend.device.memory import IO_BUFFERS, IoBuffer, check_fits, compute_memory
from popart_backend.device.spec import IpuSpec
from popart_backend.device.transfers import BatchInfo
from popart_backend.errors import OutOfMemoryException, popart_exception
from popart_backend.importer.onnx_model import import_model
from popart_backend.options.checks import check_io_options
from popart_backend.options.enums import ReplicatedTensorSharding, TensorStorage, VirtualGraphMode
from popart_backend.options.session_options import SessionOptions
from popart_backend.options.structs import TensorLocation
from popart_backend.tensorinfo import ExchangeStrategy, TileSet

ES, TS = ExchangeStrategy, TileSet
IPU2 = IpuSpec.for_version("ipu2")
IPU2_16 = IpuSpec.for_version("ipu2", 16)


def _options(n=0, vgm=VirtualGraphMode.Auto, host_copy=True, loops=True) -> SessionOptions:
    opts = SessionOptions()
    opts.numIOTiles = n
    opts.virtualGraphMode = vgm
    opts.useHostCopyOps = host_copy
    opts.enableExplicitMainLoops = loops
    return opts


def _check(opts, streams=None, tiles=16, full=1472):
    check_io_options(opts, streams or {}, tiles, full)


# -- validation (F100, F101, F104) --------------------------------------------------------------


@pytest.mark.parametrize("n", [-2, 3, 33])
def test_F100_num_io_tiles_must_be_even(n):
    with pytest.raises(popart_exception, match=f"numIOTiles = {n}: .* must be an even number"):
        _check(_options(n), tiles=1472)


def test_F100_full_chip_keeps_the_2_3_range():
    for n in (32, 64, 192):
        _check(_options(n), tiles=1472)
    for n in (2, 30, 194):
        with pytest.raises(popart_exception, match=rf"numIOTiles = {n} is outside \[32, 192\]"):
            _check(_options(n), tiles=1472)


def test_F100_few_tile_device_accepts_any_even_count_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        _check(_options(2), tiles=4)
    assert "numIOTiles = 2 is outside PopART's range [32, 192]" in caplog.text
    assert "2 compute tiles" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        _check(_options(32), tiles=64)  # in range: no warning
    assert "numIOTiles" not in caplog.text


def test_F100_io_tiles_must_leave_compute_tiles():
    with pytest.raises(popart_exception, match="numIOTiles = 4 leaves no compute tiles.*4 tiles"):
        _check(_options(4), tiles=4)


def test_F100_io_tiles_need_virtual_graphs():
    with pytest.raises(popart_exception, match="numIOTiles = 2 needs virtual graphs"):
        _check(_options(2, vgm=VirtualGraphMode.Off))
    _check(_options(2, vgm=VirtualGraphMode.Manual))


def test_F101_explicit_main_loops_require_host_copy_ops():
    with pytest.raises(popart_exception, match="^enableExplicitMainLoops requires useHostCopyOps"):
        _check(_options(0, host_copy=False, loops=True))
    _check(_options(0, host_copy=True, loops=False))  # host-copy ops alone are fine


def test_F104_overlap_step_is_rejected():
    with pytest.raises(popart_exception,
                       match=r"^ExchangeStrategy::OverlapStep is not yet supported\. Input 'x'"):
        _check(_options(2), {"Input 'x'": (TS.IO, ES.OverlapStep)})


@pytest.mark.parametrize("missing, opts", [
    ("useHostCopyOps = True, enableExplicitMainLoops = True", _options(2, host_copy=False,
                                                                        loops=False)),
    ("enableExplicitMainLoops = True", _options(2, loops=False)),
    ("virtualGraphMode Manual or Auto", _options(0, vgm=VirtualGraphMode.Off)),
])
def test_F104_overlap_needs_host_copy_ops_loops_and_virtual_graphs(missing, opts):
    with pytest.raises(popart_exception,
                       match=f"Anchor 'y' uses ExchangeStrategy.OverlapLoops, which needs "
                             f"{missing} in SessionOptions"):
        _check(opts, {"Anchor 'y'": (TS.Compute, ES.OverlapLoops)})


def test_F102_io_tile_set_needs_io_tiles():
    with pytest.raises(popart_exception, match="Input 'x' is streamed to TileSet.IO, but "
                                               "SessionOptions.numIOTiles = 0"):
        _check(_options(0), {"Input 'x'": (TS.IO, ES.JustInTime)})
    _check(_options(2), {"Input 'x'": (TS.IO, ES.JustInTime)})


def test_F104_overlap_on_compute_tiles_runs_without_speed_up(caplog):
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        _check(_options(0), {"Input 'x'": (TS.Compute, ES.OverlapInnerLoop)})
    assert "no speed-up" in caplog.text


def test_F106_io_tile_locations_need_io_tiles():
    opts = _options(0)
    opts.tensorLocationSettingsOverride["w"] = TensorLocation(
        TensorStorage.OffChip, TS.IO, TS.IO, ReplicatedTensorSharding.Off)
    with pytest.raises(popart_exception,
                       match=r"tensorLocationSettingsOverride\['w'\].loadTileSet = TileSet.IO, "
                             r"but numIOTiles = 0"):
        _check(opts)
    opts = _options(0)
    opts.weightTensorLocationSettings.location.storageTileSet = TS.IO
    with pytest.raises(popart_exception, match="weightTensorLocationSettings.location."
                                               "storageTileSet = TileSet.IO"):
        _check(opts)


# -- memory: IO tiles hold the stream buffers ------------------------------------------------


def _matmul_ir(rows=16, k=64, n=64):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.zeros((k, n), np.float32), "w")])
    return import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_io_tiles_hold_the_stream_buffers_and_compute_tiles_the_rest():
    ir = _matmul_ir()
    order = ir.main.topo_order()
    x_bytes = y_bytes = 16 * 64 * 4
    buffers = [IoBuffer("x", "f32[16,64]", x_bytes, 2, 0),  # OverlapInnerLoop: 2 buffers
               IoBuffer("y", "f32[16,64]", y_bytes, 3, 0)]  # OverlapLoops: 3 buffers
    plain = compute_memory(ir.main, order, IPU2_16, keep=["y"]).ipu(0)
    mem = compute_memory(ir.main, order, IPU2_16, keep=["y"], num_io_tiles=2,
                         io_streams=buffers).ipu(0)
    assert (mem.num_io_tiles, mem.num_compute_tiles) == (2, 14)
    assert mem.categories[IO_BUFFERS] == 2 * x_bytes + 3 * y_bytes
    code = mem.categories["code"]
    # The matmul's planner temporaries depend on its tile count (device/planner.py).
    temps = mem.categories["planner temporaries"] - plain.categories["planner temporaries"]
    assert mem.total_bytes - code - temps == plain.total_bytes - plain.categories["code"] + (
        2 * x_bytes + 3 * y_bytes)
    # The IO tiles (14, 15) hold the buffers and the per-tile code base, nothing else.
    assert mem.tile_peak_bytes[14:].sum() == 5 * x_bytes + 2 * IPU2_16.tile_code_base_bytes
    assert (mem.code_bytes_per_tile[14:] == IPU2_16.tile_code_base_bytes).all()
    # Everything else maps onto the 14 compute tiles: y f32[16,64] in pieces of
    # ceil(4096 / 14) rounded up to the 64-byte grain = 320 bytes, so 13 tiles.
    y = next(t for t in mem.tensors if t.id == "y" and t.category == "activations")
    assert (y.piece_bytes, y.num_tiles) == (320, 13)
    assert mem.tile_peak_bytes[:14].sum() == mem.total_bytes - mem.tile_peak_bytes[14:].sum()


def test_io_tile_overflow_is_reported_with_io_remedies():
    ir = _matmul_ir()
    big = IoBuffer("x", "f32[...]", 700 * 1024, 3, 0)  # 2.1 MB over 2 IO tiles of 624 KiB
    mem = compute_memory(ir.main, ir.main.topo_order(), IPU2_16, keep=["y"], num_io_tiles=2,
                         io_streams=[big])
    assert not mem.fits and mem.ipu(0).worst_tile >= 14
    with pytest.raises(OutOfMemoryException, match="one of the 2 IO tiles") as info:
        check_fits(mem)
    assert "numIOTiles" in str(info.value) and "OverlapLoops 3" in str(info.value)


# -- cycles: the overlap arithmetic ----------------------------------------------------------


def _transfer(num_bytes, spec=IPU2):
    return math.ceil(num_bytes / spec.host_link_bytes_per_s * spec.clock_hz) + (
        spec.ipu_sync_latency_cycles)


@pytest.mark.parametrize("bps, af, strategy, hidden", [
    (5, 4, ES.OverlapInnerLoop, 5 * (4 - 2)),  # M (N - 2)
    (5, 4, ES.OverlapLoops, 5 * 4 - 2),  # M N - 2
    (6, 1, ES.OverlapInnerLoop, 6 - 2),  # no accumulation: the inner loop is bps
    (6, 1, ES.OverlapLoops, 6 - 2),
    (1, 1, ES.OverlapLoops, 0),  # no loop at all
])
def test_F104_hidden_transfers_follow_the_spec_counts(bps, af, strategy, hidden):
    batch = BatchInfo(batches_per_step=bps, accumulation_factor=af)
    stream = HostStream("x", True, 4096, bps * af, TS.IO, strategy)
    result = overlap_io(HostIO(2, (stream,)), batch, IPU2, iteration_cycles=10**9)
    assert result.hidden_transfers == hidden
    assert result.exposed_transfers == bps * af - hidden
    cost = _transfer(4096)
    assert result.exposed_cycles == (bps * af - hidden) * cost
    assert result.hidden_cycles == hidden * cost and result.excess_cycles == 0
    copy = math.ceil(4096 / IPU2.exchange_bytes_per_s * IPU2.clock_hz)
    assert result.io_copy_cycles == bps * af * copy
    assert result.cycles == result.exposed_cycles + result.io_copy_cycles


def test_hidden_transfers_longer_than_compute_add_the_excess():
    batch = BatchInfo(batches_per_step=8)
    stream = HostStream("x", True, 1 << 20, 8, TS.IO, ES.OverlapInnerLoop)
    cost = _transfer(1 << 20)
    result = overlap_io(HostIO(2, (stream,)), batch, IPU2, iteration_cycles=cost // 4)
    assert result.excess_cycles == 6 * cost - 6 * (cost // 4)


def test_strategy_without_io_tiles_or_on_compute_tiles_stays_serial():
    batch = BatchInfo(batches_per_step=8)
    for io in (HostIO(0, (HostStream("x", True, 4096, 8, TS.IO, ES.OverlapLoops),)),
               HostIO(2, (HostStream("x", True, 4096, 8, TS.Compute, ES.OverlapLoops),))):
        assert not io.overlapped(io.streams[0])
    ir = _matmul_ir()
    compute = HostIO(2, (HostStream("x", True, 4096, 8, TS.Compute, ES.OverlapLoops),))
    result = compute_cycles(ir.main, ir.main.topo_order(), IPU2_16, batch, compute)
    assert result.overlap is None and result.host_input_cycles == _transfer(4096, IPU2_16)


def test_io_tiles_take_tiles_from_compute_and_overlap_shortens_the_step():
    ir = _matmul_ir(rows=64, k=512, n=512)
    order = ir.main.topo_order()
    batch = BatchInfo(batches_per_step=8)
    x_bytes, y_bytes = 64 * 512 * 4, 64 * 512 * 4

    def cycles(n, strategy):
        io = HostIO(n, (HostStream("x", True, x_bytes, 8, TS.IO if n else TS.Compute, strategy),
                        HostStream("y", False, y_bytes, 8, TS.IO if n else TS.Compute,
                                   strategy)))
        return compute_cycles(ir.main, order, IPU2_16, batch, io)

    plain = cycles(0, ES.JustInTime)
    jit = cycles(2, ES.JustInTime)
    inner = cycles(2, ES.OverlapInnerLoop)
    # 14 of 16 tiles compute: the MatMul takes longer, about 16/14 as long (the planner's grid
    # on 14 tiles may split the product a little less evenly).
    assert (plain.ops[0].compute_cycles * 16 / 14 * 0.98 <= jit.ops[0].compute_cycles
            <= plain.ops[0].compute_cycles * 16 / 14 * 1.05)
    assert inner.ops == jit.ops
    # JustInTime on IO tiles: serial transfers plus the IO -> compute copies.
    assert jit.host_input_cycles == _transfer(x_bytes, IPU2_16)
    assert jit.host_anchor_cycles == _transfer(8 * y_bytes, IPU2_16)
    # Overlapped: 6 of 8 transfers of each stream run behind the MatMul, which is longer.
    assert inner.host_input_cycles == inner.host_anchor_cycles == 0
    assert inner.overlap.hidden_transfers == 12 and inner.overlap.excess_cycles == 0
    assert inner.step_cycles == (8 * inner.micro_batch_cycles + 2 * _transfer(x_bytes, IPU2_16)
                                 + 2 * _transfer(y_bytes, IPU2_16)
                                 + inner.overlap.io_copy_cycles)
    assert inner.step_cycles < jit.step_cycles
