"""Passes for the SessionOptions that change how ops compute rather than what they mean.

- ``enableNonStableSoftmax``: ``NonStableSoftmax`` marks (``OpSettings.non_stable``) every op
  whose class ``supports_non_stable`` (the ai.onnx Softmax / LogSoftmax), before the fusions,
  which leave marked ones alone, and their kernels skip subtracting the maximum: exp(x) / sum(exp(x)). Results are equal up to rounding until exp overflows (inputs
  above ~88 in float32), where the IPU's faster form gives inf / NaN, and so does ours.
- ``groupNormStridedChannelGrouping``: ``StridedGroupNorm`` makes group g of an ai.graphcore
  GroupNormalization hold channels g, g + G, g + 2G ... (G = num_groups) instead of a contiguous
  block: it gathers the channels (and the per-channel scale and bias) into contiguous-group
  order before the op and back after it, so the op's kernel and gradient stay as they are and
  training differentiates the Gathers. The Mean / InvStdDev outputs keep their group order.
- ``enableFloatingPointChecks``: ``FloatingPointChecks`` (last in the pass list, so it sees every
  op the other passes added) marks every op (``OpSettings.checks``); the execution plan then checks each float output
  of a marked op and raises ``popart_runtime_error`` at the first NaN or inf computed from
  finite inputs, as the IPU's floating-point exceptions stop the program there. Values that
  were already non-finite on the way in propagate without a new exception.
- ``partialsTypeMatMuls = "half"``: ``HalfPartialMatMuls`` marks (``OpSettings.half_partials``)
  every op whose class ``supports_half_partials`` (MatMul, Gemm and their gradient products
  MatMulLhsGrad, MatMulRhsGrad, GemmGrad) with float16 operands, before the fusions, which
  leave marked ones alone; in training it runs again after autodiff for the gradient products. Their kernels then accumulate in float16 (ops/matmul.py); float32
  products are unaffected. "float" and "" keep float32 partials.
- ``convolutionOptions["partialsType"] = "half"``: ``HalfPartialConvs`` marks the float16 1-D,
  2-D and 3-D Conv ops (class ``supports_conv_half_partials``) the same way; their kernels then
  sum in float16 (ops/conv_partials.py), and so do the ConvGrad ops that inherit the mark. In
  training it runs again after autodiff to clear the mark of gradient ops that cannot honour it
  (ConvTransposeGrad), logged once: they keep float32 partials.
- ``lstmOptions["partialsType"] = "half"``: ``HalfPartialLstms`` marks the LSTMs (class
  ``supports_lstm_half_partials``: ai.onnx LSTM, ai.graphcore lstm) whose X is float16; their
  kernels then compute the cell products X·Wᵀ and H·Rᵀ with float16 sums (ops/rnn.py), and so
  do their gradients (LSTMGrad, PopartLSTMGrad), which inherit the mark (in training the pass
  runs again after autodiff to mark them). A float32 LSTM is logged once: the option has no
  effect on it. GRU and RNN are not LSTMs and are never marked.
- ``opxModifyChecking`` / ``opxAliasChecking``: ``KernelChecks`` (last, like the floating-point
  checks) marks every op (``OpSettings.checks``); the execution plan (device/plan.py ``modify_checked``,
  ``alias_checked``) then raises ``popart_internal_exception`` when a kernel changes an input
  its op does not list in ``modifies_inputs``, or returns an input's storage although its op
  neither sets ``aliases_inputs`` nor modifies that input. These check the kernels, not the
  model; a correct op never trips them. Ops of subgraphs (If, Loop bodies) are marked too, but
  only kernels the plan runs are checked.

Before:  y = Softmax(x)   After: y = Softmax(x)  # settings.non_stable (kernel exp / sum)
Before:  y = MatMul(a, b)  # f16   After: y = MatMul(a, b)  # settings.half_partials
Before:  y, h, c = LSTM(x, w, r)  # f16   After: the same  # settings.half_partials
Before:  y = Relu(x)      After: y = Relu(x)  # settings.checks: floating_point / modify / alias
Before:  y, m, s = GroupNorm(x, w, b)
After:   y', m, s = GroupNorm(Gather(x, p, 1), Gather(w, p), Gather(b, p)); y = Gather(y', p⁻¹, 1)
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from ..dtypes import DataType
from ..ir.graph import Graph
from ..ir.ir import Ir
from ..ir.op import Op
from ..ir.tensor import Tensor
from ..ops.registry import AI_GRAPHCORE, create_op

_log = logging.getLogger("popart:transform")


class NonStableSoftmax:
    """Pass: mark the softmaxes to compute without subtracting the maximum."""

    name = "non_stable_softmax"

    def run(self, ir: Ir) -> bool:
        changed = False
        for graph in ir.graphs.values():
            for op in graph.ops.values():
                if op.supports_non_stable and not op.settings.non_stable:
                    _mark(op, non_stable=True)
                    changed = True
        return changed


class StridedGroupNorm:
    """Pass: strided channel groups for the ai.graphcore GroupNormalization ops."""

    name = "strided_group_norm"

    def run(self, ir: Ir) -> bool:
        changed = False
        for graph in ir.graphs.values():
            for op in list(graph.ops.values()):
                if op.domain == AI_GRAPHCORE and op.op_type == "GroupNormalization":
                    changed |= _stride_groups(graph, op)
        return changed


def _stride_groups(graph: Graph, op: Op) -> bool:
    x = op.inputs[0]
    channels, groups = x.info.shape[1], op.attrs.num_groups
    if groups in (1, channels):
        return False  # one group, or one channel per group: both orders agree
    # Position i of the gathered tensor holds channel order[i]: group g's channels first.
    order = np.array([g + groups * j for g in range(groups) for j in range(channels // groups)],
                     np.int64)
    base = op.settings.name or f"{x.id}/group_norm"
    perm = graph.add_const(graph.unique_id(f"{base}/strided_channels"), order).id
    inverse = graph.add_const(graph.unique_id(f"{base}/strided_channels_inverse"),
                              np.argsort(order)).id
    for index, axis in ((0, 1), (1, 0), (2, 0)):
        source = op.inputs[index]
        gather = create_op("Gather", {"axis": axis}, op.settings, where=op.debug_name)
        out = graph.unique_id(f"{source.id}/strided_channels")
        graph.add_op(gather, [source.id, perm], [out])
        graph.replace_input(op, index, out)
    _insert_after(graph, op.outputs[0],
                  create_op("Gather", {"axis": 1}, op.settings, where=op.debug_name), inverse)
    return True


def _insert_after(graph: Graph, tensor: Tensor, op: Op, *extra_inputs: str) -> None:
    """Add ``op`` reading ``tensor`` (then ``extra_inputs``); its output takes over the
    tensor's id, consumers and graph-output place, so anchors still name the final value."""
    original = tensor.id
    temp = graph.unique_id(f"{original}/before_{op.op_type}")
    graph.add_op(op, [original, *extra_inputs], [temp])
    result = graph.tensors[temp]
    for consumer in list(tensor.consumers):
        if consumer is not op:
            for index, t in enumerate(consumer.inputs):
                if t is tensor:
                    graph.replace_input(consumer, index, temp)
    del graph.tensors[original], graph.tensors[temp]
    tensor.id, result.id = temp, original
    graph.tensors[temp], graph.tensors[original] = tensor, result


class FloatingPointChecks:
    """Pass: mark every op for the execution plan's floating-point exception check."""

    name = "floating_point_checks"

    def run(self, ir: Ir) -> bool:
        for graph in ir.graphs.values():
            for op in graph.ops.values():
                _mark(op, checks=dataclasses.replace(op.settings.checks, floating_point=True))
        return bool(ir.graphs)


class KernelChecks:
    """Pass: mark every op for the execution plan's kernel modify and/or alias checks."""

    name = "kernel_checks"

    def __init__(self, modify: bool, alias: bool):
        self.modify = modify
        self.alias = alias

    def run(self, ir: Ir) -> bool:
        for graph in ir.graphs.values():
            for op in graph.ops.values():
                _mark(op, checks=dataclasses.replace(op.settings.checks, modify=self.modify,
                                                     alias=self.alias))
        return bool(ir.graphs)


class HalfPartialMatMuls:
    """Pass: mark the float16 matrix products to accumulate in float16."""

    name = "half_partial_matmuls"

    def run(self, ir: Ir) -> bool:
        changed = False
        for graph in ir.graphs.values():
            for op in graph.ops.values():
                if (op.supports_half_partials and op.inputs[0] is not None
                        and op.inputs[0].info.dtype is DataType.FLOAT16
                        and not op.settings.half_partials):
                    _mark(op, half_partials=True)
                    changed = True
        return changed


class HalfPartialConvs:
    """Pass: mark the float16 convolutions to accumulate in float16 (convolutionOptions
    partialsType "half"); with ``unmark_unsupported`` (after autodiff) it also clears the mark
    gradient ops inherited from their forward op but cannot honour (ConvGrad), logged once."""

    name = "half_partial_convs"

    def __init__(self, unmark_unsupported: bool = False):
        self.unmark_unsupported = unmark_unsupported

    def run(self, ir: Ir) -> bool:
        changed = False
        for graph in ir.graphs.values():
            for op in graph.ops.values():
                if (op.supports_conv_half_partials and op.inputs[0] is not None
                        and op.inputs[0].info.dtype is DataType.FLOAT16
                        and op.inputs[0].info.rank in (3, 4, 5) and not op.settings.half_partials
                        and not self.unmark_unsupported):
                    _mark(op, half_partials=True)
                    changed = True
                elif (self.unmark_unsupported and op.settings.half_partials
                      and not (op.supports_half_partials or op.supports_conv_half_partials
                               or op.supports_lstm_half_partials)):
                    if op.op_type not in _UNMARKED:
                        _UNMARKED.add(op.op_type)
                        _log.warning("%s: float16 partials are not built for %s; it "
                                     "accumulates in float32.", op.debug_name, op.op_type)
                    _mark(op, half_partials=False)
                    changed = True
        return changed


_UNMARKED: set[str] = set()


class HalfPartialLstms:
    """Pass: mark the float16 LSTMs (and, run again after autodiff, their gradients) to sum
    their cell products in float16 (lstmOptions partialsType "half"); a float32 LSTM is logged
    once as unaffected."""

    name = "half_partial_lstms"

    def run(self, ir: Ir) -> bool:
        changed = lstms = False
        for graph in ir.graphs.values():
            for op in graph.ops.values():
                if op.op_type in _OTHER_RECURRENT and op.inputs and (
                        op.inputs[0].info.dtype is DataType.FLOAT16):
                    _log_other_recurrent(op)
                x = op.inputs[0] if op.supports_lstm_half_partials and op.inputs else None
                lstms = lstms or x is not None
                if x is None or op.settings.half_partials:
                    continue
                if x.info.dtype is DataType.FLOAT16:
                    _mark(op, half_partials=True)
                    changed = True
                elif not _FLOAT32_LSTM_LOGGED:
                    _FLOAT32_LSTM_LOGGED.append(op.debug_name)
                    _log.warning("%s: SessionOptions.lstmOptions['partialsType'] = 'half' has "
                                 "no effect on an LSTM with %s input: only float16 LSTMs "
                                 "accumulate in float16; it keeps float32 partials.",
                                 op.debug_name, x.info.dtype.name)
        if not lstms and "no LSTM" not in _OTHER_RECURRENT_LOGGED:
            _OTHER_RECURRENT_LOGGED.add("no LSTM")
            _log.warning("SessionOptions.lstmOptions['partialsType'] = 'half' has no effect: "
                         "the model has no LSTM.")
        return changed


_FLOAT32_LSTM_LOGGED: list[str] = []
_OTHER_RECURRENT = ("GRU", "RNN", "GRUGrad", "RNNGrad")
_OTHER_RECURRENT_LOGGED: set[str] = set()


def _log_other_recurrent(op: Op) -> None:
    """A float16 GRU or RNN keeps float32 partials under lstmOptions (said once per type)."""
    kind = op.op_type.removesuffix("Grad")
    if kind not in _OTHER_RECURRENT_LOGGED:
        _OTHER_RECURRENT_LOGGED.add(kind)
        _log.warning("%s: SessionOptions.lstmOptions['partialsType'] = 'half' has no effect on "
                     "a %s: lstmOptions sets the LSTMs' partials only, and the %s keeps float32 "
                     "partials (its float16 products are summed in float32 and rounded once).",
                     op.debug_name, kind, kind)


def _mark(op: Op, **flags) -> None:
    """Set fields of the op's (frozen) settings."""
    op.settings = dataclasses.replace(op.settings, **flags)
