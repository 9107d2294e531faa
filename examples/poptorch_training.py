"""Train a small classifier on the simulated IPU with the PopTorch API.

    python examples/poptorch_training.py

forward returns (output, loss); the training wrapper finds the loss, differentiates on the
device and applies the optimizer once per micro-batch (deviceIterations steps per call).
"""

import torch

import poptorch_lite as poptorch


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 1))

    def forward(self, x, target):
        out = self.net(x)
        return out, torch.nn.functional.mse_loss(out, target)


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    target = x.sum(1, keepdim=True)
    opts = poptorch.Options().deviceIterations(4)
    loader = poptorch.DataLoader(opts, torch.utils.data.TensorDataset(x, target), batch_size=8,
                                 shuffle=True)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    ipu_model = poptorch.trainingModel(model, opts, optimizer)
    for epoch in range(3):
        for batch, batch_target in loader:
            _, loss = ipu_model(batch, batch_target)
        print(f"epoch {epoch}: last loss {float(loss):.4f}")
    ipu_model.copyWeightsToHost()
    ipu_model.destroy()


if __name__ == "__main__":
    main()
