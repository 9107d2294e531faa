"""poptorch_lite wrappers vs eager PyTorch: per-step time and first-call compile time.

For each model (MLP, CNN and a BERT-style encoder from ``tests/models/zoo.py``) this times

- training: one ``trainingModel`` call (deviceIterations 1: one forward, backward and SGD
  momentum step on the simulated IPU) against the eager step ``zero_grad(); loss.backward();
  optimizer.step()``;
- inference: one ``inferenceModel`` call against the eager module under
  ``torch.inference_mode()``;
- compile: the first call of each wrapper (trace + ONNX export + session build +
  ``prepareDevice``), measured once in a fresh wrapper.

Repetitions of both sides are interleaved, each wrapper call right next to its eager
counterpart (alternating which goes first), so machine noise hits them alike. The table shows
median times and the *paired* ratio: the median over repetitions of wrapper/eager of the same
repetition, which stays put on a busy machine where the medians of either side drift.
Targets (issue #4): steady-state step <= 1.3x eager, BERT-style compile < 5 s.

``--threads`` sets torch's intra-op threads for both sides (default: torch's own choice). On a
shared machine a single thread gives steadier numbers: with two threads a step waits for
whichever thread the scheduler parked.

    python benchmarks/bench_frontend.py [--reps 20] [--models mlp,cnn,bert] [--threads N]
"""

from __future__ import annotations

import argparse
import copy
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


class WithLoss(torch.nn.Module):
    """A zoo model plus a cross-entropy loss on its (first) output."""

    def __init__(self, net: torch.nn.Module, pick):
        super().__init__()
        self.net = net
        self.pick = pick

    def forward(self, *inputs):
        *features, labels = inputs
        logits = self.pick(self.net(*features))
        return logits, torch.nn.functional.cross_entropy(logits, labels)


def _bert_logits(out):
    return out[1]  # pooler output [B, hidden] as logits over `hidden` classes


CONFIGS = {
    "mlp": dict(label="MLP 16-256x3-10, batch 64", spec="mlp",
                kwargs=dict(width=256, depth=3, in_features=16, classes=10), batch=64,
                pick=lambda out: out, classes=10),
    "cnn": dict(label="CNN (8,16) 16x16, batch 16", spec="cnn", kwargs={}, batch=16,
                pick=lambda out: out, classes=10),
    "bert": dict(label="BERT-style h64 L2, seq 8, batch 8", spec="bert", kwargs={}, batch=8,
                 pick=_bert_logits, classes=64),
}


def _inputs(name: str, batch: int, seed: int = 0):
    config = CONFIGS[name]
    feeds = zoo.SPECS[config["spec"]].inputs(batch, seed)
    features = zoo.to_torch_inputs(feeds)
    labels = torch.randint(0, config["classes"], (batch,),
                           generator=torch.Generator().manual_seed(seed))
    return features, labels


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def bench(name: str, reps: int) -> dict:
    config = CONFIGS[name]
    torch.manual_seed(0)
    net = zoo.SPECS[config["spec"]].model(**config["kwargs"])
    features, labels = _inputs(name, config["batch"])
    opts = poptorch.Options().showCompilationProgressBar(False)

    # Training: the wrapper's model and an eager copy, both train mode, SGD momentum.
    train_model = WithLoss(copy.deepcopy(net), config["pick"]).train()
    eager_train = copy.deepcopy(train_model)
    eager_opt = torch.optim.SGD(eager_train.parameters(), lr=1e-3, momentum=0.9)
    training = poptorch.trainingModel(
        train_model, opts, torch.optim.SGD(train_model.parameters(), lr=1e-3, momentum=0.9))
    start = time.perf_counter()
    training(*features, labels)
    train_compile = time.perf_counter() - start

    infer_model = copy.deepcopy(net).eval()
    inference = poptorch.inferenceModel(infer_model, opts.clone())
    start = time.perf_counter()
    inference(*features)
    infer_compile = time.perf_counter() - start

    def eager_step():
        eager_opt.zero_grad()
        eager_train(*features, labels)[1].backward()
        eager_opt.step()

    def eager_infer():
        with torch.inference_mode():
            net(*features)

    timings = {"train": [], "eager_train": [], "infer": [], "eager_infer": []}
    pairs = ((("train", lambda: training(*features, labels)), ("eager_train", eager_step)),
             (("infer", lambda: inference(*features)), ("eager_infer", eager_infer)))
    for pair in pairs:
        for _, fn in pair:
            fn()  # warm-up
    for rep in range(reps):
        for pair in pairs:
            for key, fn in (pair if rep % 2 == 0 else pair[::-1]):
                start = time.perf_counter()
                fn()
                timings[key].append(time.perf_counter() - start)
    training.destroy()
    inference.destroy()
    result = {key: _median_ms(values) for key, values in timings.items()}
    for kind in ("train", "infer"):
        result[f"{kind}_ratio"] = statistics.median(
            w / e for w, e in zip(timings[kind], timings[f"eager_{kind}"]))
    result.update(train_compile=train_compile, infer_compile=infer_compile)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--models", default="mlp,cnn,bert")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads for both sides (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    rows = []
    for name in args.models.split(","):
        result = bench(name, args.reps)
        rows.append((CONFIGS[name]["label"], result))
        print(f"done: {name}", file=sys.stderr)
    header = (f"{'model':<36} {'train ms':>9} {'eager':>8} {'ratio':>6}   {'infer ms':>9} "
              f"{'eager':>8} {'ratio':>6}   {'compile train s':>15} {'infer s':>8}")
    print(header)
    print("-" * len(header))
    for label, r in rows:
        print(f"{label:<36} {r['train']:>9.2f} {r['eager_train']:>8.2f} "
              f"{r['train_ratio']:>6.2f}   {r['infer']:>9.2f} "
              f"{r['eager_infer']:>8.2f} {r['infer_ratio']:>6.2f}   "
              f"{r['train_compile']:>15.2f} {r['infer_compile']:>8.2f}")
    print(f"torch threads: {torch.get_num_threads()}; ratio: median of paired wrapper/eager "
          f"times")
    print("targets: step ratio <= 1.3; BERT-style compile < 5 s (first call: trace + export + "
          "prepareDevice)")


if __name__ == "__main__":
    main()
