"""Train a small CNN on scikit-learn's bundled handwritten digits on the simulated IPU.

    python examples/train_digits.py [--epochs 6] [--quiet]

The data set (1797 8×8 images, 10 classes) ships inside scikit-learn, so nothing is
downloaded. The loop is plain PyTorch: ``poptorch_lite.trainingModel`` runs 4 optimizer steps
per call (``deviceIterations(4)``), each over 2 micro-batches of 8 images
(``Training.gradientAccumulation(2)``), so every call takes 64 images. An LR scheduler reaches
the device through ``setOptimizer``. Afterwards an inference wrapper of the same model (it
picks up the trained weights by itself) measures test accuracy. The epoch count can also come
from the environment variable ``TRAIN_DIGITS_EPOCHS``.
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


def digits_split(n_test: int = 360, seed: int = 0):
    """(train, test) TensorDatasets of [N, 1, 8, 8] images scaled to [0, 1] and int labels."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    test, train = order[:n_test], order[n_test:]
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
    opts.Training.gradientAccumulation(ACCUMULATION)
    opts.outputMode(poptorch.OutputMode.All)  # every micro-batch's logits: train accuracy
    opts.showCompilationProgressBar(not args.quiet)
    loader = poptorch.DataLoader(opts, train_set, batch_size=MICRO_BATCH, shuffle=True)

    model = DigitsCNN()
    optimizer = poptorch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.8)
    training = poptorch.trainingModel(model, opts, optimizer)

    print(f"digits: {len(train_set)} training / {len(test_set)} test images; each call takes "
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
    inference_opts = poptorch.Options().deviceIterations(5)
    inference_opts.showCompilationProgressBar(not args.quiet)
    inference = poptorch.inferenceModel(model, inference_opts)
    test_loader = poptorch.DataLoader(inference_opts, test_set, batch_size=MICRO_BATCH)
    correct, seen = 0, 0
    for images, labels in test_loader:
        correct += int((inference(images).argmax(1) == labels).sum())
        seen += len(labels)
    accuracy = correct / seen
    print(f"test accuracy {accuracy:.3f} on {seen} images")
    # The simulated IPU does not report cycle counts yet, so this is host wall-clock time of
    # the simulation on this CPU, not IPU throughput.
    print(f"throughput (wall-clock of the CPU simulation, not simulated IPU time): "
          f"{samples / seconds:.0f} samples/s over {samples} training samples")
    training.destroy()
    inference.destroy()
    return accuracy


if __name__ == "__main__":
    main()
