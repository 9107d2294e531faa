"""benchmarks/bert_large_fit.py at a tiny scale (docs/device_model.md §4), so its path cannot rot:
a 4-layer BERT of hidden 64 exported to ONNX in float16, split [1, 1, 1, 1] over a 4-IPU
pipeline with the published configuration's options (replication 4, gradient accumulation,
LAMB, optimizer state off chip with replicated tensor sharding, per-IPU available memory
proportions, pipeline recomputation, Bow IPUs), analysed by the compile-time device model."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

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
    bench.export_bert(path, 4, PUBLISHED.micro_batch, PUBLISHED.seq, TINY)
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
