"""Train a small classifier on the simulated IPU with the PopTorch API.

    python examples/poptorch_training.py

forward returns (output, loss); the training wrapper finds the loss, differentiates on the
device and applies the optimizer once per micro-batch (deviceIterations steps per call).
``OutputMode.All`` returns the loss of every micro-batch of a call (the training default,
``Final``, returns only the last one's), so the printed loss is the mean over each epoch.
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
    opts.outputMode(poptorch.OutputMode.All)  # one loss per micro-batch, not only the last
    loader = poptorch.DataLoader(opts, torch.utils.data.TensorDataset(x, target), batch_size=8,
                                 shuffle=True)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    ipu_model = poptorch.trainingModel(model, opts, optimizer)
    for epoch in range(3):
        losses = []
        for batch, batch_target in loader:
            _, loss = ipu_model(batch, batch_target)  # loss: [deviceIterations] values
            losses.append(loss)
        print(f"epoch {epoch}: mean loss {float(torch.cat(losses).mean()):.4f}")
    ipu_model.copyWeightsToHost()
    ipu_model.destroy()


if __name__ == "__main__":
    main()
