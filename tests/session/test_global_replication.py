"""Global replication across processes (spec §5.3; F74, DESIGN decision 6): the options'
validation messages, 2 processes × 2 local replicas over torch.distributed (gloo, env://
rendezvous on loopback) equal 4 local replicas, and a missing peer fails within the
configured timeout instead of hanging."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.device.distributed import TIMEOUT_ENV, distributed_timeout
from tests.session.global_replication_worker import BPS, MB, global_inputs
from tests.session.replication_models import (
    assert_weights_close,
    options,
    params,
    session,
    train,
)

REPO = Path(__file__).resolve().parents[2]
WORKER = "tests.session.global_replication_worker"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(out: Path, rank: int, world: int, port: int, local: int, grf: int, af: int,
           timeout_s: float = 30):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
               WORLD_SIZE=str(world), LOCAL_RANK=str(rank), PYTHONPATH=str(REPO),
               POPART_PROGRESS="0", OMP_NUM_THREADS="1")
    env[TIMEOUT_ENV] = str(timeout_s)
    return subprocess.Popen(
        [sys.executable, "-m", WORKER, str(out), str(local), str(grf), str(af)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, limit_s: float):
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"worker did not finish within {limit_s} s:\n{err[-2000:]}")
    return proc.returncode, err


# --- validation (spec §5.3) -------------------------------------------------------------------


def _distributed(grf=4, offset=0, local=2, enable_local=True) -> popart.SessionOptions:
    opts = options(rf=local if enable_local else 1)
    opts.enableReplicatedGraphs = enable_local
    opts.replicatedGraphCount = local
    opts.enableDistributedReplicatedGraphs = True
    opts.globalReplicationFactor = grf
    opts.globalReplicaOffset = offset
    return opts


@pytest.mark.parametrize("opts,message", [
    (_distributed(grf=0), r"Invalid globalReplicationFactor \(0\)"),
    (_distributed(offset=-2), r"Invalid globalReplicaOffset \(-2\)"),
    (_distributed(offset=6), r"globalReplicaOffset \(6\) must not be greater than "
                             r"globalReplicationFactor \(4\)"),
    (_distributed(local=1), "replicatedGraphCount = 1 while enableDistributedReplicatedGraphs"),
    (_distributed(grf=2, local=4), r"local replication factor \(replicatedGraphCount = 4\) is "
                                   r"greater than the global replication factor"),
    (_distributed(offset=3), r"globalReplicaOffset \(3\) \+ replicatedGraphCount \(2\) exceeds"),
], ids=["grf<1", "offset<0", "offset>grf", "local=1", "local>global", "past-the-end"])
def test_global_replication_validation_F74(opts, message):
    with pytest.raises(popart.popart_exception, match=message):
        session(params(), MB, 1, opts, ipus=4)


def test_rendezvous_variables_are_required_F74(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("torch.distributed already initialised in this process")
    with pytest.raises(popart.popart_exception, match="missing: MASTER_ADDR"):
        session(params(), MB, 1, _distributed(grf=4, offset=0, local=2))


def test_timeout_variable_F74(monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "2.5")
    assert distributed_timeout() == 2.5
    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    with pytest.raises(popart.popart_exception, match="not a positive number of seconds"):
        distributed_timeout()


# --- running over processes -------------------------------------------------------------------


@pytest.mark.parametrize("af", [1, 2])
def test_two_processes_of_two_replicas_equal_four_local_replicas_F74(tmp_path, af):
    port = _free_port()
    outs = [tmp_path / f"rank{r}.npz" for r in range(2)]
    procs = [_start(outs[r], r, 2, port, local=2, grf=4, af=af) for r in range(2)]
    for proc in procs:
        code, err = _finish(proc, 80)
        assert code == 0, err[-3000:]
    p = params()
    x = global_inputs(4, af)
    want, anchors, _ = train(p, x, MB, BPS, options(rf=4, af=af))
    loss = next(iter(anchors))
    for r, out in enumerate(outs):
        got = dict(np.load(out))
        # Same tensors summed in the same replica order: equal to the local run.
        assert_weights_close({k: got[k] for k in p}, want, rtol=1e-6, atol=1e-7)
        # Anchors hold the local replicas only (shapes stay local, §4.2).
        local_loss = anchors[loss][..., 2 * r:2 * r + 2]
        np.testing.assert_allclose(got["loss"], local_loss, rtol=1e-6)


def test_missing_peer_fails_within_the_timeout_F74(tmp_path):
    # WORLD_SIZE = 2 but only rank 0 starts: the rendezvous must give up after the timeout.
    start = time.monotonic()
    proc = _start(tmp_path / "rank0.npz", 0, 2, _free_port(), local=2, grf=4, af=1,
                  timeout_s=3)
    code, err = _finish(proc, 60)
    elapsed = time.monotonic() - start
    assert code != 0
    assert "popart_exception" in err and "Global replication: the rendezvous failed" in err
    assert "a peer process did not arrive or stopped" in err
    assert elapsed < 45, f"took {elapsed:.1f} s"
