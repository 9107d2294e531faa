"""Inference speed of popart_backend vs eager PyTorch vs onnxruntime, side by side.

For each model (an MLP, a CNN and a BERT-style encoder at realistic sizes) the same seeded torch
module is exported once (dynamo exporter, opset 18, the frontend's path) and timed three ways in
one process, interleaving the repetitions so that machine noise hits all three alike:

- ours:  ``InferenceSession.run`` (batchesPerStep 1, the output anchored),
- eager: the torch module under ``torch.inference_mode()``,
- ort:   onnxruntime's CPU provider on the same ONNX file.

It prints the median ms/iteration, the ratios ours/eager and ours/ort, and how long
``InferenceSession(...)`` + ``prepareDevice()`` take for the BERT-style model. Targets
(DESIGN decision 9): ours/eager <= 1.3 for each model, BERT-style compile < 1 s.

    python benchmarks/bench_inference.py [--reps 30] [--models mlp,cnn,bert] [--profile bert]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the seeded models live with the tests (tests/models/zoo.py)

import popart_backend as popart  # noqa: E402
from tests.models import zoo  # noqa: E402

# name -> (spec, constructor overrides, batch, input maker)
CONFIGS = {
    "mlp": dict(
        spec="mlp", kwargs=dict(width=1024, depth=3, in_features=1024, classes=1000),
        inputs=lambda rng: {"x": rng.standard_normal((256, 1024)).astype(np.float32)},
        label="MLP 1024x3, batch 256",
    ),
    "cnn": dict(
        spec="cnn", kwargs=dict(channels=(32, 64, 128), image=32, classes=10),
        inputs=lambda rng: {"x": rng.standard_normal((32, 3, 32, 32)).astype(np.float32)},
        label="CNN 3 conv blocks, batch 32, 32x32",
    ),
    "bert": dict(
        spec="bert", kwargs=dict(hidden=256, layers=4, heads=4, vocab=1000),
        inputs=lambda rng: zoo._token_inputs(128, vocab=1000)(8, rng),
        label="BERT-style h256 L4, seq 128, batch 8",
    ),
}


class Ours:
    def __init__(self, model_bytes: bytes, feeds, output_names):
        start = time.perf_counter()
        anchors = {o: popart.AnchorReturnType("All") for o in output_names}
        self.session = popart.InferenceSession(
            fnModel=model_bytes,
            dataFlow=popart.DataFlow(1, anchors),
            deviceInfo=popart.DeviceManager().createCpuDevice(),
        )
        self.session.prepareDevice()
        self.compile_s = time.perf_counter() - start
        self.anchors = self.session.initAnchorArrays()
        self.stepio = popart.PyStepIO(feeds, self.anchors)
        self.output_names = output_names

    def __call__(self):
        self.session.run(self.stepio)
        return [self.anchors[o] for o in self.output_names]


class Eager:
    def __init__(self, module, feeds):
        self.module = module
        self.args = zoo.to_torch_inputs(feeds)

    def __call__(self):
        with torch.inference_mode():
            out = self.module(*self.args)
        return out if isinstance(out, (tuple, list)) else [out]


class OnnxRuntime:
    def __init__(self, model_bytes: bytes, feeds):
        options = ort.SessionOptions()
        # onnxruntime's pool busy-waits after each run by default, stealing the cores from
        # whichever runner is timed next; the comparison would then measure the spinning.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self.session = ort.InferenceSession(
            model_bytes, options, providers=["CPUExecutionProvider"]
        )
        self.feeds = feeds

    def __call__(self):
        return self.session.run(None, self.feeds)


def bench(name: str, reps: int, profile: bool) -> dict:
    config = CONFIGS[name]
    spec = zoo.SPECS[config["spec"]]
    module = spec.model(**config["kwargs"])
    feeds = config["inputs"](np.random.default_rng(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = zoo.export(module, feeds, spec.output_names, "dynamo", 18)
    model_bytes = model.SerializeToString()

    runners = {
        "ours": Ours(model_bytes, feeds, spec.output_names),
        "eager": Eager(module, feeds),
        "ort": OnnxRuntime(model_bytes, feeds),
    }
    # Same answers first: a fast wrong result is no result.
    reference = [np.asarray(o) for o in runners["ort"]()]
    for got, want in zip(runners["ours"](), reference):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)

    for runner in runners.values():  # warm-up: allocator, thread pools, lazy inits
        for _ in range(3):
            runner()
    times = {k: [] for k in runners}
    keys = list(runners)
    for rep in range(reps):
        # Rotate the order too, so no runner always follows the same one.
        for key in keys[rep % 3:] + keys[: rep % 3]:
            runner = runners[key]
            start = time.perf_counter()
            runner()
            times[key].append(time.perf_counter() - start)
    medians = {k: statistics.median(v) * 1e3 for k, v in times.items()}

    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(max(reps // 2, 5)):
            runners["ours"]()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        print(f"\n--- cProfile of ours on {name} (tottime) ---\n{text.getvalue()}")

    return dict(label=config["label"], compile_s=runners["ours"].compile_s, **medians)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--models", default="mlp,cnn,bert")
    parser.add_argument("--profile", default="", help="comma-separated models to cProfile")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    profiled = set(filter(None, args.profile.split(",")))

    rows = {name: bench(name, args.reps, name in profiled) for name in args.models.split(",")}

    print(f"\ntorch {torch.__version__}, onnxruntime {ort.__version__}, "
          f"{torch.get_num_threads()} torch threads, median of {args.reps} interleaved reps")
    header = (f"{'model':38} {'ours ms':>9} {'eager ms':>9} {'ort ms':>9} "
              f"{'ours/eager':>11} {'ours/ort':>9}")
    print(header)
    print("-" * len(header))
    for row in rows.values():
        print(f"{row['label']:38} {row['ours']:9.2f} {row['eager']:9.2f} {row['ort']:9.2f} "
              f"{row['ours'] / row['eager']:11.2f} {row['ours'] / row['ort']:9.2f}")
    if "bert" in rows:
        print(f"\nBERT-style InferenceSession(...) + prepareDevice(): "
              f"{rows['bert']['compile_s']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
