"""What the ops on the vector units (every op without ``uses_amp``) receive over the exchange,
and how many worker vertices they run on a tile: shared by the cycle model (device/op_cost.py)
and the memory model (device/memory.py), so the bytes an op is charged exchange cycles for are
the bytes it holds in exchange buffers at its position.

Layout. A tensor is mapped linearly over the compute tiles in pieces of ``tile_grain_bytes``
multiples (``linear_pieces``, as device/memory.py places it). A vector op works on the tiles of
its largest output. An input holding the same number of elements as that output is laid out
like it (elementwise ops read their inputs in place), so it is not exchanged. Otherwise the op
receives pieces into temporary buffers on its tiles:

- a broadcast operand (fewer elements than the output: an elementwise op's operand
  broadcasting by the numpy rule, or a variable or constant of another op lining up with some
  of the output's axes, as a norm's scale) costs each output tile the operand's elements its
  output piece reads: a piece of p elements reads at most p values of a bias along the last
  axis, one or two of a per-row value whose row is longer than p, one of a scalar;
- another smaller input (a scatter's updates, a per-row statistic kept flat) sends each of its
  elements where the output needs it: its own size, at most the output's;
- a rearrangement (a Transpose that reorders axes, a Concat, or an input with more elements
  than the output: a gather's table, a slice's source, a loss's scores) costs the output's
  pieces once, whichever input they come from;
- a reduction (the Reduce ops) works on its input's tiles and sends each tile's partial results
  (as many as the distinct outputs its piece touches, in float32 or wider) to be summed in a
  second superstep, spread over at most the input's tiles.

Variables and constants read elementwise are laid out for the op, like computed inputs of the
same size; a variable broadcast (a bias) or gathered from (an embedding table) still moves. Ops
that are themselves transfers (IPU copies, remote loads and stores, collectives over the
IPU-Links), views other than a reordering Transpose, and the pipeline stash and restore (a ring
buffer laid out slot by slot like the tensor it keeps) receive nothing here; nor do the pooling
ops, whose input and output planes are mapped in proportion, so that each tile's windows read
its own piece (the few halo rows where windows cross a piece boundary are not counted).

Worker vertices. A tile runs an op's piece as up to ``threads_per_tile`` worker vertices, one
per ``tile_grain_bytes`` of the piece of its largest operand. The workers share the tile's
pipeline: the tile's vector rate (4 / 8 FLOPs per cycle) is reached only when every worker has a
vertex, and each vertex costs ``vertex_launch_cycles`` of that pipeline for its launch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..ir.op import Op
from ..ir.tensor import Tensor, TensorKind
from ..ops.base import ElementwiseBinary, Variadic
from ..ops.reduce import Reduce
from ..ops.shape import Transpose, ViewOp
from ..ops.stash import Restore, Stash
from .spec import IpuSpec

__all__ = ["EXCHANGE_BUFFERS", "VectorExchange", "exchange_buffer_spans", "linear_pieces",
           "vector_exchange", "worker_vertices"]

EXCHANGE_BUFFERS = "exchange buffers"  # memory category: live at their op's position only
_CONCATENATING = frozenset({"Concat", "ConcatGrad"})
# Pooling: windows over [N, C, H, W] planes, whose input and output are mapped in proportion.
_WINDOWED = frozenset(f"{kind}{grad}" for kind in (
    "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
    for grad in ("", "Grad"))
_LAID_OUT = (TensorKind.VARIABLE, TensorKind.CONST)


@dataclass(frozen=True)
class VectorExchange:
    """What one vector op receives: ``bytes`` over ``tiles`` receiving tiles (its exchange
    buffers), and for a reduction the ``partials`` values summed into ``outputs`` values in a
    second superstep on those tiles."""

    bytes: int = 0
    tiles: int = 1
    partials: int = 0
    outputs: int = 0


def linear_pieces(num_bytes: int, tiles: int, grain: int) -> tuple[int, int]:
    """(tile count, bytes per piece) of a tensor mapped linearly over ``tiles`` tiles."""
    if num_bytes <= 0 or tiles <= 0:
        return 1, 0
    piece = max(grain, math.ceil(math.ceil(num_bytes / tiles) / grain) * grain)
    return min(tiles, math.ceil(num_bytes / piece)), piece


def worker_vertices(piece_bytes: int, spec: IpuSpec) -> int:
    """Worker vertices one tile runs for a piece of ``piece_bytes`` (module docstring)."""
    return max(1, min(spec.threads_per_tile, math.ceil(piece_bytes / spec.tile_grain_bytes)))


def _moves_nothing(op: Op) -> bool:
    return (op.uses_amp or op.runs_between_cycles or op.remote_transfer or op.collective
            or isinstance(op, (Stash, Restore)) or op.op_type in _WINDOWED
            or (isinstance(op, ViewOp) and not _reorders(op)))


def _reorders(op: Op) -> bool:
    """A Transpose whose permutation changes the order of the axes longer than 1."""
    if not isinstance(op, Transpose) or op.inputs[0] is None:
        return False
    shape = op.inputs[0].info.shape
    kept = [axis for axis in op.perm if shape[axis] > 1]
    return kept != sorted(kept)


def vector_exchange(op: Op, spec: IpuSpec, tiles: int | None = None) -> VectorExchange:
    """What ``op`` receives on an IPU of ``spec`` with ``tiles`` compute tiles (default all)."""
    tiles = spec.num_tiles if tiles is None else tiles
    outs = [t for t in op.outputs if t is not None]
    if not outs or _moves_nothing(op):
        return VectorExchange()
    out = max(outs, key=lambda t: t.info.num_bytes).info
    out_tiles, out_piece = linear_pieces(out.num_bytes, tiles, spec.tile_grain_bytes)
    if isinstance(op, Reduce) and op.inputs and op.inputs[0] is not None:
        return _reduction(op, out.nelms, spec, tiles)
    if _reorders(op) or op.op_type in _CONCATENATING:
        return VectorExchange(out.num_bytes, out_tiles)
    piece_elems = math.ceil(out_piece / max(1, out.dtype.itemsize))
    broadcast, scattered, rearranged = 0, 0, 0
    for index, t in enumerate(op.inputs):
        if t is None or index in op.const_inputs or t.info.nelms == out.nelms:
            continue
        if t.info.nelms > out.nelms:
            rearranged = out.num_bytes
            continue
        aligned = _aligned(op, t, out.shape)
        if aligned is not None:
            touched = _touched(aligned, out.shape, piece_elems)
            broadcast += out_tiles * touched * t.info.dtype.itemsize
        else:  # its elements go to where the output needs them, each once
            scattered += t.info.num_bytes
    return VectorExchange(broadcast + min(scattered, out.num_bytes) + rearranged, out_tiles)


def _aligned(op: Op, t: Tensor, out: tuple[int, ...]) -> tuple[int, ...] | None:
    """``t``'s shape padded with 1s to ``out``'s rank where it broadcasts along the other axes,
    or None. Elementwise ops broadcast by the numpy rule (trailing axes aligned). A variable or
    constant of another op (a norm's scale, a bias) lines up with the trailing axes, else with
    the first run of output axes it equals (a batch norm's channels). Other computed inputs of
    other ops are not taken for broadcasts (a per-row statistic kept flat): None."""
    shape, rank = tuple(t.info.shape), len(out)
    if len(shape) > rank:
        return None
    trailing = (1,) * (rank - len(shape)) + shape
    fits = all(n in (1, o) for n, o in zip(trailing, out))
    if isinstance(op, (ElementwiseBinary, Variadic)):
        return trailing if fits else None
    if t.kind not in _LAID_OUT:
        return None
    if fits:
        return trailing
    for k in range(rank - len(shape) + 1):
        if out[k:k + len(shape)] == shape:
            return (1,) * k + shape + (1,) * (rank - k - len(shape))
    return None


def _touched(aligned: tuple[int, ...], out: tuple[int, ...], run: int) -> int:
    """Elements of an operand (its shape ``aligned`` to ``out``'s rank) broadcast to ``out``
    that a run of ``run`` consecutive output elements reads (at worst, starting anywhere): along
    each output axis the run spans ``ceil((run - 1) / inner) + 1`` indices (inner: the elements
    of the axes after it), and the operand has its own elements only along its non-broadcast
    axes."""
    touched, inner = 1, 1
    for n, o in zip(reversed(aligned), reversed(out)):
        if n == o and o > 1:
            touched *= min(o, math.ceil((run - 1) / inner) + 1)
        inner *= o
    return touched


def _reduction(op: Reduce, outputs: int, spec: IpuSpec, tiles: int) -> VectorExchange:
    """The partials of a reduction whose input spans several tiles (module docstring)."""
    x = op.inputs[0].info
    in_tiles, in_piece = linear_pieces(x.num_bytes, tiles, spec.tile_grain_bytes)
    reduced = set(op.reduced_dims)
    if in_tiles <= 1 or not reduced or outputs >= x.nelms:
        return VectorExchange()
    piece_elems = math.ceil(in_piece / max(1, x.dtype.itemsize))
    if x.rank - 1 in reduced:
        # Innermost axes reduced: a piece covers whole runs of them, one output per run.
        run = 1
        for axis in reversed(range(x.rank)):
            if axis not in reduced:
                break
            run *= x.shape[axis]
        touched = min(outputs, math.ceil(piece_elems / run) + 1)
    else:
        touched = min(outputs, piece_elems)  # each element of the piece is its own output
    partials = in_tiles * touched
    width = max(4, x.dtype.itemsize)
    num_bytes = partials * width
    receivers = min(in_tiles, linear_pieces(num_bytes, tiles, spec.tile_grain_bytes)[0])
    return VectorExchange(num_bytes, receivers, partials, outputs)


def exchange_buffer_spans(order: Sequence[Op], position: dict[int, int], spec: IpuSpec,
                          tiles: int) -> Iterator[tuple[str, Op, int, int]]:
    """(id, op, position, bytes) of the exchange buffers of each vector op that has any."""
    for op in order:
        received = vector_exchange(op, spec, tiles).bytes
        if received:
            yield f"{op.settings.name or op.id}:exchange", op, position[op.id], received
