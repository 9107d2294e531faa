"""Fidelity check of the memory model (docs/device_model.md): does BERT-Large train on 1, 2 or 4
Mk2 IPUs?

Graphcore's public BERT training applications for the IPU-M2000 pipeline BERT-Large over 4 Mk2
IPUs: the embeddings and the first 3 encoder layers on IPU 0, then 7 layers on each of IPUs 1-3,
in half precision. This script builds a BERT-Large-shaped model from a ``transformers``
``BertConfig`` (hidden 1024, 24 layers, 16 heads, FFN 4096, vocabulary 30522, sequences of 128
tokens), exports it to ONNX in float16 with the TorchScript exporter (one trace, no training),
annotates each node with the IPU and pipeline stage of its layer, and asks the simulator's
compile-time models for the verdict of a training step (Lamb optimizer, gradient accumulation):

- 1 IPU: no split;
- 2 IPUs: 12 + 12 layers (embeddings with the first half), pipelined;
- 4 IPUs: 3 + 7 + 7 + 7 layers (Graphcore's split), pipelined;

each with the optimizer state on chip and off chip (streaming memory), with pipeline
recomputation on the pipelined splits. Nothing is run on the
simulator: the ONNX is imported, the training passes run, and the memory and cycle models
analyse the schedule (as ``prepareDevice()`` does before it raises OutOfMemoryException).

The head is simplified: the loss is the mean of the encoder output (Graphcore's applications
add the masked-LM and next-sentence heads, whose decoder shares the embedding matrix on
IPU 0), so IPU 0 holds a little less here than in the published runs.

    python benchmarks/bert_large_fit.py [--layers 24] [--micro-batch 8] [--seq 128]

The numbers and their reading are in docs/device_model.md §4 (about 4 minutes on 2 cores,
most of it the export; ~2 GB of memory).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import onnx
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import popart_backend as popart  # noqa: E402
from popart_backend.dataflow import AnchorReturnType, DataFlow  # noqa: E402
from popart_backend.device.analysis import analyse  # noqa: E402
from popart_backend.device.transfers import BatchInfo  # noqa: E402
from popart_backend.device.lower import lower  # noqa: E402
from popart_backend.device.memory import format_bytes  # noqa: E402
from popart_backend.importer.onnx_model import import_model, load_model  # noqa: E402
from popart_backend.transforms.pipeline import run_passes, training_passes  # noqa: E402

# IPU configurations: name -> layers per IPU (the embeddings go with the first IPU).
SPLITS = {"1 IPU": [24], "2 IPUs": [12, 12], "4 IPUs (Graphcore's split)": [3, 7, 7, 7]}


class _Bert(torch.nn.Module):
    """BertModel + a scalar loss (mean of the encoder output, in float32)."""

    def __init__(self, config):
        super().__init__()
        from transformers import BertModel

        self.bert = BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.bert(input_ids=input_ids, token_type_ids=token_type_ids,
                        attention_mask=attention_mask).last_hidden_state
        return out.float().mean()


def export_bert(path: Path, layers: int, micro_batch: int, seq: int) -> None:
    from transformers import BertConfig

    config = BertConfig(hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
                        intermediate_size=4096, vocab_size=30522, max_position_embeddings=512,
                        hidden_act="gelu", attn_implementation="eager")
    torch.manual_seed(0)
    model = _Bert(config).half().eval()
    ids = torch.zeros((micro_batch, seq), dtype=torch.int64)
    mask = torch.ones((micro_batch, seq), dtype=torch.int64)
    with torch.no_grad():
        torch.onnx.export(model, (ids, ids, mask), str(path), input_names=[
            "input_ids", "token_type_ids", "attention_mask"], output_names=["loss"],
            opset_version=17, dynamo=False, do_constant_folding=False)


def annotate(proto: onnx.ModelProto, layers_per_ipu: list[int]) -> onnx.ModelProto:
    """Put every node on the IPU (and pipeline stage) of the encoder layer it belongs to; nodes
    before the first layer (embeddings) on IPU 0, after the last (loss) on the last IPU."""
    first_layer = [sum(layers_per_ipu[:i]) for i in range(len(layers_per_ipu))]
    ipu_of_layer = {layer: ipu for ipu, start in enumerate(first_layer)
                    for layer in range(start, start + layers_per_ipu[ipu])}
    current = 0
    for node in proto.graph.node:
        marker = "/encoder/layer."
        if marker in node.name:
            layer = int(node.name.split(marker)[1].split("/")[0])
            current = max(current, ipu_of_layer[layer])
        if len(layers_per_ipu) > 1:
            node.attribute.extend([onnx.helper.make_attribute("__ipu_number", current),
                                   onnx.helper.make_attribute("__pipeline_stage", current)])
    return proto


def verdict(path: Path, layers_per_ipu: list[int], micro_batch: int, accumulation: int,
            off_chip: bool, recompute: str = "pipeline"):
    ipus = len(layers_per_ipu)
    loaded = load_model(str(path))
    annotate(loaded.proto, layers_per_ipu)
    opts = popart.SessionOptions()
    if ipus > 1:
        opts.virtualGraphMode = popart.VirtualGraphMode.Manual
        opts.enablePipelining = True
    opts.enableGradientAccumulation = True
    opts.accumulationFactor = accumulation
    # Pipeline: only stage inputs are stashed, each stage recomputes its forward in the
    # backward pass; a single IPU has no stages, so it recomputes with checkpoints (Standard).
    opts.autoRecomputation = (popart.RecomputationType.Pipeline
                              if recompute == "pipeline" and ipus > 1
                              else popart.RecomputationType.Standard)
    if off_chip:
        opts.optimizerStateTensorLocationSettings = popart.TensorLocationSettings(
            popart.TensorStorage.OffChip)
    optimizer = popart.Adam({"defaultLearningRate": (1e-3, False)}, mode=popart.AdamMode.Lamb,
                            accum_type=popart.DataType.FLOAT16,
                            accl1_type=popart.DataType.FLOAT, accl2_type=popart.DataType.FLOAT)
    ir = import_model(loaded)
    ir.anchors = ["loss"]
    run_passes(ir, training_passes(opts, "loss", optimizer, accumulation, 1, ipus, 1))
    flow = DataFlow(1, {"loss": AnchorReturnType("Final")})
    program = lower(ir, flow, 1, accumulation)
    device = popart.DeviceManager().createOfflineIPUDevice({"numIPUs": ipus})
    model = analyse(ir, program.schedule, device, opts, BatchInfo.from_program(program),
                    program=program, model=loaded.proto)
    return model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--accumulation", type=int, default=16)
    parser.add_argument("--recompute", choices=("pipeline", "standard"), default="pipeline",
                        help="autoRecomputation of the pipelined splits (default pipeline)")
    args = parser.parse_args(argv)
    scale = args.layers / 24
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bert.onnx"
        start = time.perf_counter()
        export_bert(path, args.layers, args.micro_batch, args.seq)
        print(f"exported BERT ({args.layers} layers, micro-batch {args.micro_batch}, seq "
              f"{args.seq}, float16) in {time.perf_counter() - start:.0f} s")
        for name, split in SPLITS.items():
            split = [max(1, round(n * scale)) for n in split]
            for off_chip in (False, True):
                start = time.perf_counter()
                model = verdict(path, split, args.micro_batch, args.accumulation, off_chip,
                                args.recompute)
                where = "off chip" if off_chip else "on chip"
                print(f"\n{name}, layers {split}, optimizer state {where}: "
                      f"{'FITS' if model.memory.fits else 'DOES NOT FIT'} "
                      f"({time.perf_counter() - start:.0f} s)")
                for m in model.memory.ipus:
                    cats = ", ".join(f"{k} {format_bytes(v)}" for k, v in m.categories.items()
                                     if v)
                    print(f"  IPU {m.ipu}: {format_bytes(m.total_bytes)} of "
                          f"{format_bytes(m.capacity_bytes)} ({100 * m.utilisation:.0f}%), "
                          f"fullest tile {format_bytes(m.worst_tile_bytes)} of "
                          f"{format_bytes(m.tile_bytes)}"
                          + ("" if m.fits else "  OUT OF MEMORY")
                          + (f"; off chip {format_bytes(m.streaming_bytes)}"
                             if m.streaming_bytes else ""))
                    print(f"    {cats}")
                c = model.cycles
                print(f"  step ({args.accumulation} micro-batches): {c.step_seconds * 1e3:.1f} ms, "
                      f"{c.samples_per_second:.0f} samples/s per replica")
                del model
                gc.collect()


if __name__ == "__main__":
    main()
