"""Memory model of the simulated IPU (DESIGN decision 8).

From a scheduled graph (the plan's op order) and the device's ``IpuSpec`` it computes, per IPU
(``OpSettings.ipu``; None is IPU 0):

- always-live bytes: VARIABLE tensors by ``TensorRole`` (weights, optimizer state,
  accumulators, running statistics, optimizer parameters, step counters), CONST tensors, the
  device buffers of host input streams, and the IO-tile buffers of host streams (below);
- the peak of live activations over the schedule. A tensor is live from its producer's position
  to its last consumer's position (anchors and other kept tensors to the end of the schedule).
  An output of an in-place op (``modifies_inputs``) shares its input's storage, so it adds no
  bytes and only extends that storage's lifetime;
- code: ``tile_code_base_bytes`` on every tile plus ``vertex_bytes_per_op_tile`` for each op on
  each tile where it has work (the tiles of its largest output).

Off-chip tensors (tensor locations) live in the IPU's streaming memory pool
(``IpuSpec.streaming_memory_bytes``) and take SRAM only while they are used: a variable from its
first to its last use within each fragment (Normal, accumulate outer fragment) that reads it, an
activation at its producer and at each reader (it is stored after it is made and loaded for each
use). These transient copies are the "remote buffers" category, part of the peak over the
schedule. A tensor execution phases stream with explicit RemoteLoad / RemoteStore ops has no
transient copies: the loaded copies are tensors of the graph, counted as activations.

IO tiles: with ``numIOTiles`` = n, the last n tiles of each IPU are IO tiles and the
first tilesPerIPU - n compute tiles hold everything else. Each host stream on ``TileSet.IO``
keeps ``depth`` buffers there: 1 for JustInTime, 2 for OverlapInnerLoop (the micro-batch in use
and the prefetched next one), 3 for OverlapLoops (also the first micro-batch of the next outer
iteration, prefetched across the outer loop boundary). Off-chip tensors loaded and stored on
``TileSet.IO`` keep their transient buffers there too.

Recomputation: a recompute clone (``RecomputeType.Recomputed``) exists so that the
forward activation it replaces need not stay live across the gap between the forward and the
backward pass. Its own output must then be live only from where it is recomputed to its readers,
so the liveness walk uses ``recompute_late_order``: the schedule with every clone moved as late
as it can go, just before its first reader. The executed schedule is not changed; this is the
order a memory-aware scheduler would pick, and it never moves a non-clone op.

Planner temporaries (device/planner.py): every matmul or convolution holds its rearranged input
pieces and partials, bounded by its available memory proportion, at its own position only; the
other ops hold what they receive over the exchange (device/vector_exchange.py) likewise.

Tile mapping: each tensor is mapped linearly over its tile set in pieces of
``ceil(bytes / tiles)`` rounded up to ``tile_grain_bytes`` (the last piece takes the rest),
starting where the previous tensor of that IPU ended, so small tensors spread round the chip
instead of piling on tile 0. A tensor read on another IPU than its producer's is copied there
(as an IPU copy would) and counted on both. Per-tile peaks follow from the same walk, and
``check_fits`` raises ``OutOfMemoryException`` when the fullest tile exceeds ``tile_bytes`` or
the off-chip tensors exceed the streaming memory.

This module computes the figures; the result types, the categories, the summary text and
``check_fits`` live in device/memory_result.py (their names are importable from here too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ..errors import popart_internal_exception
from ..ir.graph import Graph
from ..ir.op import ExecutionContext, Op, RecomputeType
from ..ir.tensor import Tensor, TensorKind
from .memory_result import (
    ALWAYS_LIVE,
    CATEGORIES,
    COMPUTE_TILES,
    IO_BUFFERS,
    IO_TILES,
    PLANNER_TEMPORARIES,
    REMOTE_BUFFERS,
    ROLE_CATEGORY,
    IoBuffer,
    IpuMemory,
    MemoryResult,
    TensorMemory,
    check_fits,
    format_bytes,
    memory_summary,
)
from .option_model import OptionModel, early_op_order, early_var_update_order
from .planner import planner_plan
from .var_update_merge import group_bytes
from .spec import IpuSpec
from .transfers import explicitly_streamed
from .vector_exchange import EXCHANGE_BUFFERS, exchange_buffer_spans

# The results' names (device/memory_result.py) stay importable from here, where the memory
# model is computed.
__all__ = ["CATEGORIES", "IO_BUFFERS", "PLANNER_TEMPORARIES", "REMOTE_BUFFERS", "IoBuffer",
           "IpuMemory", "MemoryResult", "TensorMemory", "check_fits", "compute_memory",
           "format_bytes", "memory_summary", "recompute_late_order", "storage_roots"]

@dataclass
class _Span:
    """Where and when one tensor's storage takes SRAM on one IPU."""

    id: str
    ipu: int
    start: int | None  # None: always live
    end: int | None
    category: str
    num_bytes: int
    info: str
    tile_set: str = COMPUTE_TILES


def compute_memory(graph: Graph, order: Sequence[Op], spec: IpuSpec,
                   keep: Iterable[str] = (), num_ipus: int = 1,
                   off_chip: Iterable[str] = (), io_tile_buffers: Iterable[str] = (),
                   num_io_tiles: int = 0, io_streams: Iterable[IoBuffer] = (),
                   effects: OptionModel | None = None) -> MemoryResult:
    """Memory of ``graph`` run in ``order`` on IPUs of ``spec``.

    ``keep``: tensors live to the end of the schedule (anchors, graph outputs read back).
    ``off_chip``: tensors stored in streaming memory (storage roots: an in-place output shares
    its input's location); ``io_tile_buffers``: those of them whose on-chip buffers sit on the IO
    tiles. ``num_io_tiles``: IO tiles per IPU; ``io_streams``: the host-stream buffers they hold.
    IPUs 0..max(num_ipus, highest placement) - 1 are reported. ``effects``: what the session
    options ask of the model (device/option_model.py: batch-serialised activations, input
    stream buffering depths, early weight updates).
    """
    effects = effects or OptionModel()
    keep = set(keep) | set(graph.outputs)
    off_chip = set(off_chip)
    on_io = set(io_tile_buffers)
    if effects.early_var_updates:  # delayVarUpdates = False
        order = early_var_update_order(graph, order)
    # decomposeGradSum's Adds, scheduleNonWeightUpdateGradientConsumersEarly's consumers
    order = early_op_order(graph, order, effects.early_ops)
    order = recompute_late_order(order)
    position = {op.id: i for i, op in enumerate(order)}
    last = len(order) - 1
    root = _storage_roots(order)

    # Per storage root and IPU: [first position, last position], or None when always live.
    spans: dict[tuple[str, int], list] = {}
    # Off-chip roots: per IPU and fragment, the positions that read or write them.
    remote_uses: dict[tuple[str, int], dict[ExecutionContext, list[int]]] = {}
    streaming: dict[int, list[Tensor]] = {}
    category: dict[str, str] = {}

    def use(tid: str, ipu: int, pos: int | None) -> None:
        span = spans.setdefault((tid, ipu), [pos, pos])
        if pos is not None and span[0] is not None:
            span[0], span[1] = min(span[0], pos), max(span[1], pos)

    for tensor in graph.tensors.values():
        if root.get(tensor.id, tensor.id) != tensor.id:
            continue
        cat = _category(tensor)
        if cat is None:
            continue
        ipus = {_ipu(op) for op in tensor.consumers}
        if tensor.producer is not None:
            ipus.add(_ipu(tensor.producer))
        if not ipus and (tensor.id in keep or tensor.kind is TensorKind.VARIABLE):
            ipus = {0}
        category[tensor.id] = cat
        if tensor.id in off_chip:
            for ipu in ipus:
                streaming.setdefault(ipu, []).append(tensor)
                remote_uses[(tensor.id, ipu)] = {}
            continue
        for ipu in ipus:
            if cat != "activations":
                spans[(tensor.id, ipu)] = [None, None]
    for op in order:
        pos = position[op.id]
        for t in (*op.outputs, *op.inputs):
            if t is None:
                continue
            base = root.get(t.id, t.id)
            if (base, _ipu(op)) in remote_uses:
                remote_uses[(base, _ipu(op))].setdefault(
                    op.settings.execution_context, []).append(pos)
            elif category.get(base) == "activations":
                use(base, _ipu(op), pos)
    for tid in keep:
        base = root.get(tid, tid)
        if category.get(base) == "activations" and base not in off_chip:
            for (sid, ipu), span in spans.items():
                if sid == base:
                    span[1] = last

    items = [
        _Span(tid, ipu, start, end, category[tid],
              _option_bytes(effects, tid, category[tid], graph.tensors[tid].info.num_bytes),
              str(graph.tensors[tid].info))
        for (tid, ipu), (start, end) in spans.items()
    ]
    explicit = explicitly_streamed(order, root)
    for (tid, ipu), by_context in remote_uses.items():
        tensor = graph.tensors[tid]
        if tid in explicit:  # its on-chip copies are the RemoteLoad / RemoteStore tensors
            continue
        # A variable stays loaded through each fragment that uses it; an activation is stored
        # after it is made and loaded again for each reader.
        if tensor.kind is TensorKind.VARIABLE:
            windows = [(min(p), max(p)) for p in by_context.values()]
        else:
            windows = [(p, p) for p in sorted({p for ps in by_context.values() for p in ps})]
        for start, end in windows:
            items.append(_Span(tid, ipu, start, end, REMOTE_BUFFERS, tensor.info.num_bytes,
                               str(tensor.info), IO_TILES if tid in on_io else COMPUTE_TILES))
    for stream in io_streams:
        items.append(_Span(stream.id, stream.ipu, None, None, IO_BUFFERS,
                           stream.num_bytes * stream.depth,
                           f"{stream.depth} x {stream.info}", IO_TILES))

    tiles = spec.num_tiles - num_io_tiles
    for op in order:  # per-op planning settings (device/planner.py)
        plan = planner_plan(op, spec, tiles, effects.serialized_matmuls,
                            effects.matmul_proportion, effects.conv_proportion)
        if plan is not None and plan.temporary_bytes:
            pos, n = position[op.id], plan.temporary_bytes
            items.append(_Span(f"{op.settings.name or op.id}:planner", _ipu(op), pos, pos,
                               PLANNER_TEMPORARIES, n, f"u8[{n}]"))
    for tid, op, pos, n in exchange_buffer_spans(order, position, spec, tiles):
        items.append(_Span(tid, _ipu(op), pos, pos, EXCHANGE_BUFFERS, n, f"u8[{n}]"))
    for k, group in enumerate(effects.merged_updates):  # mergeVarUpdate's gradient buffer
        spots = [position[i] for i in group if i in position]
        if not spots:
            continue
        num_bytes = group_bytes(graph, group)
        items.append(_Span(f"MergedVarUpdate/{k}", _ipu(graph.ops[group[0]]), min(spots),
                           max(spots), "activations", num_bytes, f"u8[{num_bytes}]"))
    count = max([num_ipus, *(s.ipu + 1 for s in items), *(i + 1 for i in streaming)])
    result = MemoryResult(spec)
    for ipu in range(count):
        mine = [s for s in items if s.ipu == ipu]
        ops = [op for op in order if _ipu(op) == ipu]
        memory = _ipu_memory(ipu, mine, ops, position, spec, num_io_tiles, root)
        pool = sorted(streaming.get(ipu, ()), key=lambda t: (-t.info.num_bytes, t.id))
        memory.streaming_bytes = sum(t.info.num_bytes for t in pool)
        memory.streaming_tensors = tuple(t.id for t in pool)
        memory.streaming_capacity_bytes = spec.streaming_memory_bytes
        result.ipus.append(memory)
    return result


def _option_bytes(effects: OptionModel, tid: str, cat: str, num_bytes: int) -> int:
    """Bytes of a tensor as the session options have it: a batch-serialised activation is live
    one slice at a time, an input stream keeps its buffering depth of buffers."""
    if cat == "activations":
        return effects.activation_bytes(tid, num_bytes)
    if cat == "streams":
        return effects.stream_bytes(tid, num_bytes)
    return num_bytes


def _ipu(op: Op) -> int:
    return op.settings.ipu or 0


def _category(tensor: Tensor) -> str | None:
    """Memory category, or None for a tensor that is never on the device."""
    if tensor.kind is TensorKind.VARIABLE:
        if tensor.role is None:
            raise popart_internal_exception(
                f"Variable '{tensor.id}' has no TensorRole; the pass that created it must set "
                f"one (docs/training.md)."
            )
        return ROLE_CATEGORY[tensor.role]
    if tensor.kind is TensorKind.CONST:
        return "constants" if tensor.consumers else None
    if tensor.kind is TensorKind.STREAM:
        return "streams" if tensor.consumers else None
    return "activations" if tensor.producer is not None else None


def recompute_late_order(order: Sequence[Op]) -> list[Op]:
    """``order`` with each recompute clone moved just before its first reader (a clone read by
    another clone goes just before that one). Other ops keep their relative order, so the result
    is a valid schedule whenever ``order`` is. Clones no op reads stay where they are."""
    ops = list(order)
    is_clone = {op.id: op.settings.recompute is RecomputeType.Recomputed for op in ops}
    if not any(is_clone.values()):
        return ops
    position = {op.id: i for i, op in enumerate(ops)}
    anchor: dict[int, Op] = {}  # clone id -> the non-moving op it is placed before
    before: dict[int, list[Op]] = {}  # anchor id -> the clones just before it, in order
    for op in reversed(ops):
        if not is_clone[op.id]:
            continue
        readers = {r.id: r for t in op.outputs if t is not None for r in t.consumers
                   if r.id in position}
        if not readers:
            continue  # nothing to move before: it keeps its place

        def final_rank(r: Op) -> tuple[int, int]:
            # Where ``r`` ends up: its own position, or (for a moved clone) its anchor's.
            a = anchor.get(r.id, r)
            group = before.get(a.id, [])
            return position[a.id], group.index(r) if r is not a else len(group)

        first = min(readers.values(), key=final_rank)
        a = anchor.get(first.id, first)
        group = before.setdefault(a.id, [])
        group.insert(group.index(first) if first is not a else len(group), op)
        anchor[op.id] = a
    out: list[Op] = []
    for op in ops:
        if op.id in anchor:
            continue
        out.extend(before.get(op.id, ()))
        out.append(op)
    return out


def _storage_roots(order: Sequence[Op]) -> dict[str, str]:
    """Tensor id -> id of the tensor whose storage it shares (in-place outputs only).

    An in-place op's output aliases the modified input with the same info, matched in the
    order of ``modifies_inputs`` (e.g. BatchNormalizationTraining: running mean, running var).
    """
    root: dict[str, str] = {}
    for op in order:
        taken: set[int] = set()
        for index in op.modifies_inputs:
            source = op.inputs[index] if index < len(op.inputs) else None
            if source is None:
                continue
            for k, out in enumerate(op.outputs):
                if out is not None and k not in taken and out.info == source.info:
                    taken.add(k)
                    root[out.id] = root.get(source.id, source.id)
                    break
    return root


def storage_roots(order: Sequence[Op]) -> dict[str, str]:
    """Public view of the in-place aliasing the memory model uses (for the cycle model)."""
    return _storage_roots(order)


class _TileMap:
    """Linear tile mapping over one tile set of an IPU (``tiles`` tiles from ``offset``),
    continuing where the last tensor ended."""

    def __init__(self, offset: int, tiles: int, grain: int):
        self.offset = offset
        self.tiles = tiles
        self.grain = grain
        self.cursor = 0

    def place(self, num_bytes: int) -> tuple[int, int, int]:
        """(first tile, tile count, bytes per piece) for a new tensor."""
        if num_bytes <= 0 or self.tiles <= 0:
            return self.offset + self.cursor, 0, 0
        per_tile = math.ceil(num_bytes / self.tiles)
        piece = max(self.grain, math.ceil(per_tile / self.grain) * self.grain)
        count = min(self.tiles, math.ceil(num_bytes / piece))
        first = self.cursor
        self.cursor = (first + count) % self.tiles
        return self.offset + first, count, piece

    def add(self, vec: np.ndarray, t: TensorMemory, sign: int = 1) -> None:
        """Add (or remove) ``t``'s pieces to the per-tile vector."""
        if t.num_tiles == 0:
            return
        last_piece = t.num_bytes - t.piece_bytes * (t.num_tiles - 1)
        first = t.first_tile - self.offset
        tiles = self.offset + np.arange(first, first + t.num_tiles - 1) % self.tiles
        vec[tiles] += sign * t.piece_bytes
        vec[self.offset + (first + t.num_tiles - 1) % self.tiles] += sign * last_piece


def _ipu_memory(ipu: int, items: list[_Span], ops: list[Op], position: dict[int, int],
                spec: IpuSpec, num_io_tiles: int,
                root: dict[str, str] | None = None) -> IpuMemory:
    compute_tiles = spec.num_tiles - num_io_tiles
    maps = {COMPUTE_TILES: _TileMap(0, compute_tiles, spec.tile_grain_bytes),
            IO_TILES: _TileMap(compute_tiles, num_io_tiles, spec.tile_grain_bytes)}
    tensors: list[TensorMemory] = []
    # Always-live tensors first, largest first, so big weights start at tile 0 as Poplar's
    # linear mapping would; activations and remote buffers follow in schedule order.
    always = sorted((s for s in items if s.start is None), key=lambda s: (-s.num_bytes, s.id))
    live_spans = sorted((s for s in items if s.start is not None),
                        key=lambda s: (s.start, s.id, s.end))
    for s in always + live_spans:
        first, count, piece = maps[s.tile_set].place(s.num_bytes)
        tensors.append(TensorMemory(s.id, s.info, s.num_bytes, s.category, ipu, s.start, s.end,
                                    first, count, piece, s.tile_set))

    categories = dict.fromkeys(CATEGORIES, 0)
    base = np.zeros(spec.num_tiles, dtype=np.int64)
    for t in tensors:
        if t.category in ALWAYS_LIVE:
            categories[t.category] += t.num_bytes
            maps[t.tile_set].add(base, t)

    # Code: a base per tile, plus vertex state on each compute tile where an op has work: the
    # tiles of its largest output's storage (an in-place output is its input's storage), or,
    # when no output has storage here (a copy out, a store), of its largest input.
    placed = {t.id: t for t in tensors if t.tile_set == COMPUTE_TILES}
    root = root or {}
    code = np.full(spec.num_tiles, spec.tile_code_base_bytes, dtype=np.int64)
    for op in ops:
        where = _work_tiles(op, placed, root)
        count = where.num_tiles if where is not None else 1
        first = where.first_tile if where is not None else 0
        code[np.arange(first, first + max(count, 1)) % max(compute_tiles, 1)] += (
            spec.vertex_bytes_per_op_tile)
    categories["code"] = int(code.sum())

    # Walk the schedule: spans become live at their first position and die after their last.
    starts: dict[int, list[TensorMemory]] = {}
    ends: dict[int, list[TensorMemory]] = {}
    for t in tensors:
        if t.start is not None:
            starts.setdefault(t.start, []).append(t)
            ends.setdefault(t.end, []).append(t)
    live_vec = np.zeros(spec.num_tiles, dtype=np.int64)
    tile_act_peak = np.zeros(spec.num_tiles, dtype=np.int64)
    live: dict[int, TensorMemory] = {}
    live_bytes, peak_bytes, peak_position, peak_set = 0, 0, None, []
    for pos in sorted(set(starts) | set(ends)):
        for t in starts.get(pos, ()):
            live[id(t)] = t
            live_bytes += t.num_bytes
            maps[t.tile_set].add(live_vec, t)
        np.maximum(tile_act_peak, live_vec, out=tile_act_peak)
        if live_bytes > peak_bytes or peak_position is None:
            peak_bytes, peak_position = live_bytes, pos
            peak_set = list(live.values())
        for t in ends.get(pos, ()):
            del live[id(t)]
            live_bytes -= t.num_bytes
            maps[t.tile_set].add(live_vec, t, -1)
    for t in peak_set:
        categories[t.category] += t.num_bytes
    peak_live = [t.id for t in sorted(peak_set, key=lambda t: (-t.num_bytes, t.id))]
    by_position = {position[op.id]: op for op in ops}
    peak_op = by_position[peak_position].debug_name if peak_position in by_position else ""
    return IpuMemory(
        ipu=ipu,
        num_tiles=spec.num_tiles,
        tile_bytes=spec.tile_bytes,
        categories=categories,
        tensors=tensors,
        peak_position=peak_position,
        peak_op=peak_op,
        peak_live=peak_live,
        tile_peak_bytes=base + code + tile_act_peak,
        code_bytes_per_tile=code,
        num_io_tiles=num_io_tiles,
    )


def _work_tiles(op: Op, placed: dict[str, TensorMemory],
                root: dict[str, str]) -> TensorMemory | None:
    """The placed tensor whose tiles hold ``op``'s work: its largest output with storage on
    this IPU, else its largest such input (None when neither has any)."""
    for side in (op.outputs, op.inputs):
        found = [placed[root.get(t.id, t.id)] for t in side
                 if t is not None and root.get(t.id, t.id) in placed]
        if found:
            return max(found, key=lambda t: t.num_bytes)
    return None
