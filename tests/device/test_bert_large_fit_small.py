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
# Accumulation 16: the released layout has 5 forward stages (the heads back on IPU 0), 9 in all.
PUBLISHED = dataclasses.replace(bench.BERT_LARGE_SEQ128, layers_per_ipu=(1, 1, 1, 1),
                                micro_batch=2, accumulation=16, seq=16)


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
                      r"\(Bow Pod16\); ratio ([\d.]+) \(not the published", text)
    assert match, text
    assert "not comparable" in text
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
    stages = {}
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "MatMul":
            ipu = attrs["__ipu_number"]
            assert attrs["__available_memory"] == pytest.approx(PUBLISHED.available_memory[ipu])
            seen.add(ipu)
        stages.setdefault(attrs["__pipeline_stage"], set()).add(attrs["__ipu_number"])
    assert seen == {0, 1, 2, 3}
    # Stages 0-3 on IPUs 0-3; the heads (stage 4) back on IPU 0 with the embedding matrix.
    assert stages == {0: {0}, 1: {1}, 2: {2}, 3: {3}, 4: {0}}
    decoder = [n for n in model.graph.node if n.op_type == "Transpose"
               and list(n.input) == ["embeddings.word"]]
    assert len(decoder) == 1
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


def _checkpoint_outputs(model: onnx.ModelProto) -> list[str]:
    return [n.input[0] for n in model.graph.node if n.op_type == "Identity" and any(
        a.name == "__recompute_output_in_backward_pass"
        and onnx.helper.get_attribute_value(a) == bench.RECOMPUTE_CHECKPOINT
        for a in n.attribute)]


def test_F70_small_bert_fit_checkpoints_every_layer_output(tmp_path):
    """As the released configuration: each encoder layer's output (its last layer norm) is a
    recomputation checkpoint; the checkpoints are what the pipeline stashes."""
    path = bench.write_bert(tmp_path / "bert.onnx", [1, 1, 1, 1], 2, 16, TINY,
                            PUBLISHED.available_memory)
    model = onnx.load(str(path), load_external_data=False)
    producers = {out: n for n in model.graph.node for out in n.output}
    checkpoints = _checkpoint_outputs(model)
    assert len(checkpoints) == 4
    assert all(producers[c].op_type == "LayerNormalization" for c in checkpoints)
    plain = bench.write_bert(tmp_path / "plain.onnx", [1, 1, 1, 1], 2, 16, TINY,
                             PUBLISHED.available_memory, checkpoints=False)
    assert _checkpoint_outputs(onnx.load(str(plain), load_external_data=False)) == []


def test_small_bert_fit_checkpoints_lower_the_recomputed_activations(tmp_path):
    """Two layers per stage: with a checkpoint per layer the backward recomputes one layer at
    a time, so fewer activations are live at the peak of a recomputed stage than without."""
    split = [1, 2, 2, 1]
    peaks = {}
    for checkpoints in (True, False):
        path = bench.write_bert(tmp_path / f"b{checkpoints}.onnx", split, 2, 16, TINY,
                                PUBLISHED.available_memory, checkpoints=checkpoints)
        model, status = bench.verdict(path, split, PUBLISHED.accumulation, off_chip=True,
                                      ipu_version="ipu21")
        assert status.isSuccessful()
        peaks[checkpoints] = model.memory.ipu(1).categories["activations"]
    assert peaks[True] < peaks[False]


def test_bert_large_cut_on_one_ipu_with_optimizer_state_on_chip_is_refused(tmp_path):
    """BERT-Large shapes (hidden 1024, vocabulary 30522), 4 layers on one Bow IPU, micro-batch
    8, LAMB state on chip: refused with OutOfMemoryException naming IPU 0. Reference: the
    always-live bytes from the parameter count alone (float16 weight and accumulator, two
    float32 LAMB moments) already exceed the IPU's SRAM, and the report counts at least them."""
    path = bench.write_bert(tmp_path / "bert.onnx", [4], 8, 128)
    onnx_model = onnx.load(str(path), load_external_data=False)
    params = sum(int(np.prod(init.dims)) for init in onnx_model.graph.initializer)
    floor = params * (2 + 2 + 4 + 4)
    sram = 1472 * 624 * 1024
    assert floor > sram
    with pytest.raises(bench.popart.OutOfMemoryException) as caught:
        bench.verdict(path, [4], 16, off_chip=False, ipu_version="ipu21", raise_oom=True)
    first = str(caught.value).splitlines()[0]
    assert first.startswith("Out of memory on IPU 0"), first
    needed = int(re.search(r"needs [\d.]+ \w+ \((\d+) bytes\)", first).group(1))
    assert needed >= floor
