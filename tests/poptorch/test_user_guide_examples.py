"""Our own equivalents of PopTorch's user-guide examples that need no IPU hardware, written as a
PopTorch user would (``import poptorch_lite as poptorch``) and compared with eager PyTorch:
inference, a training loop with DataLoader and device iterations, pipelining with BeginBlock
over 2 IPUs, replication, gradient accumulation, setOptimizer with an LR schedule, a custom op
and anchorTensor (spec §2, P1-P77). Tiny sizes."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import popart_backend as popart
import poptorch_lite as poptorch
from popart_backend import custom
from popart_backend.custom.api import GradOp, GradOpInType, Op
from popart_backend.custom.registration import register_grad_op, register_op
from poptorch_lite.testing import assert_allclose, run_reference

from .training_helpers import assert_state_equal


class ClassifierWithLoss(torch.nn.Module):
    """The user guide's pattern: forward returns (output, loss) when labels are given."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer1 = torch.nn.Linear(6, 8)
        self.layer2 = torch.nn.Linear(8, 3)
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, labels=None):
        out = self.layer2(torch.relu(self.layer1(x)))
        if labels is None:
            return out
        return out, self.loss(out, labels)


def _dataset(rows, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(torch.randn(rows, 6, generator=generator),
                                          torch.randint(0, 3, (rows,), generator=generator))


def test_inference_of_a_small_model():
    model = ClassifierWithLoss().eval()
    poptorch_model = poptorch.inferenceModel(model)
    x = torch.randn(4, 6)
    assert_allclose(actual=poptorch_model(x), expected=model(x).detach(), rtol=1e-5, atol=1e-6)


def test_training_loop_with_dataloader_and_device_iterations():
    model = ClassifierWithLoss()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(2)
    loader = poptorch.DataLoader(opts, _dataset(16), batch_size=2, shuffle=False)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1)
    poptorch_model = poptorch.trainingModel(model, options=opts, optimizer=optimizer)
    batches = []
    for data, labels in loader:
        assert data.shape[0] == 4  # batch_size x deviceIterations
        output, loss = poptorch_model(data, labels)
        batches.append((data, labels, output, loss))
    assert len(batches) == 4
    expected = run_reference(reference, torch.optim.SGD(reference.parameters(), lr=0.1),
                             [b[:2] for b in batches], opts)
    for (_, _, output, loss), (ref_output, ref_loss) in zip(batches, expected):
        assert_allclose(actual=loss, expected=ref_loss, rtol=1e-5, atol=1e-6)
    assert_state_equal(model, reference, rtol=1e-5, atol=1e-6)


class FourLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.layer1 = torch.nn.Linear(5, 10)
        self.layer2 = torch.nn.Linear(10, 5)
        self.layer3 = torch.nn.Linear(5, 5)
        self.layer4 = torch.nn.Linear(5, 5)

    def forward(self, x):
        x = torch.relu(self.layer1(x))
        x = torch.relu(self.layer2(x))
        x = torch.relu(self.layer3(x))
        return torch.softmax(self.layer4(x), dim=1)


def test_pipelining_with_begin_block_over_two_ipus():
    model = FourLayers().eval()
    reference = copy.deepcopy(model)
    model.layer3 = poptorch.BeginBlock(model.layer3, ipu_id=1)
    opts = poptorch.Options().deviceIterations(4)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    poptorch_model = poptorch.inferenceModel(model, opts)
    x = torch.randn(8, 5)
    assert_allclose(actual=poptorch_model(x), expected=reference(x).detach(), rtol=1e-5,
                    atol=1e-6)


def test_pipelined_training_with_gradient_accumulation():
    class WithLoss(FourLayers):
        def forward(self, x, target):
            out = super().forward(x)
            return out, torch.nn.functional.mse_loss(out, target)

    model = WithLoss()
    reference = copy.deepcopy(model)
    model.layer3 = poptorch.BeginBlock(model.layer3, ipu_id=1)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    poptorch_model = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(),
                                                                         lr=0.5))
    generator = torch.Generator().manual_seed(2)
    batches = [(torch.randn(8, 5, generator=generator), torch.rand(8, 5, generator=generator))
               for _ in range(2)]
    expected = run_reference(reference, torch.optim.SGD(reference.parameters(), lr=0.5),
                             batches, opts)
    for inputs, (_, ref_loss) in zip(batches, expected):
        _, loss = poptorch_model(*inputs)
        assert_allclose(actual=loss, expected=ref_loss, rtol=1e-5, atol=1e-6)
    assert_state_equal(model, reference, rtol=1e-5, atol=1e-6)


def test_replication_trains_like_one_step_on_the_combined_batch():
    """Two replicas each take half of the rows; their mean-reduced gradients are averaged, so
    one step equals eager SGD on the whole batch with the mean loss."""
    model = ClassifierWithLoss()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().replicationFactor(2)
    poptorch_model = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(),
                                                                         lr=0.2))
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.2)
    data = _dataset(8, seed=4).tensors
    for _ in range(2):
        poptorch_model(*data)
        _, loss = reference(*data)
        loss.backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
    assert_state_equal(model, reference, rtol=1e-5, atol=1e-6)


def test_gradient_accumulation():
    model = ClassifierWithLoss()
    reference = copy.deepcopy(model)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    loader = poptorch.DataLoader(opts, _dataset(8, seed=5), batch_size=2)
    poptorch_model = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(),
                                                                         lr=0.1))
    batches = list(loader)
    for data, labels in batches:
        poptorch_model(data, labels)
    run_reference(reference, torch.optim.SGD(reference.parameters(), lr=0.1), batches, opts)
    assert_state_equal(model, reference, rtol=1e-5, atol=1e-6)


def test_set_optimizer_with_an_lr_schedule():
    model = ClassifierWithLoss()
    reference = copy.deepcopy(model)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)
    poptorch_model = poptorch.trainingModel(model, optimizer=optimizer)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.2, momentum=0.5)
    ref_scheduler = torch.optim.lr_scheduler.ExponentialLR(ref_optimizer, gamma=0.5)
    data = _dataset(4, seed=6).tensors
    for _ in range(3):
        _, loss = poptorch_model(*data)
        scheduler.step()
        poptorch_model.setOptimizer(optimizer)
        _, ref_loss = reference(*data)
        ref_loss.backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
        ref_scheduler.step()
        assert_allclose(actual=loss, expected=ref_loss.detach(), rtol=1e-5, atol=1e-6)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.025)
    assert_state_equal(model, reference, rtol=1e-5, atol=1e-6)


DOMAIN = "user.guide"
CUBE = popart.OperatorIdentifier(DOMAIN, "Cube", 1)
CUBE_GRAD = popart.OperatorIdentifier(DOMAIN, "CubeGrad", 1)


@pytest.fixture
def cube_op():
    """The user's custom op library: y = scale * x**3, with its gradient."""
    @register_op(CUBE)
    class Cube(Op):
        def __init__(self, opid, attributes, settings):
            super().__init__(opid, settings)
            self.scale = float(attributes.get("scale", 1.0))

        def setup(self, in_infos):
            return [in_infos[0]]

        def grad_ops(self):
            return [CubeGrad(self)]

        def compute(self, ctx, x):
            return (self.scale * x ** 3).astype(x.dtype)

    @register_grad_op(CUBE_GRAD)
    class CubeGrad(GradOp):
        grad_input_info = [(0, 0, GradOpInType.GradOut), (1, 0, GradOpInType.In)]
        grad_out_to_non_grad_in = {0: 0}

        def __init__(self, fwd):
            super().__init__(CUBE_GRAD, fwd.settings)
            self.scale = fwd.scale

        def setup(self, in_infos):
            return [in_infos[0]]

        def compute(self, ctx, dy, x):
            return (dy * 3 * self.scale * np.square(x)).astype(dy.dtype)

    yield
    custom.unregister_op(CUBE)
    custom.unregister_op(CUBE_GRAD)


def test_custom_op_in_training(cube_op):
    class Model(torch.nn.Module):
        def __init__(self, use_custom_op):
            super().__init__()
            torch.manual_seed(7)
            self.fc = torch.nn.Linear(3, 3)
            self.use_custom_op = use_custom_op

        def forward(self, x, target):
            h = self.fc(x)
            if self.use_custom_op:
                (h,) = poptorch.custom_op([h], "Cube", DOMAIN, 1, example_outputs=[h],
                                          attributes={"scale": 0.5})
            else:
                h = 0.5 * h ** 3
            return h, torch.nn.functional.mse_loss(h, target)

    model, reference = Model(True), Model(False)
    poptorch_model = poptorch.trainingModel(model, optimizer=torch.optim.SGD(
        model.parameters(), lr=0.1))
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    x, target = torch.randn(4, 3), torch.randn(4, 3)
    for _ in range(2):
        out, _ = poptorch_model(x, target)
        ref_out, ref_loss = reference(x, target)
        ref_loss.backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
        assert_allclose(actual=out, expected=ref_out.detach(), rtol=1e-5, atol=1e-6)
    assert_state_equal(model, reference, rtol=1e-5, atol=1e-6)


def test_anchor_tensor_of_a_gradient():
    model = ClassifierWithLoss()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().anchorTensor("grad_bias", "Gradient___layer2.bias")
    poptorch_model = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(),
                                                                         lr=0.1))
    data = _dataset(4, seed=8).tensors
    poptorch_model(*data)
    _, loss = reference(*data)
    loss.backward()
    assert_allclose(actual=poptorch_model.getAnchoredTensor("grad_bias"),
                    expected=reference.layer2.bias.grad, rtol=1e-5, atol=1e-6)
