"""Multi-process set-up for a wrapper's backend session.

Holds ``_init_distributed``: with ``Options.Distributed`` naming several processes, it makes
sure ``torch.distributed`` can meet its peers before the backend session is built.
"""

from __future__ import annotations

import atexit

from ..errors import Error
from ..options.options import Options


def _init_distributed(options: Options) -> None:
    """Several processes: make sure torch.distributed can meet its peers.

    The backend joins the env:// rendezvous (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, as
    torchrun sets them). When the process id came from elsewhere (configureProcessId, Open
    MPI's variables) RANK / WORLD_SIZE may be missing: then the process group is created here
    with this process's id and count, and the backend uses it."""
    process_id, processes = options.Distributed.process_id_and_count
    if processes <= 1:
        return
    import datetime
    import os

    import torch.distributed as dist

    if dist.is_initialized():
        return
    if os.environ.get("RANK") and os.environ.get("WORLD_SIZE"):
        if (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) != (process_id, processes):
            raise Error(f"Options.Distributed: process {process_id} of {processes}, but the "
                        f"environment says RANK={os.environ['RANK']} of WORLD_SIZE="
                        f"{os.environ['WORLD_SIZE']}; make them agree.")
        return  # the backend's env:// rendezvous reads them
    missing = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(n)]
    if missing:
        raise Error(f"Options.Distributed: {processes} processes need a rendezvous address; set "
                    f"{' and '.join(missing)} (the same on every process), or launch with "
                    f"torchrun.")
    try:
        timeout = float(os.environ.get("POPART_DISTRIBUTED_TIMEOUT") or 120.0)
    except ValueError:
        timeout = 120.0
    try:
        dist.init_process_group("gloo", init_method="env://", rank=process_id,
                                world_size=processes,
                                timeout=datetime.timedelta(seconds=timeout))
    except Exception as exc:  # torch raises RuntimeError subclasses on timeouts
        raise Error(f"Options.Distributed: process {process_id} of {processes} could not meet "
                    f"its peers at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
                    f"within {timeout:g} s (POPART_DISTRIBUTED_TIMEOUT): {exc}") from exc
    # A gloo group alive at interpreter exit can abort the process; close the one made here.
    atexit.register(lambda: dist.destroy_process_group() if dist.is_initialized() else None)

