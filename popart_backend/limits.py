"""The resource guard: sizes a model or a setting asks for are checked against a byte limit
before anything is allocated, so an untrusted model cannot exhaust the host (docs/security.md).

The limit is ``POPART_SIM_MAX_BYTES`` (bytes, or with a K/M/G/T suffix, powers of 1024) when
set, else half of the host's physical memory. It bounds one tensor, all the initializers of a
model, one folded constant, one step's host buffers (batches per step × stream sizes) and a
Loop's trip count × its body's bytes. Subgraphs nest at most ``MAX_SUBGRAPH_DEPTH`` deep. A Loop
whose trip count or condition is only known while it runs stops with an error after
``POPART_SIM_MAX_LOOP_ITERATIONS`` iterations (default 10**7), so it cannot hang the host.

A leaf module: it imports only ``errors``.
"""

from __future__ import annotations

import math
import os
import re

from .errors import ResourceLimitError

__all__ = ["ENV_VAR", "MAX_SUBGRAPH_DEPTH", "check_bytes", "max_bytes", "max_loop_iterations"]

ENV_VAR = "POPART_SIM_MAX_BYTES"
HOST_FRACTION = 0.5
MAX_SUBGRAPH_DEPTH = 64
# Host bookkeeping of one micro-batch of a step (the simulator's per-batch plan entries), so
# that batchesPerStep alone is bounded even for a model without streams.
BATCH_BOOKKEEPING_BYTES = 256

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def host_memory_bytes() -> int:
    """Physical memory of the host, from ``os.sysconf`` (0 when the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def max_bytes() -> int:
    """The guard's limit in bytes: ``POPART_SIM_MAX_BYTES`` or half the host memory."""
    raw = os.environ.get(ENV_VAR, "").strip()
    if raw:
        match = re.fullmatch(r"(\d+)\s*([KMGT]?)i?B?", raw, flags=re.IGNORECASE)
        if match is None or int(match.group(1)) <= 0:
            raise ResourceLimitError(
                f"{ENV_VAR}={raw!r} is not a positive byte count. Give bytes, e.g. "
                f"{ENV_VAR}=4000000000 or {ENV_VAR}=4G."
            )
        return int(match.group(1)) * _SUFFIX[match.group(2).upper()]
    host = host_memory_bytes()
    # Without a known host size, 8 GiB: large enough for any test model, small enough to fail.
    return int(host * HOST_FRACTION) if host > 0 else 8 << 30


LOOP_ENV_VAR = "POPART_SIM_MAX_LOOP_ITERATIONS"
DEFAULT_MAX_LOOP_ITERATIONS = 10**7


def max_loop_iterations() -> int:
    """The most iterations one Loop may run: ``POPART_SIM_MAX_LOOP_ITERATIONS`` or 10**7."""
    raw = os.environ.get(LOOP_ENV_VAR, "").strip()
    if not raw:
        return DEFAULT_MAX_LOOP_ITERATIONS
    if not raw.isdigit() or int(raw) <= 0:
        raise ResourceLimitError(
            f"{LOOP_ENV_VAR}={raw!r} is not a positive whole number, e.g. "
            f"{LOOP_ENV_VAR}=100000000."
        )
    return int(raw)


def _fmt(num_bytes: int) -> str:
    if num_bytes < 1 << 20:
        return f"{num_bytes} bytes"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if num_bytes >= size:
            return f"{num_bytes} bytes ({num_bytes / size:.1f} {unit})"
    return f"{num_bytes} bytes"


def check_bytes(num_bytes: int, what: str) -> None:
    """Raise ResourceLimitError when ``num_bytes`` exceeds the limit; ``what`` says who asks."""
    limit = max_bytes()
    if num_bytes > limit:
        raise ResourceLimitError(
            f"{what} needs {_fmt(num_bytes)}, more than the host memory limit of {_fmt(limit)}. "
            f"If the model is trusted and the host has the memory, raise the limit with the "
            f"environment variable {ENV_VAR} (bytes)."
        )


def element_count(dims, what: str) -> int:
    """The element count of declared ``dims``; negative dims are refused."""
    dims = [int(d) for d in dims]
    if any(d < 0 for d in dims):
        raise ResourceLimitError(f"{what} declares negative dimensions {dims}.")
    return math.prod(dims)


def declared_bytes(dims, bits: int, what: str) -> int:
    """Bytes of a tensor of ``dims`` with ``bits`` per element (packed types round up)."""
    return (element_count(dims, what) * bits + 7) // 8


def check_step(micro_batches: int, bytes_per_batch: int, what: str) -> None:
    """A step of ``micro_batches`` batches, each moving ``bytes_per_batch`` host bytes."""
    check_bytes(micro_batches * (bytes_per_batch + BATCH_BOOKKEEPING_BYTES), what)
