"""Sessions and wrappers shared by threads (hardening): every method that touches the device
holds the object's lock, so N threads × M runs give the weights of N·M sequential runs."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
import torch

import popart_backend as popart
import poptorch_lite as poptorch

THREADS, RUNS = 4, 5


@pytest.fixture(autouse=True)
def _switch_often():
    """Threads switch every microsecond, so unlocked code would interleave mid-run."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def _threads(target, count: int = THREADS) -> None:
    errors = []

    def guarded(index):
        try:
            target(index)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _session():
    builder = popart.Builder()
    rng = np.random.default_rng(1)
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 4]), "x")
    w1 = builder.addInitializedInputTensor(rng.standard_normal((4, 8), np.float32), "w1")
    w2 = builder.addInitializedInputTensor(rng.standard_normal((8, 2), np.float32), "w2")
    h = builder.aiOnnx.relu([builder.aiOnnx.matmul([x, w1])])
    loss = builder.aiGraphcore.l1loss([builder.aiOnnx.matmul([h, w2])], 0.1)
    session = popart.TrainingSession(
        fnModel=builder.getModelProto(),
        dataFlow=popart.DataFlow(2, {loss: popart.AnchorReturnType("All")}),
        loss=loss,
        optimizer=popart.SGD({"defaultLearningRate": (0.05, False),
                              "defaultMomentum": (0.9, False)}),
        deviceInfo=popart.DeviceManager().createIpuModelDevice({}))
    session.prepareDevice()
    session.weightsFromHost()
    return session, x


_DATA = np.random.default_rng(2).standard_normal((2, 2, 4)).astype(np.float32)


def _step(session, x) -> None:
    session.run(popart.PyStepIO({x: _DATA}, session.initAnchorArrays()))


def _weights(session) -> dict[str, np.ndarray]:
    arrays = {i: np.empty(session.getInfo(i).shape(), np.float32) for i in ("w1", "w2")}
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(arrays))
    return arrays


def test_session_runs_from_threads_equal_sequential_runs():
    shared, x = _session()
    reads = []

    def work(index):
        for _ in range(RUNS):
            _step(shared, x)
            if index == 0:
                reads.append(_weights(shared))  # weight reads interleaved with runs

    _threads(work)
    sequential, x2 = _session()
    for _ in range(THREADS * RUNS):
        _step(sequential, x2)
    got, expected = _weights(shared), _weights(sequential)
    for key in expected:
        assert got[key].tobytes() == expected[key].tobytes(), key
    assert len(reads) == RUNS and all(np.isfinite(r["w1"]).all() for r in reads)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.inner = torch.nn.Linear(4, 16)
        self.outer = torch.nn.Linear(16, 2)

    def forward(self, x):
        return self.outer(torch.relu(self.inner(x))).abs().mean()


def _wrapper():
    model = _Net()
    wrapper = poptorch.trainingModel(
        model, poptorch.Options().deviceIterations(2),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    return model, wrapper


def test_wrapper_calls_from_threads_equal_sequential_calls():
    data = torch.from_numpy(_DATA.reshape(4, 4))
    model, wrapper = _wrapper()
    wrapper(data)  # compile once in this thread

    def work(_index):
        for _ in range(RUNS):
            wrapper(data)

    _threads(work)
    wrapper.copyWeightsToHost()
    ref_model, reference = _wrapper()
    for _ in range(THREADS * RUNS + 1):
        reference(data)
    reference.copyWeightsToHost()
    for (name, got), (_, expected) in zip(model.state_dict().items(),
                                          ref_model.state_dict().items()):
        assert torch.equal(got, expected), name
    assert wrapper._steps_done == reference._steps_done
