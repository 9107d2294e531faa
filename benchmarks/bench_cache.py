"""The executable cache (``Options.enableExecutableCaching``): compile time of a BERT-style
training model in a first process (miss: trace, ONNX export, session build) against a second
process with the same model and cache folder (hit: no tracing, the session is built from the
stored graph). Target: the second compile at least 10x faster.

``--popart``: the same for PopART's engine cache (``enableEngineCaching`` + ``cachePath``) on a
small BERT-style ``TrainingSession`` written with the Builder (embedding, 2 encoder layers of
attention, layer norm and a feed-forward block, L1 loss, SGD with momentum): session
construction plus ``prepareDevice`` in a first process (miss: passes, device model analysis,
entry written) and a second one (hit: the passes still run, as the key hashes the IR after
them, but the device model is loaded from the entry instead of analysed). Edits of the device
model's sources between the two processes make the second one miss (the key hashes them).

    python benchmarks/bench_cache.py [--model bert] [--inference] [--popart]

Each process is a fresh interpreter (``--child``), so nothing is shared but the cache folder.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_frontend import CONFIGS, WithLoss, _inputs

import popart_backend as popart
import poptorch_lite as poptorch
from popart_backend.executable.session_mixin import engine_cache_stats
from poptorch_lite.executor.executable import cache_stats
from tests.models import zoo


def child(name: str, cache: str, inference: bool) -> None:
    config = CONFIGS[name]
    torch.manual_seed(0)
    net = zoo.SPECS[config["spec"]].model(**config["kwargs"])
    features, labels = _inputs(name, config["batch"])
    opts = poptorch.Options().showCompilationProgressBar(False).enableExecutableCaching(cache)
    start = time.perf_counter()
    if inference:
        wrapper = poptorch.inferenceModel(net.eval(), opts)
        wrapper.compile(*features)
    else:
        model = WithLoss(net, config["pick"]).train()
        wrapper = poptorch.trainingModel(
            model, opts, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))
        wrapper.compile(*features, labels)
    seconds = time.perf_counter() - start
    print(json.dumps({"compile_s": seconds, **cache_stats}))


def popart_bert(layers: int = 2, hidden: int = 64, heads: int = 4, seq: int = 16,
                batch: int = 4, vocab: int = 100):
    """A BERT-style encoder with an L1 loss, written with the Builder: (model, loss id)."""
    rng = np.random.default_rng(0)
    b = popart.Builder()
    ops = b.aiOnnx
    ids = b.addInputTensor(popart.TensorInfo("INT32", [batch, seq]), "ids")

    def param(name, shape, scale=0.05):
        return b.addInitializedInputTensor(
            (rng.standard_normal(shape) * scale).astype(np.float32), name)

    def const(value, dtype=np.float32):
        return ops.constant(np.array(value, dtype))

    def linear(x, n_in, n_out, name):
        return ops.add([ops.matmul([x, param(name + "_w", (n_in, n_out))]),
                        param(name + "_b", (n_out,), 0.0)])

    def layer_norm(x, name):
        centred = ops.sub([x, ops.reducemean([x], axes=[-1], keepdims=1)])
        var = ops.reducemean([ops.mul([centred, centred])], axes=[-1], keepdims=1)
        y = ops.div([centred, ops.sqrt([ops.add([var, const(1e-5)])])])
        return ops.add([ops.mul([y, param(name + "_g", (hidden,), 0.0)]),
                        param(name + "_b", (hidden,), 0.0)])

    def heads_of(t):
        shape = const([batch, seq, heads, hidden // heads], np.int64)
        return ops.transpose([ops.reshape([t, shape])], perm=[0, 2, 1, 3])

    x = ops.gather([param("embedding", (vocab, hidden), 0.02), ids], axis=0)
    for i in range(layers):
        q, k, v = (heads_of(linear(x, hidden, hidden, f"l{i}_{n}")) for n in "qkv")
        scores = ops.mul([ops.matmul([q, ops.transpose([k], perm=[0, 1, 3, 2])]),
                          const((hidden // heads) ** -0.5)])
        context = ops.matmul([ops.softmax([scores], axis=-1), v])
        context = ops.reshape([ops.transpose([context], perm=[0, 2, 1, 3]),
                               const([batch, seq, hidden], np.int64)])
        x = layer_norm(ops.add([x, linear(context, hidden, hidden, f"l{i}_o")]), f"l{i}_ln1")
        h = linear(x, hidden, 4 * hidden, f"l{i}_f1")
        h = ops.mul([h, ops.sigmoid([ops.mul([h, const(1.702)])])])
        x = layer_norm(ops.add([x, linear(h, 4 * hidden, hidden, f"l{i}_f2")]), f"l{i}_ln2")
    loss = b.aiGraphcore.l1loss([x], 0.5, reduction=popart.ReductionType.Mean)
    return b.getModelProto(), loss


def popart_child(cache: str) -> None:
    model, loss = popart_bert()
    options = popart.SessionOptions()
    options.enableEngineCaching = True
    options.cachePath = cache
    start = time.perf_counter()
    session = popart.TrainingSession(
        model, popart.DataFlow(1, [loss]), loss,
        popart.SGD({"defaultLearningRate": (0.01, False), "defaultMomentum": (0.9, True)}),
        popart.DeviceManager().createCpuDevice(), userOptions=options)
    built = time.perf_counter()
    session.prepareDevice()
    end = time.perf_counter()
    print(json.dumps({"compile_s": end - start, "construct_s": built - start,
                      "prepare_s": end - built, **engine_cache_stats}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="bert", choices=sorted(CONFIGS))
    parser.add_argument("--inference", action="store_true")
    parser.add_argument("--popart", action="store_true")
    parser.add_argument("--child", metavar="CACHE_DIR")
    args = parser.parse_args()
    if args.child:
        if args.popart:
            popart_child(args.child)
        else:
            child(args.model, args.child, args.inference)
        return
    results = []
    with tempfile.TemporaryDirectory() as cache:
        for _ in range(2):
            cmd = [sys.executable, __file__, "--model", args.model, "--child", cache]
            cmd += ["--inference"] * args.inference + ["--popart"] * args.popart
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
    first, second = results
    ratio = first["compile_s"] / second["compile_s"]
    kind = "inference" if args.inference else "training"
    label = "PopART BERT-style h64 L2, seq 16, batch 4" if args.popart else \
        CONFIGS[args.model]["label"]
    print(f"{label} ({'training' if args.popart else kind})")
    print(f"  first process  (miss): {first['compile_s']:7.2f} s  {first}")
    print(f"  second process (hit):  {second['compile_s']:7.2f} s  {second}")
    print(f"  ratio: {ratio:.1f}x (target >= 10x)")


if __name__ == "__main__":
    main()
