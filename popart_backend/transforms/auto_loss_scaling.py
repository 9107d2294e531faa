"""``SessionOptions.automaticLossScalingSettings``: the loss scale follows the gradients.

``AutomaticLossScaling`` runs after the optimizer. It adds, in the optimizer's context,
a ``LossScaleHistogram`` op (ops/loss_scaling.py) reading the gradients the optimizer reads
(loss-scaled: after accumulation and the replica reduction) before the updates, and a
``LossScaleUpdate`` op that rewrites the optimizer's ``lossScaling_FLOAT`` variable in place
after every update op has read it: halved when more
than ``thresholdUpperCountProportion`` of the gradient elements lie at or above
``binEdgeLocation`` x the largest value of their type (or overflowed to inf / NaN), doubled
otherwise, once every ``updatePeriod`` weight updates. The scale is a variable, so it can be
anchored or read with ``weightsToHost`` / ``readWeights`` during training.

A weight update whose gradients overflowed (inf / NaN) is skipped: the update ops read the
histogram's "finite" flag (``OpSettings.skip_on_overflow``) and leave the weights and the
optimizer state as they were, and the scale halves.

Before:  UpdatedVar___w = SGDUpdate(w, Gradient___w, lossScaling_FLOAT)
After:   finite = LossScaleHistogram(lossScaleStats___, Gradient___w)
         UpdatedVar___w = SGDUpdate(w, Gradient___w, lossScaling_FLOAT, finite)
         lossScaling_FLOAT/updated = LossScaleUpdate(lossScaling_FLOAT, lossScaleStats___,
                                                     finite)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..dtypes import DataType
from ..errors import popart_exception
from ..ir.ir import Ir
from ..ir.op import ExecutionContext, OpSettings
from ..ir.tensor import TensorInfo, TensorKind, TensorRole
from ..ops.registry import AI_GRAPHCORE, create_op
from ..options.enums import GradientTensorTrackingMethod
from .autodiff import GRADIENT_PREFIX

STATS_ID = "lossScaleStats___"


class TrackConvAndMatmulGradients:
    """Pass (before autodiff; automatic loss scaling with ConvAndMatmulGradients): the
    inputs of every matrix-unit op (MatMul, Gemm, Conv and their fused forms) other than the
    streamed ones get their gradient named ``Gradient___<id>`` (``Ir.named_gradients``), so
    the histogram can read the gradients of weights and activations alike.

    Before:  h = MatMul(x, w1); y = MatMul(h, w2)       # x streamed
    After:   Ir.named_gradients = {w1, h, w2}           # autodiff names Gradient___h too
    """

    name = "track_conv_and_matmul_gradients"

    def run(self, ir: Ir) -> bool:
        before = len(ir.named_gradients)
        ir.named_gradients |= {t.id for op in ir.main.ops.values() if op.uses_amp
                               for t in op.inputs
                               if t is not None and t.kind is not TensorKind.STREAM}
        return len(ir.named_gradients) != before


class AutomaticLossScaling:
    """Pass: update the non-const loss scale from a histogram of the gradients."""

    name = "automatic_loss_scaling"

    def __init__(self, settings, context: ExecutionContext):
        self.settings = settings
        self.context = context

    def run(self, ir: Ir) -> bool:
        graph = ir.main
        s = self.settings
        tensors = ir.optimizer_tensors
        scale_ids = [tid for tid, (key, _) in (tensors.hyper_params if tensors else {}).items()
                     if key == "lossScaling"]
        if not scale_ids:
            raise popart_exception(
                "automaticLossScalingSettings.enabled needs a non-const loss scaling in the "
                "optimizer, which the session then updates; give it as "
                "{'lossScaling': (initial value, False)}.")
        if not 0.0 < s.binEdgeLocation <= 1.0 or not 0.0 <= s.thresholdUpperCountProportion <= 1.0:
            raise popart_exception(
                f"automaticLossScalingSettings: binEdgeLocation must be in (0, 1] and "
                f"thresholdUpperCountProportion in [0, 1]; got {s.binEdgeLocation} and "
                f"{s.thresholdUpperCountProportion}.")
        if int(s.updatePeriod) < 1:
            raise popart_exception(
                f"automaticLossScalingSettings.updatePeriod must be >= 1, got {s.updatePeriod}.")
        tracked = self._tracked(ir)
        stats = graph.add_tensor(STATS_ID, TensorInfo(DataType.FLOAT, (3,)), TensorKind.VARIABLE,
                                 np.zeros(3, np.float32))
        stats.role = TensorRole.STEP
        settings = OpSettings(name="LossScaleHistogram___", execution_context=self.context)
        histogram = create_op("LossScaleHistogram", {"bin_edge_location": float(
            s.binEdgeLocation)}, domain=AI_GRAPHCORE, where=settings.name, settings=settings)
        finite = graph.unique_id("lossScaleGradientsFinite___")
        graph.add_op(histogram, [STATS_ID, *tracked], [finite])
        # Every update skips the step when a gradient overflowed.
        for updated in tensors.updated.values():
            op = graph.tensor(updated).producer
            op.settings = dataclasses.replace(op.settings, skip_on_overflow=True)
            graph.append_input(op, finite)
        settings = OpSettings(name="LossScaleUpdate___", execution_context=self.context)
        update = create_op("LossScaleUpdate", {
            "threshold_upper_count_proportion": float(s.thresholdUpperCountProportion),
            "update_period": int(s.updatePeriod)},
            domain=AI_GRAPHCORE, where=settings.name, settings=settings)
        graph.add_op(update, [scale_ids[0], STATS_ID, finite],
                     [graph.unique_id(f"{scale_ids[0]}/updated")])
        return True

    def _tracked(self, ir: Ir) -> list[str]:
        s = self.settings
        method = s.gradientTensorTrackingMethod
        if method is GradientTensorTrackingMethod.GradientsOfUserSpecifiedTensors:
            names = list(s.toTrackTensors or [])
            missing = [n for n in names if n not in ir.main.tensors]
            if not names or missing:
                raise popart_exception(
                    f"automaticLossScalingSettings: GradientsOfUserSpecifiedTensors needs "
                    f"toTrackTensors naming tensors of the model; got {names}"
                    f"{f', unknown: {missing}' if missing else ''}.")
            return names
        if s.toTrackTensors:
            raise popart_exception(
                f"automaticLossScalingSettings.toTrackTensors = {s.toTrackTensors} is read "
                f"only with gradientTensorTrackingMethod GradientsOfUserSpecifiedTensors, not "
                f"{method.name}; set that method or leave toTrackTensors unset.")
        if method is GradientTensorTrackingMethod.ConvAndMatmulGradients:
            # The gradients of every input of a matrix-unit op (MatMul, Gemm, Conv and their
            # fused forms) that has one: weights and activations alike.
            tracked = [GRADIENT_PREFIX + tid for tid in sorted(ir.named_gradients)
                       if GRADIENT_PREFIX + tid in ir.main.tensors]
            if not tracked:
                raise popart_exception(
                    "automaticLossScalingSettings: ConvAndMatmulGradients found no gradient of "
                    "an input of a MatMul or Conv; use AllNonViewChangingGradientTensors.")
            return tracked
        if not ir.weight_grads:
            raise popart_exception("automaticLossScalingSettings: the model trains no weight, "
                                   "so there are no gradients to track.")
        return list(ir.weight_grads.values())
