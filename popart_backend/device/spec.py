"""Hardware facts of each simulated IPU version (published figures of each IPU generation).

``IpuSpec`` is the only place these numbers live; the memory and cost models read them from the
``DeviceInfo.spec`` of the session's device. Values marked "unsure" are the spec's best public
figures, not measurements; "estimate" values are our own derivations, explained where they stand.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import popart_exception

__all__ = ["IpuSpec"]

KIB = 1024
GB = 10**9

# The IPU architectures a device can be created for ("cpu" below is the CPU target, not an IPU).
IPU_VERSIONS = ("ipu1", "ipu2", "ipu21")


@dataclass(frozen=True)
class IpuSpec:
    """One IPU of a given version. Per-IPU rates scale with ``num_tiles`` (see ``for_version``)."""

    name: str  # "ipu1", "ipu2", "ipu21" or "cpu"
    num_tiles: int
    tile_bytes: int  # SRAM per tile
    clock_hz: float
    threads_per_tile: int  # hardware worker contexts per tile (DeviceInfo.numWorkerContexts)
    peak_flops_f32: float  # FLOP/s of the whole IPU (all num_tiles tiles)
    peak_flops_f16: float  # FLOP/s with f16 inputs (AMP), whole IPU
    exchange_bytes_per_s: float  # on-chip all-to-all exchange, whole IPU
    ipu_link_bytes_per_s: float  # all IPU-Links of one chip together
    host_link_bytes_per_s: float  # host <-> IPU, per direction
    sync_latency_cycles: int  # one sync among the tiles of one IPU
    ipu_sync_latency_cycles: int  # one sync across IPUs (IPU-Link barrier)
    streaming_memory_bytes: int  # off-chip streaming memory available to one IPU
    full_chip_tiles: int  # tile count of the physical chip, before any tilesPerIPU override
    # --- facts read by the memory model (device/memory.py) and cost model (device/cost.py) ---
    sram_bytes_per_s: float  # aggregate tile-SRAM bandwidth, whole IPU
    # FLOP/s of the vector units (ops that do not use the AMP units), whole IPU.
    vector_flops_f32: float
    vector_flops_f16: float
    # fraction of the AMP peak the inner loop sustains on a tile's well-shaped piece of a
    # matmul/conv (device/planner.py adds shape, tile-split, exchange and setup losses)
    amp_efficiency: float
    amp_setup_cycles: int  # per AMP vertex pass on a tile: launch and AMP pipeline fill
    # per worker vertex of a vector-unit op on a tile: launch and loop setup (device/op_cost.py)
    vertex_launch_cycles: int
    tile_grain_bytes: int  # smallest piece of a tensor the linear tile mapping puts on one tile
    tile_code_base_bytes: int  # per tile: runtime, control program and exchange code
    vertex_bytes_per_op_tile: int  # per tile, per op with work there: vertex state and code

    @property
    def memory_bytes(self) -> int:
        """SRAM of the whole IPU (tiles x bytes per tile)."""
        return self.num_tiles * self.tile_bytes

    def peak_flops(self, dtype_short: str) -> float:
        """Peak FLOP/s for ``"f32"`` or ``"f16"`` arithmetic (other dtypes run at the f32 rate)."""
        return self.peak_flops_f16 if dtype_short == "f16" else self.peak_flops_f32

    def vector_flops(self, dtype_short: str) -> float:
        """FLOP/s of the vector units, for ops that do not run on the AMP units."""
        return self.vector_flops_f16 if dtype_short == "f16" else self.vector_flops_f32

    @classmethod
    def versions(cls) -> tuple[str, ...]:
        return tuple(_SPECS)

    @classmethod
    def for_version(cls, name: str, tiles_per_ipu: int | None = None) -> IpuSpec:
        """The spec of IPU version ``name``, optionally with ``tiles_per_ipu`` tiles.

        Fewer tiles keep the per-tile facts (bytes, clock, per-tile FLOP/s and exchange) and
        scale the whole-IPU rates, as a Poplar IPUModel with few tiles does. Raises
        popart_exception for an unknown version or a tile count outside 1..full chip.
        """
        if name not in _SPECS:
            raise popart_exception(
                f"Unknown IPU version '{name}'. Known versions: {', '.join(_SPECS)}."
            )
        full = _SPECS[name]
        if tiles_per_ipu is None or tiles_per_ipu == full.num_tiles:
            return full
        if not 1 <= tiles_per_ipu <= full.full_chip_tiles:
            raise popart_exception(
                f"tilesPerIPU={tiles_per_ipu} is out of range for {name}: a {name} has "
                f"{full.full_chip_tiles} tiles, so use 1..{full.full_chip_tiles}."
            )
        share = tiles_per_ipu / full.num_tiles
        return dataclasses.replace(
            full,
            num_tiles=tiles_per_ipu,
            peak_flops_f32=full.peak_flops_f32 * share,
            peak_flops_f16=full.peak_flops_f16 * share,
            exchange_bytes_per_s=full.exchange_bytes_per_s * share,
            sram_bytes_per_s=full.sram_bytes_per_s * share,
            vector_flops_f32=full.vector_flops_f32 * share,
            vector_flops_f16=full.vector_flops_f16 * share,
        )


# Sync latency: the spec gives no figure. A tile-level barrier on one chip is modelled as 150
# cycles and an IPU-Link barrier as 1500 cycles (estimates of the order reported for the IPU's
# BSP syncs); both are only used for timing estimates.
_ON_CHIP_SYNC_CYCLES = 150
_IPU_SYNC_CYCLES = 1500

# Model facts no datasheet gives; all estimates, shared by every IPU version (device/memory.py,
# device/planner.py and device/cost.py explain how they are used):
# - vector units: 64-bit SIMD per tile, so 2 f32 or 4 f16 lanes; a multiply-add counts 2 FLOPs,
#   giving 4 (f32) or 8 (f16) FLOPs per tile per cycle (``_vector_flops``).
# - AMP efficiency: the fraction of the AMP peak one tile's inner loop sustains on a piece whose
#   dimensions fill the AMP groups; the planner adds the losses of shape, tile split, exchange
#   and setup on top. Calibrated with the setup cycles on the two anchors of
#   docs/device_model.md (BERT-Large pretraining on a Bow Pod16, ResNet-50 training on a Mk2
#   IPU-POD16): 0.75 put them at 1.04x / 1.21x of the published throughput, 0.65 at
#   0.96x / 1.13x. Refitted when the vector ops got their vertex launches and exchange (which
#   gave 0.96x / 1.13x at 0.65): 0.63 gives 0.94x / 1.11x. A 2048^3 float16 matmul then runs
#   at about 40 % of the AMP peak.
# - AMP setup: cycles per vertex pass on a tile (launch, worker start, AMP pipeline fill); an
#   estimate of the order of a vertex launch, held at 100 while the AMP efficiency was
#   calibrated.
# - vertex launch: cycles of a tile's shared pipeline one worker vertex of an op on the vector
#   units takes to start (the supervisor handing it its piece, the worker loading its state and
#   setting up its loop) and to finish, on top of its arithmetic. A tile runs an op as up to
#   6 worker vertices (one per worker thread), so an op pays this up to 6 times per superstep
#   however small its piece. An estimate, of the order of a few tens of cycles per worker
#   vertex reported for Poplar codelets; not fitted.
# - tile grain: 64 bytes keeps each tile's piece aligned for the 64-bit loads and exchange.
# - code: a fixed 8 KiB per tile for the runtime, control program and exchange code, plus 128
#   bytes per op on each tile where it has work (vertex state, its share of the codelets and the
#   exchange descriptors). Estimates, checked (not fitted) on the BERT-Large anchor: one IPU
#   at micro-batch 8 with its optimizer state is refused by a wide margin either way.
_MODEL_FACTS = dict(
    amp_efficiency=0.63,
    amp_setup_cycles=100,
    vertex_launch_cycles=30,
    tile_grain_bytes=64,
    tile_code_base_bytes=8 * KIB,
    vertex_bytes_per_op_tile=128,
)


def _vector_flops(tiles: int, clock_hz: float) -> dict[str, float]:
    return dict(vector_flops_f32=tiles * clock_hz * 4, vector_flops_f16=tiles * clock_hz * 8)

_SPECS: dict[str, IpuSpec] = {
    # Mk1, Colossus GC2.
    "ipu1": IpuSpec(
        name="ipu1",
        num_tiles=1216,
        tile_bytes=256 * KIB,
        clock_hz=1.6e9,  # unsure: from the C2 card figures
        threads_per_tile=6,
        peak_flops_f32=31.1e12,
        peak_flops_f16=124.5e12,
        # unsure: no published figure; estimate 4 bytes per tile per cycle, as on Mk2
        exchange_bytes_per_s=1216 * 4 * 1.6e9,
        ipu_link_bytes_per_s=2.5e12 / 8,  # unsure: C2 card-to-card 2.5 Tbps
        host_link_bytes_per_s=32 * GB,  # unsure: PCIe Gen4 x16 per direction
        sync_latency_cycles=_ON_CHIP_SYNC_CYCLES,
        ipu_sync_latency_cycles=_IPU_SYNC_CYCLES,
        streaming_memory_bytes=64 * 2**30,  # unsure: remote buffers lived in host memory
        full_chip_tiles=1216,
        sram_bytes_per_s=45e12,  # Jia et al.: ~45 TB/s aggregate
        **_vector_flops(1216, 1.6e9),
        **_MODEL_FACTS,
    ),
    # Mk2, Colossus GC200 (IPU-M2000).
    "ipu2": IpuSpec(
        name="ipu2",
        num_tiles=1472,
        tile_bytes=624 * KIB,
        clock_hz=1.33e9,  # unsure
        threads_per_tile=6,
        peak_flops_f32=62.5e12,  # unsure
        peak_flops_f16=250e12,
        exchange_bytes_per_s=8e12,
        ipu_link_bytes_per_s=320 * GB,  # 10 links x 32 GB/s
        host_link_bytes_per_s=32 * GB,  # PCIe Gen4 x16: 64 GB/s bidirectional
        sync_latency_cycles=_ON_CHIP_SYNC_CYCLES,
        ipu_sync_latency_cycles=_IPU_SYNC_CYCLES,
        streaming_memory_bytes=448 * GB // 4,  # unsure: up to 448 GB per 4-IPU M2000
        full_chip_tiles=1472,
        sram_bytes_per_s=47.5e12,  # GC200 spec
        **_vector_flops(1472, 1.33e9),
        **_MODEL_FACTS,
    ),
    # Bow IPU (Bow-2000): the GC200 die at a higher clock; per-IPU rates scale with the clock.
    "ipu21": IpuSpec(
        name="ipu21",
        num_tiles=1472,
        tile_bytes=624 * KIB,
        clock_hz=1.85e9,
        threads_per_tile=6,
        peak_flops_f32=62.5e12 * 1.85 / 1.33,  # unsure: Mk2 figure scaled by the clock
        peak_flops_f16=250e12 * 1.85 / 1.33,  # unsure: Mk2 figure scaled by the clock
        exchange_bytes_per_s=8e12 * 1.85 / 1.33,  # unsure: Mk2 figure scaled by the clock
        ipu_link_bytes_per_s=320 * GB,
        host_link_bytes_per_s=32 * GB,
        sync_latency_cycles=_ON_CHIP_SYNC_CYCLES,
        ipu_sync_latency_cycles=_IPU_SYNC_CYCLES,
        streaming_memory_bytes=256 * GB // 4,  # Bow-2000: 256 GB per 4 IPUs
        full_chip_tiles=1472,
        sram_bytes_per_s=47.5e12 * 1.85 / 1.33,  # unsure: Mk2 figure scaled by the clock
        **_vector_flops(1472, 1.85e9),
        **_MODEL_FACTS,
    ),
    # Poplar's CPU target: one tile and no memory limit. Rates are the ipu2's so that cycle
    # estimates read as "on one ipu2"; the huge tile means the memory check never fails.
    "cpu": IpuSpec(
        name="cpu",
        num_tiles=1,
        tile_bytes=2**40,
        clock_hz=1.33e9,
        threads_per_tile=1,
        peak_flops_f32=62.5e12,
        peak_flops_f16=250e12,
        exchange_bytes_per_s=8e12,
        ipu_link_bytes_per_s=320 * GB,
        host_link_bytes_per_s=32 * GB,
        sync_latency_cycles=_ON_CHIP_SYNC_CYCLES,
        ipu_sync_latency_cycles=_IPU_SYNC_CYCLES,
        streaming_memory_bytes=0,
        full_chip_tiles=1,
        sram_bytes_per_s=47.5e12,
        **_vector_flops(1472, 1.33e9),
        **_MODEL_FACTS,
    ),
}
