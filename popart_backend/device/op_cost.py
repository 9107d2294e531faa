"""Per-op cost of the simulated IPU (DESIGN decision 8; published IPU figures): one op is one
BSP superstep on its IPU (``OpSettings.ipu``; None is IPU 0):

    compute  = max(FLOPs / rate, bytes moved / SRAM bandwidth) · clock
    exchange = exchanged bytes / exchange bandwidth · clock
    cycles   = compute + exchange + sync latency

with FLOPs and bytes from ``Op.cost()``. An op with ``uses_amp`` (MatMul, Gemm, Conv, the fused
LinearBias and ConvBiasAct ...) follows its AMP plan (device/planner.py): the compute and
exchange cycles of the busiest tile of the grid the planner picks for the op's shapes and
available memory proportion; the ``epilogue_flops()`` of such an op (a fused bias add, residual
add or activation) run at the vector rate, after the product. Other ops run at the vector
units' rate. The vector rate and the SRAM bandwidth are scaled by the share of tiles the op has
work on (the tiles of its largest operand under the linear mapping of device/memory.py); a tile
runs its piece as up to ``threads_per_tile`` worker vertices sharing its pipeline, each paying
``vertex_launch_cycles``, and reaches the vector rate only with a vertex on every worker. What a
non-AMP op receives over the exchange (broadcast operands, rearranged pieces, a reduction's
partials, device/vector_exchange.py) is receive-bound at the per-tile exchange rate on the tiles
receiving it; a reduction sums its partials in a second superstep (its vertices and one more
sync). Inputs laid out like the output (elementwise) are not exchanged.

A cross-replica collective (``ReplicatedAllReduce`` and the sharding collectives) also crosses
the IPU-Links as a ring (``collective_cycles``): an all-reduce over a group of k replicas moves
2(k−1)/k of the tensor's bytes through each IPU's links, a reduce-scatter or all-gather (k−1)/k
of the whole tensor, plus one IPU sync.

The conversions every part of the cycle model shares live here too: seconds to cycles, one
host-link transfer with its sync, and an IPU spec narrowed to the tiles left after IO tiles.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..ir.op import ExecutionContext, Op
from .planner import PlannerPlan, planner_plan
from .spec import IpuSpec
from .vector_exchange import VectorExchange, linear_pieces, vector_exchange, worker_vertices


@dataclass(frozen=True)
class OpCycles:
    """The cost of one execution of one op."""

    position: int  # in the schedule
    op_id: int
    name: str  # debug name
    op_type: str
    ipu: int
    context: ExecutionContext
    flops: int
    bytes_moved: int
    exchange_bytes: int
    tiles_used: int
    compute_cycles: int
    exchange_cycles: int
    sync_cycles: int
    # Cross-replica traffic of a collective over the IPU-Links (0 for other ops).
    collective_cycles: int = 0
    stage: int | None = None  # pipeline stage (None: not pipelined, or outer fragment)
    between_cycles: bool = False  # an IpuCopy: runs in the exchange at the end of a cycle

    @property
    def cycles(self) -> int:
        return (self.compute_cycles + self.exchange_cycles + self.sync_cycles
                + self.collective_cycles)


def _seconds_to_cycles(seconds: float, spec: IpuSpec) -> int:
    return math.ceil(seconds * spec.clock_hz)


def _tiles_for(num_bytes: int, spec: IpuSpec) -> int:
    return max(1, min(spec.num_tiles, math.ceil(num_bytes / spec.tile_grain_bytes)))


def _exchange_per_tile(spec: IpuSpec) -> float:
    """Bytes one tile receives per second over the exchange."""
    return spec.exchange_bytes_per_s / spec.num_tiles


def _vector_op(op: Op, flops: float, moved: float, largest: int, dtype: str,
               spec: IpuSpec) -> tuple[float, int, VectorExchange]:
    """(compute seconds, launch cycles, exchange) of an op on the vector units: its busiest
    tile's FLOPs at the tile's vector rate, reached only when each of the tile's worker
    threads has a vertex (fewer leave pipeline slots idle), or its bytes at the tile's SRAM
    bandwidth; plus ``vertex_launch_cycles`` per vertex on that tile. Ops that only move data
    (transfers, views) launch nothing."""
    tiles = _tiles_for(largest, spec)
    share = tiles / spec.num_tiles
    piece = linear_pieces(largest, spec.num_tiles, spec.tile_grain_bytes)[1]
    vertices = worker_vertices(piece, spec)
    idle = spec.threads_per_tile / vertices  # pipeline slots of the workers without a vertex
    compute_s = max(flops / (spec.vector_flops(dtype) * share) * idle,
                    moved / (spec.sram_bytes_per_s * share))
    works = (flops or moved) and not (op.runs_between_cycles or op.remote_transfer)
    launch = vertices * spec.vertex_launch_cycles if works else 0
    return compute_s, launch, vector_exchange(op, spec)


def collective_cycles(op: Op, spec: IpuSpec, replicas: int) -> int:
    """IPU-Link cycles of a cross-replica collective over ``replicas`` replicas (0 for other
    ops, or one replica): a ring over each group of k replicas moves 2(k−1)/k of the bytes for
    an all-reduce, (k−1)/k of the whole tensor for a reduce-scatter or all-gather, plus one
    IPU sync."""
    if not op.collective or replicas <= 1:
        return 0
    k = max(len(g) for g in op.groups(replicas))
    if k <= 1:
        return 0
    if op.op_type == "ReplicatedAllReduce":
        moved = 2 * (k - 1) / k * op.inputs[0].info.num_bytes
    else:
        # The whole tensor: the reduce-scatter's input, the all-gather's output.
        whole = max(op.inputs[0].info.num_bytes, op.outputs[0].info.num_bytes)
        moved = (k - 1) / k * whole
    return _seconds_to_cycles(moved / spec.ipu_link_bytes_per_s, spec) + (
        spec.ipu_sync_latency_cycles)


def op_cycles(op: Op, spec: IpuSpec, position: int = 0, replicas: int = 1,
              plan: PlannerPlan | None = None) -> OpCycles:
    """The cycles of one execution of ``op`` on an IPU of ``spec``, in a program of
    ``replicas`` replicas (collectives cross the IPU-Links between them). ``plan``: the AMP
    plan of an op with ``uses_amp`` (default: planned here with the default proportion)."""
    flops, moved = op.cost()
    ins = [t.info for t in op.inputs if t is not None]
    outs = [t.info for t in op.outputs if t is not None]
    largest = max((i.num_bytes for i in (*ins, *outs)), default=0)
    tiles = _tiles_for(largest, spec)
    share = tiles / spec.num_tiles
    info = outs[0] if outs else (ins[0] if ins else None)
    dtype = info.dtype.short if info is not None else "f32"
    vector_rate = spec.vector_flops(dtype) * share
    launch, syncs = 0, 1
    if op.uses_amp and plan is None:
        plan = planner_plan(op, spec)
    if op.uses_amp and plan is not None:
        # The product on the AMP as planned, its epilogue on the vector units.
        compute_s = (max(plan.compute_cycles / spec.clock_hz,
                         moved / (spec.sram_bytes_per_s * share))
                     + op.epilogue_flops() / vector_rate)
        exchange_s = plan.exchange_cycles / spec.clock_hz
        exchange = plan.exchange_bytes
        tiles = plan.tiles_used
    else:
        compute_s, launch, received = _vector_op(op, flops, moved, largest, dtype, spec)
        exchange = received.bytes
        exchange_s = exchange / received.tiles / _exchange_per_tile(spec)
        if received.partials:  # a reduction's second superstep sums the partials
            syncs = 2
            per_tile = math.ceil(received.partials / received.tiles)
            compute_s += per_tile / (spec.vector_flops_f32 / spec.num_tiles)
            launch += worker_vertices(per_tile * 4, spec) * spec.vertex_launch_cycles
    return OpCycles(
        position=position,
        op_id=op.id,
        name=op.debug_name,
        op_type=op.op_type,
        ipu=op.settings.ipu or 0,
        context=op.settings.execution_context,
        flops=int(flops),
        bytes_moved=int(moved),
        exchange_bytes=int(exchange),
        tiles_used=tiles,
        compute_cycles=_seconds_to_cycles(compute_s, spec) + launch,
        exchange_cycles=_seconds_to_cycles(exchange_s, spec),
        sync_cycles=spec.sync_latency_cycles * syncs,
        collective_cycles=collective_cycles(op, spec, replicas),
        stage=(op.settings.pipeline_stage
               if op.settings.execution_context is ExecutionContext.Normal else None),
        between_cycles=op.runs_between_cycles,
    )


def _with_tiles(spec: IpuSpec, tiles: int) -> IpuSpec:
    """``spec`` with only ``tiles`` tiles computing: whole-IPU rates scale with the tiles."""
    if tiles == spec.num_tiles:
        return spec
    share = tiles / spec.num_tiles
    return dataclasses.replace(
        spec, num_tiles=tiles,
        peak_flops_f32=spec.peak_flops_f32 * share, peak_flops_f16=spec.peak_flops_f16 * share,
        exchange_bytes_per_s=spec.exchange_bytes_per_s * share,
        sram_bytes_per_s=spec.sram_bytes_per_s * share,
        vector_flops_f32=spec.vector_flops_f32 * share,
        vector_flops_f16=spec.vector_flops_f16 * share,
    )


def _host_transfer_cycles(num_bytes: int, spec: IpuSpec) -> int:
    """One transfer over the host link (or to streaming memory) with its sync."""
    return (_seconds_to_cycles(num_bytes / spec.host_link_bytes_per_s, spec)
            + spec.ipu_sync_latency_cycles)
