"""Pipelined (2 stages) and replicated (2 replicas) training on the simulated IPU.

    python examples/poptorch_pipelined_replicated.py [--epochs 3] [--profile]

An MLP classifies scikit-learn's bundled handwritten digits (nothing is downloaded). The model
is split in two pipeline stages with one line, ``poptorch_lite.BeginBlock(model.head, "head",
ipu_id=1)``: the body runs on IPU 0, the head and the loss on IPU 1. Each replica therefore
uses 2 IPUs, and ``replicationFactor(2)`` runs two replicas: 4 IPUs in all.

One call of the wrapper takes ``batch_size × deviceIterations × replicationFactor ×
gradientAccumulation`` = 8 × 2 × 2 × 4 = 128 images (the DataLoader builds such batches). For
each of the 2 device iterations every replica pushes 4 micro-batches of 8 images through the
pipeline, the gradients are averaged over the 4 micro-batches and the 2 replicas, and the
optimizer steps once. Training needs ``gradientAccumulation >= 2 × stages - 1`` = 3: the
backward pass adds stages (2 forward stages become 3: forward 0, forward+backward 1,
backward 2), and the pipeline must be filled and flushed once per weight update.

The script prints the pipeline schedule (which stage runs on which IPU; fill, main and flush
cycles per weight update) and, with ``--profile``, the simulated device's summary report. At
the end it replays the same batches with plain PyTorch and checks that the weights agree:
pipelining and replication change where and when the work runs, not the numbers.
"""

from __future__ import annotations

import argparse
import copy

import torch
from sklearn.datasets import load_digits

import poptorch_lite as poptorch
from poptorch_lite.testing import run_reference

MICRO_BATCH = 8
DEVICE_ITERATIONS = 2
REPLICAS = 2
ACCUMULATION = 4


class DigitsMLP(torch.nn.Module):
    """64 pixels -> 128 -> 128 -> 10 classes; forward returns (logits, loss)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                        torch.nn.Linear(128, 128), torch.nn.ReLU())
        self.head = torch.nn.Linear(128, 10)

    def forward(self, x, labels):
        logits = self.head(self.body(x))
        return logits, torch.nn.functional.cross_entropy(logits, labels)


def digits(samples: int | None):
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    if samples:
        x, y = x[:samples], y[:samples]
    split = int(0.8 * len(x))
    return (torch.utils.data.TensorDataset(x[:split], y[:split]),
            torch.utils.data.TensorDataset(x[split:], y[split:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=None, help="use only this many images")
    parser.add_argument("--profile", action="store_true",
                        help="enable profiling and print the simulated device's summary report")
    parser.add_argument("--no-progress", action="store_true", help="hide the compile bar")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = DigitsMLP()
    reference = copy.deepcopy(model)  # for the check at the end

    # Stage 1 (IPU 1) starts at the head; everything before it is stage 0 on IPU 0.
    poptorch.BeginBlock(model.head, "head", ipu_id=1)

    options = poptorch.Options()
    options.deviceIterations(DEVICE_ITERATIONS)
    options.replicationFactor(REPLICAS)
    options.Training.gradientAccumulation(ACCUMULATION)
    options.setExecutionStrategy(poptorch.PipelinedExecution())  # the default, made explicit
    options.showCompilationProgressBar(not args.no_progress)
    if args.profile:
        options.enableProfiling()

    train_set, test_set = digits(args.samples)
    loader = poptorch.DataLoader(options, train_set, batch_size=MICRO_BATCH, shuffle=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    training = poptorch.trainingModel(model, options, optimizer)

    seen = []
    for epoch in range(args.epochs):
        losses = []
        for x, y in loader:
            _, loss = training(x, y)  # loss: [replicas] (Final output mode)
            losses.append(loss.mean().item())
            seen.append((x, y))
        print(f"epoch {epoch + 1}: mean loss {sum(losses) / len(losses):.4f} over "
              f"{len(losses)} calls of {loader.combinedBatchSize} images")
        if epoch == 0:
            print("Pipeline schedule:")
            print(training.getPipelineSummary())

    # Test accuracy with an inference wrapper (it shares the trained weights). All test images
    # go in one call of one micro-batch, so there is nothing to pipeline: ShardedExecution runs
    # the two stages one after the other on their IPUs.
    eval_options = poptorch.Options().setExecutionStrategy(poptorch.ShardedExecution())
    model_eval = poptorch.inferenceModel(
        model.eval(), eval_options.showCompilationProgressBar(not args.no_progress))
    x_test, y_test = test_set.tensors
    logits, _ = model_eval(x_test, y_test)
    accuracy = (logits.argmax(1) == y_test).float().mean().item()
    print(f"test accuracy: {100 * accuracy:.1f}% on {len(y_test)} images")

    # The same batches with plain PyTorch: one step per device iteration, gradients averaged
    # over the accumulation x replica micro-batches (the replica index is the innermost).
    eager = poptorch.Options().deviceIterations(DEVICE_ITERATIONS)
    eager.Training.gradientAccumulation(ACCUMULATION * REPLICAS)
    run_reference(reference, torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9),
                  seen, eager)
    state = model.state_dict()
    worst = max(((state[k] - v).abs().max() / v.abs().max().clamp_min(1e-12)).item()
                for k, v in reference.state_dict().items())
    verdict = "final weights equal the eager run" if worst < 1e-4 else "WEIGHTS DIFFER"
    print(f"{verdict} (largest relative difference {worst:.1e})")
    training.destroy()


if __name__ == "__main__":
    main()
