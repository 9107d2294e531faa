"""Tensor locations (spec §10.1-§10.2, F105-F108): the resolution order, its effect on the memory
model (off-chip tensors leave SRAM for the streaming-memory pool) and on the cycle model
(RemoteLoad / RemoteStore), and, through TrainingSession, that off-chip optimizer state lowers the
reported memory while the trained weights stay bit-identical."""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart
from popart_backend.device.analysis import analyse
from popart_backend.device.cost import compute_cycles
from popart_backend.device.manager import DeviceManager
from popart_backend.device.memory import (
    REMOTE_BUFFERS,
    check_fits,
    compute_memory,
    storage_roots,
)
from popart_backend.device.spec import IpuSpec
from popart_backend.errors import OutOfMemoryException
from popart_backend.importer.onnx_model import import_model
from popart_backend.ir.op import ExecutionContext, RecomputeType
from popart_backend.ir.tensor import TensorRole
from popart_backend.optim.adam import Adam
from popart_backend.options.checks import check_buildable
from popart_backend.options.enums import ReplicatedTensorSharding, TensorStorage
from popart_backend.options.session_options import SessionOptions
from popart_backend.options.structs import TensorLocation, TensorLocationSettings
from popart_backend.tensorinfo import TileSet
from popart_backend.transforms.pipeline import run_passes, training_passes
from popart_backend.transforms.tensor_locations import (
    TensorType,
    output_locations_from_model,
    resolve_tensor_locations,
)

IPU2_4 = IpuSpec.for_version("ipu2", 4)
OFF, ON = TensorStorage.OffChip, TensorStorage.OnChip
K, N1, N2, MB = 16, 32, 8, 4


def _two_layer():
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
         helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"),
         helper.make_node("ReduceMean", ["y"], ["loss"], keepdims=0, name="mean")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [MB, K])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(rng.standard_normal((K, N1)).astype(np.float32), "w1"),
         numpy_helper.from_array(rng.standard_normal((N1, N2)).astype(np.float32), "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _adam_ir(options=None, af=1):
    options = options or SessionOptions()
    if af > 1:
        options.enableGradientAccumulation = True
        options.accumulationFactor = af
    ir = import_model(_two_layer())
    run_passes(ir, training_passes(options, "loss", Adam({}), af))
    return ir


def _resolve(ir, options, **kw):
    order = ir.main.topo_order()
    return resolve_tensor_locations(ir.main, order, options, aliases=storage_roots(order), **kw)


def _state_ids(ir, role=TensorRole.OPTIMIZER_STATE):
    return sorted(t.id for t in ir.main.tensors.values() if t.role is role)


# -- resolution (F105-F108) ------------------------------------------------------------------


def test_F108_classification_and_defaults_stay_on_chip():
    opts = SessionOptions()
    ir = _adam_ir(opts, af=2)
    resolved = _resolve(ir, opts)
    assert not any(r.off_chip for r in resolved.values())  # nothing set => OnChip
    assert resolved["w1"].tensor_type is TensorType.Weight
    assert resolved["h"].tensor_type is TensorType.Activation
    for tid in _state_ids(ir):
        assert resolved[tid].tensor_type is TensorType.OptimizerState
    for tid in _state_ids(ir, TensorRole.ACCUMULATOR):
        assert resolved[tid].tensor_type is TensorType.Accumulator
    for tid in _state_ids(ir, TensorRole.OPTIMIZER_PARAM) + _state_ids(ir, TensorRole.STEP):
        assert resolved[tid].tensor_type is None
    # An in-place output follows the storage it writes.
    assert resolved["UpdatedVar___w1"].alias_of == "w1"
    assert resolved["UpdatedVar___w1"].tensor_type is TensorType.Weight


@pytest.mark.parametrize("field, role", [
    ("weightTensorLocationSettings", TensorRole.WEIGHT),
    ("optimizerStateTensorLocationSettings", TensorRole.OPTIMIZER_STATE),
    ("accumulatorTensorLocationSettings", TensorRole.ACCUMULATOR),
])
def test_F105_each_type_setting_moves_only_its_type(field, role):
    opts = SessionOptions()
    setattr(opts, field, TensorLocationSettings(OFF))
    ir = _adam_ir(opts, af=2)
    resolved = _resolve(ir, opts)
    off = sorted(tid for tid, r in resolved.items() if r.off_chip and r.alias_of is None)
    assert off == _state_ids(ir, role)
    assert all(field in resolved[tid].reason for tid in off)


def test_F108_hyper_parameters_and_constants_stay_on_chip_whatever_the_settings():
    opts = SessionOptions()
    for field in ("weightTensorLocationSettings", "optimizerStateTensorLocationSettings",
                  "accumulatorTensorLocationSettings", "activationTensorLocationSettings"):
        setattr(opts, field, TensorLocationSettings(OFF, 0))
    ir = _adam_ir(opts)
    resolved = _resolve(ir, opts)
    for tid in _state_ids(ir, TensorRole.OPTIMIZER_PARAM):
        assert not resolved[tid].off_chip and "optimizer hyper-parameter" in resolved[tid].reason
    assert not resolved["x"].off_chip and "host input stream" in resolved["x"].reason


def test_F105_min_elements_for_off_chip():
    opts = SessionOptions()
    # w1 has 16*32 = 512 elements, w2 has 32*8 = 256.
    opts.weightTensorLocationSettings = TensorLocationSettings(OFF, minElementsForOffChip=300)
    ir = _adam_ir(opts)
    resolved = _resolve(ir, opts)
    assert resolved["w1"].off_chip
    assert not resolved["w2"].off_chip
    assert "256 element(s) < minElementsForOffChip = 300" in resolved["w2"].reason


def test_F107_override_map_wins_over_the_type_setting(caplog):
    opts = SessionOptions()
    opts.weightTensorLocationSettings = TensorLocationSettings(OFF)
    opts.tensorLocationSettingsOverride["w1"] = TensorLocation(ON)
    opts.tensorLocationSettingsOverride["Accl1___w2"] = TensorLocation(OFF)
    ir = _adam_ir(opts)
    with caplog.at_level(logging.DEBUG, logger="popart:transform"):
        resolved = _resolve(ir, opts)
    assert not resolved["w1"].off_chip and resolved["w2"].off_chip
    assert resolved["Accl1___w2"].off_chip and not resolved["Accl2___w2"].off_chip
    assert "tensorLocationSettingsOverride" in resolved["w1"].reason
    # Every decision is logged at debug on popart:transform with its reason.
    assert "'w1' (weight): OnChip from tensorLocationSettingsOverride" in caplog.text


def _builder_model(recompute: bool):
    """h = Relu(x @ w) with outputTensorLocation(OffChip) on h; y = Sigmoid(h) @ w2 ..."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]), "x")
    w = b.addInitializedInputTensor(np.ones((8, 8), np.float32), "w")
    m = b.aiOnnx.matmul([x, w], "mm")
    h = b.aiOnnx.relu([m], "h")
    b.outputTensorLocation(h, popart.TensorLocation(popart.TensorStorage.OffChip))
    if recompute:
        b.recomputeOutputInBackwardPass(h, popart.RecomputeType.Recompute)
    s = b.aiOnnx.sigmoid([h], "s")
    t = b.aiOnnx.tanh([s], "t")
    y = b.aiOnnx.add([t, h], "y")
    b.addOutputTensor(y)
    return b.getModelProto(), h


def test_F107_builder_output_tensor_location():
    proto, h = _builder_model(recompute=False)
    model = onnx.load_from_string(proto)
    outputs = output_locations_from_model(model)
    assert outputs[h].storage is OFF and outputs[h].loadTileSet is TileSet.Compute
    ir = import_model(model)
    resolved = _resolve(ir, SessionOptions(), output_locations=outputs)
    assert resolved[h].off_chip and "builder outputTensorLocation" in resolved[h].reason
    # The override map comes first.
    opts = SessionOptions()
    opts.tensorLocationSettingsOverride[h] = TensorLocation(ON)
    assert not _resolve(ir, opts, output_locations=outputs)[h].off_chip


def test_F107_builder_location_on_a_recomputed_producer_is_ignored_with_a_warning(caplog):
    model = onnx.load_from_string(_builder_model(recompute=True)[0])
    ir = import_model(model)
    h = next(t for t in ir.main.tensors.values()
             if t.producer is not None and t.producer.settings.recompute is RecomputeType.Recompute)
    outputs = output_locations_from_model(model)
    with caplog.at_level(logging.WARNING, logger="popart:transform"):
        resolved = _resolve(ir, SessionOptions(), output_locations=outputs)
    assert not resolved[h.id].off_chip
    assert f"Ignoring the outputTensorLocation of tensor '{h.id}'" in caplog.text


def test_F108_activation_without_a_window_stays_on_chip():
    model = onnx.load_from_string(_builder_model(recompute=False)[0])
    ir = import_model(model)
    opts = SessionOptions()
    opts.activationTensorLocationSettings = TensorLocationSettings(OFF)
    resolved = _resolve(ir, opts)
    # The MatMul output is read by the very next op: no window to move it.
    mm = next(t.id for t in ir.main.tensors.values()
              if t.producer is not None and t.producer.op_type == "MatMul")
    assert not resolved[mm].off_chip and "no window" in resolved[mm].reason


def test_F108_rts_without_replication_is_off_and_activations_are_never_sharded(caplog):
    # Replicated tensor sharding itself is tested in tests/transforms/test_rts.py.
    opts = SessionOptions()
    opts.tensorLocationSettingsOverride["w1"] = TensorLocation(OFF, ReplicatedTensorSharding.On)
    opts.weightTensorLocationSettings.minElementsForReplicatedTensorSharding = 1
    ir = _adam_ir()
    with caplog.at_level(logging.WARNING, logger="popart:transform"):
        resolved = _resolve(ir, opts)
    assert resolved["w1"].location.replicatedTensorSharding is ReplicatedTensorSharding.Off
    assert "Unable to shard tensor w1 due to lack of replication" in caplog.text
    opts = SessionOptions()
    opts.tensorLocationSettingsOverride["h"] = TensorLocation(ON, ReplicatedTensorSharding.On)
    resolved = _resolve(ir, opts)
    assert resolved["h"].location.replicatedTensorSharding is ReplicatedTensorSharding.Off
    assert "never sharded" in resolved["h"].reason


def test_F105_rts_settings_are_buildable():
    opts = SessionOptions()
    opts.optimizerStateTensorLocationSettings.location.replicatedTensorSharding = (
        ReplicatedTensorSharding.On)
    check_buildable(opts, training=True)
    opts = SessionOptions()
    opts.tensorLocationSettingsOverride["w"] = TensorLocation(OFF, ReplicatedTensorSharding.On)
    check_buildable(opts, training=True)
    opts = SessionOptions()
    opts.optimizerStateTensorLocationSettings = TensorLocationSettings(OFF, 4)
    opts.tensorLocationSettingsOverride["w"] = TensorLocation(OFF)
    check_buildable(opts, training=True)


def test_device_without_streaming_memory_keeps_everything_on_chip(caplog):
    opts = SessionOptions()
    opts.weightTensorLocationSettings = TensorLocationSettings(OFF)
    ir = _adam_ir(opts)
    with caplog.at_level(logging.WARNING, logger="popart:transform"):
        model = analyse(ir, ir.main.topo_order(), DeviceManager().createCpuDevice(), opts)
    assert model.off_chip() == [] and "no streaming memory" in caplog.text


# -- memory and cycles -----------------------------------------------------------------------


def test_off_chip_state_moves_to_streaming_memory_with_transient_buffers():
    opts = SessionOptions()
    opts.optimizerStateTensorLocationSettings = TensorLocationSettings(OFF)
    ir = _adam_ir(opts)
    g, order = ir.main, ir.main.topo_order()
    states = _state_ids(ir)
    weights = (K * N1 + N1 * N2) * 4
    plain = compute_memory(g, order, IPU2_4, keep=["loss"]).ipu(0)
    mem = compute_memory(g, order, IPU2_4, keep=["loss"], off_chip=states).ipu(0)
    assert plain.categories["optimizer state"] == 2 * weights
    assert mem.categories["optimizer state"] == 0
    assert mem.streaming_bytes == 2 * weights
    assert sorted(mem.streaming_tensors) == states
    # Each state is on chip only around the update that reads and writes it.
    position = {op.id: i for i, op in enumerate(order)}
    for t in mem.tensors:
        if t.category == REMOTE_BUFFERS:
            users = [position[op.id] for op in g.tensors[t.id].consumers]
            assert (t.start, t.end) == (min(users), max(users))
    assert mem.total_bytes < plain.total_bytes
    assert mem.total_bytes >= plain.total_bytes - 2 * weights


def test_remote_transfers_cost_load_and_store_per_fragment():
    opts = SessionOptions()
    opts.optimizerStateTensorLocationSettings = TensorLocationSettings(OFF)
    ir = _adam_ir(opts, af=2)
    g, order = ir.main, ir.main.topo_order()
    states = _state_ids(ir)
    spec = IPU2_4
    plain = compute_cycles(g, order, spec)
    result = compute_cycles(g, order, spec, off_chip=states)
    assert sorted(r.tensor_id for r in result.remote) == states
    outer = ExecutionContext.AccumulateOuterFragment
    for r in result.remote:
        # Adam state is read and written in place by the update in the outer fragment.
        assert (r.context, r.loads, r.stores) == (outer, 1, 1)
        one = math.ceil(r.num_bytes / spec.host_link_bytes_per_s * spec.clock_hz)
        assert r.cycles == 2 * (one + spec.ipu_sync_latency_cycles)
    assert result.fragment_cycles(outer) == plain.fragment_cycles(outer) + sum(
        r.cycles for r in result.remote)
    assert result.micro_batch_cycles == plain.micro_batch_cycles


def test_streaming_memory_overflow_is_an_out_of_memory_error():
    opts = SessionOptions()
    ir = _adam_ir(opts)
    tiny = dataclasses.replace(IPU2_4, streaming_memory_bytes=1024)
    mem = compute_memory(ir.main, ir.main.topo_order(), tiny, keep=["loss"],
                         off_chip=["w1", "w2"])
    assert not mem.fits
    with pytest.raises(OutOfMemoryException, match="Out of streaming memory on IPU 0.*'w1'"):
        check_fits(mem)


# -- through TrainingSession ---------------------------------------------------------------


def _train(options: popart.SessionOptions, steps: int = 2):
    options.engineOptions = {"autoReport.all": "true"}
    options.instrumentWithHardwareCycleCounter = True
    device = popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 4})
    optimizer = popart.Adam({"defaultLearningRate": (0.01, False)})
    session = popart.TrainingSession(
        _two_layer().SerializeToString(), popart.DataFlow(1, {"loss": popart.AnchorReturnType(
            "All")}), "loss", optimizer, device, userOptions=options)
    session.prepareDevice()
    session.weightsFromHost()
    x = np.random.default_rng(3).standard_normal((MB, K)).astype(np.float32)
    losses = []
    for _ in range(steps):
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({"x": x}, anchors))
        losses.append(anchors["loss"].copy())
    session.weightsToHost()
    weights = {"w1": np.zeros((K, N1), np.float32), "w2": np.zeros((N1, N2), np.float32)}
    session.readWeights(popart.PyWeightsIO(weights))
    return session, losses, weights


def test_F105_off_chip_adam_state_lowers_memory_and_keeps_results():
    plain, plain_losses, plain_weights = _train(popart.SessionOptions())
    opts = popart.SessionOptions()
    opts.optimizerStateTensorLocationSettings = popart.TensorLocationSettings(
        popart.TensorStorage.OffChip)
    off, off_losses, off_weights = _train(opts)
    for a, b in zip(plain_losses, off_losses):
        np.testing.assert_array_equal(a, b)
    for name in plain_weights:
        np.testing.assert_array_equal(plain_weights[name], off_weights[name])
    weights = (K * N1 + N1 * N2) * 4
    plain_mem, off_mem = plain._device_model.memory.ipu(0), off._device_model.memory.ipu(0)
    assert off_mem.total_bytes < plain_mem.total_bytes
    assert off_mem.streaming_bytes == 2 * weights
    assert "streaming memory: 6.00 KiB" in off.getSummaryReport()
    # The remote loads and stores make the step longer.
    assert off.getCycleCount() > plain.getCycleCount()
