"""Training-step speed of popart_backend vs eager PyTorch, side by side.

For each model (an MLP, a CNN with BatchNorm and a BERT-style encoder at realistic sizes) the
same seeded torch module is exported once (dynamo exporter, opset 18, eval mode), a loss is
appended with ``popart.Builder``, and one weight update is timed two ways in one process,
interleaving the repetitions so that machine noise hits both alike:

- ours:  ``TrainingSession.run`` with batchesPerStep 1 (forward, backward, optimizer step; the
  loss anchored),
- eager: the torch module's forward + loss + ``backward()`` + ``optimizer.step()`` (with
  ``zero_grad()``), for torch.optim.SGD with momentum and torch.optim.Adam.

The CNN's eager module runs in train mode (BatchNorm batch statistics, as the session does);
the BERT-style one in eval mode, because the eval export has no Dropout. Both sides start from
the same weights, and the weights after the first step are checked equal before timing.

It prints the median ms per weight update and the ratio ours/eager. Target (issue #3):
ours/eager <= 1.3 for each model and optimizer.

    python benchmarks/bench_training.py [--reps 20] [--models mlp,cnn,bert]
        [--optimizers sgd,adam] [--profile bert-adam] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the seeded models live with the tests (tests/models/zoo.py)

import popart_backend as popart  # noqa: E402
from tests.models import zoo  # noqa: E402


def _mlp_loss(builder, batch):
    label = builder.addInputTensor(popart.TensorInfo("INT32", [batch]), "label")
    log_probs = builder.aiOnnx.logsoftmax(["logits"], axis=-1)
    loss = builder.aiGraphcore.nllloss([log_probs, label], reduction=popart.ReductionType.Mean,
                                       inputIsLogProbability=True)
    return loss, label


def _cnn_loss(builder, batch):
    label = builder.addInputTensor(popart.TensorInfo("INT64", [batch]), "label")
    (loss,) = builder.aiOnnx.softmaxcrossentropyloss(["logits", label], num_outputs=1,
                                                     reduction="mean")
    return loss, label


def _bert_loss(builder, batch):
    loss = builder.aiGraphcore.l1loss(["last_hidden_state"], 0.5,
                                      reduction=popart.ReductionType.Mean)
    return loss, None


# name -> model spec, constructor overrides, inputs, the loss (ONNX and torch), train mode
CONFIGS = {
    "mlp": dict(
        spec="mlp", kwargs=dict(width=1024, depth=3, in_features=1024, classes=1000),
        inputs=lambda rng: {"x": rng.standard_normal((256, 1024)).astype(np.float32)},
        label=lambda rng: rng.integers(0, 1000, 256).astype(np.int32),
        onnx_loss=_mlp_loss,
        torch_loss=lambda out, label: torch.nn.functional.nll_loss(
            torch.log_softmax(out, -1), label.long()),
        train_mode=True,
        title="MLP 1024x3, batch 256",
    ),
    "cnn": dict(
        spec="cnn", kwargs=dict(channels=(32, 64, 128), image=32, classes=10),
        inputs=lambda rng: {"x": rng.standard_normal((32, 3, 32, 32)).astype(np.float32)},
        label=lambda rng: rng.integers(0, 10, 32).astype(np.int64),
        onnx_loss=_cnn_loss,
        torch_loss=lambda out, label: torch.nn.functional.cross_entropy(out, label),
        train_mode=True,
        title="CNN 3 conv blocks, batch 32, 32x32",
    ),
    "bert": dict(
        spec="bert", kwargs=dict(hidden=256, layers=4, heads=4, vocab=1000),
        inputs=lambda rng: zoo._token_inputs(128, vocab=1000)(8, rng),
        label=None,
        onnx_loss=_bert_loss,
        torch_loss=lambda out, label: 0.5 * out[0].abs().mean(),
        train_mode=False,
        title="BERT-style h256 L4, seq 128, batch 8",
    ),
}

OPTIMIZERS = {
    "sgd": (
        lambda: popart.SGD({"defaultLearningRate": (0.01, False),
                            "defaultMomentum": (0.9, True)}),
        lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    ),
    "adam": (
        lambda: popart.Adam({"defaultLearningRate": (1e-4, False), "defaultBeta1": (0.9, True),
                             "defaultBeta2": (0.999, True), "defaultEps": (1e-6, True)}),
        lambda params: torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-6),
    ),
}


class Ours:
    def __init__(self, model_bytes: bytes, loss: str, optimizer, feeds):
        start = time.perf_counter()
        self.session = popart.TrainingSession(
            fnModel=model_bytes,
            dataFlow=popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}),
            loss=loss,
            optimizer=optimizer,
            deviceInfo=popart.DeviceManager().createCpuDevice(),
        )
        self.session.prepareDevice()
        self.session.weightsFromHost()
        self.compile_s = time.perf_counter() - start
        self.anchors = self.session.initAnchorArrays()
        self.stepio = popart.PyStepIO(feeds, self.anchors)

    def __call__(self):
        self.session.run(self.stepio)

    def weights(self, names) -> dict[str, np.ndarray]:
        self.session.weightsToHost()
        out = {n: np.zeros(self.session.getInfo(n).shape(), np.float32) for n in names}
        self.session.readWeights(popart.PyWeightsIO(out))
        return out


class Eager:
    def __init__(self, module, make_optimizer, config, feeds, label):
        self.module = copy.deepcopy(module).train(config["train_mode"])
        self.optimizer = make_optimizer(self.module.parameters())
        self.args = zoo.to_torch_inputs(feeds)
        self.label = None if label is None else torch.from_numpy(label)
        self.loss = config["torch_loss"]

    def __call__(self):
        self.optimizer.zero_grad()
        out = self.module(*self.args)
        self.loss(out, self.label).backward()
        self.optimizer.step()


def build(name: str):
    config = CONFIGS[name]
    spec = zoo.SPECS[config["spec"]]
    module = spec.model(**config["kwargs"])
    rng = np.random.default_rng(0)
    feeds = config["inputs"](rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = zoo.export(module, feeds, spec.output_names, "dynamo", 18)
    builder = popart.Builder(model.SerializeToString())
    batch = len(next(iter(feeds.values())))
    loss, label_id = config["onnx_loss"](builder, batch)
    label = None if config["label"] is None else config["label"](rng)
    all_feeds = dict(feeds) if label_id is None else {**feeds, label_id: label}
    return config, module, builder.getModelProto(), loss, feeds, all_feeds, label


def bench(name: str, optimizer: str, reps: int, profile: bool, built) -> dict:
    config, module, model_bytes, loss, feeds, all_feeds, label = built
    make_ours, make_torch = OPTIMIZERS[optimizer]
    ours = Ours(model_bytes, loss, make_ours(), all_feeds)
    eager = Eager(module, make_torch, config, feeds, label)

    # Same answers first: one step each from the same weights.
    ours()
    eager()
    names = [n for n, _ in eager.module.named_parameters()]
    got = ours.weights(names)
    for n, p in eager.module.named_parameters():
        want = p.detach().numpy()
        if n.endswith("word_embeddings.weight"):
            # nn.Embedding(padding_idx=0) gives row 0 no gradient; ONNX Gather has no
            # padding index, so the export trains that row like any other.
            got[n], want = got[n][1:], want[1:]
        np.testing.assert_allclose(got[n], want, rtol=1e-3, atol=1e-5,
                                   err_msg=f"{name}/{optimizer} weight {n}")

    runners = {"ours": ours, "eager": eager}
    for runner in runners.values():  # warm-up: allocator, thread pools, lazy inits
        for _ in range(2):
            runner()
    times = {k: [] for k in runners}
    keys = list(runners)
    for rep in range(reps):
        for key in keys[rep % 2:] + keys[: rep % 2]:
            start = time.perf_counter()
            runners[key]()
            times[key].append(time.perf_counter() - start)
    medians = {k: statistics.median(v) * 1e3 for k, v in times.items()}

    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(max(reps // 2, 5)):
            ours()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        print(f"\n--- cProfile of ours on {name}/{optimizer} (tottime) ---\n{text.getvalue()}")

    return dict(title=f"{config['title']}, {optimizer}", compile_s=ours.compile_s, **medians)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--models", default="mlp,cnn,bert")
    parser.add_argument("--optimizers", default="sgd,adam")
    parser.add_argument("--profile", default="", help="comma-separated model-optimizer pairs")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads for both sides (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    profiled = set(filter(None, args.profile.split(",")))

    rows = []
    for name in args.models.split(","):
        built = build(name)
        for optimizer in args.optimizers.split(","):
            rows.append(bench(name, optimizer, args.reps, f"{name}-{optimizer}" in profiled,
                              built))

    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} torch threads, "
          f"median of {args.reps} interleaved reps, one weight update each")
    header = (f"{'model, optimizer':46} {'ours ms':>9} {'eager ms':>9} {'ours/eager':>11} "
              f"{'build s':>8}")
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['title']:46} {row['ours']:9.2f} {row['eager']:9.2f} "
              f"{row['ours'] / row['eager']:11.2f} {row['compile_s']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
