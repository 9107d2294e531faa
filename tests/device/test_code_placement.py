"""Where the memory model puts an op's vertex state (docs/device_model.md §2, code): on the
tiles holding its data. An in-place op (an ``Accumulate`` into a gradient accumulator, a
weight update) works on its input's storage, so its vertex state goes to that storage's tiles;
it used to pile up on tile 0, which then overflowed first in large pipelined models."""

from __future__ import annotations

import numpy as np

import popart_backend as popart
from popart_backend.device.memory import storage_roots
from popart_backend.device.spec import IpuSpec

WEIGHTS, D, TILES = 12, 4, 64


def _session():
    rng = np.random.default_rng(0)
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, D]), "x")
    h = x
    for k in range(WEIGHTS):
        w = builder.addInitializedInputTensor(rng.standard_normal((D, D)).astype(np.float32),
                                              f"w{k}")
        h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, w])])
    loss = builder.aiGraphcore.l1loss([h], 0.1)
    opts = popart.SessionOptions()
    opts.enableGradientAccumulation, opts.accumulationFactor = True, 4
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": 1, "tilesPerIPU": TILES})
    session = popart.TrainingSession(builder.getModelProto(), popart.DataFlow(1, [loss]), loss,
                                     popart.ConstSGD(0.1), device, userOptions=opts)
    session.prepareDevice()
    return session


def test_vertex_state_of_in_place_ops_sits_on_their_storage_tiles():
    session = _session()
    memory = session._device_model.memory.ipu(0)
    graph = session.getIr().main
    ops = list(graph.ops.values())
    root = storage_roots(ops)
    tiles_of = {}
    for t in memory.tensors:  # the model's own tile mapping of each stored tensor
        if t.num_tiles:
            tiles_of[t.id] = {(t.first_tile + i) % TILES for i in range(t.num_tiles)}
    accumulates = [op for op in ops if op.op_type == "Accumulate"
                   and root.get(op.outputs[0].id, "").startswith("Accum___")]
    assert len(accumulates) == WEIGHTS
    # Reference: an op may add vertex state only to tiles holding a tensor it reads or writes.
    touching = {tile: 0 for tile in range(TILES)}
    for op in ops:
        tiles = set()
        for t in (*op.outputs, *op.inputs):
            if t is not None:
                tiles |= tiles_of.get(root.get(t.id, t.id), set())
        for tile in tiles or {0}:
            touching[tile] += 1
    spec = IpuSpec.for_version("ipu2", TILES)
    spec_base, vertex = spec.tile_code_base_bytes, spec.vertex_bytes_per_op_tile
    for tile in range(TILES):
        assert memory.code_bytes_per_tile[tile] <= spec_base + vertex * touching[tile], tile
    # Each accumulator's Accumulate works where the accumulator lives.
    for op in accumulates:
        accum = root[op.outputs[0].id]
        for tile in tiles_of[accum]:
            assert memory.code_bytes_per_tile[tile] >= spec_base + vertex
