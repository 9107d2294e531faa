"""Analysis without allocation (F45, P33): on an offline device ``prepareDevice()`` plans memory
and cycles from shapes alone and allocates no tensor storage; on an IPU Model device the
storage is allocated at ``weightsFromHost`` (or the first run), not at ``prepareDevice``. The
fit verdict and the report are the same either way."""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart
from popart_backend.device.lower import lower
from popart_backend.device.run_tables import execution_order
from popart_backend.device.simulator import SimulatedDevice
from popart_backend.ops.collectives import shard_layout

MB, IN, HIDDEN = 2, 256, 512  # w1 is 512 KiB of float32; with Adam state and 2 replicas the
REPLICAS = 2                  # device would hold over 3 MiB of variables


def _params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w1": (rng.standard_normal((IN, HIDDEN)) * 0.05).astype(np.float32),
            "w2": (rng.standard_normal((HIDDEN, IN)) * 0.05).astype(np.float32)}


def _model(params) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
             helper.make_node("Relu", ["h0"], ["h"], name="relu"),
             helper.make_node("MatMul", ["h", "w2"], ["y"], name="fc2"),
             helper.make_node("L1", ["y"], ["loss"], name="l1", domain="ai.graphcore",
                              lambda_=0.5, reduction=1)]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [MB, IN])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(v, k) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                   helper.make_opsetid("ai.graphcore", 1)])


def _session(device, tiles_opts=None) -> popart.TrainingSession:
    opts = popart.SessionOptions()
    opts.engineOptions = {"autoReport.all": "true"}
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = REPLICAS
    opts.enableGradientAccumulation = True
    opts.accumulationFactor = 2
    optimizer = popart.Adam({"defaultLearningRate": (1e-3, False)})
    flow = popart.DataFlow(1, {"loss": popart.AnchorReturnType("All")})
    return popart.TrainingSession(_model(_params()).SerializeToString(), flow, "loss",
                                  optimizer, device, userOptions=opts, name="mlp")


def _offline(**opts):
    return popart.DeviceManager().createOfflineIPUDevice({"numIPUs": REPLICAS, **opts})


def _ipu_model(**opts):
    return popart.DeviceManager().createIpuModelDevice({"numIPUs": REPLICAS, **opts})


def test_offline_prepare_device_allocates_no_storage_F45():
    session = _session(_offline())
    tracemalloc.start()
    try:
        session.prepareDevice()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    device = session._device
    assert not device.allocated and "plan" not in vars(device)
    assert session._host_weights.copied == 0  # no host copies of the weights either
    # One weight alone is 512 KiB: planning the whole session touched far less than that
    # (building the device storage copies every variable of every replica).
    assert peak < _params()["w1"].nbytes
    with pytest.raises(popart.popart_exception,
                       match="^Offline IPU device is not configured for execution$"):
        session.weightsFromHost()
    assert not device.allocated


def test_building_the_device_storage_is_what_tracemalloc_would_see():
    """The reference for the bound above: allocating the same device copies more than one
    weight's bytes (so the offline test can fail)."""
    session = _session(_offline())
    device = SimulatedDevice(session._program)
    tracemalloc.start()
    try:
        device._allocate()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert device.allocated
    assert peak > _params()["w1"].nbytes


def test_ipu_model_allocates_at_weights_from_host_F36():
    session = _session(_ipu_model(tilesPerIPU=1472))
    session.prepareDevice()
    assert not session._device.allocated
    new = {k: v + 1 for k, v in _params(1).items()}
    session.writeWeights(popart.PyWeightsIO(new))
    session.weightsFromHost()
    assert session._device.allocated
    back = {k: np.zeros_like(v) for k, v in new.items()}
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(back))
    for k in new:
        np.testing.assert_array_equal(back[k], new[k])


def test_ipu_model_seed_set_before_allocation_reaches_the_device():
    session = _session(_ipu_model(tilesPerIPU=1472))
    session.prepareDevice()
    session.setRandomSeed(1234)
    assert not session._device.allocated
    session.weightsFromHost()
    seeds = [float(s[0]) for s in session._device._seeds or ()]
    assert seeds == [1234.0] * len(seeds)


def test_offline_and_ipu_model_reports_are_equal():
    """Same spec (tile count, version) on both devices: the same memory and cycle report."""
    reports = []
    for device in (_offline(tilesPerIPU=1472), _ipu_model(tilesPerIPU=1472)):
        session = _session(device)
        session.prepareDevice()
        report = session.getReport().to_dict()
        report["compilation"]["target"].pop("device")
        summary = [line for line in session.getSummaryReport().splitlines()
                   if not line.startswith("Target:")]  # names the device type
        reports.append((report, summary))
    assert reports[0] == reports[1]
    assert any(line.startswith("Memory") for line in reports[0][1])


def test_offline_and_ipu_model_refuse_the_same_overflow():
    messages = []
    for device in (_offline(tilesPerIPU=4), _ipu_model(tilesPerIPU=4)):
        session = _session(device)
        with pytest.raises(popart.OutOfMemoryException) as info:
            session.prepareDevice()
        assert not session._device_model.memory.fits
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "IPU 0" in messages[0]


def test_execution_order_is_the_plans_order():
    """The analysis walks execution_order(program) instead of building the plan: it must be
    the order the plan runs (Normal fragment, then the accumulate outer fragment)."""
    session = _session(_ipu_model(tilesPerIPU=1472))
    program = lower(session._ir, session.dataFlow, REPLICAS, 2)
    device = SimulatedDevice(program)
    assert [op.id for op in execution_order(program)] == [op.id for op in device.plan.order]


def test_shard_layout_builds_no_index_until_used_and_matches_its_definition():
    big = shard_layout(10 ** 9 + 7, 4)  # a billion elements: planned, not indexed
    assert "split_index" not in vars(big) and "join_index" not in vars(big)
    assert sum(big.counts) == 10 ** 9 + 7
    for n, k in [(30, 4), (1, 4), (7, 7), (8, 4), (5, 3), (3, 5)]:
        layout = shard_layout(n, k)
        size = layout.shard_size
        split, join = [], []
        for j in range(k):  # shard j: its real elements, then the appended zero (index n)
            split += list(range(layout.starts[j], layout.starts[j] + layout.counts[j]))
            split += [n] * (size - layout.counts[j])
            join += [j * size + i for i in range(layout.counts[j])]
        assert layout.split_index.tolist() == split
        assert layout.join_index.tolist() == join
