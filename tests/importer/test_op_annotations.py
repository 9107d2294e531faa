"""Per-op planning annotations carried into OpSettings and read by the device model:
``__available_memory``, ``__serialize_matmul_*``, ``__partials_type`` (setAvailableMemoryProportion,
setSerializeMatMul, setPartialsType), and the ``__`` annotations nothing reads, logged once.

Each annotated run is compared with the un-annotated one: the values equal numpy's product,
and the planner temporaries and syncs follow the plan device/planner.py makes on the
device's own tile count, tile memory and sync latency."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.device.planner import planner_plan

M, K, N = 32, 48, 64
TILES = 4


def _session(annotate=None, options=None, dtype=np.float32, tiles=TILES):
    rng = np.random.default_rng(1)
    b = popart.Builder()
    kind = "FLOAT16" if dtype == np.float16 else "FLOAT"
    x = b.addInputTensor(popart.TensorInfo(kind, [M, K]), "x")
    w_value = rng.standard_normal((K, N)).astype(dtype)
    w = b.addInitializedInputTensor(w_value, "w")
    y = b.aiOnnx.matmul([x, w], "mm")
    z = b.aiOnnx.relu([y], "relu")
    if annotate:
        annotate(b, y, z)
    b.addOutputTensor(z)
    opts = options or popart.SessionOptions()
    opts.engineOptions = {"autoReport.all": "true"}
    session = popart.InferenceSession(
        b.getModelProto(), popart.DataFlow(1, [y]),
        popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": tiles}), userOptions=opts)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    x_value = rng.standard_normal((M, K)).astype(dtype)
    session.run(popart.PyStepIO({x: x_value}, anchors))
    model = session.getReport().model
    return session, anchors[y].copy(), x_value @ w_value, model


def _temporaries(model) -> int:
    """Bytes of the planner temporaries (wherever the peak is)."""
    return sum(t.num_bytes for t in model.memory.ipus[0].tensors
               if t.category == "planner temporaries")


def _plan(session, model):
    """The plan device/planner.py makes for the session's MatMul on its device."""
    return planner_plan(_matmul(session), model.spec)


def test_planner_temporaries_count_at_the_peak_when_live_there():
    """Without the Relu the MatMul is the peak, so its temporary is in the peak categories."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [M, K]), "x")
    y = b.aiOnnx.matmul([x, b.addInitializedInputTensor(np.ones((K, N), np.float32))])
    b.setSerializeMatMul({y}, "output_channels", 2)
    opts = popart.SessionOptions()
    opts.engineOptions = {"autoReport.all": "true"}
    session = popart.InferenceSession(
        b.getModelProto(), popart.DataFlow(1, [y]),
        popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": TILES}), userOptions=opts)
    session.prepareDevice()
    model = session.getReport().model
    memory = model.memory.ipus[0]
    assert memory.categories["planner temporaries"] == _plan(session, model).temporary_bytes > 0
    assert memory.categories["activations"] == M * N * 4


def _matmul(session):
    return next(op for op in session.getIr().main.ops.values() if op.op_type == "MatMul")


def _sync(model) -> int:
    return model.spec.sync_latency_cycles


@pytest.fixture(scope="module")
def plain():
    return _session()


def test_plain_matmul_has_the_default_plans_temporaries(plain):
    session, y, expected, model = plain
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    assert _matmul(session).settings.available_memory_proportion is None
    plan = _plan(session, model)
    assert _temporaries(model) == plan.temporary_bytes > 0
    # Within Poplar's default proportion (0.6) of the memory of the tiles it uses.
    assert plan.temporary_bytes <= 0.6 * model.spec.tile_bytes * plan.tiles_used


@pytest.mark.parametrize("proportion", [0.001, 0.5])
def test_available_memory_bounds_the_temporaries_and_adds_passes(plain, proportion):
    session0, y0, _, model0 = plain
    session, y, expected, model = _session(
        lambda b, y, z: b.setAvailableMemoryProportion(y, proportion))
    np.testing.assert_array_equal(y, y0)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    assert _matmul(session).settings.available_memory_proportion == pytest.approx(proportion)
    plan, plan0 = _plan(session, model), _plan(session0, model0)
    assert _temporaries(model) == plan.temporary_bytes <= _temporaries(model0)
    assert model.cycles.step_cycles >= model0.cycles.step_cycles
    if proportion < 0.01:
        # The small budget binds: a tile cannot hold its rows' working set at once, so the
        # temporaries shrink and the op pays a sync per extra pass.
        assert plan.passes > plan0.passes
        assert _temporaries(model) < _temporaries(model0)
        assert (model.cycles.step_cycles - model0.cycles.step_cycles
                >= (plan.passes - plan0.passes) * _sync(model))


@pytest.mark.parametrize("mode,factor", [("input_channels", 2), ("reducing_dim", 4),
                                         ("output_channels", 8)])
def test_serialized_matmul_divides_the_temporaries_and_pays_a_sync_per_slice(plain, mode,
                                                                              factor):
    session0, y0, _, model0 = plain
    session, y, _, model = _session(
        lambda b, y, z: b.setSerializeMatMul({y}, mode, factor, keep_precision=True))
    np.testing.assert_array_equal(y, y0)
    serial = _matmul(session).settings.serialize_matmul
    assert (serial.mode, serial.factor, serial.keep_precision) == (mode, factor, True)
    assert _temporaries(model) == math.ceil(_temporaries(model0) / factor)
    passes0 = _plan(session0, model0).passes
    assert (model.cycles.step_cycles - model0.cycles.step_cycles
            == passes0 * (factor - 1) * _sync(model))


def test_enable_serialized_matmuls_false_plans_the_plain_matmul(plain):
    _, y0, _, model0 = plain
    opts = popart.SessionOptions()
    opts.enableSerializedMatmuls = False
    _, y, _, model = _session(
        lambda b, y, z: b.setSerializeMatMul({y}, "output_channels", 4), opts)
    np.testing.assert_array_equal(y, y0)
    assert _temporaries(model) == _temporaries(model0)
    assert model.cycles.step_cycles == model0.cycles.step_cycles


def test_serialized_float16_without_keep_precision_sums_in_float16():
    keep = _session(lambda b, y, z: b.setSerializeMatMul({y}, "reducing_dim", 2, True),
                    dtype=np.float16)
    drop = _session(lambda b, y, z: b.setSerializeMatMul({y}, "reducing_dim", 2, False),
                    dtype=np.float16)
    np.testing.assert_array_equal(keep[1], drop[1])
    # float32 partials of a float16 output are a buffer of their own; float16 ones are summed
    # in the output.
    assert _temporaries(drop[3]) < _temporaries(keep[3])


def test_partials_type_half_marks_the_op_and_lowers_its_temporaries():
    def annotate(half):
        def inner(b, y, z):
            b.setAvailableMemoryProportion(y, 1.0)
            b.setPartialsType(y, "half" if half else "float")
        return inner

    session_f, y_f, _, model_f = _session(annotate(False), dtype=np.float16)
    session_h, y_h, _, model_h = _session(annotate(True), dtype=np.float16)
    assert not _matmul(session_f).settings.half_partials
    assert _matmul(session_h).settings.half_partials
    assert _temporaries(model_h) < _temporaries(model_f)
    # The per-op annotation computes what the session-wide partialsTypeMatMuls does.
    opts = popart.SessionOptions()
    opts.partialsTypeMatMuls = "half"
    _, y_session, _, _ = _session(lambda b, y, z: b.setAvailableMemoryProportion(y, 1.0), opts,
                                  dtype=np.float16)
    np.testing.assert_array_equal(y_h, y_session)


def test_annotation_on_an_op_without_a_planner_is_logged_and_dropped(caplog):
    caplog.set_level(logging.WARNING, "popart:ir")
    session, _, _, _ = _session(lambda b, y, z: b.addNodeAttribute(
        "__available_memory", 0.3, {z}))
    relu = next(op for op in session.getIr().main.ops.values() if op.op_type == "Relu")
    assert relu.settings.available_memory_proportion is None
    assert any("__available_memory has no effect on a Relu" in r.getMessage()
               for r in caplog.records)


def test_unread_annotation_is_logged_once_per_name(caplog):
    caplog.set_level(logging.WARNING, "popart:ir")
    name = "__op_annotations_test_unread"
    for _ in range(2):
        _session(lambda b, y, z: (b.addNodeAttribute(name, 1, {y}),
                                  b.addNodeAttribute(name, 2, {z})))
    hits = [r for r in caplog.records if name in r.getMessage()]
    assert len(hits) == 1 and "no effect" in hits[0].getMessage()


def test_read_annotations_are_not_reported_as_unread(caplog):
    caplog.set_level(logging.WARNING, "popart:ir")
    _session(lambda b, y, z: (b.setAvailableMemoryProportion(y, 0.5),
                              b.setSerializeMatMul({y}, "output_channels", 2)))
    assert not [r for r in caplog.records if "Node annotation" in r.getMessage()]


@pytest.mark.parametrize("name,value,match", [
    ("__available_memory", 1.5, "must be in"),
    ("__serialize_matmul_mode", "sideways", "must be one of"),
    ("__partials_type", "double", "float"),
])
def test_bad_annotation_values_are_refused(name, value, match):
    with pytest.raises(popart.popart_exception, match=match):
        _session(lambda b, y, z: b.addNodeAttribute(name, value, {y}))
