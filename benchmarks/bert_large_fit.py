"""Fidelity check of the device model (docs/device_model.md): does BERT-Large pretraining
fit, and how fast does the simulated IPU say it runs, next to what Graphcore published?

The published configuration (Graphcore's released PopART BERT-Large pretraining, phase 1,
sequence 128): 24 encoder layers split [3, 7, 7, 7] over a 4-IPU pipeline (the embeddings with
the first 3 layers), micro-batch 8, replication 4, gradient accumulation 2048, LAMB, float16,
optimizer state off chip with replicated tensor sharding, available memory proportion
[0.15, 0.25, 0.25, 0.25] per IPU, recomputation; it ran at 5,179 sequences/s on a Bow Pod16.

This script builds a BERT-shaped model from a ``transformers`` ``BertConfig`` (hidden 1024,
16 heads, FFN 4096, vocabulary 30522), exports it to ONNX in float16 with the TorchScript
exporter (one trace, no training), annotates each node with the IPU and pipeline stage of its
layer and each matmul with its IPU's available memory proportion, runs the training passes and
asks the compile-time memory and cycle models for the verdict, on an offline Bow (ipu21)
device. Nothing is run and no device storage is allocated. It prints the fit verdict per IPU
and the estimated sequences/s of all replicas next to the published figure, with the ratio.

The head is simplified: the loss is the mean of the encoder output (Graphcore's applications
add the masked-LM and next-sentence heads, whose decoder shares the embedding matrix on
IPU 0), so IPU 0 holds a little less here than in the published runs.

    python benchmarks/bert_large_fit.py [--layers 24] [--accumulation 2048] [--sweep]

``--layers N`` keeps the 4-IPU split in proportion (a cut, whose throughput is not comparable
with the published figure: the script says so). ``--sweep`` also prints the older table: 1, 2
and 4 Mk2 IPUs without replication, optimizer state on chip and off chip.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from dataclasses import dataclass
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

# The older sweep (--sweep): name -> layers per IPU (the embeddings go with the first IPU).
SPLITS = {"1 IPU": [24], "2 IPUs": [12, 12], "4 IPUs (Graphcore's split)": [3, 7, 7, 7]}


@dataclass(frozen=True)
class Published:
    """A configuration Graphcore released and ran, with its measured throughput."""

    layers_per_ipu: tuple[int, ...]
    micro_batch: int
    replicas: int
    accumulation: int
    seq: int
    available_memory: tuple[float, ...]  # per IPU of a replica
    ipu_version: str
    system: str
    sequences_per_second: float


# Graphcore's released PopART BERT-Large pretraining (phase 1, sequence 128) on a Bow Pod16.
BERT_LARGE_SEQ128 = Published(
    layers_per_ipu=(3, 7, 7, 7), micro_batch=8, replicas=4, accumulation=2048, seq=128,
    available_memory=(0.15, 0.25, 0.25, 0.25), ipu_version="ipu21", system="Bow Pod16",
    sequences_per_second=5179.0)


@dataclass(frozen=True)
class BertShape:
    hidden: int = 1024
    heads: int = 16
    ffn: int = 4096
    vocab: int = 30522


BERT_LARGE = BertShape()


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


def export_bert(path: Path, layers: int, micro_batch: int, seq: int,
                shape: BertShape = BERT_LARGE) -> None:
    from transformers import BertConfig

    config = BertConfig(hidden_size=shape.hidden, num_hidden_layers=layers,
                        num_attention_heads=shape.heads, intermediate_size=shape.ffn,
                        vocab_size=shape.vocab, max_position_embeddings=max(512, seq),
                        hidden_act="gelu", attn_implementation="eager")
    torch.manual_seed(0)
    model = _Bert(config).half().eval()
    ids = torch.zeros((micro_batch, seq), dtype=torch.int64)
    mask = torch.ones((micro_batch, seq), dtype=torch.int64)
    with torch.no_grad():
        torch.onnx.export(model, (ids, ids, mask), str(path), input_names=[
            "input_ids", "token_type_ids", "attention_mask"], output_names=["loss"],
            opset_version=17, dynamo=False, do_constant_folding=False)
    del model
    gc.collect()


# Nodes whose plan the available memory proportion constrains (builder.setAvailableMemoryProportion).
_PLANNED = ("MatMul", "Gemm", "Conv")


def annotate(proto: onnx.ModelProto, layers_per_ipu: list[int],
             available_memory: tuple[float, ...] | None = None) -> onnx.ModelProto:
    """Put every node on the IPU (and pipeline stage) of the encoder layer it belongs to; nodes
    before the first layer (embeddings) on IPU 0, after the last (loss) on the last IPU. With
    ``available_memory`` each matmul gets its IPU's proportion (``__available_memory``)."""
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
        if available_memory is not None and node.op_type in _PLANNED:
            node.attribute.append(onnx.helper.make_attribute(
                "__available_memory", float(available_memory[current])))
    return proto


def verdict(path: Path, layers_per_ipu: list[int], micro_batch: int, accumulation: int,
            off_chip: bool, recompute: str = "pipeline", replicas: int = 1, rts: bool = False,
            available_memory: tuple[float, ...] | None = None, ipu_version: str = "ipu2"):
    """The device model of one training configuration (nothing is run or allocated)."""
    ipus = len(layers_per_ipu)
    loaded = load_model(str(path))
    annotate(loaded.proto, layers_per_ipu, available_memory)
    opts = popart.SessionOptions()
    if ipus > 1:
        opts.virtualGraphMode = popart.VirtualGraphMode.Manual
        opts.enablePipelining = True
    opts.enableGradientAccumulation = True
    opts.accumulationFactor = accumulation
    if replicas > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = replicas
    # Pipeline: only stage inputs are stashed, each stage recomputes its forward in the
    # backward pass; a single IPU has no stages, so it recomputes with checkpoints (Standard).
    opts.autoRecomputation = (popart.RecomputationType.Pipeline
                              if recompute == "pipeline" and ipus > 1
                              else popart.RecomputationType.Standard)
    if off_chip or rts:
        storage = popart.TensorStorage.OffChip if off_chip else popart.TensorStorage.OnChip
        sharding = (popart.ReplicatedTensorSharding.On if rts
                    else popart.ReplicatedTensorSharding.Off)
        opts.optimizerStateTensorLocationSettings = popart.TensorLocationSettings(
            popart.TensorLocation(storage, sharding))
    optimizer = popart.Adam({"defaultLearningRate": (1e-3, False)}, mode=popart.AdamMode.Lamb,
                            accum_type=popart.DataType.FLOAT16,
                            accl1_type=popart.DataType.FLOAT, accl2_type=popart.DataType.FLOAT)
    ir = import_model(loaded)
    ir.anchors = ["loss"]
    run_passes(ir, training_passes(opts, "loss", optimizer, accumulation, replicas, ipus, 1))
    flow = DataFlow(1, {"loss": AnchorReturnType("Final")})
    program = lower(ir, flow, replicas, accumulation)
    device = popart.DeviceManager().createOfflineIPUDevice(
        {"numIPUs": ipus * replicas, "ipuVersion": ipu_version})
    return analyse(ir, program.schedule, device, opts, BatchInfo.from_program(program),
                   program=program, model=loaded.proto)


def memory_lines(model) -> list[str]:
    lines = []
    for m in model.memory.ipus:
        cats = ", ".join(f"{k} {format_bytes(v)}" for k, v in m.categories.items() if v)
        lines.append(f"  IPU {m.ipu}: {format_bytes(m.total_bytes)} of "
                     f"{format_bytes(m.capacity_bytes)} ({100 * m.utilisation:.0f}%), "
                     f"fullest tile {format_bytes(m.worst_tile_bytes)} of "
                     f"{format_bytes(m.tile_bytes)}"
                     + ("" if m.fits else "  OUT OF MEMORY")
                     + (f"; off chip {format_bytes(m.streaming_bytes)}"
                        if m.streaming_bytes else ""))
        lines.append(f"    {cats}")
    return lines


def comparison_line(model, published: Published, comparable: bool = True) -> str:
    """Estimated throughput of all replicas next to the published figure, with the ratio."""
    estimate = model.cycles.samples_per_second
    ratio = estimate / published.sequences_per_second
    ipus = len(published.layers_per_ipu) * published.replicas
    line = (f"estimated {estimate:.0f} sequences/s on {ipus} IPUs; published "
            f"{published.sequences_per_second:.0f} sequences/s ({published.system}); "
            f"ratio {ratio:.2f}")
    return line if comparable else line + " (a cut of the model: not comparable)"


def run_published(path: Path, published: Published, layers_per_ipu: list[int],
                  accumulation: int, comparable: bool) -> tuple[object, list[str]]:
    """The published configuration (or a cut of it): (device model, printed lines)."""
    start = time.perf_counter()
    model = verdict(path, layers_per_ipu, published.micro_batch, accumulation, off_chip=True,
                    replicas=published.replicas, rts=True,
                    available_memory=published.available_memory,
                    ipu_version=published.ipu_version)
    c = model.cycles
    lines = [f"published configuration, layers {layers_per_ipu}, micro-batch "
             f"{published.micro_batch}, replication {published.replicas}, accumulation "
             f"{accumulation}, {published.ipu_version}: "
             f"{'FITS' if model.memory.fits else 'DOES NOT FIT'} "
             f"({time.perf_counter() - start:.0f} s)",
             *memory_lines(model),
             f"  step ({accumulation} micro-batches per replica): {c.step_seconds * 1e3:.1f} ms",
             "  " + comparison_line(model, published, comparable)]
    return model, lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--accumulation", type=int,
                        default=BERT_LARGE_SEQ128.accumulation)
    parser.add_argument("--sweep", action="store_true",
                        help="also the older 1/2/4-IPU table (Mk2, no replication)")
    parser.add_argument("--recompute", choices=("pipeline", "standard"), default="pipeline",
                        help="autoRecomputation of the sweep's pipelined splits")
    args = parser.parse_args(argv)
    published = BERT_LARGE_SEQ128
    scale = args.layers / 24
    split = [max(1, round(n * scale)) for n in published.layers_per_ipu]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bert.onnx"
        start = time.perf_counter()
        export_bert(path, sum(split), published.micro_batch, published.seq)
        print(f"exported BERT ({sum(split)} layers, micro-batch {published.micro_batch}, seq "
              f"{published.seq}, float16) in {time.perf_counter() - start:.0f} s")
        comparable = args.layers == 24 and args.accumulation == published.accumulation
        model, lines = run_published(path, published, split, args.accumulation, comparable)
        print("\n".join(lines))
        del model
        gc.collect()
        if not args.sweep:
            return
        for name, sweep_split in SPLITS.items():
            sweep_split = [max(1, round(n * scale)) for n in sweep_split]
            for off_chip in (False, True):
                start = time.perf_counter()
                model = verdict(path, sweep_split, published.micro_batch, 16, off_chip,
                                args.recompute)
                where = "off chip" if off_chip else "on chip"
                print(f"\n{name}, layers {sweep_split}, optimizer state {where}: "
                      f"{'FITS' if model.memory.fits else 'DOES NOT FIT'} "
                      f"({time.perf_counter() - start:.0f} s)")
                print("\n".join(memory_lines(model)))
                c = model.cycles
                print(f"  step (16 micro-batches): {c.step_seconds * 1e3:.1f} ms, "
                      f"{c.samples_per_second:.0f} samples/s per replica")
                del model
                gc.collect()


if __name__ == "__main__":
    main()
