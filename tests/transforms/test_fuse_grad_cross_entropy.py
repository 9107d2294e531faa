"""FuseCrossEntropyGrad (transforms/fuse_grad_cross_entropy.py): a trained
SoftmaxCrossEntropyLoss computes its softmax once in the forward, reads the loss from it, and
its gradient scales it in place. Loss and gradient against torch (float64 autograd), the
gradient equal to the unfused one, the pass fires (and does not where it must not), and the
loss stays right where the softmax underflows at the label."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.errors import popart_exception
from popart_backend.importer.onnx_model import import_model
from popart_backend.transforms.autodiff import Autodiff
from popart_backend.transforms.fuse_grad_cross_entropy import FuseCrossEntropyGrad
from tests.helpers import one_op_model

N, C = 6, 7
FUSED = ("Softmax", "SoftmaxCrossEntropyFromProbs", "SoftmaxCrossEntropyGradFromProbs")


def _data(scale=1.0, dtype=np.float32, ignore=None):
    rng = np.random.default_rng(0)
    scores = (rng.standard_normal((N, C)) * scale).astype(dtype)
    labels = np.array([0, 6, 2, 3, 2, 1], np.int64)
    if ignore is not None:
        labels[[1, 4]] = ignore
    weights = rng.uniform(0.2, 1.0, C).astype(dtype)
    return scores, labels, weights


def _run(scores, labels, weights, attrs, fuse, num_outputs=1, feed_labels=None):
    """(loss, d scores, op type counts, fired) of SoftmaxCrossEntropyLoss(in0, in1[, in2])
    with a random seed for the loss gradient."""
    inputs = [scores, labels] + ([weights] if weights is not None else [])
    model, _ = one_op_model("SoftmaxCrossEntropyLoss", inputs, attrs, opset=13,
                            num_outputs=num_outputs, const_inputs={0, 1, 2})
    ir = import_model(model, constant_weights=False)
    loss = ir.main.tensors["out0"]
    seed = np.random.default_rng(1).uniform(0.5, 1.5, loss.info.shape).astype(scores.dtype)
    autodiff = Autodiff(None, output_grads={"out0": seed})
    autodiff.run(ir)
    grad_id = autodiff.variable_grads["in0"]
    fired = FuseCrossEntropyGrad().run(ir) if fuse else False
    plan = ExecutionPlan(ir.main, keep=["out0", grad_id])
    if feed_labels is not None:
        plan.set_value("in1", to_torch(feed_labels))
    plan.execute()
    counts = Counter(op.op_type for op in ir.main.ops.values())
    return (plan.get_value("out0").numpy(), plan.get_value(grad_id).numpy(), counts, fired,
            seed)


def _reference(scores, labels, weights, reduction, ignore, seed):
    x = torch.from_numpy(scores.astype(np.float64)).requires_grad_()
    w = None if weights is None else torch.from_numpy(weights.astype(np.float64))
    loss = F.cross_entropy(x, torch.from_numpy(labels), weight=w, reduction=reduction,
                           ignore_index=-100 if ignore is None else ignore)
    (loss * torch.from_numpy(seed.astype(np.float64))).sum().backward()
    return loss.detach().numpy(), x.grad.numpy()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 5])
def test_fused_cross_entropy_matches_torch_and_the_unfused_gradient(reduction, weighted,
                                                                    ignore):
    scores, labels, weights = _data(ignore=ignore)
    weights = weights if weighted else None
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    loss, grad, counts, fired, seed = _run(scores, labels, weights, attrs, fuse=True)
    assert fired and all(counts[t] == 1 for t in FUSED)
    assert counts["SoftmaxCrossEntropyLoss"] == counts["SoftmaxCrossEntropyLossGrad"] == 0
    want_loss, want_grad = _reference(scores, labels, weights, reduction, ignore, seed)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
    unfused_loss, unfused_grad, unfused_counts, _, _ = _run(scores, labels, weights, attrs,
                                                            fuse=False)
    assert unfused_counts["SoftmaxCrossEntropyLossGrad"] == 1 and unfused_counts["Softmax"] == 0
    np.testing.assert_array_equal(grad, unfused_grad)  # the same softmax, scaling, subtraction
    np.testing.assert_allclose(loss, unfused_loss, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype, scale, one_row", [(np.float32, 300.0, False),
                                                   (np.float64, 3000.0, False),
                                                   (np.float32, 300.0, True)])
def test_loss_is_exact_where_the_softmax_underflows_at_the_label(dtype, scale, one_row):
    """Scores so spread that P at the label is 0 (-log P would be inf): those rows take
    x[label] - logsumexp(x) instead, as torch's log-softmax does (most rows, or one row)."""
    scores, labels, _ = _data(scale=scale, dtype=dtype)
    if one_row:
        scores[[0, 2, 3, 4, 5]] /= scale  # only row 1 stays spread
    scores[0, labels[0]] = scores[0].max() + 1  # one row where the label wins
    probs = torch.softmax(torch.from_numpy(scores), 1).gather(1, torch.from_numpy(labels)[:, None])
    zero = int((probs == 0).sum())
    assert (zero == 1 if one_row else zero >= 2) and (probs > 0.5).any()
    loss, grad, _, fired, seed = _run(scores, labels, None, {"reduction": "none"}, fuse=True)
    assert fired and np.isfinite(loss).all()
    want_loss, want_grad = _reference(scores, labels, None, "none", None, seed)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)


def test_the_forward_computes_no_log_softmax_and_the_backward_no_softmax():
    scores, labels, _ = _data()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _run(scores, labels, None, {"reduction": "mean"}, fuse=True)
    counts = {e.key: e.count for e in prof.key_averages()}
    assert counts.get("aten::_log_softmax", 0) == 0
    assert counts.get("aten::_softmax", 0) == 1
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _run(scores, labels, None, {"reduction": "mean"}, fuse=False)
    counts = {e.key: e.count for e in prof.key_averages()}
    assert counts.get("aten::_log_softmax", 0) == 1 and counts.get("aten::_softmax", 0) == 1


def test_not_fused_when_the_log_probabilities_are_an_output():
    scores, labels, _ = _data()
    loss, grad, counts, fired, seed = _run(scores, labels, None, {"reduction": "sum"},
                                           fuse=True, num_outputs=2)
    assert not fired and counts["SoftmaxCrossEntropyLoss"] == 1 and counts["Softmax"] == 0
    want_loss, want_grad = _reference(scores, labels, None, "sum", None, seed)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)


def test_not_fused_for_float16_or_rank_3_scores():
    scores, labels, _ = _data(dtype=np.float16)
    *_, fired, _ = _run(scores, labels, None, {"reduction": "mean"}, fuse=True)
    assert not fired
    scores3 = np.random.default_rng(0).standard_normal((2, C, 3)).astype(np.float32)
    labels3 = np.array([[0, 1, 2], [3, 4, 5]], np.int64)
    *_, fired, _ = _run(scores3, labels3, None, {"reduction": "mean"}, fuse=True)
    assert not fired


def test_disabled_pass_does_nothing():
    scores, labels, _ = _data()
    model, _ = one_op_model("SoftmaxCrossEntropyLoss", [scores, labels], {}, opset=13,
                            const_inputs={0, 1})
    ir = import_model(model, constant_weights=False)
    Autodiff(None, output_grads={"out0": np.float32(1.0)}).run(ir)
    assert not FuseCrossEntropyGrad(enabled=False).run(ir)


def test_out_of_range_label_is_refused_with_the_label():
    scores, labels, _ = _data()
    labels[2] = C + 3
    with pytest.raises(popart_exception, match=f"label {C + 3} is outside the {C} classes"):
        _run(scores, labels, None, {"reduction": "mean"}, fuse=True)


@pytest.mark.parametrize("fuse", [True, False])
def test_label_minus_100_without_ignore_index_is_refused(fuse):
    """The loss has no ignore_index, so every label must be a class: -100 (torch's default
    ignore index) is refused, not dropped."""
    scores, labels, _ = _data()
    labels[2] = -100
    with pytest.raises(Exception, match="-100"):
        _run(scores, labels, None, {"reduction": "mean"}, fuse=fuse)
    # With ignore_index=-100 the row is dropped, as torch does.
    loss, *_ = _run(scores, labels, None, {"reduction": "mean", "ignore_index": -100}, fuse=fuse)
    keep = labels != -100
    want = F.cross_entropy(torch.from_numpy(scores[keep]), torch.from_numpy(labels[keep]))
    np.testing.assert_allclose(loss, want.numpy(), rtol=1e-6)


def test_an_ignored_row_with_non_finite_scores_adds_nothing_to_the_loss():
    scores, labels, _ = _data(ignore=5)
    scores[1] = np.nan  # label 5 there: ignored, as torch's nll_loss skips it
    loss, _, _, fired, seed = _run(scores, labels, None, {"reduction": "mean", "ignore_index": 5},
                                   fuse=True)
    want_loss, _ = _reference(scores, labels, None, "mean", 5, seed)
    assert fired and np.isfinite(loss)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
