"""What the examples print is honest: the training example prints the mean loss over each epoch's
micro-batches, and the main (digits) example's data loaders drop no samples, so its first run
prints no warning about dropped samples."""

from __future__ import annotations

import re
import runpy
import sys
import warnings
from pathlib import Path

import pytest
import torch

import poptorch_lite as poptorch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def test_poptorch_training_prints_the_mean_loss_of_every_micro_batch(capsys, monkeypatch):
    recorded = []
    real_cat = torch.cat

    def cat(tensors, *args, **kwargs):  # the losses the example averages
        recorded.append([t.clone() for t in tensors])
        return real_cat(tensors, *args, **kwargs)

    module = runpy.run_path(str(EXAMPLES / "poptorch_training.py"), run_name="example")
    monkeypatch.setattr(module["torch"], "cat", cat)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module["main"]()
    printed = [float(v) for v in re.findall(r"epoch \d: mean loss ([\d.]+)",
                                           capsys.readouterr().out)]
    assert len(printed) == 3 == len(recorded)
    for value, losses in zip(printed, recorded):
        # one loss per micro-batch: deviceIterations(4) values per call, every call of the epoch
        assert all(loss.shape == (4,) for loss in losses)
        assert len(losses) == 256 // (8 * 4)
        reference = sum(float(x) for loss in losses for x in loss) / (4 * len(losses))
        assert value == pytest.approx(reference, abs=1e-4)
    assert printed[0] > printed[1] > printed[2]  # the per-epoch mean falls steadily
    assert [w for w in caught if issubclass(w.category, UserWarning)] == []


def test_digits_example_loaders_drop_no_samples():
    pytest.importorskip("sklearn")
    sys.path.insert(0, str(EXAMPLES))
    try:
        example = runpy.run_path(str(EXAMPLES / "train_digits.py"), run_name="example")
    finally:
        sys.path.remove(str(EXAMPLES))
    train, test = example["digits_split"]()
    train_opts = poptorch.Options().deviceIterations(example["DEVICE_ITERATIONS"])
    train_opts.Training.gradientAccumulation(example["ACCUMULATION"])
    test_opts = poptorch.Options().deviceIterations(example["TEST_DEVICE_ITERATIONS"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a dropped-samples warning fails the test
        train_loader = poptorch.DataLoader(train_opts, train, batch_size=example["MICRO_BATCH"],
                                           shuffle=True)
        test_loader = poptorch.DataLoader(test_opts, test, batch_size=example["MICRO_BATCH"])
    assert len(train_loader) * train_loader.combinedBatchSize == len(train)
    assert len(test_loader) * test_loader.combinedBatchSize == len(test)
    # The split keeps all but fewer than one training call of the 1797 images.
    from sklearn.datasets import load_digits
    total = len(load_digits().target)
    assert 0 <= total - len(train) - len(test) < train_loader.combinedBatchSize
