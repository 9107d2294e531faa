"""Run a PyTorch model on the simulated IPU with the PopTorch API.

    python examples/poptorch_inference.py

The DataLoader hands out combined batches (batch_size × deviceIterations samples); each
wrapper call runs deviceIterations micro-batches on the device and returns every output.
"""

import torch

import poptorch_lite as poptorch


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model.eval()

    opts = poptorch.Options().deviceIterations(4)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8))
    loader = poptorch.DataLoader(opts, data, batch_size=2)
    ipu_model = poptorch.inferenceModel(model, opts)

    for (x,) in loader:
        out = ipu_model(x)
        assert torch.allclose(out, model(x), atol=1e-5)
    print(f"{len(loader)} calls of {loader.combinedBatchSize} samples; last output {tuple(out.shape)}")
    ipu_model.destroy()


if __name__ == "__main__":
    main()
