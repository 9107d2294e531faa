"""Pipelined + replicated training against the plain run over the same samples (issue #5).

The BERT-style model of ``tests/models/zoo.py`` (hidden 64, 2 layers, sequence 8) with a
cross-entropy loss on the pooler output trains through ``poptorch_lite.trainingModel`` twice:

- multi-IPU: 2 pipeline stages (``BeginBlock`` on encoder layer 1, IPU 1) and
  ``replicationFactor(2)``, i.e. 4 IPUs, ``gradientAccumulation(G)``;
- plain: one IPU, no replicas, ``gradientAccumulation(2·G)``.

Both take the same combined batch each call (micro-batch × deviceIterations × replicas ×
accumulation samples), run the same number of micro-batches of the same size and make the same
optimizer steps, so they train on the same samples. The simulator runs every replica and stage
on the host's cores, so the multi-IPU run costs at least the plain run's compute; the ratio
shows the overhead of the pipeline (stash / restore, inter-IPU copies, the cycle schedule) and
the replica all-reduce. Calls of both are interleaved so machine noise hits them alike; the
table shows medians. Target: ratio <= 1.3.

    python benchmarks/bench_multi_ipu.py [--reps 10] [--accumulation 4] [--micro-batch 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the seeded models live with the tests (tests/models/zoo.py)

import poptorch_lite as poptorch  # noqa: E402
from tests.models import zoo  # noqa: E402

REPLICAS = 2
CLASSES = 64  # the pooler output (hidden 64) serves as logits


class BertWithLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = zoo.SPECS["bert"].model()

    def forward(self, input_ids, attention_mask, labels):
        logits = self.net(input_ids, attention_mask)[1]
        return logits, torch.nn.functional.cross_entropy(logits, labels)


def _batch(rows: int, seed: int = 0):
    feeds = zoo.SPECS["bert"].inputs(rows, seed)
    ids, mask = zoo.to_torch_inputs(feeds)
    labels = torch.randint(0, CLASSES, (rows,), generator=torch.Generator().manual_seed(seed))
    return ids, mask, labels


def _wrapper(multi_ipu: bool, accumulation: int, iterations: int):
    model = BertWithLoss().train()
    opts = poptorch.Options().deviceIterations(iterations).showCompilationProgressBar(False)
    if multi_ipu:
        poptorch.BeginBlock(model.net.bert.encoder.layer[1], "layer1", ipu_id=1)
        opts.replicationFactor(REPLICAS)
        opts.Training.gradientAccumulation(accumulation)
    else:
        opts.Training.gradientAccumulation(accumulation * REPLICAS)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return poptorch.trainingModel(model, opts, optimizer)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--accumulation", type=int, default=4, help="G of the multi-IPU run")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=2, help="deviceIterations")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(max(1, torch.get_num_threads()))

    rows = args.micro_batch * args.iterations * REPLICAS * args.accumulation
    batch = _batch(rows)
    runs = {}
    for name, multi in (("multi-IPU", True), ("plain", False)):
        start = time.perf_counter()
        wrapper = _wrapper(multi, args.accumulation, args.iterations)
        wrapper(*batch)  # compile + first call
        runs[name] = (wrapper, time.perf_counter() - start)
    multi_wrapper = runs["multi-IPU"][0]
    print("multi-IPU placement:")
    print(multi_wrapper.getPipelineSummary())
    times = {name: [] for name in runs}
    for _ in range(args.reps):
        for name, (wrapper, _) in runs.items():
            start = time.perf_counter()
            wrapper(*batch)
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["multi-IPU"] / medians["plain"]
    print(f"\nBERT-style h64 L2 seq 8: {rows} samples per call "
          f"({args.iterations} device iterations, micro-batch {args.micro_batch})")
    print(f"{'run':<12}{'setup':>18}{'compile+1st (s)':>18}{'call (ms)':>12}"
          f"{'samples/s':>12}")
    setups = {"multi-IPU": f"2 stages x {REPLICAS} rep, G={args.accumulation}",
              "plain": f"1 IPU, G={args.accumulation * REPLICAS}"}
    for name, (_, compile_s) in runs.items():
        print(f"{name:<12}{setups[name]:>18}{compile_s:>18.2f}{medians[name] * 1e3:>12.1f}"
              f"{rows / medians[name]:>12.0f}")
    verdict = "meets" if ratio <= 1.3 else "misses"
    print(f"\nwall time ratio multi-IPU / plain: {ratio:.2f}x ({verdict} the <= 1.3x target)")
    for wrapper, _ in runs.values():
        wrapper.destroy()


if __name__ == "__main__":
    main()
