"""OffChip activations written in place (F105-F108, F21; docs/device_model.md §2-§3): the value
an op writes into an activation's storage is streamed like any other off-chip activation, with
and without execution phases, and the results stay those of the on-chip run."""

from __future__ import annotations

import math

import numpy as np

import popart_backend as popart

MB, D = 2, 64


def _x() -> np.ndarray:
    return np.random.default_rng(3).standard_normal((MB, D)).astype(np.float32)


def _w() -> np.ndarray:
    return (np.random.default_rng(4).standard_normal((D, D)) * 0.3).astype(np.float32)


def _reference(x: np.ndarray) -> np.ndarray:
    """y = u + tanh(tanh(tanh(u))) with u = tanh(x): ``c`` holds u, written over x @ w."""
    u = np.tanh(x)
    return u + np.tanh(np.tanh(np.tanh(u)))


def _run(opts: popart.SessionOptions, phased: bool, ipus: int = 1):
    """h = x @ w, then c = CopyVarUpdate(h, u) writes u over h in place, right after it is
    made; c is read only at the end. (session, output, id of h, id of c)."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    w = builder.addInitializedInputTensor(_w(), "w")

    def phase(k):
        return builder.executionPhase(k) if phased else builder.nameScope(f"p{k}")

    with phase(0):
        u = builder.aiOnnx.tanh([x])
        h = builder.aiOnnx.matmul([x, w])
        c = builder.aiGraphcore.copyvarupdate([h, u])
        t = builder.aiOnnx.tanh([u])
    with phase(1):
        t = builder.aiOnnx.tanh([t])
    with phase(2):
        t = builder.aiOnnx.tanh([t])
    with phase(3):
        y = builder.aiOnnx.add([c, t])
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus, "tilesPerIPU": 4})
    session = popart.InferenceSession(
        builder.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}),
        device, userOptions=opts)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: _x()}, anchors))
    return session, anchors[y], h, c


def _off_chip_activations() -> popart.SessionOptions:
    opts = popart.SessionOptions()
    opts.activationTensorLocationSettings.location.storage = popart.TensorStorage.OffChip
    opts.activationTensorLocationSettings.minElementsForOffChip = 0
    return opts


def _transfer_cycles(num_bytes: int, spec) -> int:
    return (math.ceil(num_bytes / spec.host_link_bytes_per_s * spec.clock_hz)
            + spec.ipu_sync_latency_cycles)


def test_F108_activation_written_in_place_right_after_it_is_made_goes_off_chip():
    session, out, h, c = _run(_off_chip_activations(), phased=False)
    plain, plain_out, _, _ = _run(popart.SessionOptions(), phased=False)
    np.testing.assert_allclose(out, _reference(_x()), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out, plain_out)
    main = session._ir.main
    writer = main.tensors[c].producer
    # The precondition of the finding: h's only reader is its in-place writer, which runs
    # right after h's producer; the value it writes is read much later.
    assert [op.id for op in main.tensors[h].consumers] == [writer.id]
    model = session._device_model
    assert model.locations[h].off_chip and model.locations[c].alias_of == h
    assert h in model.off_chip()
    spec = model.spec
    num_bytes = main.tensors[h].info.num_bytes
    (record,) = [r for r in model.cycles.remote if r.tensor_id == h]
    # Stored once after it is written, loaded once for the reader of c.
    assert (record.loads, record.stores) == (1, 1)
    assert record.cycles == 2 * _transfer_cycles(num_bytes, spec)
    assert model.cycles.step_cycles > plain._device_model.cycles.step_cycles
    memory = model.memory.ipu(0)
    assert h in memory.streaming_tensors
    assert h not in plain._device_model.memory.ipu(0).streaming_tensors


def test_F21_activation_written_in_place_is_streamed_between_phases():
    opts = _off_chip_activations()
    opts.virtualGraphMode = popart.VirtualGraphMode.ExecutionPhases
    opts.executionPhaseSettings.phases = 4
    opts.executionPhaseSettings.stages = 2
    session, out, _, c = _run(opts, phased=True, ipus=2)
    _, plain_out, _, _ = _run(popart.SessionOptions(), phased=False)
    np.testing.assert_allclose(out, _reference(_x()), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out, plain_out)
    main = session._ir.main
    # c is read in phase 3, on IPU 1: stored there in phase 1 (after its IPU copy), loaded in
    # phase 2 (Preload), and the Add reads the loaded copy.
    buffer = f"RemoteBuffer___{c}"
    (store,) = main.tensors[buffer].consumers
    value = store.inputs[1]
    assert value.id == c or [t.id for t in value.producer.inputs] == [c]
    assert (store.op_type, store.settings.execution_phase, store.settings.ipu) == (
        "RemoteStore", 1, 1)
    (load,) = store.outputs[0].consumers
    assert (load.op_type, load.settings.execution_phase, load.settings.ipu) == (
        "RemoteLoad", 2, 1)
    (add,) = [op for op in main.ops.values() if op.op_type == "Add"]
    assert add.inputs[0] is load.outputs[0]
    model = session._device_model
    assert model.locations[buffer].off_chip
    (record,) = [r for r in model.cycles.remote if r.tensor_id == buffer]
    assert (record.loads, record.stores) == (1, 1)
    assert record.cycles == 2 * _transfer_cycles(main.tensors[c].info.num_bytes, model.spec)
    assert buffer in model.memory.ipu(1).streaming_tensors
