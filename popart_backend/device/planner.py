"""The matrix-unit (AMP) plan of a matmul or convolution: how its product is split over the
tiles, what that costs in cycles and how much temporary memory it holds.

Every op with ``uses_amp`` is seen as a product ``[M, K] x [K, N]`` (``amp_shape``): N is the
output's last dimension (its channels, dimension 1, for a convolution), M the rest of the output
and K the multiply-accumulates per output element. The plan splits M, N and K over a grid of
``sm x sn x sk`` tiles (at most the compute tiles). Each tile then works on

    mt = ceil(M / sm) rows,  nt = ceil(N / sn) and kt = ceil(K / sk), the last two rounded up to
    the AMP's input-channel and output-channel groups (16 and 8 halves, 8 and 8 floats), so
    small or odd dimensions leave part of the units idle,

and costs, in cycles of one tile:

    compute   = mt · nt · kt / (AMP MACs per tile per cycle · amp_efficiency)
    exchange  = (mt · kt + passes · kt · nt) · input bytes / exchange bytes per tile per cycle
    reduction = (sk > 1) the partials of the K split exchanged and summed on the vector units
    setup     = passes · amp_setup_cycles                   (vertex launch, AMP pipeline fill)

The temporary memory of a tile is the input pieces it receives (its exchange buffers) plus its
partials (``mt · nt`` values of 4 bytes, 2 with half partials) when they are wider than the
output or the product is split over K (else they accumulate in the output). A variable or
constant operand is laid out for the op at compile time, so one copy of each of its pieces is
in place: only the other tiles sharing the piece (``sn - 1`` of ``sn`` for the ``[M, K]``
side, ``sm - 1`` of ``sm`` for the ``[K, N]`` side) receive and hold it. The available memory proportion ``p``
(per op: builder.setAvailableMemoryProportion, MultiConv; else SessionOptions.matmulOptions /
convolutionOptions["availableMemoryProportion"]; else Poplar's default 0.6) bounds it to
``p · tile_bytes`` per tile: a tile whose pieces do not fit works in ``passes`` row slices,
each receiving the weight piece again and paying the setup and a sync. The planner picks the
grid with the fewest cycles, so a lower proportion can only keep or lower the temporaries and
keep or raise the cycles. Its temporaries ("planner temporaries" in device/memory.py) are live
at the op's position only.

A matmul serialisation (``OpSettings.serialize_matmul``, setSerializeMatMul) splits the op in
``factor`` slices run one after another: the temporaries are divided by the factor (a float16
product that does not keep precision sums its slices in float16: 2-byte partials) and each
slice pays its own sync (``passes`` is multiplied by the factor). FLOPs, bytes moved and every
value are those of the plain op.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ..ir.op import Op
from ..ir.tensor import TensorKind
from .spec import IpuSpec

__all__ = ["DEFAULT_PROPORTION", "PlannerPlan", "amp_plan", "amp_shape", "planner_plan"]

# Poplar's default availableMemoryProportion for matmuls and convolutions (0.6: Poplar
# libraries' documentation of the "availableMemoryProportion" option).
DEFAULT_PROPORTION = 0.6
# AMP operand groups: input channels (K) in groups of 16 halves or 8 floats, output channels (N)
# in groups of 8 (unsure: the "input channels per group" / "output channels per group" of the
# Mk2 AMP convolution vertices in the Poplar libraries' documentation; the Graphcore
# performance guidance to keep channel counts multiples of 16 / 8 says the same).
_K_GROUP = {"f16": 16, "f32": 8}
_N_GROUP = 8
_LAID_OUT = (TensorKind.VARIABLE, TensorKind.CONST)


@dataclass(frozen=True)
class PlannerPlan:
    """The planner's choice for one op: its temporary bytes and supersteps, and (for the cost
    model) the per-tile cycles of its product and the grid it uses."""

    temporary_bytes: int
    passes: int
    compute_cycles: int = 0  # product, setup and K-split reduction, on the busiest tile
    exchange_cycles: int = 0  # input pieces received by the busiest tile
    exchange_bytes: int = 0  # all tiles together
    tiles_used: int = 1
    grid: tuple[int, int, int] = (1, 1, 1)  # sm, sn, sk
    efficiency: float = 0.0  # ideal AMP cycles over the plan's cycles


def amp_shape(op: Op, product_flops: int) -> tuple[int, int, int]:
    """``(M, K, N)`` of an AMP op's product from its largest output and its product FLOPs."""
    out = max((t for t in op.outputs if t is not None), key=lambda t: t.info.nelms)
    shape = out.info.shape
    elems = max(1, out.info.nelms)
    if not shape:
        n = 1
    elif "Conv" in op.op_type and len(shape) >= 3:
        n = shape[1]
    else:
        n = shape[-1]
    n = max(1, n)
    k = max(1, round(product_flops / 2 / elems))
    return max(1, elems // n), k, n


def _candidates(cap: int, limit: int) -> list[int]:
    """Powers of two up to ``min(cap, limit)``, and that bound itself."""
    top = max(1, min(cap, limit))
    values = {top}
    v = 1
    while v <= top:
        values.add(v)
        v *= 2
    return sorted(values)


@functools.lru_cache(maxsize=4096)
def amp_plan(m: int, k: int, n: int, dtype: str, partial_bytes: int, proportion: float,
             spec: IpuSpec, tiles: int, a_laid_out: bool = False, b_laid_out: bool = False,
             out_bytes: int = 4) -> PlannerPlan:
    """The fastest grid for a ``[m, k] x [k, n]`` product of ``dtype`` ("f16"/"f32") on
    ``tiles`` compute tiles of ``spec`` with a per-tile temporary budget of ``proportion`` ·
    tile bytes (module docstring). ``a_laid_out`` / ``b_laid_out``: the ``[m, k]`` / ``[k, n]``
    operand is a variable or constant, laid out for this op at compile time, so one copy of each
    piece is already in place; ``out_bytes``: bytes per output element (partials as wide as the
    output and no K split accumulate in the output itself)."""
    in_bytes = 2 if dtype == "f16" else 4
    kg, ng = _K_GROUP.get(dtype, 8), _N_GROUP
    per_tile_cycle = spec.num_tiles * spec.clock_hz
    macs = spec.peak_flops(dtype) / 2 / per_tile_cycle  # AMP MACs per tile per cycle
    exch = spec.exchange_bytes_per_s / per_tile_cycle  # bytes a tile receives per cycle
    vec = spec.vector_flops_f32 / per_tile_cycle  # f32 vector FLOPs per tile per cycle
    budget = max(1, int(proportion * spec.tile_bytes))
    best, best_key = None, None
    for sm in _candidates(m, tiles):
        for sk in _candidates(math.ceil(k / kg), tiles // sm):
            for sn in _candidates(math.ceil(n / ng), tiles // (sm * sk)):
                mt = math.ceil(m / sm)
                nt = math.ceil(math.ceil(n / sn) / ng) * ng
                kt = math.ceil(math.ceil(k / sk) / kg) * kg
                a_piece, b_piece = mt * kt * in_bytes, kt * nt * in_bytes
                # A laid-out operand has one copy in place; the rest of the tiles sharing
                # its piece receive it (A is shared by the sn tiles of a row, B by sm).
                a_recv = a_piece * ((sn - 1) / sn if a_laid_out else 1.0)
                b_recv = b_piece * ((sm - 1) / sm if b_laid_out else 1.0)
                partials = (mt * nt * partial_bytes
                            if sk > 1 or partial_bytes != out_bytes else 0)
                rows = a_recv + partials  # what row slices divide
                room = budget - b_recv
                passes = 1 if rows + b_recv <= budget else (
                    math.ceil(rows / room) if room > 0 else mt)
                passes = min(passes, mt)
                temp = math.ceil(b_recv + rows / passes)
                compute = mt * nt * kt / (macs * spec.amp_efficiency)
                received = a_recv + passes * b_recv
                exchange = received / exch
                reduce = 0.0
                if sk > 1:  # partials of the K split exchanged to and summed on one tile
                    reduce = mt * nt * partial_bytes / exch + mt * nt * (sk - 1) / sk * 2 / vec
                cycles = compute + passes * spec.amp_setup_cycles + reduce + exchange
                over = temp > budget
                key = (over, cycles, temp)
                if best_key is None or key < best_key:
                    used = sm * sn * sk
                    best_key = key
                    best = (temp * used, passes + (1 if sk > 1 else 0),
                            math.ceil(compute + passes * spec.amp_setup_cycles + reduce),
                            math.ceil(exchange), int(received * used), used, (sm, sn, sk),
                            cycles)
    temp, passes, compute, exchange, exch_bytes, used, grid, cycles = best
    ideal = m * k * n / (macs * tiles)
    return PlannerPlan(temp, passes, compute, exchange, exch_bytes, used, grid,
                       min(1.0, ideal / cycles) if cycles else 0.0)


def op_proportion(op: Op, matmul_default: float | None = None,
                  conv_default: float | None = None) -> float:
    """The available memory proportion of an AMP op: its own, else the session's for its kind
    (convolutions: ``conv_default``, other AMP ops: ``matmul_default``), else Poplar's 0.6."""
    own = op.settings.available_memory_proportion
    if own is not None:
        return own
    session = conv_default if "Conv" in op.op_type else matmul_default
    return session if session is not None else DEFAULT_PROPORTION


def planner_plan(op: Op, spec: IpuSpec, compute_tiles: int | None = None,
                 serialized_matmuls: bool = True, matmul_default: float | None = None,
                 conv_default: float | None = None) -> PlannerPlan | None:
    """The plan of ``op`` on an IPU of ``spec`` with ``compute_tiles`` compute tiles (default
    all), or None for an op that does not use the AMP units (see the module docstring)."""
    if not op.uses_amp:
        return None
    outs = [t for t in op.outputs if t is not None]
    if not outs:
        return None
    s = op.settings
    serial = s.serialize_matmul if serialized_matmuls else None
    flops, _ = op.cost()
    product = max(0, int(flops) - op.epilogue_flops())
    m, k, n = amp_shape(op, product)
    info = outs[0].info
    dtype = "f16" if info.dtype.short == "f16" else "f32"
    half = s.half_partials or (serial is not None and dtype == "f16"
                               and not serial.keep_precision)
    tiles = spec.num_tiles if compute_tiles is None else compute_tiles
    proportion = op_proportion(op, matmul_default, conv_default)
    ins = [t for t in op.inputs if t is not None]
    laid = [t.kind in _LAID_OUT for t in ins[:2]] + [False, False]
    plan = amp_plan(m, k, n, dtype, 2 if half else 4, float(proportion), spec, max(1, tiles),
                    laid[0], laid[1], info.dtype.itemsize)
    if serial is None or serial.factor <= 1:
        return plan
    return PlannerPlan(math.ceil(plan.temporary_bytes / serial.factor),
                       plan.passes * serial.factor, plan.compute_cycles, plan.exchange_cycles,
                       plan.exchange_bytes, plan.tiles_used, plan.grid, plan.efficiency)
