"""Profiling reports (report/; spec §4.7, F54, F55): switch, summary text, Report JSON and the
Chrome trace with one track per IPU, the host and the IPU-Links."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from popart_backend.dataflow import AnchorReturnType, DataFlow
from popart_backend.device.analysis import analyse
from popart_backend.device.lower import lower
from popart_backend.device.manager import DeviceManager
from popart_backend.device.transfers import BatchInfo
from popart_backend.importer.onnx_model import import_model
from popart_backend.options.session_options import SessionOptions
from popart_backend.report import (
    PROFILING_DISABLED,
    Report,
    chrome_trace,
    profiling_enabled,
    summary_text,
)


def _model(two_ipus: bool = False):
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32), "w")])
    ir = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    ir.anchors = ["y"]
    if two_ipus:
        relu = ir.main.tensors["y"].producer
        relu.settings = dataclasses.replace(relu.settings, ipu=1)
    device = DeviceManager().createIpuModelDevice({"tilesPerIPU": 4, "numIPUs": 2})
    program = lower(ir, DataFlow(3, {"y": AnchorReturnType("All")}))
    batch = BatchInfo.from_program(program)
    return analyse(ir, program.schedule, device, SessionOptions(), batch)


def test_profiling_is_off_by_default():
    opts = SessionOptions()
    assert not profiling_enabled(opts)
    opts.engineOptions = {"autoReport.all": "true"}
    assert profiling_enabled(opts)
    assert PROFILING_DISABLED == "Execution profiling not enabled"


def test_batch_info_from_program():
    batch = _model().cycles.batch
    assert (batch.batches_per_step, batch.samples_per_micro_batch) == (3, 8)
    assert batch.input_bytes_per_micro_batch == 8 * 32 * 4
    assert batch.anchor_bytes_per_step == 3 * 8 * 16 * 4  # y returned every batch
    assert batch.samples_per_step == 24


def test_summary_text():
    model = _model()
    text = summary_text(model, runs=2)
    assert "IpuModel ipu2" in text and "IPU 0:" in text
    assert "weights 2.00 KiB" in text  # 32 x 16 f32
    assert f"cycles per step: {model.cycles.step_cycles}" in text
    assert "samples/s" in text and "utilisation" in text
    assert f"total cycles: {2 * model.cycles.step_cycles}" in text


def test_report_json(tmp_path):
    model = _model()
    report = Report(model, runs=2)
    report.to_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    (ipu,) = data["compilation"]["ipus"]
    assert ipu["categories"]["weights"] == 32 * 16 * 4
    assert len(ipu["tileBytes"]) == 4 and max(ipu["tileBytes"]) == ipu["worstTileBytes"]
    data_tensors = [t for t in ipu["largestTensors"] if t["category"] != "planner temporaries"]
    assert data_tensors[0]["id"] == "w"
    ex = data["execution"]
    assert ex["runs"] == 2 and ex["totalCycles"] == 2 * ex["cyclesPerStep"]
    assert [o["type"] for o in ex["ops"]] == ["MatMul", "Relu"]


def _tracks(trace: dict) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def test_chrome_trace_tracks(tmp_path):
    model = _model(two_ipus=True)
    Report(model).to_chrome_trace(tmp_path / "t.json")
    trace = json.loads((tmp_path / "t.json").read_text())
    tracks = _tracks(trace)
    assert sorted(tracks.values()) == ["IPU 0", "IPU 1", "IPU-Link", "host"]
    by_track = {name: [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == tid]
                for tid, name in tracks.items()}
    assert by_track["IPU 0"][0]["name"].startswith("MatMul")
    assert by_track["IPU 1"][0]["name"].startswith("Relu")
    assert by_track["IPU-Link"][0]["args"]["bytes"] == 8 * 16 * 4  # h crosses to IPU 1
    host = [e["name"] for e in by_track["host"]]
    assert host[:2] == ["inputs 0", "inputs 1"] and host[-1] == "anchors"
    # Events follow each other and end at the step's length.
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    end = max(e["ts"] + e["dur"] for e in xs)
    assert end * model.spec.clock_hz / 1e6 == pytest.approx(model.cycles.step_cycles, rel=1e-9)


def test_long_steps_are_drawn_as_blocks():
    model = _model()
    model.cycles.batch = dataclasses.replace(model.cycles.batch, batches_per_step=1000)
    events = [e for e in chrome_trace(model)["traceEvents"] if e["ph"] == "X"]
    assert len(events) < 700
    end = max(e["ts"] + e["dur"] for e in events)
    assert abs(end * model.spec.clock_hz / 1e6 - model.cycles.step_cycles) < 1e-3
