"""Fidelity check of the device model (docs/device_model.md): does ResNet-50 training fit on a
Mk2 IPU, and how fast does the simulated IPU say it runs, next to what Graphcore published?

The published configuration (Graphcore's released ResNet-50 training on a Mk2 IPU-POD16):
micro-batch 18 images of 224x224 per replica, 16 replicas of 1 IPU, gradient accumulation 57,
float16, available memory proportion 0.16, SGD with momentum; about 30,000 images/s.

This script builds ResNet-50 (bottleneck blocks [3, 4, 6, 3], widths 64-2048, 1000 classes)
in torch itself (torchvision is not needed), exports it to ONNX in float16 (one trace, no
training), and asks the compile-time memory and cycle models of a training step on an offline
Mk2 (ipu2) device for the verdict, with the proportion given session-wide through
``convolutionOptions`` and ``matmulOptions``. Nothing is run and no device storage is
allocated. The batch norms are exported as inference batch norms (their statistics are not
updated) and the loss is the mean of the logits: the classifier's softmax and the statistics
updates are a small part of a step.

    python benchmarks/resnet50_fit.py [--blocks 3 4 6 3] [--image 224] [--recompute none]

Other ``--blocks``/``--image``/``--width`` values build a smaller net (the script says its figure
is then not comparable); tests/device/test_resnet50_fit_small.py runs one so it cannot rot.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import popart_backend as popart  # noqa: E402
from popart_backend.dataflow import AnchorReturnType, DataFlow  # noqa: E402
from popart_backend.device.analysis import analyse  # noqa: E402
from popart_backend.device.lower import lower  # noqa: E402
from popart_backend.device.memory import format_bytes  # noqa: E402
from popart_backend.device.transfers import BatchInfo  # noqa: E402
from popart_backend.importer.onnx_model import import_model, load_model  # noqa: E402
from popart_backend.transforms.pipeline import run_passes, training_passes  # noqa: E402


@dataclass(frozen=True)
class Published:
    """A configuration Graphcore released and ran, with its measured throughput."""

    micro_batch: int
    replicas: int
    accumulation: int
    image: int
    available_memory: float
    ipu_version: str
    system: str
    images_per_second: float


# Graphcore's released ResNet-50 training configuration on a Mk2 IPU-POD16.
RESNET50_POD16 = Published(micro_batch=18, replicas=16, accumulation=57, image=224,
                           available_memory=0.16, ipu_version="ipu2", system="Mk2 IPU-POD16",
                           images_per_second=30000.0)
RESNET50_BLOCKS = (3, 4, 6, 3)


class _Bottleneck(torch.nn.Module):
    def __init__(self, cin: int, mid: int, stride: int):
        super().__init__()
        cout = 4 * mid
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(cin, mid, 1, bias=False), torch.nn.BatchNorm2d(mid),
            torch.nn.ReLU(),
            torch.nn.Conv2d(mid, mid, 3, stride, 1, bias=False), torch.nn.BatchNorm2d(mid),
            torch.nn.ReLU(),
            torch.nn.Conv2d(mid, cout, 1, bias=False), torch.nn.BatchNorm2d(cout))
        self.skip = (torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                         torch.nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else torch.nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


class ResNet(torch.nn.Module):
    """ResNet with bottleneck blocks; ``blocks`` per stage, ``width`` channels after the stem
    (ResNet-50: blocks (3, 4, 6, 3), width 64). Returns the mean of the logits, in float32."""

    def __init__(self, blocks=RESNET50_BLOCKS, width: int = 64, classes: int = 1000):
        super().__init__()
        layers = [torch.nn.Conv2d(3, width, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(width),
                  torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1)]
        cin = width
        for stage, count in enumerate(blocks):
            mid = width * 2**stage
            for i in range(count):
                layers.append(_Bottleneck(cin, mid, 2 if i == 0 and stage > 0 else 1))
                cin = 4 * mid
        self.features = torch.nn.Sequential(*layers)
        self.fc = torch.nn.Linear(cin, classes)

    def forward(self, x):
        y = self.features(x).mean(dim=(2, 3))
        return self.fc(y).float().mean()


def export_resnet(path: Path, micro_batch: int, image: int, blocks=RESNET50_BLOCKS,
                  width: int = 64, classes: int = 1000) -> None:
    torch.manual_seed(0)
    model = ResNet(blocks, width, classes)
    with torch.no_grad():  # distinct values, so the exporter does not merge equal initializers
        for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            for t in (bn.weight, bn.bias, bn.running_mean):
                t.copy_(torch.randn_like(t))
            bn.running_var.copy_(torch.rand_like(bn.running_var) + 0.5)
    model = model.half().eval()
    x = torch.zeros((micro_batch, 3, image, image), dtype=torch.float16)
    with torch.no_grad():
        torch.onnx.export(model, (x,), str(path), input_names=["image"],
                          output_names=["loss"], opset_version=17, dynamo=False,
                          do_constant_folding=False)
    del model
    gc.collect()


def verdict(path: Path, published: Published, accumulation: int, recompute: bool = True):
    """The device model of one training configuration (nothing is run or allocated); without
    ``recompute``, no recomputation (the question whether the configuration needs it)."""
    loaded = load_model(str(path))
    opts = popart.SessionOptions()
    opts.enableGradientAccumulation = accumulation > 1
    opts.accumulationFactor = accumulation
    if published.replicas > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = published.replicas
    proportion = str(published.available_memory)
    # 18 images of activations do not fit in one IPU's SRAM without recomputation (run
    # ``--recompute none``), so the released runs must recompute too; their exact checkpoints
    # are not known here, Standard places its own.
    opts.autoRecomputation = (popart.RecomputationType.Standard if recompute
                              else popart.RecomputationType.NoRecompute)
    opts.convolutionOptions = {"availableMemoryProportion": proportion}
    opts.matmulOptions = {"availableMemoryProportion": proportion}
    optimizer = popart.SGD({"defaultLearningRate": (0.1, False),
                            "defaultMomentum": (0.9, True)})
    ir = import_model(loaded)
    ir.anchors = ["loss"]
    run_passes(ir, training_passes(opts, "loss", optimizer, accumulation, published.replicas,
                                   1, 1))
    flow = DataFlow(1, {"loss": AnchorReturnType("Final")})
    program = lower(ir, flow, published.replicas, accumulation)
    device = popart.DeviceManager().createOfflineIPUDevice(
        {"numIPUs": published.replicas, "ipuVersion": published.ipu_version})
    return analyse(ir, program.schedule, device, opts, BatchInfo.from_program(program),
                   program=program, model=loaded.proto)


def comparison_line(model, published: Published, comparable: bool = True) -> str:
    """Estimated throughput of all replicas next to the published figure, with the ratio."""
    estimate = model.cycles.samples_per_second
    ratio = estimate / published.images_per_second
    line = (f"estimated {estimate:.0f} images/s on {published.replicas} IPUs; published "
            f"{published.images_per_second:.0f} images/s ({published.system}); "
            f"ratio {ratio:.2f}")
    return line if comparable else line + " (a smaller net: not comparable)"


def run_published(path: Path, published: Published, accumulation: int,
                  comparable: bool, recompute: bool = True) -> tuple[object, list[str]]:
    """(device model, printed lines) of the published configuration or a smaller net."""
    start = time.perf_counter()
    model = verdict(path, published, accumulation, recompute)
    lines = [f"ResNet training, micro-batch {published.micro_batch}, replication "
             f"{published.replicas}, accumulation {accumulation}, available memory proportion "
             f"{published.available_memory}, {published.ipu_version}, "
             f"{'recomputation Standard' if recompute else 'no recomputation'}: "
             f"{'FITS' if model.memory.fits else 'DOES NOT FIT'} "
             f"({time.perf_counter() - start:.0f} s)"]
    for m in model.memory.ipus:
        cats = ", ".join(f"{k} {format_bytes(v)}" for k, v in m.categories.items() if v)
        lines.append(f"  IPU {m.ipu}: {format_bytes(m.total_bytes)} of "
                     f"{format_bytes(m.capacity_bytes)} ({100 * m.utilisation:.0f}%), fullest "
                     f"tile {format_bytes(m.worst_tile_bytes)} of {format_bytes(m.tile_bytes)}"
                     + ("" if m.fits else "  OUT OF MEMORY"))
        lines.append(f"    {cats}")
    lines.append(f"  step ({accumulation} micro-batches per replica): "
                 f"{model.cycles.step_seconds * 1e3:.1f} ms")
    lines.append("  " + comparison_line(model, published, comparable))
    return model, lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, nargs=4, default=list(RESNET50_BLOCKS))
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--image", type=int, default=RESNET50_POD16.image)
    parser.add_argument("--accumulation", type=int, default=RESNET50_POD16.accumulation)
    parser.add_argument("--recompute", choices=("standard", "none"), default="standard",
                        help="autoRecomputation (none: does the configuration need it?)")
    args = parser.parse_args(argv)
    published = RESNET50_POD16
    comparable = (tuple(args.blocks) == RESNET50_BLOCKS and args.width == 64
                  and args.image == published.image
                  and args.accumulation == published.accumulation)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resnet.onnx"
        start = time.perf_counter()
        export_resnet(path, published.micro_batch, args.image, tuple(args.blocks), args.width)
        print(f"exported ResNet (blocks {args.blocks}, width {args.width}, micro-batch "
              f"{published.micro_batch}, {args.image}x{args.image}, float16) in "
              f"{time.perf_counter() - start:.0f} s")
        _, lines = run_published(path, published, args.accumulation, comparable,
                                 args.recompute == "standard")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
