"""The executable cache (``Options.enableExecutableCaching``): compile time of a BERT-style
training model in a first process (miss: trace, ONNX export, session build) against a second
process with the same model and cache folder (hit: no tracing, the session is built from the
stored graph). Target: the second compile at least 10x faster.

    python benchmarks/bench_cache.py [--model bert] [--inference]

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

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_frontend import CONFIGS, WithLoss, _inputs

import poptorch_lite as poptorch
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="bert", choices=sorted(CONFIGS))
    parser.add_argument("--inference", action="store_true")
    parser.add_argument("--child", metavar="CACHE_DIR")
    args = parser.parse_args()
    if args.child:
        child(args.model, args.child, args.inference)
        return
    results = []
    with tempfile.TemporaryDirectory() as cache:
        for _ in range(2):
            cmd = [sys.executable, __file__, "--model", args.model, "--child", cache]
            cmd += ["--inference"] * args.inference
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
    first, second = results
    ratio = first["compile_s"] / second["compile_s"]
    kind = "inference" if args.inference else "training"
    print(f"{CONFIGS[args.model]['label']} ({kind})")
    print(f"  first process  (miss): {first['compile_s']:7.2f} s  {first}")
    print(f"  second process (hit):  {second['compile_s']:7.2f} s  {second}")
    print(f"  ratio: {ratio:.1f}x (target >= 10x)")


if __name__ == "__main__":
    main()
