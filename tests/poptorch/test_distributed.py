"""Several processes in the frontend (spec §2.5 Distributed, §2.6, P34, P49; backend F74):
``Options.Distributed`` from torchrun's / Open MPI's variables, the backend's global replication
options, the DataLoader's per-process share, and a real 2-process run on loopback.

The 2-process run starts this file as a worker (``python -m tests.poptorch.test_distributed
OUT``) with torchrun-style variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK).
Each process holds 2 local replicas and reads its half of the data; the result must equal one
process with 4 local replicas fed the same micro-batches, and eager PyTorch on the combined
batch. Every subprocess wait is bounded.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import poptorch_lite as poptorch
from poptorch_lite.testing import run_reference

ROOT = Path(__file__).resolve().parents[2]
ENV_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
             "MASTER_ADDR", "MASTER_PORT")
IN, OUT = 4, 3
LOCAL, PROCESSES, ACCUMULATION, MICRO = 2, 2, 2, 2
SAMPLES = 32  # 2 calls per process: combined batch = MICRO x LOCAL x ACCUMULATION = 8


@pytest.fixture
def clean_env(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_process_id_from_the_environment_P34(clean_env):
    opts = poptorch.Options()
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (0, 1)
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "4")
    clean_env.setenv("LOCAL_RANK", "1")
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (1, 4)
    assert opts.Distributed.localProcessId == 1
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "2")  # Open MPI's variables come first (PopTorch)
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "3")
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (2, 3)
    clean_env.setenv("MY_ID", "0")
    clean_env.setenv("MY_COUNT", "2")
    named = poptorch.Options()
    named.Distributed.setEnvVarNames("MY_COUNT", "MY_ID")
    assert (named.Distributed.processId, named.Distributed.numProcesses) == (0, 2)
    assert poptorch.Options().Distributed.disable().numProcesses == 1
    configured = poptorch.Options()
    configured.Distributed.configureProcessId(1, 2)
    assert (configured.Distributed.processId, configured.Distributed.numProcesses) == (1, 2)
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        poptorch.Options().Distributed.configureProcessId(2, 2)
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "5")
    with pytest.raises(ValueError, match="outside"):
        _ = opts.Distributed.processId


def test_global_replication_options_for_the_backend_P34(clean_env):
    opts = poptorch.Options().replicationFactor(2)
    opts.Distributed.configureProcessId(1, 3)
    backend = opts.to_backend(training=True)
    assert backend.enableReplicatedGraphs and backend.replicatedGraphCount == 2
    assert backend.enableDistributedReplicatedGraphs
    assert (backend.globalReplicationFactor, backend.globalReplicaOffset) == (6, 2)
    single = poptorch.Options().to_backend(training=True)
    assert not single.enableDistributedReplicatedGraphs


def test_data_loader_gives_each_process_its_share_P49(clean_env):
    data = torch.utils.data.TensorDataset(torch.arange(50))
    shares = []
    for process in range(2):
        opts = poptorch.Options().deviceIterations(2)
        opts.Distributed.configureProcessId(process, 2)
        loader = poptorch.DataLoader(opts, data, batch_size=3)  # combined batch 6
        shares.append([int(v) for batch in loader for v in batch[0]])
        assert len(loader) == 4
    # Contiguous ranges of whole combined batches: 24 samples each, 2 left out.
    assert shares == [list(range(24)), list(range(24, 48))]
    opts = poptorch.Options()
    opts.Distributed.configureProcessId(0, 2)
    with pytest.raises(poptorch.Error, match="needs Options.randomSeed"):
        poptorch.DataLoader(opts, data, batch_size=2, shuffle=True)
    epochs = {0: [], 1: []}
    for process in range(2):
        opts = poptorch.Options().randomSeed(5)
        opts.Distributed.configureProcessId(process, 2)
        loader = poptorch.DataLoader(opts, data, batch_size=4, shuffle=True)
        for _ in range(2):
            epochs[process].append([int(v) for batch in loader for v in batch[0]])
    for epoch in range(2):
        first, second = epochs[0][epoch], epochs[1][epoch]
        assert len(first) == len(second) == 24 and not set(first) & set(second)
    assert epochs[0][0] != epochs[0][1]  # a new global permutation each epoch
    opts = poptorch.Options().randomSeed(0)
    opts.Distributed.configureProcessId(0, 2)
    with pytest.raises(poptorch.Error, match="auto_distributed_partitioning=False"):
        poptorch.DataLoader(opts, _Stream(), batch_size=2)
    whole = poptorch.DataLoader(opts, data, batch_size=5, auto_distributed_partitioning=False)
    assert len(whole) == 10


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))


def test_processes_need_a_rendezvous_address_P34(clean_env):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("torch.distributed already initialised in this process")
    opts = poptorch.Options().replicationFactor(2).showCompilationProgressBar(False)
    opts.Distributed.configureProcessId(0, 2)
    wrapper = poptorch.inferenceModel(_Net().eval(), opts)
    with pytest.raises(poptorch.Error, match="set MASTER_ADDR and MASTER_PORT"):
        x, y = _dataset().tensors
        wrapper(x[:4], y[:4])


# --- two processes on loopback ---------------------------------------------------------------


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(IN, 6)
        self.fc2 = torch.nn.Linear(6, OUT)

    def forward(self, x, y):
        logits = self.fc2(torch.tanh(self.fc1(x)))
        return logits, torch.nn.functional.cross_entropy(logits, y)


def _dataset():
    g = torch.Generator().manual_seed(3)
    return torch.utils.data.TensorDataset(torch.randn(SAMPLES, IN, generator=g),
                                          torch.randint(0, OUT, (SAMPLES,), generator=g))


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _options(replicas: int):
    opts = poptorch.Options().replicationFactor(replicas).showCompilationProgressBar(False)
    opts.Training.gradientAccumulation(ACCUMULATION)
    return opts


def worker(out: str) -> None:
    """One process of the job: Distributed comes from RANK / WORLD_SIZE (torchrun's)."""
    opts = _options(LOCAL)
    model = _Net()
    wrapper = poptorch.trainingModel(model, opts, _sgd(model.parameters()))
    loader = poptorch.DataLoader(opts, _dataset(), batch_size=MICRO)
    batches, losses = [], []
    for x, y in loader:
        batches.append((x, y))
        losses.append(wrapper(x, y)[1])
    torch.save({"state": model.state_dict(), "losses": losses, "batches": batches,
                "summary": wrapper.getPipelineSummary()}, out)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(out: Path, rank: int, world: int, port: int, timeout_s: float):
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
               WORLD_SIZE=str(world), LOCAL_RANK=str(rank), PYTHONPATH=str(ROOT),
               OMP_NUM_THREADS="1", POPART_DISTRIBUTED_TIMEOUT=str(timeout_s))
    return subprocess.Popen([sys.executable, "-m", "tests.poptorch.test_distributed", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _finish(proc, limit_s: float):
    try:
        _, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"worker did not finish within {limit_s} s:\n{err[-2000:]}")
    return proc.returncode, err


def test_two_processes_equal_local_replicas_P34_P49(tmp_path):
    port = _free_port()
    outs = [tmp_path / f"rank{r}.pt" for r in range(PROCESSES)]
    procs = [_start(outs[r], r, PROCESSES, port, timeout_s=60) for r in range(PROCESSES)]
    for proc in procs:
        code, err = _finish(proc, 150)
        assert code == 0, err[-3000:]
    results = [torch.load(out, weights_only=False) for out in outs]
    assert "processes: 2 (this one: 1), global replicas: 4" in results[1]["summary"]
    # Each process read its own half of the data set.
    seen = [torch.cat([x for x, _ in r["batches"]]) for r in results]
    data = _dataset()
    torch.testing.assert_close(torch.cat(seen), data.tensors[0])
    # The reference: one process, 4 local replicas, replica 2p + r fed process p's replica r.
    calls = []
    for c in range(len(results[0]["batches"])):
        xs, ys = zip(*(r["batches"][c] for r in results))
        x = torch.cat([t.reshape(ACCUMULATION, LOCAL, MICRO, IN) for t in xs], dim=1)
        y = torch.cat([t.reshape(ACCUMULATION, LOCAL, MICRO) for t in ys], dim=1)
        calls.append((x.reshape(-1, IN), y.reshape(-1)))
    model = _Net()
    reference = copy.deepcopy(model)
    wrapper = poptorch.trainingModel(model, _options(LOCAL * PROCESSES), _sgd(model.parameters()))
    losses = [wrapper(*inputs)[1] for inputs in calls]
    state = model.state_dict()
    for r, result in enumerate(results):
        for name, value in state.items():
            torch.testing.assert_close(result["state"][name], value, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(result["losses"][-1], losses[-1][LOCAL * r:LOCAL * (r + 1)])
    # And eager PyTorch on the combined batch (all replicas' micro-batches averaged).
    eager = poptorch.Options()
    eager.Training.gradientAccumulation(ACCUMULATION * LOCAL * PROCESSES)
    run_reference(reference, _sgd(reference.parameters()), calls, eager)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(results[0]["state"][name], value, rtol=1e-5, atol=1e-6)


def test_missing_peer_fails_within_the_timeout_P34(tmp_path):
    import time

    start = time.monotonic()
    proc = _start(tmp_path / "rank0.pt", 0, 2, _free_port(), timeout_s=3)
    code, err = _finish(proc, 90)
    assert code != 0
    assert "rendezvous failed" in err and "a peer process did not arrive" in err
    assert time.monotonic() - start < 80


if __name__ == "__main__":
    worker(sys.argv[1])
