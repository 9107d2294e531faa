"""ai.graphcore CTC ops (``builder.aiGraphcore.ctcloss`` / ``ctcbeamsearchdecoder``).

The loss uses torch's CTC kernels directly (aten ``_ctc_loss`` and its backward kernel, not
autograd) with PopART's time-major layout, which is torch's: log-probabilities [T, N, C].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.signature import INT, STRING, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from .graphcore_common import _INT_DTYPES, REDUCTION_ATTR, _output_or_none, _require_float
from .registry import AI_GRAPHCORE, register_op

GC = AI_GRAPHCORE


# --- CTC --------------------------------------------------------------------------------------

_REDUCTIONS = {0: "sum", 1: "mean", 2: "none"}


def _logaddexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    top = max(a, b)
    return top + math.log1p(math.exp(-abs(a - b)))


@register_op("Ctc", versions=1, domain=GC)
class Ctc(Op):
    """Connectionist temporal classification loss (``builder.aiGraphcore.ctcloss``).

    Inputs: log-probabilities [T, N, C] (log_softmax outputs, time-major as in torch), targets
    [N, S] ints, input lengths [N], target lengths [N]. Outputs: the loss (reduced: Sum; Mean =
    mean over the batch of loss_n / target_length_n, as torch; NoReduction [N]) and
    d loss_n / d log-probs [T, N, C], which the backward pass scales.
    """

    # PopART's ctcloss returns only the loss.
    builder_method = BuilderMethod(
        "ctcloss",
        4,
        2,
        (REDUCTION_ATTR, AttrSpec("blank", INT, 0), AttrSpec("outDataType", STRING, "UNDEFINED"),
         AttrSpec("zeroInfinity", INT, 0)),
        returned=1,
    )

    @dataclass(frozen=True)
    class Attrs:
        reduction: int = 1
        blank: int = 0
        outDataType: str = "UNDEFINED"
        zeroInfinity: int = 0  # impossible alignments (infinite loss) count 0, with 0 gradient

    def infer(self, log_probs, targets, input_lengths, target_lengths):
        if self.attrs.reduction not in _REDUCTIONS:
            raise ShapeError(f"{self.debug_name}: reduction {self.attrs.reduction} is not a "
                             f"ReductionType (0 Sum, 1 Mean, 2 NoReduction).")
        if log_probs.rank != 3:
            raise ShapeError(f"{self.debug_name}: log-probabilities {log_probs} must be [T, N, C].")
        t, n, c = log_probs.shape
        if targets.rank != 2 or targets.shape[0] != n:
            raise ShapeError(f"{self.debug_name}: targets {targets} must be [{n}, S].")
        for name, info in (("input", input_lengths), ("target", target_lengths)):
            if info.shape != (n,) or info.dtype not in _INT_DTYPES:
                raise ShapeError(f"{self.debug_name}: {name} lengths {info} must be [{n}] ints.")
        if not 0 <= self.attrs.blank < c:
            raise ShapeError(f"{self.debug_name}: blank {self.attrs.blank} is not a class of {c}.")
        _require_float(self, log_probs)
        out = self.attrs.outDataType
        self._out_dtype = log_probs.dtype if out == "UNDEFINED" else DataType.from_string(out)
        shape = (n,) if _REDUCTIONS[self.attrs.reduction] == "none" else ()
        return [TensorInfo(self._out_dtype, shape), log_probs]

    def kernel(self, log_probs, targets, input_lengths, target_lengths):
        lp = log_probs.float()
        targets, ilen, tlen = targets.long(), input_lengths.long(), target_lengths.long()
        nll, alpha = torch.ops.aten._ctc_loss(lp, targets, ilen, tlen, self.attrs.blank, False)
        grad = torch.ops.aten._ctc_loss_backward(torch.ones_like(nll), lp, targets, ilen, tlen,
                                                 nll, alpha, self.attrs.blank, False)
        if self.attrs.zeroInfinity:
            impossible = torch.isinf(nll)
            nll = nll.masked_fill(impossible, 0.0)
            grad = grad.masked_fill(impossible.view(1, -1, 1), 0.0)
        mode = _REDUCTIONS[self.attrs.reduction]
        if mode == "sum":
            loss = nll.sum()
        elif mode == "mean":
            loss = (nll / tlen.clamp(min=1).to(nll.dtype)).mean()
        else:
            loss = nll
        return loss.to(self._out_dtype.torch), grad.to(log_probs.dtype)

    def grad(self, g):
        per_sample = _output_or_none(self, 1)
        if per_sample is None:  # the node left out the gradient output: compute it again
            per_sample = g.op("Ctc", *(g.input(i) for i in range(4)), domain=GC, num_outputs=2,
                              reduction=2, blank=self.attrs.blank,
                              zeroInfinity=self.attrs.zeroInfinity)[1]
        g.set_input_grad(0, g.op("CtcGrad", g.output_grad(0), per_sample, g.input(3), domain=GC,
                                 reduction=self.attrs.reduction))


@register_op("CtcGrad", versions=1, domain=GC)
class CtcGrad(Op):
    """d log-probs = dloss_n · d loss_n / d log-probs, with Mean's 1 / (N · target_length_n).
    Inputs (dloss, per-sample gradient [T, N, C], target lengths)."""

    @dataclass(frozen=True)
    class Attrs:
        reduction: int = 1

    def infer(self, dloss, grad, target_lengths):
        self._n = grad.shape[1]
        return grad

    def kernel(self, dloss, grad, target_lengths):
        mode = _REDUCTIONS[self.attrs.reduction]
        scale = dloss.to(grad.dtype).reshape(-1).expand(self._n)
        if mode == "mean":
            scale = scale / (target_lengths.clamp(min=1).to(grad.dtype) * self._n)
        return grad * scale.reshape(1, -1, 1)


@register_op("CtcBeamSearchDecoder", versions=1, domain=GC)
class CtcBeamSearchDecoder(Op):
    """CTC prefix beam search (``builder.aiGraphcore.ctcbeamsearchdecoder``).

    Inputs: log-probabilities [T, N, C] and data lengths [N]. Outputs: label log-probabilities
    [N, top_paths], label lengths [N, top_paths] (INT32) and decoded labels [N, top_paths, T]
    (INT32, padded with 0 past each length), best path first.
    """

    builder_method = BuilderMethod(
        "ctcbeamsearchdecoder",
        2,
        3,
        (
            AttrSpec("blank", INT, 0),
            AttrSpec("beam_width", INT, 100),
            AttrSpec("top_paths", INT, 1),
        ),
    )

    foldable = False

    @dataclass(frozen=True)
    class Attrs:
        blank: int = 0
        beam_width: int = 100
        top_paths: int = 1

    def infer(self, log_probs, lengths):
        if log_probs.rank != 3:
            raise ShapeError(f"{self.debug_name}: log-probabilities {log_probs} must be [T, N, C].")
        t, n, c = log_probs.shape
        if lengths.shape != (n,) or lengths.dtype not in _INT_DTYPES:
            raise ShapeError(f"{self.debug_name}: data lengths {lengths} must be [{n}] ints.")
        a = self.attrs
        if not 0 <= a.blank < c or a.beam_width < 1 or not 1 <= a.top_paths <= a.beam_width:
            raise ShapeError(f"{self.debug_name}: need 0 <= blank < {c}, beam_width >= 1 and "
                             f"1 <= top_paths <= beam_width; got {a}.")
        k = a.top_paths
        return [TensorInfo(log_probs.dtype, (n, k)), TensorInfo(DataType.INT32, (n, k)),
                TensorInfo(DataType.INT32, (n, k, t))]

    def kernel(self, log_probs, lengths):
        t, n, _ = log_probs.shape
        k = self.attrs.top_paths
        probs = torch.full((n, k), -math.inf, dtype=log_probs.dtype)
        lens = torch.zeros((n, k), dtype=torch.int32)
        labels = torch.zeros((n, k, t), dtype=torch.int32)
        lp = log_probs.double()
        for b, length in enumerate(lengths.tolist()):
            for j, (prefix, score) in enumerate(self._search(lp[:min(length, t), b])[:k]):
                probs[b, j] = score
                lens[b, j] = len(prefix)
                if prefix:
                    labels[b, j, : len(prefix)] = torch.tensor(prefix, dtype=torch.int32)
        return probs, lens, labels

    def _search(self, lp: torch.Tensor) -> list[tuple[tuple[int, ...], float]]:
        """Prefix beam search over one sequence [T, C]: (prefix, log-probability), best first."""
        blank, width = self.attrs.blank, self.attrs.beam_width
        neg_inf = -math.inf
        # prefix -> (log p ending in blank, log p ending in a label)
        beams: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, neg_inf)}
        for step in lp.tolist():
            grown: dict[tuple[int, ...], list[float]] = {}

            def add(prefix, blank_part, label_part):
                entry = grown.setdefault(prefix, [neg_inf, neg_inf])
                entry[0] = _logaddexp(entry[0], blank_part)
                entry[1] = _logaddexp(entry[1], label_part)

            for prefix, (p_blank, p_label) in beams.items():
                total = _logaddexp(p_blank, p_label)
                add(prefix, total + step[blank], neg_inf)
                for c, lp_c in enumerate(step):
                    if c == blank:
                        continue
                    if prefix and prefix[-1] == c:
                        add(prefix, neg_inf, p_label + lp_c)  # repeat collapses
                        add(prefix + (c,), neg_inf, p_blank + lp_c)  # blank separates
                    else:
                        add(prefix + (c,), neg_inf, total + lp_c)
            ranked = sorted(grown.items(), key=lambda kv: -_logaddexp(*kv[1]))[:width]
            beams = {p: (v[0], v[1]) for p, v in ranked}
        return sorted(((p, float(_logaddexp(*v))) for p, v in beams.items()),
                      key=lambda pv: -pv[1])
