"""Train a small CNN on scikit-learn's bundled handwritten digits on the simulated IPU.

    python examples/train_digits.py [--epochs 6] [--quiet]

The data set (1797 8×8 images, 10 classes) ships inside scikit-learn, so nothing is
downloaded. The loop is plain PyTorch: ``poptorch_lite.trainingModel`` runs 4 optimizer steps
per call (``deviceIterations(4)``), each over 2 micro-batches of 8 images
(``Training.gradientAccumulation(2)``), so every call takes 64 images. An LR scheduler reaches
the device through ``setOptimizer``. Afterwards an inference wrapper of the same model (it
picks up the trained weights by itself) measures test accuracy. The epoch count can also come
from the environment variable ``TRAIN_DIGITS_EPOCHS``.

The training and test sets are whole numbers of calls, so no DataLoader drops samples. At the
end it prints the CPU wall-clock throughput of the simulation and the simulated IPU's own
estimate: the cycles of one training call (``Options.logCycleCount``, ``cycleCount()``).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import tqdm
from sklearn.datasets import load_digits

import poptorch_lite as poptorch

MICRO_BATCH = 8
DEVICE_ITERATIONS = 4
ACCUMULATION = 2
TEST_DEVICE_ITERATIONS = 5


class DigitsCNN(torch.nn.Module):
    """Two conv blocks (Conv, BatchNorm, ReLU), a max pool and a linear classifier."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2))
        self.classifier = torch.nn.Linear(32 * 4 * 4, 10)

    def forward(self, images, labels=None):
        logits = self.classifier(torch.flatten(self.features(images), 1))
        if labels is None:
            return logits
        return logits, torch.nn.functional.cross_entropy(logits, labels)


TRAIN_CALL = MICRO_BATCH * DEVICE_ITERATIONS * ACCUMULATION  # images per training call
TEST_CALL = MICRO_BATCH * TEST_DEVICE_ITERATIONS  # images per inference call


def digits_split(n_test: int = 320, seed: int = 0):
    """(train, test) TensorDatasets of [N, 1, 8, 8] images scaled to [0, 1] and int labels.

    Both sizes are whole numbers of calls (a DataLoader drops, with a warning, the samples that
    do not fill a last call): ``n_test`` must be a multiple of ``TEST_CALL``, and the training
    set takes the largest multiple of ``TRAIN_CALL`` of the rest (1472 of 1477 images)."""
    if n_test % TEST_CALL:
        raise ValueError(f"n_test={n_test} is not a multiple of {TEST_CALL} images per call")
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_train = (len(labels) - n_test) // TRAIN_CALL * TRAIN_CALL
    test, train = order[:n_test], order[n_test:n_test + n_train]
    return (torch.utils.data.TensorDataset(images[train], labels[train]),
            torch.utils.data.TensorDataset(images[test], labels[test]))


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int,
                        default=int(os.environ.get("TRAIN_DIGITS_EPOCHS", "6")))
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    train_set, test_set = digits_split()

    opts = poptorch.Options().deviceIterations(DEVICE_ITERATIONS).randomSeed(0)
    opts.logCycleCount(True)  # the simulated IPU's cycle estimate: training.cycleCount()
    opts.Training.gradientAccumulation(ACCUMULATION)
    opts.outputMode(poptorch.OutputMode.All)  # every micro-batch's logits: train accuracy
    opts.showCompilationProgressBar(not args.quiet)
    loader = poptorch.DataLoader(opts, train_set, batch_size=MICRO_BATCH, shuffle=True)

    model = DigitsCNN()
    optimizer = poptorch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.8)
    training = poptorch.trainingModel(model, opts, optimizer)

    print(f"digits: {len(train_set)} training / {len(test_set)} test images (whole calls; "
          f"{1797 - len(train_set) - len(test_set)} left out); each call takes "
          f"{loader.combinedBatchSize} = micro-batch {MICRO_BATCH} × deviceIterations "
          f"{DEVICE_ITERATIONS} × gradientAccumulation {ACCUMULATION}")
    images, labels = next(iter(loader))
    training.compile(images, labels)
    print(f"compiled the training model in {training.compilationTime().total_seconds():.1f} s")

    samples, seconds = 0, 0.0
    for epoch in range(args.epochs):
        correct, seen = 0, 0
        bar = tqdm.tqdm(loader, desc=f"epoch {epoch + 1}/{args.epochs}", unit="call",
                        disable=args.quiet, leave=False)
        for images, labels in bar:
            start = time.perf_counter()
            logits, losses = training(images, labels)
            seconds += time.perf_counter() - start
            samples += len(labels)
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
            bar.set_postfix(loss=f"{float(losses[-1]):.3f}")
        scheduler.step()
        training.setOptimizer(optimizer)  # the new lr, no recompilation
        print(f"epoch {epoch + 1}: train accuracy {correct / seen:.3f} "
              f"(lr now {scheduler.get_last_lr()[0]:.2e})")

    model.eval()
    inference_opts = poptorch.Options().deviceIterations(TEST_DEVICE_ITERATIONS)
    inference_opts.showCompilationProgressBar(not args.quiet)
    inference = poptorch.inferenceModel(model, inference_opts)
    test_loader = poptorch.DataLoader(inference_opts, test_set, batch_size=MICRO_BATCH)
    correct, seen = 0, 0
    for images, labels in test_loader:
        correct += int((inference(images).argmax(1) == labels).sum())
        seen += len(labels)
    accuracy = correct / seen
    print(f"test accuracy {accuracy:.3f} on {seen} images")
    # Host wall-clock time of the simulation on this CPU. The simulated IPU's own estimate
    # (cycles of one call) is printed next to it: Options.logCycleCount and cycleCount().
    print(f"throughput (wall-clock of the CPU simulation, not simulated IPU time): "
          f"{samples / seconds:.0f} samples/s over {samples} training samples")
    print(f"simulated IPU: {training.cycleCount()} cycles for the last training call of "
          f"{loader.combinedBatchSize} images (an estimate of the cycle model)")
    training.destroy()
    inference.destroy()
    return accuracy


if __name__ == "__main__":
    main()
