"""Forward loss ops against torch (ai.graphcore losses) and onnxruntime (ONNX losses). F49."""

import numpy as np
import pytest
import torch

from tests.helpers import check_op, one_op_model, rand, run_popart, assert_close

REDUCTIONS = {0: "sum", 1: "mean", 2: "none"}


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_identityloss(reduction):
    x = rand(4, 3)
    model, feeds = one_op_model("IdentityLoss", [x], {"reduction": reduction}, domain="ai.graphcore")
    ours = run_popart(model, feeds)["out0"]
    ref = {0: x.sum(), 1: x.mean(), 2: x}[reduction]
    assert_close(ours, np.asarray(ref, dtype=np.float32))


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_l1loss(reduction):
    x = rand(4, 3)
    model, feeds = one_op_model("L1", [x], {"reduction": reduction, "lambda": 0.5},
                                domain="ai.graphcore")
    ours = run_popart(model, feeds)["out0"]
    ref = torch.nn.functional.l1_loss(torch.from_numpy(x), torch.zeros(4, 3),
                                      reduction=REDUCTIONS[reduction]) * 0.5
    assert_close(ours, ref.numpy())


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("log_input", [0, 1])
def test_nllloss(reduction, log_input):
    probs = torch.softmax(torch.from_numpy(rand(5, 4)), dim=-1)
    label = np.array([0, 3, 1, 2, 1], dtype=np.int32)
    inp = probs.log() if log_input else probs
    attrs = {"reduction": reduction, "inputIsLogProbability": log_input, "ignoreIndex": 1}
    model, feeds = one_op_model("Nll", [inp.numpy(), label], attrs, domain="ai.graphcore")
    ours = run_popart(model, feeds)["out0"]
    ref = torch.nn.functional.nll_loss(probs.log(), torch.from_numpy(label).long(),
                                       ignore_index=1, reduction=REDUCTIONS[reduction])
    assert_close(ours, ref.numpy(), rtol=1e-5, atol=1e-6)


def test_nllloss_label_shape_error():
    from popart_backend.errors import ShapeError

    model, feeds = one_op_model("Nll", [rand(5, 4), np.zeros(4, np.int32)], {},
                                domain="ai.graphcore")
    with pytest.raises(ShapeError, match="Nll.*label shape"):
        run_popart(model, feeds)


@pytest.mark.parametrize("opset", [12, 13])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_onnx_losses(opset, reduction, weighted):
    scores = rand(3, 5, 2)
    labels = np.array([[0, 4], [2, 1], [3, 3]], dtype=np.int64)
    weights = rand(5, low=0.1, high=1.0) if weighted else None
    attrs = {"reduction": reduction, "ignore_index": 2}
    check_op("SoftmaxCrossEntropyLoss", [scores, labels, weights], attrs, opset=opset,
             num_outputs=2)
    check_op("NegativeLogLikelihoodLoss", [scores, labels, weights], attrs, opset=opset)


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_loss_gradients(reduction):
    """Gradients of the ai.graphcore losses against torch.autograd (issue #3 item 3)."""
    from tests.helpers import check_grad

    red = REDUCTIONS[reduction]
    check_grad("IdentityLoss", [rand(4, 3)], {"reduction": reduction}, domain="ai.graphcore",
               ref=lambda x: {"sum": x.sum(), "mean": x.mean(), "none": x}[red])
    check_grad("L1", [rand(4, 3)], {"reduction": reduction, "lambda": 0.3}, domain="ai.graphcore",
               ref=lambda x: torch.nn.functional.l1_loss(x, torch.zeros_like(x), reduction=red) * 0.3)
    probs = torch.softmax(torch.from_numpy(rand(5, 4)), dim=-1).numpy()
    label = np.array([0, 3, 1, 2, 1], dtype=np.int32)
    for log_input in (0, 1):
        inp = np.log(probs) if log_input else probs
        check_grad("Nll", [inp, label],
                   {"reduction": reduction, "ignoreIndex": 1, "inputIsLogProbability": log_input},
                   domain="ai.graphcore",
                   ref=lambda p, l: torch.nn.functional.nll_loss(
                       p if log_input else p.log(), l.long(), ignore_index=1, reduction=red))
