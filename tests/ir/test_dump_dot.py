"""IR dump JSON and DOT check points (spec §8; F98, F99)."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from popart_backend.errors import popart_exception
from popart_backend.importer.onnx_model import import_model
from popart_backend.ir.dot import DotWriter, parse_dot_checks
from popart_backend.ir.dump import dump_on_error, ir_to_json, maybe_dump_ir
from popart_backend.ir.op import RecomputeType
from popart_backend.optim.adam import Adam
from popart_backend.options.enums import DotCheck
from popart_backend.options.session_options import SessionOptions
from popart_backend.transforms.pipeline import inference_passes, run_passes, training_passes


def _ir():
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
         helper.make_node("Softmax", ["h"], ["s"], axis=1),
         helper.make_node("ReduceMean", ["s"], ["loss"], keepdims=0)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "w")])
    return import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_ir_dump_format():
    ir = _ir()
    fc = ir.main.tensors["h"].producer
    fc.settings = dataclasses.replace(fc.settings, ipu=1, pipeline_stage=0,
                                      recompute=RecomputeType.Recompute)
    dump = json.loads(json.dumps(ir_to_json(ir)))
    assert list(dump) == ["maingraph"]
    ops = dump["maingraph"]
    assert [o["type"] for o in ops] == ["MatMul", "Softmax", "ReduceMean"]  # op-id order
    mm = ops[0]
    assert mm == {
        "type": "MatMul", "version": "13", "domain": "ai.onnx", "name": "fc",
        "inputs": [{"name": "x", "shape": "[2 3]", "type": "FLOAT", "index": "0"},
                   {"name": "w", "shape": "[3 4]", "type": "FLOAT", "index": "1"}],
        "outputs": [{"name": "h", "index": "0"}],
        "attributes": {"recompute": "YES", "__ipu_number": "1", "tileSet": "Compute",
                       "__execution_context": "Normal", "__pipeline_stage": "0", "scope": "",
                       "schedulePriority": "0.0"},
    }
    softmax = ops[1]["attributes"]
    assert softmax["axis"] == "1" and softmax["recompute"] == "NO"
    assert "__ipu_number" not in softmax and "__pipeline_stage" not in softmax
    assert "__execution_phase" not in softmax

    def strings(value):
        if isinstance(value, dict):
            return all(strings(v) for v in value.values())
        if isinstance(value, list):
            return all(strings(v) for v in value)
        return isinstance(value, str)

    assert strings(dump)
    assert list(ir_to_json(ir, graph_name="mymodel")) == ["mymodel"]


def test_popart_ir_dump_env(tmp_path, monkeypatch):
    ir = _ir()
    path = tmp_path / "ir.json"
    maybe_dump_ir(ir)
    assert not path.exists()
    monkeypatch.setenv("POPART_IR_DUMP", str(path))
    maybe_dump_ir(ir)
    assert json.loads(path.read_text()) == ir_to_json(ir)
    path.unlink()
    with pytest.raises(popart_exception, match="boom"):
        with dump_on_error(lambda: ir):
            raise popart_exception("boom")
    assert "maingraph" in json.loads(path.read_text())


def test_parse_dot_checks():
    assert parse_dot_checks("FWD0:FINAL") == {DotCheck.Fwd0, DotCheck.Final}
    assert parse_dot_checks("") == set()
    with pytest.raises(popart_exception, match="Unrecognised dot check 'FWD9'"):
        parse_dot_checks("FWD0:FWD9")


_OP = re.compile(r'^"n_(\d+)" \[shape=box, label="(\d+)\. (\w+) \((\d+)\)( \(\d+:[^)]*\))?'
                 r'( vgid:\d+)?( pp:\d+)? ts:Compute"(, color="#6B8E23")?\];$')
_TENSOR = re.compile(r'^"([^"]+)" \[shape=egg, color=(red|gold|blue|black), '
                     r'label="\w+\[[\d,]*\] nc:\d+( in:\d+)?( out:\d+)?"\];$')
_EDGE = re.compile(r'^"([^"]+)" -> "([^"]+)" \[label="([^" ]+) \[[\d,]*\]"\];$')
_CONSTRAINT = re.compile(r'^"n_\d+" -> "n_\d+" \[color=grey, style=dotted\];$')


def _check_dot(text: str) -> dict[str, list[str]]:
    lines = text.strip().split("\n")
    assert lines[:2] == ["digraph net {", 'size="6,6";'] and lines[-1] == "}"
    kinds: dict[str, list[str]] = {"op": [], "tensor": [], "edge": [], "constraint": []}
    for line in lines[2:-1]:
        for kind, pattern in (("op", _OP), ("tensor", _TENSOR), ("edge", _EDGE),
                              ("constraint", _CONSTRAINT)):
            if pattern.match(line):
                kinds[kind].append(line)
                break
        else:
            raise AssertionError(f"unexpected DOT line: {line}")
    return kinds


def test_training_checkpoints(tmp_path):
    opts = SessionOptions()
    opts.logDir = str(tmp_path)
    writer = DotWriter(opts, env={"POPART_DOT_CHECKS": "ALL"})
    ir = _ir()
    writer.write(ir, DotCheck.Fwd0)
    writer.run_passes(ir, training_passes(opts, "loss", Adam({}), 1), run_passes)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["bwd0_r.dot", "final_r.dot", "fwd0_r.dot", "fwd1_r.dot", "prealias_r.dot"]
    fwd0 = _check_dot((tmp_path / "fwd0_r.dot").read_text())
    assert [re.search(r"\. (\w+)", op).group(1) for op in fwd0["op"]] == [
        "MatMul", "Softmax", "ReduceMean"]
    text = (tmp_path / "fwd0_r.dot").read_text()
    assert '"x" [shape=egg, color=red, label="f32[2,3] nc:1 in:0"];' in text
    assert '"w" [shape=egg, color=blue, label="f32[3,4] nc:1"];' in text
    assert '"x" -> "n_0" [label="x [2,3]"];' in text
    assert '"n_0" -> "h" [label="h [2,4]"];' in text
    final = _check_dot((tmp_path / "final_r.dot").read_text())
    assert len(final["op"]) > len(fwd0["op"])
    assert any('color="#6B8E23"' in op for op in final["op"])  # in-place Adam update
    assert final["constraint"]  # the update waits for the weight's other readers


def test_inference_checkpoints_from_options(tmp_path):
    opts = SessionOptions()
    opts.logDir = str(tmp_path)
    opts.dotChecks = {DotCheck.Fwd1, DotCheck.Final}
    ir = _ir()
    DotWriter(opts, env={}).run_passes(ir, inference_passes(opts), run_passes)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_r.dot", "fwd1_r.dot"]


def test_dot_range_names_and_single_file(tmp_path):
    opts = SessionOptions()
    opts.logDir = str(tmp_path)
    opts.dotChecks = {DotCheck.Fwd0}
    opts.firstDotOp, opts.finalDotOp = 1, 2
    opts.dotOpNames = True
    opts.separateCallOpPdfs = False
    ir = _ir()
    softmax = ir.main.tensors["s"].producer
    softmax.settings = dataclasses.replace(softmax.settings, ipu=1)
    (path,) = DotWriter(opts, env={}).write(ir, DotCheck.Fwd0)
    assert path.name == "fwd0_all.dot"
    ops = _check_dot(path.read_text())["op"]
    assert len(ops) == 1 and 'label="1. Softmax (1) (1:s) vgid:1 ts:Compute"' in ops[0]
    opts.firstDotOp = 5
    with pytest.raises(popart_exception, match="Invalid dot range"):
        DotWriter(opts, env={}).write(ir, DotCheck.Fwd0)
    assert DotWriter(opts, env={}).write(ir, DotCheck.Final) == []  # not enabled
