"""Poplar's automatic report files (report/auto.py; spec §4.7): ``engineOptions`` and the
``POPLAR_ENGINE_OPTIONS`` variable write profile.json, profile.html and trace.json into
``autoReport.directory/<session name>`` after prepareDevice and again after the first run."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.report import REPORT_FILES, auto, engine_options, report_directory


def _builder(training: bool):
    rng = np.random.default_rng(0)
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 8]), "x")
    w = builder.addInitializedInputTensor(rng.standard_normal((8, 4)).astype(np.float32))
    y = builder.aiOnnx.relu([builder.aiOnnx.matmul([x, w])])
    out = builder.aiGraphcore.l1loss([y], 0.1) if training else y
    return builder.getModelProto(), out


def _session(training: bool, engine_opts: dict | None, name: str):
    proto, out = _builder(training)
    opts = popart.SessionOptions()
    if engine_opts is not None:
        opts.engineOptions = engine_opts
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": 1, "tilesPerIPU": 4})
    flow = popart.DataFlow(1, {out: popart.AnchorReturnType("All")})
    if training:
        session = popart.TrainingSession(proto, flow, out, popart.ConstSGD(0.01), device,
                                         userOptions=opts, name=name)
    else:
        opts.constantWeights = False
        session = popart.InferenceSession(proto, flow, device, userOptions=opts, name=name)
    return session


def _run(session):
    session.prepareDevice()
    session.weightsFromHost()
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    session.run(popart.PyStepIO({"x": x}, session.initAnchorArrays()))


def check_report_files(directory) -> dict:
    """The three files exist and parse; returns the Report JSON."""
    for name in REPORT_FILES:
        assert (directory / name).is_file(), f"{name} missing in {directory}"
    report = json.loads((directory / "profile.json").read_text())
    assert report["execution"]["cyclesPerStep"] > 0
    assert report["compilation"]["ipus"][0]["totalBytes"] > 0
    trace = json.loads((directory / "trace.json").read_text())
    events = trace["traceEvents"]
    assert events and all({"ph", "pid", "name"} <= e.keys() for e in events)
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all({"tid", "ts", "dur"} <= e.keys() and e["dur"] >= 0 for e in spans)
    page = (directory / "profile.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    return report


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_engine_options_write_the_report(tmp_path, training, monkeypatch):
    monkeypatch.delenv(auto.ENV_ENGINE_OPTIONS, raising=False)
    session = _session(training, {"autoReport.all": "true",
                                  "autoReport.directory": str(tmp_path)}, "net")
    session.prepareDevice()
    report = check_report_files(tmp_path / "net")
    assert report["execution"]["runs"] == 0
    session.weightsFromHost()
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    session.run(popart.PyStepIO({"x": x}, session.initAnchorArrays()))
    assert check_report_files(tmp_path / "net")["execution"]["runs"] == 1


def test_environment_variable_writes_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv(auto.ENV_ENGINE_OPTIONS, json.dumps(
        {"autoReport.all": "true", "autoReport.directory": str(tmp_path / "env")}))
    session = _session(False, None, "inference")
    _run(session)
    check_report_files(tmp_path / "env" / "inference")
    assert "Execution profiling not enabled" not in session.getSummaryReport()


def test_environment_variable_without_directory_writes_to_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(auto.ENV_ENGINE_OPTIONS, '{"autoReport.all": "true"}')
    _run(_session(False, None, "inference"))
    check_report_files(tmp_path / "inference")


@pytest.mark.parametrize("engine_opts", [None, {"autoReport.all": "true"},
                                         {"autoReport.all": "false", "autoReport.directory": "d"}])
def test_nothing_written_without_profiling_or_directory(tmp_path, monkeypatch, engine_opts):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(auto.ENV_ENGINE_OPTIONS, raising=False)
    _run(_session(False, engine_opts, "inference"))
    assert list(tmp_path.iterdir()) == []


def test_bad_environment_variable_is_refused(monkeypatch):
    monkeypatch.setenv(auto.ENV_ENGINE_OPTIONS, "autoReport.all=true")
    with pytest.raises(popart.popart_exception, match="POPLAR_ENGINE_OPTIONS"):
        engine_options(popart.SessionOptions())


def test_environment_wins_over_session_options(tmp_path, monkeypatch):
    opts = popart.SessionOptions()
    opts.engineOptions = {"autoReport.all": "true", "autoReport.directory": "a"}
    monkeypatch.setenv(auto.ENV_ENGINE_OPTIONS, '{"autoReport.directory": "b"}')
    assert report_directory(opts, "s") == report_directory(opts, "s").parent.parent / "b" / "s"


def test_unread_engine_options_log_once(monkeypatch, caplog):
    monkeypatch.delenv(auto.ENV_ENGINE_OPTIONS, raising=False)
    monkeypatch.setattr(auto, "_LOGGED", set())
    opts = popart.SessionOptions()
    opts.engineOptions = {"autoReport.all": "true", "opt.internalExchangeOptimisationTarget":
                          "memory"}
    with caplog.at_level(logging.WARNING, logger="popart:session"):
        engine_options(opts)
        engine_options(opts)
    lines = [r for r in caplog.records if "internalExchange" in r.getMessage()]
    assert len(lines) == 1 and "no effect" in lines[0].getMessage()
