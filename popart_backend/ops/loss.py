"""Loss ops: ai.graphcore IdentityLoss, L1, Nll and ONNX SoftmaxCrossEntropyLoss /
NegativeLogLikelihoodLoss, with their gradients.

PopART's ``reduction`` attribute is the int of ``popart.ReductionType``: 0 Sum, 1 Mean,
2 NoReduction. Mean divides by the number of elements (L1, IdentityLoss) or of non-ignored
labels (Nll), as torch's losses do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ShapeError, popart_exception
from ..ir.op import Op
from ..ir.signature import FLOAT, INT, REQUIRED, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from .graphcore_common import REDUCTION_ATTR
from .registry import AI_GRAPHCORE, register_op

_POPART_REDUCTION = {0: "sum", 1: "mean", 2: "none"}


class GraphcoreLoss(Op):
    """Base of the ai.graphcore losses: shared reduction handling."""

    def reduction(self) -> str:
        try:
            return _POPART_REDUCTION[self.attrs.reduction]
        except KeyError:
            raise popart_exception(
                f"{self.debug_name}: reduction {self.attrs.reduction} is not a ReductionType "
                f"(0 Sum, 1 Mean, 2 NoReduction)."
            ) from None

    def reduce(self, per_element: torch.Tensor) -> torch.Tensor:
        mode = self.reduction()
        if mode == "sum":
            return per_element.sum()
        if mode == "mean":
            return per_element.mean()
        return per_element

    def reduced_info(self, x: TensorInfo) -> TensorInfo:
        self.reduction()  # validates the attribute at build time
        return x if self.reduction() == "none" else x.with_shape(())


@register_op("IdentityLoss", versions=1, domain=AI_GRAPHCORE)
class IdentityLoss(GraphcoreLoss):
    """loss = reduce(x): the user computed the per-sample loss with ordinary ops."""

    builder_method = BuilderMethod("identityloss", 1, 1, (REDUCTION_ATTR,))

    aliases_inputs = True  # reduction none returns its input

    @dataclass(frozen=True)
    class Attrs:
        reduction: int = 1

    def infer(self, x):
        return self.reduced_info(x)

    def kernel(self, x):
        return self.reduce(x)

    def grad(self, g):
        g.set_input_grad(0, g.op("IdentityLossGrad", g.output_grad(0), g.input(0),
                                 domain=AI_GRAPHCORE, reduction=self.attrs.reduction))


@register_op("IdentityLossGrad", versions=1, domain=AI_GRAPHCORE)
class IdentityLossGrad(GraphcoreLoss):
    """dx = dloss broadcast to x (divided by the element count for Mean)."""

    @dataclass(frozen=True)
    class Attrs:
        reduction: int = 1

    def infer(self, dloss, x):
        return x

    def kernel(self, dloss, x):
        scale = 1.0 / x.numel() if self.reduction() == "mean" else 1.0
        return (dloss * scale).expand(x.shape).contiguous()


@register_op("L1", versions=1, domain=AI_GRAPHCORE)
class L1(GraphcoreLoss):
    """loss = lambda * reduce(|x|)."""

    builder_method = BuilderMethod(
        "l1loss", 1, 1, (AttrSpec("lambda", FLOAT, REQUIRED), REDUCTION_ATTR)
    )

    @dataclass(frozen=True)
    class Attrs:
        reduction: int = 1
        # ``lambda`` is a Python keyword: the importer maps the ONNX name onto this field.
        lambda_: float = 1.0

    @classmethod
    def attr_aliases(cls) -> dict[str, str]:
        return {"lambda": "lambda_"}

    def infer(self, x):
        return self.reduced_info(x)

    def kernel(self, x):
        return self.reduce(x.abs()) * self.attrs.lambda_

    def grad(self, g):
        g.set_input_grad(0, g.op("L1Grad", g.output_grad(0), g.input(0), domain=AI_GRAPHCORE,
                                 reduction=self.attrs.reduction, lambda_=self.attrs.lambda_))


@register_op("L1Grad", versions=1, domain=AI_GRAPHCORE)
class L1Grad(GraphcoreLoss):
    """dx = lambda * sign(x) * dloss (divided by the element count for Mean)."""

    Attrs = L1.Attrs
    attr_aliases = L1.attr_aliases

    def infer(self, dloss, x):
        return x

    def kernel(self, dloss, x):
        scale = self.attrs.lambda_ / x.numel() if self.reduction() == "mean" else self.attrs.lambda_
        return torch.sign(x) * (dloss * scale)


@register_op("Nll", versions=1, domain=AI_GRAPHCORE)
class Nll(GraphcoreLoss):
    """Negative log-likelihood of ``probs`` [..., C] (class axis last) at integer ``label`` [...]."""

    builder_method = BuilderMethod(
        "nllloss",
        2,
        1,
        (
            REDUCTION_ATTR,
            AttrSpec("ignoreIndex", INT, None),
            AttrSpec("inputIsLogProbability", INT, 0),
        ),
    )

    @dataclass(frozen=True)
    class Attrs:
        reduction: int = 1
        ignoreIndex: int | None = None  # noqa: N815 - ONNX attribute name
        inputIsLogProbability: int = 0  # noqa: N815

    def infer(self, probs, label):
        if not label.dtype.is_int:
            raise ShapeError(f"{self.debug_name}: label must be an integer tensor, got {label}.")
        if probs.shape[:-1] != label.shape:
            raise ShapeError(
                f"{self.debug_name}: label shape {list(label.shape)} must equal the probs shape "
                f"{list(probs.shape)} without its last (class) dimension."
            )
        return self.reduced_info(label.with_dtype(probs.dtype))

    def kernel(self, probs, label):
        logp = probs if self.attrs.inputIsLogProbability else torch.log(probs)
        classes = logp.shape[-1]
        ignore = self.attrs.ignoreIndex if self.attrs.ignoreIndex is not None else -100
        loss = F.nll_loss(
            logp.reshape(-1, classes), label.reshape(-1).long(), ignore_index=ignore,
            reduction=self.reduction(),
        )
        return loss.reshape(label.shape) if self.reduction() == "none" else loss

    def grad(self, g):
        a = self.attrs
        g.set_input_grad(0, g.op("NllGrad", g.output_grad(0), g.input(0), g.input(1),
                                 domain=AI_GRAPHCORE, reduction=a.reduction,
                                 ignoreIndex=a.ignoreIndex,
                                 inputIsLogProbability=a.inputIsLogProbability))


@register_op("NllGrad", versions=1, domain=AI_GRAPHCORE)
class NllGrad(GraphcoreLoss):
    """d probs: -dloss / p at the label (-dloss for log-probabilities), 0 elsewhere."""

    Attrs = Nll.Attrs
    writes_into = True  # the static memory plan (device/arena.py); the labels are indices

    def infer(self, dloss, probs, label):
        return probs

    def kernel(self, dloss, probs, label):
        return self.kernel_into(None, dloss, probs, label)

    def kernel_into(self, out, dloss, probs, label):
        classes = probs.shape[-1]
        flat_label = label.reshape(-1).long()
        ignore = self.attrs.ignoreIndex
        keep = None if ignore is None else flat_label != ignore
        if self.reduction() == "mean":
            count = flat_label.numel() if keep is None else keep.sum().clamp(min=1).to(probs.dtype)
            per = (dloss / count).neg().expand(flat_label.shape)
        else:
            per = dloss.reshape(-1).neg().expand(flat_label.shape)
        if keep is not None:
            per = torch.where(keep, per, 0)
            flat_label = torch.where(keep, flat_label, 0)
        # One zero-filled buffer with -dloss scattered at the labels: no one-hot temporaries.
        dlogp = (torch.zeros(flat_label.numel(), classes, dtype=probs.dtype) if out is None
                 else out.view(flat_label.numel(), classes).zero_())
        dlogp.scatter_(1, flat_label.unsqueeze(1), per.unsqueeze(1))
        if not self.attrs.inputIsLogProbability:
            dlogp.div_(probs.reshape(-1, classes))
        return dlogp.reshape(probs.shape) if out is None else out


class OnnxLossBase(Op):
    """ONNX losses: scores [N, C, d1..], labels [N, d1..], optional class weights [C]."""

    @dataclass(frozen=True)
    class Attrs:
        reduction: str = "mean"
        ignore_index: int | None = None

    def check(self, scores, labels, weights):
        if self.attrs.reduction not in ("mean", "sum", "none"):
            raise popart_exception(
                f"{self.debug_name}: reduction '{self.attrs.reduction}' must be mean, sum or none."
            )
        if not labels.dtype.is_int:
            raise ShapeError(f"{self.debug_name}: labels must be integers, got {labels}.")
        if scores.rank < 2 or (scores.shape[0],) + scores.shape[2:] != labels.shape:
            raise ShapeError(
                f"{self.debug_name}: scores {list(scores.shape)} must be [N, C, d1..] with labels "
                f"[N, d1..], got labels {list(labels.shape)}."
            )
        if weights is not None and weights.shape != (scores.shape[1],):
            raise ShapeError(
                f"{self.debug_name}: weights {list(weights.shape)} must be [C] = [{scores.shape[1]}]."
            )
        loss_shape = labels.shape if self.attrs.reduction == "none" else ()
        return TensorInfo(scores.dtype, loss_shape)

    def nll(self, logp, labels, weights):
        ignore = self.attrs.ignore_index if self.attrs.ignore_index is not None else -100
        return F.nll_loss(
            logp, labels.long(), weight=weights, ignore_index=ignore, reduction=self.attrs.reduction
        )


    def nll_backward(self, dloss, labels, weights, shape, dtype, out=None):
        """d loss / d log-probabilities [N, C, d1..]: -weight[label] at each label (scaled by
        dloss, and for Mean divided by the summed weights of the kept labels), 0 elsewhere;
        written into ``out`` when given."""
        labels, per = self.label_weights(dloss, labels, weights, dtype)
        grad = torch.zeros(shape, dtype=dtype) if out is None else out.zero_()
        return grad.scatter_(1, labels.unsqueeze(1), per.neg().unsqueeze(1))

    def label_weights(self, dloss, labels, weights, dtype):
        """(labels with ignored ones set to 0, per-label factor [N, d1..]): minus the NLL
        gradient at each label (0 for ignored labels)."""
        labels = labels.long()
        keep = None
        if self.attrs.ignore_index is not None:
            keep = labels != self.attrs.ignore_index
            labels = torch.where(keep, labels, 0)
        per = weights[labels].to(dtype) if weights is not None else torch.ones(labels.shape, dtype=dtype)
        if keep is not None:
            per = per * keep
        if self.attrs.reduction == "mean":
            per = per * (dloss / per.sum().clamp(min=torch.finfo(dtype).tiny))
        else:
            per = per * dloss
        return labels, per

    def loss_grad(self, g, grad_type: str, *extra: str) -> None:
        weights = g.input(2) if g.has_input(2) else None
        g.set_input_grad(0, g.op(grad_type, g.output_grad(0), g.input(0), g.input(1), weights,
                                 *extra, domain=AI_GRAPHCORE, reduction=self.attrs.reduction,
                                 ignore_index=self.attrs.ignore_index))


@register_op("NegativeLogLikelihoodLoss", versions=(12, 13, 22))
class NegativeLogLikelihoodLoss(OnnxLossBase):
    def infer(self, scores, labels, weights=None):
        return self.check(scores, labels, weights)

    def kernel(self, scores, labels, weights=None):
        return self.nll(scores, labels, weights)

    def grad(self, g):
        self.loss_grad(g, "NegativeLogLikelihoodLossGrad")


@register_op("NegativeLogLikelihoodLossGrad", versions=1, domain=AI_GRAPHCORE)
class NegativeLogLikelihoodLossGrad(OnnxLossBase):
    """d input: -dloss * weight[label] at the label (Mean: over the summed weights)."""

    def infer(self, dloss, scores, labels, weights=None):
        return scores

    writes_into = True  # the static memory plan (device/arena.py); labels are indices

    def kernel(self, dloss, scores, labels, weights=None):
        return self.nll_backward(dloss, labels, weights, scores.shape, scores.dtype)

    def kernel_into(self, out, dloss, scores, labels, weights=None):
        return self.nll_backward(dloss, labels, weights, scores.shape, scores.dtype, out)


@register_op("SoftmaxCrossEntropyLoss", versions=(12, 13))
class SoftmaxCrossEntropyLoss(OnnxLossBase):
    """Outputs the loss and, optionally, the log-probabilities."""

    def infer(self, scores, labels, weights=None):
        return self.check(scores, labels, weights), scores

    def kernel(self, scores, labels, weights=None):
        logp = torch.log_softmax(scores, dim=1)
        loss = self.nll(logp, labels, weights)
        # The log-probabilities output is optional: a one-output node gets the loss alone.
        if len(self.outputs) < 2:
            return loss
        return loss, logp if self.outputs[1] is not None else None

    def grad(self, g):
        has_logp = len(self.outputs) > 1 and self.outputs[1] is not None
        self.loss_grad(g, "SoftmaxCrossEntropyLossGrad", *([g.output_grad(1)] if has_logp else []))


@register_op("SoftmaxCrossEntropyLossGrad", versions=1, domain=AI_GRAPHCORE)
class SoftmaxCrossEntropyLossGrad(OnnxLossBase):
    """d scores = log-softmax backward of (NLL gradient + the log-probabilities' gradient)."""

    def infer(self, dloss, scores, labels, weights=None, dlogp=None):
        return scores

    # The static memory plan (device/arena.py): the labels are indices, the float output (the
    # size of the logits: 206 MB for a GPT-2 LM head) is written into its arena buffer.
    writes_into = True

    def kernel(self, dloss, scores, labels, weights=None, dlogp=None):
        return self.kernel_into(None, dloss, scores, labels, weights, dlogp)

    def kernel_into(self, out, dloss, scores, labels, weights=None, dlogp=None):
        if dlogp is None:
            # The NLL gradient g is -per at the label, 0 elsewhere, so the log-softmax backward
            # g - softmax * sum(g) is softmax * per minus per at the label: one softmax pass and
            # one scaling pass, no log-softmax recomputed and no zero-filled gradient.
            labels, per = self.label_weights(dloss, labels, weights, scores.dtype)
            per = per.unsqueeze(1)
            probs = (torch.softmax(scores, dim=1) if out is None
                     else torch._softmax(scores, 1, False, out=out))
            return probs.mul_(per).scatter_add_(1, labels.unsqueeze(1), per.neg())
        logp = torch.log_softmax(scores, dim=1)
        grad = self.nll_backward(dloss, labels, weights, scores.shape, scores.dtype)
        if out is None:
            return torch._log_softmax_backward_data(grad.add_(dlogp), logp, 1, scores.dtype)
        return torch._log_softmax_backward_data(grad.add_(dlogp), logp, 1, scores.dtype, out=out)


