"""Fidelity check of the device model (docs/device_model.md): does BERT-Large pretraining
fit, and how fast does the simulated IPU say it runs, next to what Graphcore published?

The published configuration (Graphcore's released PopART BERT-Large pretraining, phase 1,
sequence 128): 24 encoder layers split [3, 7, 7, 7] over a 4-IPU pipeline (the embeddings with
the first 3 layers), micro-batch 8, replication 4, gradient accumulation 2048, LAMB, float16,
optimizer state off chip with replicated tensor sharding, available memory proportion
[0.15, 0.25, 0.25, 0.25] per IPU, pipeline recomputation with a checkpoint per layer; it ran at 5,179 sequences/s on a Bow Pod16.

This script drives the public API only, as a user asking "will it fit" would: it writes a
BERT-shaped ONNX model (hidden 1024, 16 heads, FFN 4096, vocabulary 30522, float16) whose
initializers are external data in a sparse file of zeros (the model is never run, so only
the shapes matter and the file costs no disk and no time), with each node placed on the IPU
and pipeline stage of its layer and each matmul given its IPU's available memory proportion;
then builds a ``TrainingSession`` with the published options on an offline Bow (ipu21) device
and calls ``prepareDevice()``, which plans memory and cycles from shapes alone and allocates
no tensor storage. It prints the fit verdict per IPU (from ``getReport()``), the estimated
sequences/s of all replicas next to the published figure with the ratio, the wall time and
the peak host memory of the process.

As in the released configuration, every encoder layer's output is a recomputation checkpoint
(``Builder.checkpointOutput``), and the masked-LM and next-sentence heads run back on IPU 0 as
a fifth pipeline stage (the MLM decoder is the word embedding matrix). The heads' losses are
simplified (their shapes are the real ones) and the decoder matmul is not serialised.

    python benchmarks/bert_large_fit.py [--layers 24] [--accumulation 2048] [--sweep]
                                        [--simple-head] [--detach-lookup]

``--layers N`` keeps the 4-IPU split in proportion (a cut, whose throughput is not comparable
with the published figure: the script says so). ``--simple-head`` puts the loss (the mean of
the encoder output) on the last IPU instead of the heads on IPU 0; ``--detach-lookup`` detaches
the word embedding lookup, so only the decoder's gradient reaches the tied matrix (both are
what-ifs, not the published configuration). ``--sweep`` also prints the older table: 1, 2
and 4 Mk2 IPUs without replication, optimizer state on chip and off chip.
"""

from __future__ import annotations

import argparse
import gc
import math
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import popart_backend as popart  # noqa: E402

# ``RecomputeType.Checkpoint`` as the ``__recompute_output_in_backward_pass`` annotation holds it.
RECOMPUTE_CHECKPOINT = 1

# Masked tokens per sequence of 128 in the released pretraining data (phase 1).
MASKED_TOKENS = 20

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
    max_positions: int = 512


BERT_LARGE = BertShape()


class _OnnxWriter:
    """Nodes and float16 initializers of the model; every initializer is a slice of one
    external data file, which ``close`` extends (sparsely) to its full length."""

    def __init__(self, data_path: Path):
        self.data_path = data_path
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.offset = 0
        self.place: tuple[int, int] | None = None  # (IPU, stage) of the nodes made now
        self.available_memory: float | None = None
        self._count = 0

    def weight(self, name: str, shape: tuple[int, ...]) -> str:
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT16, dims=shape)
        length = 2 * math.prod(shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.data_path.name), ("offset", str(self.offset)),
                           ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.offset += -(-length // 64) * 64  # aligned, as onnx's writer does
        self.initializers.append(tensor)
        return name

    def const(self, values, dtype=np.int64) -> str:
        name = self._name("const")
        self.node("Constant", [], name, value=onnx.numpy_helper.from_array(
            np.asarray(values, dtype=dtype), name))
        return name

    def _name(self, kind: str) -> str:
        self._count += 1
        return f"{kind}_{self._count}"

    def node(self, op_type: str, inputs: list[str], output: str | None = None,
             domain: str = "", **attrs) -> str:
        output = output or self._name(op_type.lower())
        node = helper.make_node(op_type, inputs, [output], name=f"{op_type}_{self._count}",
                                domain=domain, **attrs)
        if self.place is not None:
            node.attribute.extend([helper.make_attribute("__ipu_number", self.place[0]),
                                   helper.make_attribute("__pipeline_stage", self.place[1])])
        if self.available_memory is not None and op_type in ("MatMul", "Gemm", "Conv"):
            node.attribute.append(helper.make_attribute("__available_memory",
                                                        float(self.available_memory)))
        self.nodes.append(node)
        return output

    def checkpoint(self, x: str) -> str:
        """``x`` through an Identity marked as a recomputation checkpoint, as
        ``Builder.checkpointOutput`` writes it: kept (stashed) for the backward pass, so the
        recomputation restarts from it rather than from the stage input."""
        output = self.node("Identity", [x])
        self.nodes[-1].attribute.append(helper.make_attribute(
            "__recompute_output_in_backward_pass", RECOMPUTE_CHECKPOINT))
        return output

    def close(self) -> None:
        with open(self.data_path, "wb") as f:
            f.truncate(self.offset)  # a hole: zeros, no disk blocks


def write_bert(path: Path, layers_per_ipu: list[int], micro_batch: int, seq: int,
               shape: BertShape = BERT_LARGE,
               available_memory: tuple[float, ...] | None = None,
               checkpoints: bool = True, pretraining_heads: bool = True,
               detach_lookup: bool = False) -> Path:
    """A BERT encoder (post-layer-norm, GELU, additive attention mask) in float16 with a
    scalar float32 loss, written to ``path`` (data next to it, in ``<name>.data``).

    The embeddings go with the first layer's IPU, the loss with the last. With more than one
    IPU every node has ``__ipu_number`` and ``__pipeline_stage``; with ``available_memory``
    every matmul has its IPU's proportion (``__available_memory``). With ``checkpoints``
    (the default, as Graphcore's released BERT does) every encoder layer's output is a
    recomputation checkpoint. With ``pretraining_heads`` (the default) the pretraining heads follow the
    encoder back on the first IPU, as in the released layout (``_heads``); without, the loss
    is the mean of the encoder output on the last IPU. ``detach_lookup`` detaches the word
    embedding lookup (a what-if: the word embeddings then learn from the decoder only)."""
    w = _OnnxWriter(path.with_suffix(".data"))
    h, heads, b, s = shape.hidden, shape.heads, micro_batch, seq
    d = h // heads
    pipelined = len(layers_per_ipu) > 1

    def at(ipu: int) -> None:
        w.place = (ipu, ipu) if pipelined else None
        w.available_memory = available_memory[ipu] if available_memory is not None else None

    def linear(x: str, name: str, n_in: int, n_out: int) -> str:
        y = w.node("MatMul", [x, w.weight(f"{name}.weight", (n_in, n_out))])
        return w.node("Add", [y, w.weight(f"{name}.bias", (n_out,))])

    def layer_norm(x: str, name: str) -> str:
        return w.node("LayerNormalization", [x, w.weight(f"{name}.gamma", (h,)),
                                             w.weight(f"{name}.beta", (h,))], axis=-1,
                      epsilon=1e-12)

    at(0)
    table = w.weight("embeddings.word", (shape.vocab, h))
    if detach_lookup:  # only the tied MLM decoder's gradient reaches the word embeddings
        table = w.node("Detach", [table], domain="ai.graphcore")
    word = w.node("Gather", [table, "input_ids"])
    positions = w.node("Gather", [w.weight("embeddings.position", (shape.max_positions, h)),
                                  w.const(np.arange(s), np.int32)])
    types = w.node("Gather", [w.weight("embeddings.token_type", (2, h)), "token_type_ids"])
    x = layer_norm(w.node("Add", [w.node("Add", [word, positions]), types]), "embeddings.ln")
    # The additive mask (0 where attended, -10000 where padded), made once on IPU 0.
    keep = w.node("Cast", [w.node("Reshape", ["attention_mask", w.const([b, 1, 1, s])])],
                  to=TensorProto.FLOAT16)
    mask = w.node("Mul", [w.node("Sub", [w.const(np.array(1), np.float16), keep]),
                          w.const(np.array(-10000), np.float16)])
    heads_shape = w.const([b, s, heads, d])
    hidden_shape = w.const([b, s, h])
    scale = w.const(np.array(1 / math.sqrt(d)), np.float16)
    layer = 0
    for ipu, count in enumerate(layers_per_ipu):
        at(ipu)
        for _ in range(count):
            name = f"encoder.layer.{layer}"
            q, k, v = (w.node("Reshape", [linear(x, f"{name}.attention.{p}", h, h),
                                          heads_shape]) for p in "qkv")
            q = w.node("Transpose", [q], perm=[0, 2, 1, 3])
            k = w.node("Transpose", [k], perm=[0, 2, 3, 1])
            v = w.node("Transpose", [v], perm=[0, 2, 1, 3])
            scores = w.node("Add", [w.node("Mul", [w.node("MatMul", [q, k]), scale]),
                                    mask])
            context = w.node("MatMul", [w.node("Softmax", [scores], axis=-1), v])
            context = w.node("Reshape", [w.node("Transpose", [context], perm=[0, 2, 1, 3]),
                                         hidden_shape])
            x = layer_norm(w.node("Add", [linear(context, f"{name}.attention.out", h, h), x]),
                           f"{name}.attention.ln")
            inner = w.node("Gelu", [linear(x, f"{name}.ffn.in", h, shape.ffn)],
                           domain="ai.graphcore")
            x = layer_norm(w.node("Add", [linear(inner, f"{name}.ffn.out", shape.ffn, h), x]),
                           f"{name}.ffn.ln")
            if checkpoints:
                x = w.checkpoint(x)
            layer += 1
    if pretraining_heads:
        _heads(w, x, b, s, shape, layer_norm, linear, stage=len(layers_per_ipu),
               available_memory=available_memory)
    else:
        w.node("ReduceMean", [w.node("Cast", [x], to=TensorProto.FLOAT)], "loss", keepdims=0)
    w.close()
    graph = helper.make_graph(
        w.nodes, "bert",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT32, [b, s]),
         helper.make_tensor_value_info("token_type_ids", TensorProto.INT32, [b, s]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT32, [b, s])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], w.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.graphcore", 1)])
    path.write_bytes(model.SerializeToString())
    return path


def _heads(w: _OnnxWriter, x: str, b: int, s: int, shape: BertShape, layer_norm, linear,
           stage: int, available_memory: tuple[float, ...] | None) -> None:
    """The masked-LM and next-sentence heads with a scalar float32 loss ``loss``.

    As in Graphcore's released BERT, they run on IPU 0 (the MLM decoder is the word
    embedding matrix, transposed, so it stays with the embeddings) as the last pipeline
    stage, and the MLM head sees only the ``MASKED_TOKENS`` positions at the start of each
    sequence (their data pipeline puts the masked tokens first). The losses are simplified
    (the means of the log-softmaxes): the shapes, hence memory and cycles, are the real
    ones, except that the released runs also split the decoder matmul over the vocabulary
    (serialisation), which is not modelled here."""
    if stage > 1:  # pipelined: a stage of its own on IPU 0
        w.place = (0, stage)
    w.available_memory = available_memory[0] if available_memory is not None else None
    h = shape.hidden
    masked = w.node("Slice", [x, w.const([0]), w.const([min(MASKED_TOKENS, s)]),
                              w.const([1])])
    t = layer_norm(w.node("Gelu", [linear(masked, "cls.transform", h, h)],
                          domain="ai.graphcore"), "cls.transform.ln")
    decoder = w.node("Transpose", ["embeddings.word"], perm=[1, 0])
    logits = w.node("Add", [w.node("MatMul", [t, decoder]),
                            w.weight("cls.decoder.bias", (shape.vocab,))])
    mlm = w.node("ReduceMean", [w.node("LogSoftmax", [w.node("Cast", [logits],
                                                               to=TensorProto.FLOAT)],
                                       axis=-1)], keepdims=0)
    first = w.node("Reshape", [w.node("Slice", [x, w.const([0]), w.const([1]), w.const([1])]),
                               w.const([b, h])])
    pooled = w.node("Tanh", [linear(first, "cls.pooler", h, h)])
    nsp = w.node("ReduceMean", [w.node("LogSoftmax", [w.node(
        "Cast", [linear(pooled, "cls.nsp", h, 2)], to=TensorProto.FLOAT)], axis=-1)],
        keepdims=0)
    w.node("Neg", [w.node("Add", [mlm, nsp])], "loss")


def options(layers_per_ipu: list[int], accumulation: int, off_chip: bool,
            recompute: str = "pipeline", replicas: int = 1,
            rts: bool = False) -> popart.SessionOptions:
    """The published configuration's session options (profiling on, for the report)."""
    opts = popart.SessionOptions()
    opts.engineOptions = {"autoReport.all": "true"}
    if len(layers_per_ipu) > 1:
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
                              if recompute == "pipeline" and len(layers_per_ipu) > 1
                              else popart.RecomputationType.Standard)
    if off_chip or rts:
        storage = popart.TensorStorage.OffChip if off_chip else popart.TensorStorage.OnChip
        sharding = (popart.ReplicatedTensorSharding.On if rts
                    else popart.ReplicatedTensorSharding.Off)
        opts.optimizerStateTensorLocationSettings = popart.TensorLocationSettings(
            popart.TensorLocation(storage, sharding))
    return opts


def verdict(path: Path, layers_per_ipu: list[int], accumulation: int, off_chip: bool,
            recompute: str = "pipeline", replicas: int = 1, rts: bool = False,
            ipu_version: str = "ipu2", raise_oom: bool = False):
    """Prepare one training configuration on an offline device: (device model of the
    report, out-of-memory status). Nothing is run and no device storage is allocated. With
    ``raise_oom`` an overflow raises ``OutOfMemoryException`` instead."""
    opts = options(layers_per_ipu, accumulation, off_chip, recompute, replicas, rts)
    optimizer = popart.Adam({"defaultLearningRate": (1e-3, False)}, mode=popart.AdamMode.Lamb,
                            accum_type=popart.DataType.FLOAT16,
                            accl1_type=popart.DataType.FLOAT, accl2_type=popart.DataType.FLOAT)
    device = popart.DeviceManager().createOfflineIPUDevice(
        {"numIPUs": len(layers_per_ipu) * replicas, "ipuVersion": ipu_version})
    flow = popart.DataFlow(1, {"loss": popart.AnchorReturnType("Final")})
    session = popart.TrainingSession(fnModel=str(path), dataFlow=flow, loss="loss",
                                     optimizer=optimizer, deviceInfo=device, userOptions=opts)
    status = popart.OutOfMemoryError()
    session.prepareDevice(**({} if raise_oom else {"err": status}))
    return session.getReport().model, status


def memory_lines(model) -> list[str]:
    lines = []
    for m in model.memory.ipus:
        cats = ", ".join(f"{k} {_bytes(v)}" for k, v in m.categories.items() if v)
        lines.append(f"  IPU {m.ipu}: {_bytes(m.total_bytes)} of "
                     f"{_bytes(m.capacity_bytes)} ({100 * m.utilisation:.0f}%), "
                     f"fullest tile {_bytes(m.worst_tile_bytes)} of "
                     f"{_bytes(m.tile_bytes)}"
                     + ("" if m.fits else "  OUT OF MEMORY")
                     + (f"; off chip {_bytes(m.streaming_bytes)}"
                        if m.streaming_bytes else ""))
        lines.append(f"    {cats}")
    return lines


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def comparison_line(model, published: Published, comparable: bool = True) -> str:
    """Estimated throughput of all replicas next to the published figure, with the ratio."""
    estimate = model.cycles.samples_per_second
    ratio = estimate / published.sequences_per_second
    ipus = len(published.layers_per_ipu) * published.replicas
    line = (f"estimated {estimate:.0f} sequences/s on {ipus} IPUs; published "
            f"{published.sequences_per_second:.0f} sequences/s ({published.system}); "
            f"ratio {ratio:.2f}")
    return line if comparable else line + " (not the published configuration: not comparable)"


def peak_host_bytes() -> int:
    """Peak resident memory of this process so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_published(path: Path, published: Published, layers_per_ipu: list[int],
                  accumulation: int, comparable: bool) -> tuple[object, list[str]]:
    """The published configuration (or a cut of it) on an offline device of its IPU version:
    (device model, printed lines)."""
    start = time.perf_counter()
    model, status = verdict(path, layers_per_ipu, accumulation, off_chip=True,
                            replicas=published.replicas, rts=True,
                            ipu_version=published.ipu_version)
    c = model.cycles
    fits = status.isSuccessful()
    lines = [f"published configuration, layers {layers_per_ipu}, micro-batch "
             f"{published.micro_batch}, replication {published.replicas}, accumulation "
             f"{accumulation}, {published.ipu_version}: "
             f"{'FITS' if fits else 'DOES NOT FIT'} "
             f"(prepared in {time.perf_counter() - start:.1f} s)",
             *([] if fits else ["  " + str(status).splitlines()[0]]),
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
    parser.add_argument("--simple-head", action="store_true",
                        help="the older layout: the loss (mean of the encoder output) on the "
                             "last IPU instead of the pretraining heads on IPU 0")
    parser.add_argument("--detach-lookup", action="store_true",
                        help="what-if: detach the word embedding lookup, so the tied "
                             "embedding's gradient comes from the decoder only")
    args = parser.parse_args(argv)
    published = BERT_LARGE_SEQ128
    scale = args.layers / 24
    split = [max(1, round(n * scale)) for n in published.layers_per_ipu]
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bert.onnx"
        start = time.perf_counter()
        write_bert(path, split, published.micro_batch, published.seq,
                   available_memory=published.available_memory,
                   pretraining_heads=not args.simple_head, detach_lookup=args.detach_lookup)
        print(f"wrote BERT ({sum(split)} layers, micro-batch {published.micro_batch}, seq "
              f"{published.seq}, float16, "
              f"{'loss on the last IPU' if args.simple_head else 'heads on IPU 0'}"
              f"{', word lookup detached' if args.detach_lookup else ''}) "
              f"in {time.perf_counter() - start:.1f} s")
        comparable = (args.layers == 24 and args.accumulation == published.accumulation
                      and not args.simple_head and not args.detach_lookup)
        model, lines = run_published(path, published, split, args.accumulation, comparable)
        print("\n".join(lines))
        print(f"wall time {time.perf_counter() - wall:.1f} s, peak host memory "
              f"{_bytes(peak_host_bytes())}")
        del model
        gc.collect()
        if not args.sweep:
            return
        for name, sweep_split in SPLITS.items():
            sweep_split = [max(1, round(n * scale)) for n in sweep_split]
            sweep_path = write_bert(Path(tmp) / f"sweep{len(sweep_split)}.onnx", sweep_split,
                                    published.micro_batch, published.seq)
            for off_chip in (False, True):
                start = time.perf_counter()
                model, status = verdict(sweep_path, sweep_split, 16, off_chip, args.recompute)
                where = "off chip" if off_chip else "on chip"
                print(f"\n{name}, layers {sweep_split}, optimizer state {where}: "
                      f"{'FITS' if status.isSuccessful() else 'DOES NOT FIT'} "
                      f"({time.perf_counter() - start:.1f} s)")
                print("\n".join(memory_lines(model)))
                c = model.cycles
                print(f"  step (16 micro-batches): {c.step_seconds * 1e3:.1f} ms, "
                      f"{c.samples_per_second:.0f} samples/s per replica")
                del model
                gc.collect()


if __name__ == "__main__":
    main()
