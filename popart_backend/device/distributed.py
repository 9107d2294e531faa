"""How the replicas of a simulated device reach each other (DESIGN 6).

A device holds its local replicas (``replicatedGraphCount``). With global replication
(``enableDistributedReplicatedGraphs``) each process is one instance holding the global
replicas ``globalReplicaOffset .. globalReplicaOffset + local - 1`` of
``globalReplicationFactor``; instances meet over ``torch.distributed`` with the gloo backend
and the standard env:// rendezvous (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), which is what
``torchrun --nproc-per-node N script.py`` sets, and what a user sets by hand on several hosts.

A collective (ops/collectives.py) asks ``gather()`` for the inputs of every global replica:
locally that is the local values; across processes every instance all-gathers its local
values, so each process sums the same tensors in the same replica order and the result equals
the single-process run with all replicas local, bit for bit.

A peer that never arrives or dies fails the rendezvous or the collective within
``POPART_DISTRIBUTED_TIMEOUT`` seconds (default 120) with a ``popart_exception``; nothing
waits forever.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
from typing import Sequence

import torch

from ..errors import popart_exception

__all__ = ["TIMEOUT_ENV", "DEFAULT_TIMEOUT_SECONDS", "ReplicaComm", "LocalReplicas",
           "DistributedReplicas", "check_global_replication", "distributed_timeout",
           "replica_comm"]

TIMEOUT_ENV = "POPART_DISTRIBUTED_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 120.0
_RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
_log = logging.getLogger("popart:devicex")


def distributed_timeout() -> float:
    """Seconds a rendezvous or collective may wait for peers (``POPART_DISTRIBUTED_TIMEOUT``)."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None or text == "":
        return DEFAULT_TIMEOUT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise popart_exception(
            f"{TIMEOUT_ENV} = '{text}' is not a positive number of seconds; set it to e.g. 60 "
            f"or unset it for the default of {DEFAULT_TIMEOUT_SECONDS:g} s."
        )
    return seconds


def check_global_replication(options) -> None:
    """The checks of the global replication options (only when they are enabled)."""
    if not options.enableDistributedReplicatedGraphs:
        return
    grf = options.globalReplicationFactor
    offset = options.globalReplicaOffset
    local = options.replicatedGraphCount if options.enableReplicatedGraphs else 1
    if grf < 1:
        raise popart_exception(
            f"Invalid globalReplicationFactor ({grf}): it must be 1 or greater (the number of "
            f"replicas over all instances)."
        )
    if offset < 0:
        raise popart_exception(
            f"Invalid globalReplicaOffset ({offset}): it must be 0 or greater (this instance's "
            f"first global replica: 0, replicatedGraphCount, 2·replicatedGraphCount, ...)."
        )
    if offset > grf:
        raise popart_exception(
            f"globalReplicaOffset ({offset}) must not be greater than globalReplicationFactor "
            f"({grf})."
        )
    if options.enableReplicatedGraphs and options.replicatedGraphCount == 1:
        raise popart_exception(
            "enableReplicatedGraphs is true with replicatedGraphCount = 1 while "
            "enableDistributedReplicatedGraphs is true: set replicatedGraphCount to this "
            "instance's number of local replicas (> 1), or disable enableReplicatedGraphs for "
            "one local replica."
        )
    if local > grf:
        raise popart_exception(
            f"The local replication factor (replicatedGraphCount = {local}) is greater than "
            f"the global replication factor (globalReplicationFactor = {grf}); the global "
            f"factor counts the replicas of all instances, this one's included."
        )
    if offset + local > grf:
        raise popart_exception(
            f"globalReplicaOffset ({offset}) + replicatedGraphCount ({local}) exceeds "
            f"globalReplicationFactor ({grf}): this instance's replicas would not exist."
        )


class ReplicaComm:
    """The replicas a collective spans: ``local`` here, starting at global replica
    ``offset``, ``total`` over all instances."""

    local: int = 1
    total: int = 1
    offset: int = 0

    def gather(self, values: Sequence[torch.Tensor], what: str) -> list[torch.Tensor]:
        """Every global replica's value (index = global replica) from the local ones."""
        raise NotImplementedError


class LocalReplicas(ReplicaComm):
    """All replicas are in this process."""

    def __init__(self, local: int):
        self.local = self.total = local
        self.offset = 0

    def gather(self, values, what):
        return list(values)


def _close_process_group(dist) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class DistributedReplicas(ReplicaComm):
    """Replicas over processes: a gloo process group from the env:// rendezvous."""

    def __init__(self, local: int, total: int, offset: int, timeout_seconds: float | None = None):
        import torch.distributed as dist

        self.local, self.total, self.offset = local, total, offset
        self.timeout_seconds = (distributed_timeout() if timeout_seconds is None
                                else timeout_seconds)
        self._dist = dist
        if not dist.is_available():
            raise popart_exception(
                "Global replication needs torch.distributed, which this torch build lacks."
            )
        if not dist.is_initialized():
            missing = [name for name in _RENDEZVOUS_ENV if not os.environ.get(name)]
            if missing:
                raise popart_exception(
                    f"enableDistributedReplicatedGraphs: the torch.distributed rendezvous needs "
                    f"the environment variables {', '.join(_RENDEZVOUS_ENV)}; missing: "
                    f"{', '.join(missing)}. Launch with `torchrun --nproc-per-node N script.py` "
                    f"or set them on every process."
                )
            self._guard("the rendezvous", lambda: dist.init_process_group(
                "gloo", init_method="env://",
                timeout=datetime.timedelta(seconds=self.timeout_seconds)))
            # A gloo group still alive at interpreter exit can abort the process ("terminate
            # called without an active exception"); the group this session made is closed then.
            atexit.register(_close_process_group, dist)
        elif dist.get_backend() != "gloo":
            raise popart_exception(
                f"Global replication runs its collectives over the gloo backend, but "
                f"torch.distributed was initialised with '{dist.get_backend()}'. Initialise it "
                f"with backend='gloo' (or let the session do it)."
            )
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world * local != total:
            raise popart_exception(
                f"Global replication: {self.world} processes × replicatedGraphCount {local} = "
                f"{self.world * local} replicas, but globalReplicationFactor = {total}. Start "
                f"globalReplicationFactor / replicatedGraphCount processes."
            )
        offsets: list = [None] * self.world
        self._guard("exchanging replica offsets",
                    lambda: dist.all_gather_object(offsets, offset))
        expected = sorted(range(0, total, local))
        if sorted(offsets) != expected:
            raise popart_exception(
                f"Global replication: the processes' globalReplicaOffset values are "
                f"{offsets} (by rank); with replicatedGraphCount {local} they must be "
                f"{expected}, one per process. Set globalReplicaOffset = rank × "
                f"replicatedGraphCount."
            )
        # Ranks in global replica order.
        self._rank_order = sorted(range(self.world), key=lambda r: offsets[r])
        _log.info("global replication: rank %d of %d holds replicas %d..%d of %d", self.rank,
                  self.world, offset, offset + local - 1, total)

    def gather(self, values, what):
        stacked = torch.stack(list(values))
        parts = [torch.empty_like(stacked) for _ in range(self.world)]
        self._guard(what, lambda: self._dist.all_gather(parts, stacked))
        return [value for rank in self._rank_order for value in parts[rank].unbind(0)]

    def _guard(self, what: str, call) -> None:
        try:
            call()
        except popart_exception:
            raise
        except Exception as exc:  # torch.distributed raises RuntimeError subclasses
            where = (f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}")
            raise popart_exception(
                f"Global replication: {what} failed on rank {os.environ.get('RANK', '?')} of "
                f"{os.environ.get('WORLD_SIZE', '?')} (rendezvous {where}, timeout "
                f"{self.timeout_seconds:g} s from {TIMEOUT_ENV}): a peer process did not "
                f"arrive or stopped. Check that all WORLD_SIZE processes are started with the "
                f"same MASTER_ADDR/MASTER_PORT and are running. ({type(exc).__name__}: {exc})"
            ) from exc


def replica_comm(options, local: int) -> ReplicaComm:
    """The ReplicaComm of a session's options with ``local`` replicas per device."""
    if options is not None and options.enableDistributedReplicatedGraphs:
        return DistributedReplicas(local, options.globalReplicationFactor,
                                   options.globalReplicaOffset)
    return LocalReplicas(local)
