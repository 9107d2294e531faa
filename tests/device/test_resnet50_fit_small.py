"""benchmarks/resnet50_fit.py at a tiny scale (docs/device_model.md), so its path cannot rot: a
ResNet with one bottleneck block per stage, width 8, 32x32 images, exported to ONNX in float16
and analysed by the compile-time device model with the published configuration's options
(replication, gradient accumulation, session-wide available memory proportion, recomputation,
Mk2 IPUs)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("resnet50_fit",
                                                  ROOT / "benchmarks" / "resnet50_fit.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = _bench()
PUBLISHED = dataclasses.replace(bench.RESNET50_POD16, micro_batch=2, replicas=2,
                                accumulation=3, image=32)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("resnet") / "resnet.onnx"
    bench.export_resnet(path, PUBLISHED.micro_batch, PUBLISHED.image, (1, 1, 1, 1), 8, 10)
    return bench.run_published(path, PUBLISHED, PUBLISHED.accumulation, comparable=False)


def test_resnet_net_has_the_resnet50_shape():
    """The full net: 53 convolutions (49 in the blocks and stem, 4 projections) and about
    25.6 M parameters, as ResNet-50 has."""
    net = bench.ResNet()
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 53
    params = sum(p.numel() for p in net.parameters())
    assert 25.4e6 < params < 25.7e6


def test_small_resnet_fit_prints_verdict_and_throughput_ratio(run):
    model, lines = run
    text = "\n".join(lines)
    assert model.memory.fits and "FITS" in lines[0]
    samples = PUBLISHED.micro_batch * PUBLISHED.accumulation * PUBLISHED.replicas
    estimate = samples / model.cycles.step_seconds
    match = re.search(r"estimated (\d+) images/s on 2 IPUs; published 30000 images/s "
                      r"\(Mk2 IPU-POD16\); ratio ([\d.]+) \(a smaller net", text)
    assert match, text
    assert int(match.group(1)) == pytest.approx(estimate, abs=1)
    assert float(match.group(2)) == pytest.approx(estimate / 30000, abs=0.006)


def test_small_resnet_fit_plans_convolutions_with_the_session_proportion(run):
    model, _ = run
    spec = model.memory.spec
    [ipu] = model.memory.ipus
    temps = [t for t in ipu.tensors if t.category == "planner temporaries"]
    assert temps  # every convolution (forward and gradients) holds its plan's temporaries
    budget = PUBLISHED.available_memory * spec.tile_bytes
    assert all(t.num_bytes <= budget * t.num_tiles for t in temps)


def test_small_resnet_fit_without_recomputation_keeps_more_activations(tmp_path, run):
    """``--recompute none``: the question whether the configuration needs recomputation. The
    same net without it keeps every forward activation to the backward pass."""
    model, lines = run
    assert "recomputation Standard" in lines[0]
    path = tmp_path / "resnet.onnx"
    bench.export_resnet(path, PUBLISHED.micro_batch, PUBLISHED.image, (1, 1, 1, 1), 8, 10)
    plain, plain_lines = bench.run_published(path, PUBLISHED, PUBLISHED.accumulation,
                                             comparable=False, recompute=False)
    assert "no recomputation" in plain_lines[0]
    [with_recompute], [without] = model.memory.ipus, plain.memory.ipus
    assert without.categories["activations"] > with_recompute.categories["activations"]
