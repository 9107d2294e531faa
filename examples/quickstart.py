"""Quickstart: build a graph with popart.Builder, run it, then run an exported PyTorch model.

Run it with ``python examples/quickstart.py``. It takes a few seconds, prints the results and
exits with status 1 if popart_backend disagrees with numpy or with PyTorch.
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

import popart_backend as popart


def builder_example() -> float:
    """y = relu(x @ w + b), built op by op, four batches per step."""
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    rng = np.random.default_rng(7)
    w_value = rng.standard_normal((3, 4)).astype(np.float32)
    b_value = rng.standard_normal(4).astype(np.float32)
    w = builder.addInitializedInputTensor(w_value, "w")
    b = builder.addInitializedInputTensor(b_value, "b")
    y = builder.aiOnnx.relu([builder.aiOnnx.add([builder.aiOnnx.matmul([x, w]), b])])
    builder.addOutputTensor(y)

    batches_per_step = 4
    session = popart.InferenceSession(
        fnModel=builder.getModelProto(),
        dataFlow=popart.DataFlow(batches_per_step, {y: popart.AnchorReturnType("ALL")}),
        deviceInfo=popart.DeviceManager().createCpuDevice(),
    )
    session.prepareDevice()
    anchors = session.initAnchorArrays()  # {y: array of shape [4, 2, 4]}

    # One step feeds batchesPerStep micro-batches: the leading axis of each input.
    inputs = {x: rng.standard_normal((batches_per_step, 2, 3)).astype(np.float32)}
    session.run(popart.PyStepIO(inputs, anchors))

    print(f"Builder graph: y = relu(x @ w + b), {batches_per_step} batches per step")
    print(f"  y has shape {anchors[y].shape}; first batch:\n{anchors[y][0]}")
    expected = np.maximum(inputs[x] @ w_value + b_value, 0)
    error = float(np.abs(anchors[y] - expected).max())
    print(f"  max |popart - numpy| = {error:.2e}")
    return error


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4), torch.nn.Softmax(-1)
        )

    def forward(self, x):
        return self.net(x)


def pytorch_example(folder: Path) -> float:
    """Export a torch model to ONNX and run the file with an InferenceSession."""
    torch.manual_seed(0)
    model = TinyNet().eval()
    x = torch.randn(5, 8)
    path = folder / "tiny.onnx"
    # The TorchScript exporter is the fast one for a quick start; the torch.export-based one
    # (dynamo=True, what poptorch_lite uses) works too and takes a few seconds longer.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(model, (x,), str(path), input_names=["input"], output_names=["output"],
                          dynamo=False, opset_version=13)

    session = popart.InferenceSession(
        fnModel=str(path),
        dataFlow=popart.DataFlow(1, {"output": popart.AnchorReturnType("ALL")}),
        deviceInfo=popart.DeviceManager().createCpuDevice(),
    )
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"input": x.numpy()}, anchors))

    with torch.no_grad():
        expected = model(x).numpy()
    error = float(np.abs(anchors["output"] - expected).max())
    print(f"Exported PyTorch model ({path.name}): output shape {anchors['output'].shape}")
    print(f"  max |popart - torch| = {error:.2e}")
    return error


def main() -> int:
    errors = [builder_example()]
    with tempfile.TemporaryDirectory() as folder:
        errors.append(pytorch_example(Path(folder)))
    if max(errors) > 1e-5:
        print("MISMATCH: popart_backend disagrees with the reference.", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
