"""Memory model of the simulated IPU (DESIGN decision 8; spec §4.5, Appendix A).

From a scheduled graph (the plan's op order) and the device's ``IpuSpec`` it computes, per IPU
(``OpSettings.ipu``; None is IPU 0):

- always-live bytes: VARIABLE tensors by ``TensorRole`` (weights, optimizer state,
  accumulators, running statistics, optimizer parameters, step counters), CONST tensors and
  the device buffers of host input streams;
- the peak of live activations over the schedule. A tensor is live from its producer's position
  to its last consumer's position (anchors and other kept tensors to the end of the schedule).
  An output of an in-place op (``modifies_inputs``) shares its input's storage, so it adds no
  bytes and only extends that storage's lifetime;
- code: ``tile_code_base_bytes`` on every tile plus ``vertex_bytes_per_op_tile`` for each op on
  each tile where it has work (the tiles of its largest output).

Tile mapping: each tensor is mapped linearly over the IPU's tiles in pieces of
``ceil(bytes / tiles)`` rounded up to ``tile_grain_bytes`` (the last piece takes the rest),
starting where the previous tensor of that IPU ended, so small tensors spread round the chip
instead of piling on tile 0. A tensor read on another IPU than its producer's is copied there
(as an IPU copy would) and counted on both. Per-tile peaks follow from the same walk, and
``check_fits`` raises ``OutOfMemoryException`` when the fullest tile exceeds ``tile_bytes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from ..errors import OutOfMemoryException, popart_internal_exception
from ..ir.graph import Graph
from ..ir.op import Op
from ..ir.tensor import Tensor, TensorKind, TensorRole
from .spec import IpuSpec

__all__ = [
    "CATEGORIES", "IpuMemory", "MemoryResult", "TensorMemory", "check_fits", "compute_memory",
    "format_bytes", "memory_summary",
]

_ROLE_CATEGORY = {
    TensorRole.WEIGHT: "weights",
    TensorRole.OPTIMIZER_STATE: "optimizer state",
    TensorRole.ACCUMULATOR: "accumulators",
    TensorRole.RUNNING_STAT: "running stats",
    TensorRole.OPTIMIZER_PARAM: "optimizer params",
    TensorRole.STEP: "step counters",
    TensorRole.STASH: "pipeline stashes",
}
# Report order. "activations" is the peak over the schedule; the others are always live.
CATEGORIES = (*_ROLE_CATEGORY.values(), "constants", "streams", "activations", "code")
_ALWAYS_LIVE = frozenset(CATEGORIES) - {"activations", "code"}


def format_bytes(num_bytes: float) -> str:
    """``1536`` -> ``'1.50 KiB'`` (binary units, as SRAM sizes are quoted)."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class TensorMemory:
    """One tensor's storage on one IPU: its bytes, category, lifetime and tile range."""

    id: str
    info: str  # e.g. "f32[64,128]"
    num_bytes: int
    category: str
    ipu: int
    # Schedule positions it is live at, inclusive; None for always-live tensors.
    start: int | None
    end: int | None
    first_tile: int
    num_tiles: int
    piece_bytes: int  # bytes on each tile of the range but the last


@dataclass
class IpuMemory:
    """Memory use of one IPU."""

    ipu: int
    num_tiles: int
    tile_bytes: int
    categories: dict[str, int]
    tensors: list[TensorMemory]
    peak_position: int | None  # schedule position of the activation peak (None: no ops)
    peak_op: str  # debug name of the op at the peak
    peak_live: list[str]  # activation ids live at the peak, largest first
    tile_peak_bytes: np.ndarray  # per tile: always-live + code + that tile's activation peak
    code_bytes_per_tile: np.ndarray

    @property
    def capacity_bytes(self) -> int:
        return self.num_tiles * self.tile_bytes

    @property
    def total_bytes(self) -> int:
        """Always-live + code + the activation peak (all tiles together)."""
        return sum(self.categories.values())

    @property
    def worst_tile(self) -> int:
        return int(np.argmax(self.tile_peak_bytes))

    @property
    def worst_tile_bytes(self) -> int:
        return int(self.tile_peak_bytes[self.worst_tile])

    @property
    def fits(self) -> bool:
        return self.worst_tile_bytes <= self.tile_bytes

    @property
    def utilisation(self) -> float:
        """Fraction of the IPU's SRAM in use at the peak."""
        return self.total_bytes / self.capacity_bytes

    def largest(self, n: int = 5) -> list[TensorMemory]:
        return sorted(self.tensors, key=lambda t: (-t.num_bytes, t.id))[:n]

    def tiles_needed(self) -> int:
        """Tiles this IPU's data needs at ``tile_bytes`` each, after the per-tile code base and
        the op vertices (an estimate: mapping granularity can add a little)."""
        data = self.total_bytes - self.categories["code"]
        vertex_bytes = int(self.code_bytes_per_tile.max()) if len(self.code_bytes_per_tile) else 0
        room = self.tile_bytes - vertex_bytes
        return math.ceil(data / room) if room > 0 else -1


@dataclass
class MemoryResult:
    """Memory use of every IPU of one replica (replicas are identical)."""

    spec: IpuSpec
    ipus: list[IpuMemory] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return all(m.fits for m in self.ipus)

    def ipu(self, index: int) -> IpuMemory:
        return self.ipus[index]


def compute_memory(graph: Graph, order: Sequence[Op], spec: IpuSpec,
                   keep: Iterable[str] = (), num_ipus: int = 1,
                   off_chip: Iterable[str] = ()) -> MemoryResult:
    """Memory of ``graph`` run in ``order`` on IPUs of ``spec``.

    ``keep``: tensors live to the end of the schedule (anchors, graph outputs read back).
    ``off_chip``: tensors stored in streaming memory, left out of SRAM (extension point for
    tensor locations). IPUs 0..max(num_ipus, highest placement) - 1 are reported.
    """
    keep = set(keep) | set(graph.outputs)
    off_chip = set(off_chip)
    position = {op.id: i for i, op in enumerate(order)}
    last = len(order) - 1
    root = _storage_roots(order)

    # Per storage root and IPU: (first position, last position) or None when always live.
    spans: dict[tuple[str, int], list] = {}
    category: dict[str, str] = {}

    def use(tid: str, ipu: int, pos: int | None) -> None:
        span = spans.setdefault((tid, ipu), [pos, pos])
        if pos is not None and span[0] is not None:
            span[0], span[1] = min(span[0], pos), max(span[1], pos)

    for tensor in graph.tensors.values():
        if tensor.id in off_chip or root.get(tensor.id, tensor.id) != tensor.id:
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
        for ipu in ipus:
            if cat != "activations":
                spans[(tensor.id, ipu)] = [None, None]
    for op in order:
        pos = position[op.id]
        for t in op.outputs:
            if t is not None and category.get(root.get(t.id, t.id)) == "activations":
                use(root.get(t.id, t.id), _ipu(op), pos)
        for t in op.inputs:
            if t is not None and category.get(root.get(t.id, t.id)) == "activations":
                use(root.get(t.id, t.id), _ipu(op), pos)
    for tid in keep:
        base = root.get(tid, tid)
        if category.get(base) == "activations":
            for (sid, ipu), span in spans.items():
                if sid == base:
                    span[1] = last

    count = max([num_ipus, *(ipu + 1 for _, ipu in spans)])
    result = MemoryResult(spec)
    for ipu in range(count):
        items = [(tid, span) for (tid, i), span in spans.items() if i == ipu]
        ops = [op for op in order if _ipu(op) == ipu]
        result.ipus.append(_ipu_memory(graph, ipu, items, category, ops, position, spec))
    return result


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
        return _ROLE_CATEGORY[tensor.role]
    if tensor.kind is TensorKind.CONST:
        return "constants" if tensor.consumers else None
    if tensor.kind is TensorKind.STREAM:
        return "streams" if tensor.consumers else None
    return "activations" if tensor.producer is not None else None


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


class _TileMap:
    """Linear tile mapping of one IPU's tensors, continuing where the last one ended."""

    def __init__(self, spec: IpuSpec):
        self.tiles = spec.num_tiles
        self.grain = spec.tile_grain_bytes
        self.cursor = 0

    def place(self, num_bytes: int) -> tuple[int, int, int]:
        """(first tile, tile count, bytes per piece) for a new tensor."""
        if num_bytes <= 0:
            return self.cursor, 0, 0
        per_tile = math.ceil(num_bytes / self.tiles)
        piece = max(self.grain, math.ceil(per_tile / self.grain) * self.grain)
        count = min(self.tiles, math.ceil(num_bytes / piece))
        first = self.cursor
        self.cursor = (first + count) % self.tiles
        return first, count, piece

    def add(self, vec: np.ndarray, t: TensorMemory, sign: int = 1) -> None:
        """Add (or remove) ``t``'s pieces to the per-tile vector."""
        if t.num_tiles == 0:
            return
        last_piece = t.num_bytes - t.piece_bytes * (t.num_tiles - 1)
        tiles = (np.arange(t.first_tile, t.first_tile + t.num_tiles - 1) % self.tiles)
        vec[tiles] += sign * t.piece_bytes
        vec[(t.first_tile + t.num_tiles - 1) % self.tiles] += sign * last_piece


def _ipu_memory(graph: Graph, ipu: int, items: list, category: dict[str, str], ops: list[Op],
                position: dict[int, int], spec: IpuSpec) -> IpuMemory:
    tile_map = _TileMap(spec)
    tensors: dict[str, TensorMemory] = {}
    # Always-live tensors first, largest first, so big weights start at tile 0 as Poplar's
    # linear mapping would; activations follow in schedule order.
    always = sorted((x for x in items if x[1][0] is None),
                    key=lambda x: (-graph.tensors[x[0]].info.num_bytes, x[0]))
    acts = sorted((x for x in items if x[1][0] is not None), key=lambda x: (x[1][0], x[0]))
    for tid, (start, end) in always + acts:
        info = graph.tensors[tid].info
        first, count, piece = tile_map.place(info.num_bytes)
        tensors[tid] = TensorMemory(tid, str(info), info.num_bytes, category[tid], ipu, start,
                                    end, first, count, piece)

    categories = dict.fromkeys(CATEGORIES, 0)
    base = np.zeros(spec.num_tiles, dtype=np.int64)
    for t in tensors.values():
        if t.category in _ALWAYS_LIVE:
            categories[t.category] += t.num_bytes
            tile_map.add(base, t)

    # Code: a base per tile, plus vertex state on each tile where an op has work.
    code = np.full(spec.num_tiles, spec.tile_code_base_bytes, dtype=np.int64)
    for op in ops:
        largest = max((t for t in op.outputs if t is not None), default=None,
                      key=lambda t: t.info.num_bytes)
        placed = tensors.get(largest.id) if largest is not None else None
        count = placed.num_tiles if placed is not None else 1
        first = placed.first_tile if placed is not None else 0
        code[np.arange(first, first + max(count, 1)) % spec.num_tiles] += (
            spec.vertex_bytes_per_op_tile)
    categories["code"] = int(code.sum())

    # Walk the schedule: activations become live at their first position, die after their last.
    starts: dict[int, list[TensorMemory]] = {}
    ends: dict[int, list[TensorMemory]] = {}
    for t in tensors.values():
        if t.start is not None:
            starts.setdefault(t.start, []).append(t)
            ends.setdefault(t.end, []).append(t)
    live_vec = np.zeros(spec.num_tiles, dtype=np.int64)
    tile_act_peak = np.zeros(spec.num_tiles, dtype=np.int64)
    live: dict[str, TensorMemory] = {}
    live_bytes, peak_bytes, peak_position, peak_live = 0, 0, None, []
    for pos in sorted(set(starts) | set(ends)):
        for t in starts.get(pos, ()):
            live[t.id] = t
            live_bytes += t.num_bytes
            tile_map.add(live_vec, t)
        np.maximum(tile_act_peak, live_vec, out=tile_act_peak)
        if live_bytes > peak_bytes or peak_position is None:
            peak_bytes, peak_position = live_bytes, pos
            peak_live = sorted(live, key=lambda i: (-live[i].num_bytes, i))
        for t in ends.get(pos, ()):
            del live[t.id]
            live_bytes -= t.num_bytes
            tile_map.add(live_vec, t, -1)
    categories["activations"] = peak_bytes
    by_position = {position[op.id]: op for op in ops}
    peak_op = by_position[peak_position].debug_name if peak_position in by_position else ""
    return IpuMemory(
        ipu=ipu,
        num_tiles=spec.num_tiles,
        tile_bytes=spec.tile_bytes,
        categories=categories,
        tensors=list(tensors.values()),
        peak_position=peak_position,
        peak_op=peak_op,
        peak_live=peak_live,
        tile_peak_bytes=base + code + tile_act_peak,
        code_bytes_per_tile=code,
    )


def memory_summary(result: MemoryResult, top: int = 5) -> str:
    """Per-IPU text: totals vs capacity, the fullest tile, categories and the largest tensors."""
    spec = result.spec
    lines = [f"Memory ({spec.name}, {spec.num_tiles} tiles x {format_bytes(spec.tile_bytes)} "
             f"per IPU):"]
    for m in result.ipus:
        lines.append(
            f"  IPU {m.ipu}: {format_bytes(m.total_bytes)} of {format_bytes(m.capacity_bytes)} "
            f"({100 * m.utilisation:.1f}%), fullest tile {m.worst_tile}: "
            f"{format_bytes(m.worst_tile_bytes)} of {format_bytes(m.tile_bytes)}"
            + ("" if m.fits else "  OUT OF MEMORY")
        )
        parts = [f"{name} {format_bytes(n)}" for name, n in m.categories.items() if n]
        lines.append("    " + ", ".join(parts))
        for t in m.largest(top):
            lines.append(f"    {t.id} {t.info}: {format_bytes(t.num_bytes)} ({t.category})")
    return "\n".join(lines)


def check_fits(result: MemoryResult, summary_report: str = "") -> None:
    """Raise OutOfMemoryException for the first IPU whose fullest tile exceeds its SRAM.

    The message names the IPU, bytes needed vs available (IPU and worst tile), the largest
    tensors and live activations at the peak, and what to change. ``summary_report`` becomes
    the exception's ``getSummaryReport()`` (default: the memory summary).
    """
    over = [m for m in result.ipus if not m.fits]
    if not over:
        return
    spec = result.spec
    m = over[0]
    names = {t.id: t for t in m.tensors}
    largest = ", ".join(f"'{t.id}' {t.info} {format_bytes(t.num_bytes)} ({t.category})"
                        for t in m.largest(5))
    live = ", ".join(f"'{i}' {names[i].info} {format_bytes(names[i].num_bytes)}"
                     for i in m.peak_live[:5])
    cats = ", ".join(f"{name} {format_bytes(n)}" for name, n in m.categories.items() if n)
    others = f" (IPUs {', '.join(str(o.ipu) for o in over)} do not fit)" if len(over) > 1 else ""
    state = m.categories["optimizer state"] + m.categories["accumulators"]
    needed = m.tiles_needed()
    lines = [
        f"Out of memory on IPU {m.ipu}{others}: it needs {format_bytes(m.total_bytes)} "
        f"({m.total_bytes} bytes) but has {format_bytes(m.capacity_bytes)} ({m.num_tiles} "
        f"tiles x {format_bytes(m.tile_bytes)}, {spec.name}); its fullest tile {m.worst_tile} "
        f"needs {format_bytes(m.worst_tile_bytes)} ({m.worst_tile_bytes} bytes) of "
        f"{format_bytes(m.tile_bytes)} ({m.tile_bytes} bytes).",
        f"By category: {cats}.",
        f"Largest tensors: {largest}.",
    ]
    if m.peak_live:
        lines.append(f"Live activations at the peak (before {m.peak_op}): {live}.")
    lines += [
        "To fit, try one of:",
        f"  - more IPUs: split the model with builder.virtualGraph(...) and "
        f"SessionOptions.virtualGraphMode = VirtualGraphMode.Manual, with enablePipelining = "
        f"True, on a device with more IPUs"
        + (f"; or at least {needed} tiles per IPU (this estimate), e.g. "
           f"createIpuModelDevice({{'tilesPerIPU': {needed}}})"
           if 0 < needed <= spec.full_chip_tiles and needed > m.num_tiles else "")
        + ";",
        f"  - optimizer state off chip (optimizer state and accumulators here: "
        f"{format_bytes(state)}): SessionOptions.optimizerStateTensorLocationSettings = "
        f"TensorLocationSettings(TensorStorage.OffChip);",
        "  - replicated tensor sharding of weights and optimizer state across replicas "
        "(TensorLocationSettings with replicatedTensorSharding = True, with "
        "enableReplicatedGraphs);",
        f"  - recomputation of activations (activation peak here: "
        f"{format_bytes(m.categories['activations'])}): SessionOptions.autoRecomputation = "
        f"RecomputationType.Standard;",
        "  - a smaller micro-batch (activations scale with it), with gradient accumulation to "
        "keep the batch size.",
    ]
    raise OutOfMemoryException("\n".join(lines), summary_report or memory_summary(result))
