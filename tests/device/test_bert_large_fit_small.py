"""benchmarks/bert_large_fit.py at a tiny scale (docs/device_model.md §4), so its path cannot rot:
a 4-layer BERT of hidden 64 written as ONNX in float16 (external zero initializers), split
[1, 1, 1, 1] over a 4-IPU pipeline with the published configuration's options (replication 4,
gradient accumulation, LAMB, optimizer state off chip with replicated tensor sharding, per-IPU
available memory proportions, pipeline recomputation), prepared through the public API on an
offline Bow (ipu21) device."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bert_large_fit",
                                                  ROOT / "benchmarks" / "bert_large_fit.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = _bench()
TINY = bench.BertShape(hidden=64, heads=2, ffn=128, vocab=128)
PUBLISHED = dataclasses.replace(bench.BERT_LARGE_SEQ128, layers_per_ipu=(1, 1, 1, 1),
                                micro_batch=2, accumulation=8, seq=16)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    bench.write_bert(path, [1, 1, 1, 1], PUBLISHED.micro_batch, PUBLISHED.seq, TINY,
                     PUBLISHED.available_memory)
    return bench.run_published(path, PUBLISHED, [1, 1, 1, 1], PUBLISHED.accumulation,
                               comparable=False)


def test_small_bert_fit_prints_verdict_and_throughput_ratio(run):
    model, lines = run
    text = "\n".join(lines)
    assert model.memory.fits and "FITS" in lines[0]
    assert [m.ipu for m in model.memory.ipus] == [0, 1, 2, 3]
    # The throughput of all replicas: samples of a step over the step time.
    samples = PUBLISHED.micro_batch * PUBLISHED.accumulation * PUBLISHED.replicas
    estimate = samples / model.cycles.step_seconds
    match = re.search(r"estimated (\d+) sequences/s on 16 IPUs; published 5179 sequences/s "
                      r"\(Bow Pod16\); ratio ([\d.]+) \(a cut", text)
    assert match, text
    assert int(match.group(1)) == pytest.approx(estimate, abs=1)
    assert float(match.group(2)) == pytest.approx(estimate / 5179, abs=0.006)


def test_small_bert_fit_uses_the_published_options(run):
    model, _ = run
    for m in model.memory.ipus:
        # LAMB state (two float32 moments per weight) lives off chip, sharded over 4 replicas.
        assert m.streaming_bytes > 0
        assert not m.categories.get("optimizer state")
    assert model.cycles.batch.replication_factor == 4
    assert model.cycles.batch.accumulation_factor == PUBLISHED.accumulation


def test_small_bert_fit_matmuls_carry_their_ipus_available_memory(tmp_path):
    path = bench.write_bert(tmp_path / "bert.onnx", [1, 1, 1, 1], 2, 16, TINY,
                            PUBLISHED.available_memory)
    model = onnx.load(str(path), load_external_data=False)
    seen = set()
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "MatMul":
            ipu = attrs["__ipu_number"]
            assert attrs["__available_memory"] == pytest.approx(PUBLISHED.available_memory[ipu])
            seen.add(ipu)
        assert attrs["__pipeline_stage"] == attrs["__ipu_number"]
    assert seen == {0, 1, 2, 3}
    # Every initializer is external (a sparse file of zeros) with the shape's byte length.
    for init in model.graph.initializer:
        info = {e.key: int(e.value) for e in init.external_data if e.key == "length"}
        assert info["length"] == 2 * int(np.prod(init.dims))


def test_small_bert_fit_prepares_on_an_offline_bow_device(run):
    """The script prepares on an offline device (no storage: tests/device/
    test_offline_no_allocation.py) of the published IPU version."""
    model, lines = run
    assert model.device.startswith("OfflineIpu ipu21 x16"), model.device
    assert "prepared in" in lines[0]
