"""The memory model's results (device/memory.py computes them): the memory categories, the
per-tensor and per-IPU figures of one replica, the per-IPU text summary and the fit verdict
(``check_fits``: ``OutOfMemoryException`` naming the IPU, the bytes needed against those
available, the largest tensors, the activations live at the peak and the remedies)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import OutOfMemoryException
from ..ir.tensor import TensorRole
from .spec import IpuSpec
from .vector_exchange import EXCHANGE_BUFFERS

__all__ = ["ALWAYS_LIVE", "CATEGORIES", "COMPUTE_TILES", "IO_BUFFERS", "IO_TILES",
           "PLANNER_TEMPORARIES", "REMOTE_BUFFERS", "ROLE_CATEGORY", "IoBuffer", "IpuMemory",
           "MemoryResult", "TensorMemory", "check_fits", "format_bytes", "memory_summary"]

ROLE_CATEGORY = {
    TensorRole.WEIGHT: "weights",
    TensorRole.OPTIMIZER_STATE: "optimizer state",
    TensorRole.ACCUMULATOR: "accumulators",
    TensorRole.RUNNING_STAT: "running stats",
    TensorRole.OPTIMIZER_PARAM: "optimizer params",
    TensorRole.STEP: "step counters",
    TensorRole.STASH: "pipeline stashes",
}
IO_BUFFERS = "IO tile buffers"
REMOTE_BUFFERS = "remote buffers"
PLANNER_TEMPORARIES = "planner temporaries"  # device/planner.py, live at their op only
# Report order. "activations" and "remote buffers" are what is live at the peak over the
# schedule; the others are always live.
CATEGORIES = (*ROLE_CATEGORY.values(), "constants", "streams", IO_BUFFERS, "activations",
              REMOTE_BUFFERS, PLANNER_TEMPORARIES, EXCHANGE_BUFFERS, "code")
ALWAYS_LIVE = frozenset(CATEGORIES) - {"activations", REMOTE_BUFFERS, PLANNER_TEMPORARIES,
                                       EXCHANGE_BUFFERS, "code"}
# The tile sets a tensor's range wraps around in.
COMPUTE_TILES, IO_TILES = "compute", "io"


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
    """One tensor's storage on one IPU: its bytes, category, lifetime and tile range.

    An off-chip tensor has one entry per span its on-chip buffer is live (same id)."""

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
    tile_set: str = COMPUTE_TILES  # "compute" or "io": the tiles its range wraps around in


@dataclass(frozen=True)
class IoBuffer:
    """The buffers of one host stream on the IO tiles of an IPU (all ``depth`` of them)."""

    id: str  # the stream's tensor id
    info: str
    num_bytes: int  # one buffer
    depth: int
    ipu: int


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
    num_io_tiles: int = 0  # the last num_io_tiles tiles are IO tiles
    streaming_bytes: int = 0  # off-chip tensors in this IPU's streaming memory
    streaming_capacity_bytes: int = 0
    streaming_tensors: tuple[str, ...] = ()  # their ids, largest first

    @property
    def capacity_bytes(self) -> int:
        return self.num_tiles * self.tile_bytes

    @property
    def num_compute_tiles(self) -> int:
        return self.num_tiles - self.num_io_tiles

    @property
    def total_bytes(self) -> int:
        """Always-live + code + what is live at the peak (all tiles together)."""
        return sum(self.categories.values())

    @property
    def worst_tile(self) -> int:
        return int(np.argmax(self.tile_peak_bytes))

    @property
    def worst_tile_bytes(self) -> int:
        return int(self.tile_peak_bytes[self.worst_tile])

    @property
    def fits_sram(self) -> bool:
        return self.worst_tile_bytes <= self.tile_bytes

    @property
    def fits_streaming(self) -> bool:
        return self.streaming_bytes <= self.streaming_capacity_bytes

    @property
    def fits(self) -> bool:
        return self.fits_sram and self.fits_streaming

    @property
    def utilisation(self) -> float:
        """Fraction of the IPU's SRAM in use at the peak."""
        return self.total_bytes / self.capacity_bytes

    def largest(self, n: int = 5) -> list[TensorMemory]:
        """The ``n`` largest tensors (one entry per id)."""
        seen, out = set(), []
        for t in sorted(self.tensors, key=lambda t: (-t.num_bytes, t.id)):
            if t.id not in seen:
                seen.add(t.id)
                out.append(t)
        return out[:n]

    def tiles_needed(self) -> int:
        """Tiles this IPU's data needs at ``tile_bytes`` each, after the per-tile code base and
        the op vertices, plus its IO tiles (an estimate: mapping granularity can add a little)."""
        data = self.total_bytes - self.categories["code"] - self.categories[IO_BUFFERS]
        vertex_bytes = int(self.code_bytes_per_tile.max()) if len(self.code_bytes_per_tile) else 0
        room = self.tile_bytes - vertex_bytes
        return math.ceil(data / room) + self.num_io_tiles if room > 0 else -1


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
        if m.num_io_tiles:
            lines.append(f"    tiles: {m.num_compute_tiles} compute, {m.num_io_tiles} IO")
        if m.streaming_tensors:
            lines.append(
                f"    streaming memory: {format_bytes(m.streaming_bytes)} of "
                f"{format_bytes(m.streaming_capacity_bytes)} in {len(m.streaming_tensors)} "
                f"off-chip tensor(s)" + ("" if m.fits_streaming else "  OUT OF MEMORY"))
        for t in m.largest(top):
            lines.append(f"    {t.id} {t.info}: {format_bytes(t.num_bytes)} ({t.category})")
    return "\n".join(lines)


def check_fits(result: MemoryResult, summary_report: str = "") -> None:
    """Raise OutOfMemoryException for the first IPU whose fullest tile exceeds its SRAM.

    The message names the IPU, bytes needed vs available (IPU and worst tile), the largest
    tensors and live activations at the peak, and what to change. ``summary_report`` becomes
    the exception's ``getSummaryReport()`` (default: the memory summary).
    """
    _check_streaming(result, summary_report)
    over = [m for m in result.ipus if not m.fits_sram]
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
    lines.append("To fit, try one of:")
    if m.worst_tile >= m.num_compute_tiles:
        lines.append(
            f"  - the fullest tile is one of the {m.num_io_tiles} IO tiles (host-stream buffers "
            f"there: {format_bytes(m.categories[IO_BUFFERS])}): more IO tiles "
            f"(SessionOptions.numIOTiles), or fewer buffers per stream "
            f"(ExchangeStrategy.JustInTime keeps 1, OverlapInnerLoop 2, OverlapLoops 3);")
    lines += [
        "  - more IPUs: split the model with builder.virtualGraph(...) and "
        "SessionOptions.virtualGraphMode = VirtualGraphMode.Manual, with enablePipelining = "
        "True, on a device with more IPUs"
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


def _check_streaming(result: MemoryResult, summary_report: str) -> None:
    """Raise OutOfMemoryException if the off-chip tensors of an IPU exceed its streaming
    memory."""
    for m in result.ipus:
        if m.fits_streaming:
            continue
        names = ", ".join(repr(i) for i in m.streaming_tensors[:5])
        raise OutOfMemoryException(
            f"Out of streaming memory on IPU {m.ipu}: its off-chip tensors need "
            f"{format_bytes(m.streaming_bytes)} ({m.streaming_bytes} bytes) but it has "
            f"{format_bytes(m.streaming_capacity_bytes)} ({m.streaming_capacity_bytes} bytes, "
            f"{result.spec.name}). Largest: {names}. Keep some of them on chip "
            f"(TensorStorage.OnChip in the TensorLocationSettings or "
            f"tensorLocationSettingsOverride) or spread the model over more IPUs.",
            summary_report or memory_summary(result),
        )
