"""Execution phases' prefetch overlap (F21, docs/device_model.md §3): a RemoteLoad on an IPU
that computes nothing in its phase hides behind the compute of the phase's other IPUs, and an
``Init`` (a streaming-memory buffer being set up) is no compute to hide behind."""

from __future__ import annotations

import math

from popart_backend.device.cost import compute_cycles, phase_prefetch_cycles
from popart_backend.device.spec import IpuSpec
from popart_backend.dtypes import DataType
from popart_backend.ir.graph import Graph
from popart_backend.ir.op import OpSettings
from popart_backend.ir.tensor import TensorInfo, TensorKind
from popart_backend.ops.registry import AI_GRAPHCORE, create_op

SPEC = IpuSpec.for_version("ipu2", 4)
D = 64
INFO = TensorInfo(DataType.FLOAT, (D, D))


def _load_cycles(num_bytes: int) -> int:
    """One streaming-memory transfer: bytes / host link bandwidth · clock + one IPU sync."""
    return (math.ceil(num_bytes / SPEC.host_link_bytes_per_s * SPEC.clock_hz)
            + SPEC.ipu_sync_latency_cycles)


def _phase0(inits: int, computes: int):
    """Phase 0: IPU 0 prefetches ``w`` (a RemoteLoad); IPU 1 runs ``inits`` Init ops and
    ``computes`` Tanh ops. Returns (graph, order, cycle result)."""
    g = Graph("main")
    g.add_tensor("w", INFO, TensorKind.VARIABLE)
    g.add_tensor("x", INFO, TensorKind.STREAM)
    on_ipu1 = OpSettings(ipu=1, execution_phase=0)
    for k in range(inits):
        g.add_op(create_op("Init", {"shape": (D, D), "data_type": DataType.FLOAT.onnx,
                                    "init_type": 0}, on_ipu1, domain=AI_GRAPHCORE),
                 [], [f"buffer{k}"])
    h = "x"
    for k in range(computes):
        g.add_op(create_op("Tanh", {}, OpSettings(ipu=1, execution_phase=0)), [h], [f"t{k}"])
        h = f"t{k}"
    g.add_op(create_op("RemoteLoad", {}, OpSettings(ipu=0, execution_phase=0),
                       domain=AI_GRAPHCORE), ["w"], ["w/phase1"])
    order = g.topo_order()
    return g, order, compute_cycles(g, order, SPEC, off_chip=["w"])


def test_F21_a_phase_of_only_init_ops_hides_no_prefetch():
    _, order, result = _phase0(inits=2, computes=0)
    assert [op.op_type for op in order].count("Init") == 2
    assert all(oc.cycles > 0 for op, oc in zip(order, result.ops) if op.op_type == "Init")
    assert result.phase_prefetch_cycles == 0
    assert phase_prefetch_cycles(order, result.ops, SPEC) == 0


def test_F21_prefetch_hides_behind_compute_but_not_behind_init():
    load = _load_cycles(INFO.num_bytes)
    _, order, result = _phase0(inits=0, computes=1)
    tanh = sum(oc.cycles for op, oc in zip(order, result.ops) if op.op_type == "Tanh")
    assert result.phase_prefetch_cycles == min(load, tanh) > 0
    # Adding Init ops on the computing IPU hides no more: only the Tanh counts.
    _, order, with_inits = _phase0(inits=3, computes=1)
    assert with_inits.phase_prefetch_cycles == result.phase_prefetch_cycles
