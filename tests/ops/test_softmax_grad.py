"""Gradients of Softmax and LogSoftmax (both axis rules) against torch.autograd (issue #3
item 2, F49)."""

import pytest
import torch

from tests.helpers import check_grad, rand

FNS = {"Softmax": torch.softmax, "LogSoftmax": torch.log_softmax}


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
def test_softmax_grad_opset13(op_type, axis):
    check_grad(op_type, [rand(2, 3, 4)], {"axis": axis}, opset=13,
               ref=lambda x: FNS[op_type](x, axis))


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 9])
@pytest.mark.parametrize("axis", [0, 1, 2, -1, 3])
def test_softmax_grad_coerced_2d(op_type, opset, axis):
    """Versions 1 and 11 flatten to [prod(d[:axis]), prod(d[axis:])] and normalize rows."""
    shape = (2, 3, 4)
    cut = axis + len(shape) if axis < 0 else axis
    rows = 1
    for d in shape[:cut]:
        rows *= d

    def ref(x):
        return FNS[op_type](x.reshape(rows, -1), 1).reshape(shape)

    check_grad(op_type, [rand(*shape)], {"axis": axis}, opset=opset, ref=ref)


def test_hardmax_has_zero_grad():
    """Hardmax's gradient is zero: no gradient reaches its input."""
    import numpy as np

    from popart_backend.importer.onnx_model import import_model
    from popart_backend.transforms.autodiff import Autodiff
    from tests.helpers import one_op_model

    model, _ = one_op_model("Hardmax", [rand(2, 3)], {}, opset=13, const_inputs=[0])
    ir = import_model(model, constant_weights=False)
    autodiff = Autodiff(None, output_grads={"out0": np.ones((2, 3), np.float32)})
    autodiff.run(ir)
    assert "in0" not in autodiff.variable_grads


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 2])
def test_onnx_loss_grads(reduction, weighted, ignore):
    """SoftmaxCrossEntropyLoss (with and without its log-prob output) and
    NegativeLogLikelihoodLoss against torch.nn.functional.cross_entropy / nll_loss."""
    import numpy as np
    import torch.nn.functional as F

    scores = rand(3, 5, 2)
    labels = np.array([[0, 4], [2, 1], [3, 2]], dtype=np.int64)
    weights = rand(5, low=0.1, high=1.0) if weighted else None
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    kw = dict(reduction=reduction, ignore_index=ignore if ignore is not None else -100)

    def ce(s, lab, w=None):
        return F.cross_entropy(s, lab, weight=w, **kw)

    def ce_both(s, lab, w=None):
        return [F.cross_entropy(s, lab, weight=w, **kw), torch.log_softmax(s, 1)]

    def nll(s, lab, w=None):
        return F.nll_loss(s, lab, weight=w, **kw)

    inputs = [scores, labels] + ([weights] if weighted else [])
    check_grad("SoftmaxCrossEntropyLoss", inputs, attrs, opset=13, wrt=[0],
               const_inputs=[1, 2], ref=ce)
    check_grad("SoftmaxCrossEntropyLoss", inputs, attrs, opset=13, wrt=[0], num_outputs=2,
               const_inputs=[1, 2], ref=ce_both)
    check_grad("NegativeLogLikelihoodLoss", inputs, attrs, opset=13, wrt=[0],
               const_inputs=[1, 2], ref=nll)


def test_cross_entropy_gradient_reuses_no_log_softmax():
    """The one-output SoftmaxCrossEntropyLoss gradient is softmax * weight minus the weight at
    the label: the log-softmax runs once (the forward), and no zero-filled NLL gradient is
    built (torch's eager backward materialises it)."""
    import numpy as np
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    scores = rand(6, 7)
    labels = np.array([0, 6, 2, 3, 2, 1], dtype=np.int64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        check_grad("SoftmaxCrossEntropyLoss", [scores, labels], {"reduction": "mean"},
                   opset=13, wrt=[0], const_inputs=[1],
                   ref=lambda s, lab: F.cross_entropy(s, lab))
    counts = {e.key: e.count for e in prof.key_averages()}
    # One in our forward; the float64 reference's autograd adds one more.
    assert counts.get("aten::_log_softmax", 0) == 2
    assert counts.get("aten::_log_softmax_backward_data", 0) == 1  # the reference's
