"""Loss ops: ai.graphcore IdentityLoss, L1, Nll and ONNX SoftmaxCrossEntropyLoss /
NegativeLogLikelihoodLoss, with their gradients.

PopART's ``reduction`` attribute is the int of ``popart.ReductionType``: 0 Sum, 1 Mean,
2 NoReduction. Mean divides by the number of elements (L1, IdentityLoss) or of non-ignored
labels (Nll), as torch's losses do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..dtypes import DataType
from ..errors import ShapeError, popart_exception
from ..ir.op import Op
from ..ir.signature import FLOAT, INT, REQUIRED, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from .graphcore_common import REDUCTION_ATTR
from .registry import AI_GRAPHCORE, register_op

_POPART_REDUCTION = {0: "sum", 1: "mean", 2: "none"}

# The ignore index handed to torch's kernels when a loss has none: no label can equal it
# (labels reach the device as 32-bit integers; wider values are refused at the stream), so
# every label counts and an out-of-range one is refused, where torch's default -100 would
# silently drop labels of -100.
NO_IGNORE = -(2**31) - 1


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
        ignore = self.attrs.ignoreIndex if self.attrs.ignoreIndex is not None else NO_IGNORE
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
        ignore = self.attrs.ignore_index if self.attrs.ignore_index is not None else NO_IGNORE
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

    def label_scratch_infos(self, scores: TensorInfo) -> tuple:
        """The scratch buffers (ir/op.py ``scratch_infos``) of ``label_weights_into`` plus
        the negated factor, for scores [N, C, d1..] and no class weights: kept-label mask,
        labels, factor, negated factor, summed factor."""
        rows = scores.shape[:1] + scores.shape[2:]
        return (TensorInfo(DataType.BOOL, rows), TensorInfo(DataType.INT64, rows),
                scores.with_shape(rows), scores.with_shape(rows), scores.with_shape(()))

    def label_weights_into(self, dloss, labels, keep, index, per, total):
        """``label_weights`` without class weights, each temporary written into its scratch
        buffer (the same values); the factor comes back unsqueezed to [N, 1, d1..]."""
        labels = labels.long()
        if self.attrs.ignore_index is not None:
            torch.ne(labels, self.attrs.ignore_index, out=keep)
            labels = index.copy_(keep).mul_(labels)  # ignored labels -> 0
            per.copy_(keep)
        else:
            per.fill_(1)
        if self.attrs.reduction == "mean":
            torch.sum(per, tuple(range(per.dim())), out=total)
            total.clamp_(min=torch.finfo(per.dtype).tiny)
            per.mul_(torch.div(dloss, total, out=total))
        else:
            per.mul_(dloss)
        return labels, per.unsqueeze(1)

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

    def scratch_infos(self):
        """The static memory plan (device/arena.py): the log-probabilities, when they are no
        output, and nll_loss's summed weight live in the arena instead of each step's heap."""
        scores = self.inputs[0].info
        if (len(self.outputs) > 1 and self.outputs[1] is not None) or scores.rank != 2:
            return ()
        return scores, scores.with_shape(())

    def kernel_scratch(self, out, logp, total, scores, labels, weights=None):
        torch._log_softmax(scores, 1, False, out=logp)
        # nll_loss's own kernel (F.nll_loss calls it for [N, C]) with its outputs given.
        ignore = self.attrs.ignore_index if self.attrs.ignore_index is not None else NO_IGNORE
        reduction = ("none", "mean", "sum").index(self.attrs.reduction)
        loss = torch.empty(labels.shape if reduction == 0 else (), dtype=scores.dtype)
        torch.ops.aten.nll_loss_forward.output(logp, labels.long(), weights, reduction, ignore,
                                               output=loss, total_weight=total)
        return loss

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

    def scratch_infos(self):
        """The per-label temporaries of the fused gradient (no class weights, no
        log-probabilities' gradient): kept-label mask, labels, factor, its negation, sum."""
        ins = self.inputs
        if any(len(ins) > i and ins[i] is not None for i in (3, 4)):
            return ()
        return self.label_scratch_infos(ins[1].info)

    def kernel_scratch(self, out, keep, index, per, negated, total, dloss, scores, labels,
                       weights=None, dlogp=None):
        labels, per = self.label_weights_into(dloss, labels, keep, index, per, total)
        probs = (torch.softmax(scores, dim=1) if out is None
                 else torch._softmax(scores, 1, False, out=out))
        return probs.mul_(per).scatter_add_(1, labels.unsqueeze(1),
                                            torch.neg(per, out=negated.unsqueeze(1)))

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




# --- cross-entropy from a saved softmax (transforms/fuse_grad_cross_entropy.py) --------------


class _FromProbs(OnnxLossBase):
    """Shared by the two ops a training fusion makes of SoftmaxCrossEntropyLoss and its
    gradient: both read the softmax P [N, C] of the scores, computed once in the forward."""

    public = False  # made by a fusion only; not a builder op

    def check_probs(self, probs, labels, weights):
        if probs.rank != 2 or probs.dtype.torch not in (torch.float32, torch.float64):
            raise ShapeError(f"{self.debug_name}: the softmax {probs} must be a float32 or "
                             f"float64 [N, C] tensor.")
        return self.check(probs, labels, weights)


@register_op("SoftmaxCrossEntropyFromProbs", versions=1, domain=AI_GRAPHCORE)
class SoftmaxCrossEntropyFromProbs(_FromProbs):
    """The SoftmaxCrossEntropyLoss loss from the softmax P of its scores: -log P at each label,
    weighted, ignored labels dropped, reduced as the ONNX op does. Where the probability at a
    label is below the dtype's smallest normal number (log P would lose digits or be -inf),
    the log-probability comes from the scores instead, x[label] - logsumexp(x)."""

    def infer(self, probs, scores, labels, weights=None):
        if scores != probs:
            raise ShapeError(f"{self.debug_name}: the scores {scores} must match the softmax "
                             f"{probs}.")
        return self.check_probs(probs, labels, weights)

    def kernel(self, probs, scores, labels, weights=None):
        labels = labels.long()
        ignore = self.attrs.ignore_index if self.attrs.ignore_index is not None else NO_IGNORE
        keep = labels != ignore
        safe = torch.where(keep, labels, 0)
        self._check_labels(labels, keep, *torch.aminmax(safe), probs.shape[1])
        logp = probs.gather(1, safe.unsqueeze(1)).squeeze(1).log_()
        small = (logp < math.log(torch.finfo(probs.dtype).tiny)).nonzero().squeeze(1)
        if small.numel():
            # P = exp(x - max x) / s peaks at 1 / s where x does: logsumexp(x) is
            # max x - log(max P), two reductions with no exp and no temporary.
            if small.numel() * 4 <= probs.shape[0]:  # a few rows: reduce copies of them
                lse = (scores.index_select(0, small).amax(1)
                       - probs.index_select(0, small).amax(1).log_())
            else:
                lse = (scores.amax(1).index_select(0, small)
                       - probs.amax(1).index_select(0, small).log_())
            logp[small] = scores[small, safe[small]] - lse
        w = weights.to(probs.dtype)[safe] if weights is not None else torch.ones_like(logp)
        w.mul_(keep)
        # Ignored rows add 0, even where their scores are not finite.
        per = logp.masked_fill_(keep.logical_not_(), 0.0).mul_(w).neg_()
        if self.attrs.reduction == "none":
            return per
        if self.attrs.reduction == "sum":
            return per.sum()
        return per.sum().div_(w.sum())

    def _check_labels(self, labels, keep, low, high, classes: int) -> None:
        """Refuse a kept label outside [0, classes) (``low``, ``high``: the extremes of the
        kept labels, ignored ones read as 0)."""
        if low.item() < 0 or high.item() >= classes:
            labels = labels.long()
            bad = labels[keep & ((labels < 0) | (labels >= classes))]
            raise popart_exception(
                f"{self.debug_name}: label {int(bad[0])} is outside the {classes} classes "
                f"[0, {classes - 1}]; fix the labels, or set ignore_index for padding.")

    def scratch_infos(self):
        """The static memory plan (device/arena.py), without class weights: kept-label mask,
        labels (ignored ones 0), their extremes, log-probabilities at the labels, small-row
        mask and whether any row is small, row weights, their sum (first the small-probability
        threshold), and two row buffers of the small-probability fallback."""
        if len(self.inputs) > 3 and self.inputs[3] is not None:
            return ()
        probs = self.inputs[0].info
        rows = probs.with_shape(probs.shape[:1])
        index = TensorInfo(DataType.INT64, rows.shape)
        mask = TensorInfo(DataType.BOOL, rows.shape)
        extreme = TensorInfo(DataType.INT64, ())
        return (mask, index, extreme, extreme, rows, mask, TensorInfo(DataType.BOOL, ()),
                rows, probs.with_shape(()), rows, rows)

    def kernel_scratch(self, out, keep, safe, low, high, logp, small, any_small, w, total,
                       lse, picked, probs, scores, labels, weights=None):
        """``kernel`` with every temporary in its scratch buffer: the same arithmetic, and
        the small-probability rows replaced by a select over all rows (no index list)."""
        ignore = self.attrs.ignore_index if self.attrs.ignore_index is not None else NO_IGNORE
        torch.ne(labels, ignore, out=keep)
        safe.copy_(keep).mul_(labels)  # ignored labels -> 0
        torch.aminmax(safe, out=(low, high))
        self._check_labels(labels, keep, low, high, probs.shape[1])
        column = safe.unsqueeze(1)
        torch.gather(probs, 1, column, out=logp.unsqueeze(1)).log_()
        # The threshold in ``total`` (read before the sum reuses it): compared with a Python
        # float, torch would wrap it in a fresh tensor each call.
        torch.lt(logp, total.fill_(math.log(torch.finfo(probs.dtype).tiny)), out=small)
        if torch.any(small, out=any_small).item():
            # As ``kernel``: log P at the label is x[label] - (max x - log(max P)).
            torch.amax(scores, 1, out=lse)
            lse.sub_(torch.amax(probs, 1, out=picked).log_())
            torch.gather(scores, 1, column, out=picked.unsqueeze(1))
            picked.sub_(lse)
            torch.where(small, picked, logp, out=logp)
        w.copy_(keep)  # 1 for the kept rows, 0 for the ignored ones
        per = logp.masked_fill_(keep.logical_not_(), 0.0).mul_(w).neg_()
        if self.attrs.reduction == "none":
            return per.clone() if out is None else out.copy_(per)
        if self.attrs.reduction == "sum":
            return per.sum()
        return per.sum().div_(torch.sum(w, (0,), out=total))


@register_op("SoftmaxCrossEntropyGradFromProbs", versions=1, domain=AI_GRAPHCORE)
class SoftmaxCrossEntropyGradFromProbs(_FromProbs):
    """d scores of SoftmaxCrossEntropyLoss written over the softmax P it reads (its output is
    P's storage): P * per minus per at the label, where per is dloss times the label's weight
    (Mean: over the summed weights of the kept labels; 0 for ignored labels). The same
    arithmetic as SoftmaxCrossEntropyLossGrad without computing the softmax again."""

    modifies_inputs = (1,)

    def infer(self, dloss, probs, labels, weights=None):
        self.check_probs(probs, labels, weights)
        return probs

    def kernel(self, dloss, probs, labels, weights=None):
        labels, per = self.label_weights(dloss, labels, weights, probs.dtype)
        per = per.unsqueeze(1)
        return probs.mul_(per).scatter_add_(1, labels.unsqueeze(1), per.neg())

    def scratch_infos(self):
        """The per-label temporaries, without class weights (device/arena.py)."""
        if len(self.inputs) > 3 and self.inputs[3] is not None:
            return ()
        return self.label_scratch_infos(self.inputs[1].info)

    def kernel_scratch(self, out, keep, index, per, negated, total, dloss, probs, labels,
                       weights=None):
        labels, per = self.label_weights_into(dloss, labels, keep, index, per, total)
        return probs.mul_(per).scatter_add_(1, labels.unsqueeze(1),
                                            torch.neg(per, out=negated.unsqueeze(1)))
