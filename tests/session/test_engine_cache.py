"""The engine cache (F53): a hit loads the device model (memory, cycles, the fit verdict)
instead of analysing it, with reports identical to a miss; the key changes with the options,
inputs, device and version; corrupted entries are reported once per entry (a warning),
counted, and rebuilt, so the next session hits the rewritten entry; crafted entries are refused."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import popart_backend as popart
from popart_backend import session as session_module
from popart_backend.device.analysis import DeviceModel
from popart_backend.device.model_io import model_from_json, model_to_json
from popart_backend.executable.session_mixin import engine_cache_stats
from popart_backend.report import Report, summary_text
from tests.session import replication_models
from tests.session.executable_worker import batches, make_session
from tests.session.training_models import mlp_model, mlp_params


def test_corrupt_entry_reported_once_and_rebuilt(tmp_path, caplog):
    options = popart.SessionOptions()
    options.enableEngineCaching = True
    options.cachePath = str(tmp_path)
    make_session(options).prepareDevice()  # miss: written
    (entry,) = tmp_path.glob("*.popart")
    stats = engine_cache_stats
    corrupt, hits = stats["corrupt"], stats["hits"]
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        for _ in range(2):
            entry.write_bytes(b"not an archive")
            make_session(options).prepareDevice()
    assert stats["corrupt"] == corrupt + 2  # both corruptions were seen ...
    warnings = [r for r in caplog.records if "unusable" in r.getMessage()]
    assert len(warnings) == 1 and str(entry) in warnings[0].getMessage()  # ... reported once
    make_session(options).prepareDevice()
    assert stats["hits"] == hits + 1  # the rebuilt entry is valid


# --- a hit loads the device model (F53) ---------------------------------------------------------

def _cached_options(folder, **values) -> popart.SessionOptions:
    options = popart.SessionOptions()
    options.enableEngineCaching = True
    options.cachePath = str(folder)
    options.engineOptions = {"autoReport.all": "true"}
    options.instrumentWithHardwareCycleCounter = True
    for key, value in values.items():
        setattr(options, key, value)
    return options


def _observed(session) -> dict:
    """Everything a user sees of the device model: summary, report, cycles after one run."""
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": batches(0, 1)[0]}, anchors))
    return {"summary": session.getSummaryReport(),
            "report": json.dumps(session.getReport().to_dict(), sort_keys=True, default=str),
            "cycles": session.getCycleCount(), "loss": anchors["loss"].copy()}


def _no_analysis(*args, **kwargs):
    raise AssertionError("the device model was analysed on an engine cache hit")


def test_f53_hit_loads_the_device_model_with_identical_reports(tmp_path, monkeypatch):
    """The reference is a miss, which runs the analysis; the hit must not run it and must show
    the same summary, report, cycle count and numbers."""
    stats = engine_cache_stats
    misses, hits = stats["misses"], stats["hits"]
    miss = _observed(make_session(_cached_options(tmp_path)))
    assert stats["misses"] == misses + 1
    with monkeypatch.context() as patch:
        patch.setattr(session_module, "analyse", _no_analysis)
        hit = _observed(make_session(_cached_options(tmp_path)))
    assert stats["hits"] == hits + 1
    assert hit["summary"] == miss["summary"] and hit["report"] == miss["report"]
    assert hit["cycles"] == miss["cycles"] > 0
    np.testing.assert_array_equal(hit["loss"], miss["loss"])
    # ... and the same as without any cache.
    plain = _observed(make_session(_cached_options(tmp_path, enableEngineCaching=False)))
    assert plain["report"] == miss["report"] and plain["cycles"] == miss["cycles"]


def _oom_session(folder):
    """4 MiB of weights on 4 tiles of an IPU model: does not fit."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [1, 1024]), "x")
    w = b.addInitializedInputTensor(np.ones((1024, 1024), np.float32), "w")
    y = b.aiOnnx.matmul([x, w])
    options = popart.SessionOptions()
    options.enableEngineCaching = True
    options.cachePath = str(folder)
    device = popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 4})
    return popart.InferenceSession(b.getModelProto(), popart.DataFlow(
        1, {y: popart.AnchorReturnType("All")}), device, userOptions=options)


def test_f53_out_of_memory_verdict_is_cached(tmp_path, monkeypatch):
    with pytest.raises(popart.OutOfMemoryException) as miss:
        _oom_session(tmp_path).prepareDevice()
    assert len(list(tmp_path.glob("*.popart"))) == 1  # written although it does not fit
    hits = engine_cache_stats["hits"]
    monkeypatch.setattr(session_module, "analyse", _no_analysis)
    with pytest.raises(popart.OutOfMemoryException) as hit:
        _oom_session(tmp_path).prepareDevice()
    assert engine_cache_stats["hits"] == hits + 1
    assert str(hit.value) == str(miss.value)
    assert hit.value.getSummaryReport() == miss.value.getSummaryReport()


def test_f53_key_changes_with_options_inputs_device_and_version(tmp_path, monkeypatch):
    base = make_session(_cached_options(tmp_path))._cache_file()
    assert make_session(_cached_options(tmp_path))._cache_file() == base  # deterministic
    changed = _cached_options(tmp_path)
    changed.enableStochasticRounding = True
    keys = {make_session(changed)._cache_file()}
    device = popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8})
    flow = popart.DataFlow(1, {"loss": popart.AnchorReturnType("All")})
    optimizer = popart.SGD({"defaultLearningRate": (0.05, False),
                            "defaultMomentum": (0.9, True)})
    keys.add(popart.TrainingSession(mlp_model(mlp_params(0)), flow, "loss", optimizer, device,
                                    userOptions=_cached_options(tmp_path))._cache_file())
    keys.add(popart.TrainingSession(mlp_model(mlp_params(0), mb=2), flow, "loss", optimizer,
                                    popart.DeviceManager().createCpuDevice(),
                                    userOptions=_cached_options(tmp_path))._cache_file())
    monkeypatch.setattr(popart, "__version__", "0.0.0-other")
    keys.add(make_session(_cached_options(tmp_path))._cache_file())
    assert base not in keys and len(keys) == 4


def test_f53_input_settings_change_the_key(tmp_path):
    """The builder's InputSettings change the device model (IO tiles), not always the IR."""
    def key(strategy):
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]),
                             popart.InputSettings(popart.TileSet.IO, strategy), "x")
        y = b.aiOnnx.relu([x])
        options = _cached_options(tmp_path, numIOTiles=2, useHostCopyOps=True,
                                  enableExplicitMainLoops=True, virtualGraphMode=popart.VirtualGraphMode.Auto)
        device = popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 16})
        return popart.InferenceSession(b.getModelProto(), popart.DataFlow(
            2, {y: popart.AnchorReturnType("All")}), device, userOptions=options)._cache_file()

    assert key(popart.ExchangeStrategy.JustInTime) != key(popart.ExchangeStrategy.OverlapLoops)


def test_f53_crafted_entry_classes_are_refused(tmp_path):
    """Reading the stored model never imports or constructs a class outside this package's
    dataclasses and enums."""
    model = "popart_backend.device.analysis:DeviceModel"
    for classes, crafted in (
            ([["os:_wrap_close", []]], {"$": "dc", "c": 0, "v": []}),
            ([["subprocess:Popen", []]], {"$": "enum", "c": 0, "v": "x"}),
            ([["popart_backend.device.analysis:analyse", []]], {"$": "dc", "c": 0, "v": []}),
            ([[model, ["__class__"]]], {"$": "dc", "c": 0, "v": [None]}),
            ([[model, ["spec"]]], {"$": "dc", "c": 0, "v": [None]}),  # fields missing
            ([], {"$": "np", "d": "object", "v": 1})):
        with pytest.raises(popart.popart_exception, match="malformed"):
            model_from_json({"format_version": 2, "classes": classes, "model": crafted}, {})


def _hit_equals_miss(monkeypatch, build) -> DeviceModel:
    """``build()`` prepares a session with the engine cache on: a miss, then a hit that must
    not analyse and must hold an equal device model."""
    miss = build()._device_model
    hits = engine_cache_stats["hits"]
    with monkeypatch.context() as patch:
        patch.setattr(session_module, "analyse", _no_analysis)
        hit = build()._device_model
    assert engine_cache_stats["hits"] == hits + 1
    assert summary_text(hit, 3) == summary_text(miss, 3)
    assert json.dumps(Report(hit, 1).to_dict(), sort_keys=True, default=str) == json.dumps(
        Report(miss, 1).to_dict(), sort_keys=True, default=str)
    for ipu in range(len(miss.memory.ipus)):
        assert hit.cycle_count(f"ipu{ipu}") == miss.cycle_count(f"ipu{ipu}")
        np.testing.assert_array_equal(hit.memory.ipus[ipu].tile_peak_bytes,
                                      miss.memory.ipus[ipu].tile_peak_bytes)
    assert hit.off_chip() == miss.off_chip()
    (hit_doc, hit_arrays), (miss_doc, miss_arrays) = model_to_json(hit), model_to_json(miss)
    assert _diff(hit_doc, miss_doc) == [] and sorted(hit_arrays) == sorted(miss_arrays)
    for key, array in miss_arrays.items():
        assert hit_arrays[key].dtype == array.dtype
        np.testing.assert_array_equal(hit_arrays[key], array)
    return miss


def _diff(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in _diff(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:100]} != {str(b)[:100]}"]


def test_f53_pipelined_replicated_model_round_trips(tmp_path, monkeypatch):
    def build():
        opts = replication_models.options(rf=2, af=4, stages=True)
        opts.enableEngineCaching, opts.cachePath = True, str(tmp_path)
        return replication_models.session(replication_models.params(), 2, 2, opts,
                                          stages=True)[0]

    model = _hit_equals_miss(monkeypatch, build)
    assert model.cycles.pipeline is not None and len(model.memory.ipus) == 2


def test_f53_off_chip_and_overlapped_io_round_trip(tmp_path, monkeypatch):
    def off_chip():
        options = _cached_options(tmp_path)
        options.weightTensorLocationSettings.location.storage = popart.TensorStorage.OffChip
        options.weightTensorLocationSettings.minElementsForOffChip = 0
        device = popart.DeviceManager().createIpuModelDevice({})
        flow = popart.DataFlow(1, {"loss": popart.AnchorReturnType("All")})
        session = popart.TrainingSession(mlp_model(mlp_params(0)), flow, "loss", popart.SGD(
            {"defaultLearningRate": (0.05, False)}), device, userOptions=options)
        session.prepareDevice()
        return session

    assert _hit_equals_miss(monkeypatch, off_chip).off_chip()

    def overlapped():
        b = popart.Builder()
        strategy = popart.ExchangeStrategy.OverlapInnerLoop
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]),
                             popart.InputSettings(popart.TileSet.IO, strategy), "x")
        y = b.aiOnnx.relu([x])
        options = _cached_options(tmp_path, numIOTiles=2, useHostCopyOps=True,
                                  enableExplicitMainLoops=True,
                                  virtualGraphMode=popart.VirtualGraphMode.Auto)
        device = popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 16})
        session = popart.InferenceSession(b.getModelProto(), popart.DataFlow(
            4, {y: popart.AnchorReturnType("All", popart.TileSet.IO, strategy)}), device,
            userOptions=options)
        session.prepareDevice()
        return session

    assert _hit_equals_miss(monkeypatch, overlapped).cycles.overlap is not None


def test_f53_hit_logs_the_warnings_of_the_analysis_again(tmp_path, monkeypatch, caplog):
    """Weights set OffChip on a device without streaming memory: the analysis warns that they
    stay on chip; a hit, which does not analyse, must still say so."""
    def build():
        options = _cached_options(tmp_path)
        options.weightTensorLocationSettings.location.storage = popart.TensorStorage.OffChip
        options.weightTensorLocationSettings.minElementsForOffChip = 0
        flow = popart.DataFlow(1, {"loss": popart.AnchorReturnType("All")})
        session = popart.TrainingSession(mlp_model(mlp_params(0)), flow, "loss", popart.SGD(
            {"defaultLearningRate": (0.05, False)}), popart.DeviceManager().createCpuDevice(),
            userOptions=options)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            session.prepareDevice()
        return [(r.name, r.levelno, r.getMessage()) for r in caplog.records]

    miss = build()
    assert any("no streaming memory" in m for _, _, m in miss), miss
    monkeypatch.setattr(session_module, "analyse", _no_analysis)
    assert build() == miss
