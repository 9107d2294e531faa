"""Host streams and the IO-tile overlap of their transfers with compute.

Overlapped IO. With ``numIOTiles`` = n, ops compute on the remaining
tilesPerIPU − n tiles. A host stream on ``TileSet.IO`` with ``ExchangeStrategy`` OverlapInnerLoop
or OverlapLoops is prefetched by the IO tiles while the compute tiles work. The loops of a step
are an outer loop of M = batchesPerStep and an inner loop of N = accumulationFactor iterations
(a loop of fewer than 2 iterations is omitted: then N = batchesPerStep, M = 1). Of a stream's
transfers, OverlapInnerLoop hides all but 2 per inner loop (M·(N−2) of M·N), OverlapLoops all
but 2 per step (M·N−2). A hidden transfer costs nothing while the compute of the iterations it
runs behind is longer; the rest is added to the step. Every other transfer is serial, as with
JustInTime, and each transfer on the IO tiles is also copied to the compute tiles (on-chip
exchange). The simulator computes the same values either way: only the timeline changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..tensorinfo import ExchangeStrategy, TileSet
from .op_cost import _host_transfer_cycles, _seconds_to_cycles
from .spec import IpuSpec
from .transfers import BatchInfo

_OVERLAP = (ExchangeStrategy.OverlapInnerLoop, ExchangeStrategy.OverlapLoops)


@dataclass(frozen=True)
class HostStream:
    """One host stream of one replica: an input (host -> IPU) or an anchor (IPU -> host)."""

    id: str
    is_input: bool
    num_bytes: int  # one transfer
    transfers_per_step: int
    tile_set: TileSet = TileSet.Compute
    strategy: ExchangeStrategy = ExchangeStrategy.JustInTime
    ipu: int = 0
    info: str = ""  # e.g. "f32[4,8]"


@dataclass(frozen=True)
class HostIO:
    """The host streams of a program and the IO tiles per IPU that may serve them."""

    num_io_tiles: int = 0
    streams: tuple[HostStream, ...] = ()

    def on_io_tiles(self, stream: HostStream) -> bool:
        return self.num_io_tiles > 0 and stream.tile_set is TileSet.IO

    def overlapped(self, stream: HostStream) -> bool:
        """Whether the stream's transfers can run behind compute (IO tiles and a strategy)."""
        return self.on_io_tiles(stream) and stream.strategy in _OVERLAP


@dataclass(frozen=True)
class OverlapIO:
    """The host transfers of overlapped streams in one step (module docstring)."""

    outer_iterations: int  # M
    inner_iterations: int  # N
    exposed_transfers: int
    hidden_transfers: int
    exposed_cycles: int  # transfers that do not overlap, at full cost
    hidden_cycles: int  # transfer cycles run behind compute
    excess_cycles: int  # the part of the hidden transfers longer than the compute they hide behind
    io_copy_cycles: int  # IO tiles -> compute tiles (and back) for every IO-tile transfer

    @property
    def cycles(self) -> int:
        """What the overlapped streams add to a step."""
        return self.exposed_cycles + self.excess_cycles + self.io_copy_cycles


def overlap_io(io: HostIO, batch: BatchInfo, spec: IpuSpec, iteration_cycles: int) -> OverlapIO:
    """The cycles the IO-tile streams of ``io`` add to a step whose micro-batches compute for
    ``iteration_cycles`` each (module docstring)."""
    af, bps = batch.accumulation_factor, batch.batches_per_step
    outer, inner = (bps, af) if af >= 2 else (1, bps)
    exposed = hidden = exposed_cycles = hidden_cycles = copy_cycles = 0
    most_hidden = 0
    for stream in io.streams:
        if not io.on_io_tiles(stream):
            continue
        count = stream.transfers_per_step
        copy_cycles += count * _seconds_to_cycles(stream.num_bytes / spec.exchange_bytes_per_s,
                                                  spec)
        if not io.overlapped(stream):
            continue
        loops = outer if stream.strategy is ExchangeStrategy.OverlapInnerLoop else 1
        shown = min(count, 2 * loops)
        cost = _host_transfer_cycles(stream.num_bytes, spec)
        exposed += shown
        hidden += count - shown
        exposed_cycles += shown * cost
        hidden_cycles += (count - shown) * cost
        most_hidden = max(most_hidden, count - shown)
    # Streams not overlapped are in host_input_cycles / host_anchor_cycles already.
    return OverlapIO(
        outer_iterations=outer,
        inner_iterations=inner,
        exposed_transfers=exposed,
        hidden_transfers=hidden,
        exposed_cycles=exposed_cycles,
        hidden_cycles=hidden_cycles,
        excess_cycles=max(0, hidden_cycles - most_hidden * iteration_cycles),
        io_copy_cycles=copy_cycles,
    )
