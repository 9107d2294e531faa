"""The ordered list of IR passes a session runs (DESIGN: one list, in order).

A pass is an object with a ``name`` and ``run(ir) -> bool`` (True when it changed the IR).
With ``debug=True`` the IR is verified after every pass. Passes communicate only through the
``Ir``: a fact one pass leaves for another (the weight gradients, accumulators, what the
optimizer added, the pipeline stages) is a typed field of the Ir (ir/ir.py), never a pass
object handed to another pass. Their constructors take options and other configuration only.

Training (docs/training.md) runs the fusions whose fused op has a gradient (MatMul + bias,
GELU, the spelled-out layer norm, attention), in their training mode, before autodiff;
BatchNorm folding (inference statistics) and Conv + activation stay inference-only.
"""

from __future__ import annotations

import logging

from ..errors import popart_exception
from ..ir.op import ExecutionContext
from ..ir.verify import verify
from ..options.enums import GradientTensorTrackingMethod, ReductionType, VirtualGraphMode
from ..options.planning import conv_half_partials, lstm_half_partials, matmul_half_partials
from .apply_patterns import ApplyPatterns
from .autodiff import Autodiff
from .const_fold import FoldConstants
from .decompose_grad_sum import DecomposeGradSums
from .execution_phases import ExecutionPhases
from .fuse_attention import FuseAttention
from .fuse_conv_act import FuseConvActivation
from .fuse_conv_bn import FoldBatchNormIntoConv
from .fuse_conv_bn_var import FoldVariableBatchNormIntoConv
from .fuse_gelu import FuseGelu
from .fuse_grad_update import FuseGradIntoUpdate
from .fuse_grad_cross_entropy import FuseCrossEntropyGrad
from .fuse_grad_sum import FuseSliceGradSum
from .fuse_tied_gather_grad import FuseTiedGatherGrad
from .fuse_layer_norm import FuseLayerNorm
from .fuse_matmul_add import FuseMatMulAdd
from .gather_rows_early import GatherRowsEarly
from .grad_accumulation import OUTER, AccumulateGradients, ResetAccumulators, reduction_factors
from .inplace import InplaceVariants
from .loss_scaling import Fp32LossScale, SeedLossScaling
from .numerics_options import (FloatingPointChecks, HalfPartialConvs, HalfPartialLstms,
                               HalfPartialMatMuls, KernelChecks, NonStableSoftmax,
                               StridedGroupNorm)
from .ipu_copy import InsertIpuCopies
from .pipelining import AssignPipelineStages, InsertPipelineStashes
from .auto_loss_scaling import AutomaticLossScaling, TrackConvAndMatmulGradients
from .random_seed import WireRandomSeed
from .stochastic_rounding import StochasticRounding
from .recompute import Recompute
from .replication import AllReduceGradients, GroupOptimizerState
from .rts import ShardVariables
from .tensor_locations import replication_of
from .training_semantics import TrainingSemantics
from .virtual_graphs import AssignVirtualGraphs, Placement, PlaceRemainingOps

_log = logging.getLogger("popart:transform")


def inference_passes(options=None, ipus_per_replica: int = 1,
                     batches_per_step: int = 1) -> list:
    """Passes for an InferenceSession, in order. ``options`` is the session's SessionOptions;
    ``ipus_per_replica`` (device IPUs ÷ replicas) and ``batches_per_step`` serve virtual graphs
    and pipelining."""
    passes = [
        FoldConstants(_fold_multiple(options)),
        *numerics_passes(options),
        # Compile-time fusions (DESIGN decision 9); BN folding must precede Conv+Relu.
        FoldBatchNormIntoConv(),
        FoldVariableBatchNormIntoConv(),  # the same with variable weights, folded at run time
        FuseConvActivation(),
        FuseMatMulAdd(),
        FuseGelu(),
        FuseLayerNorm(),
        FuseAttention(),
        GatherRowsEarly(),  # after the fusions: it moves through the fused ops
        ApplyPatterns(),  # after the fusions, which match ops some patterns rewrite
        # Random ops (RandomNormal, Bernoulli ...) read the session seed in inference too.
        WireRandomSeed(),
        InplaceVariants(),
    ]
    if options is None:
        return passes
    if options.enableStochasticRounding:
        passes.insert(len(passes) - 2, StochasticRounding())  # before WireRandomSeed
    checks = check_passes(options)
    # Weights (when not constants) asking for replicated tensor sharding.
    local_replicas = options.replicatedGraphCount if options.enableReplicatedGraphs else 1
    passes.insert(len(passes) - 1,
                  ShardVariables(options, replication_of(options), local_replicas))
    placement = _placement(options, ipus_per_replica)
    # Placement follows the fusions, which keep the settings of the ops they replace.
    return [*passes, AssignVirtualGraphs(placement)] + multi_ipu_passes(
        options, placement, None, batches_per_step, "batchesPerStep") + checks


def _placement(options, ipus_per_replica: int) -> Placement:
    phases = options.executionPhaseSettings
    return Placement(options.virtualGraphMode, ipus_per_replica, options.enablePipelining,
                     tuple(options.virtualGraphSplitRatios), phases.phases, phases.stages)


def numerics_passes(options) -> list:
    """Passes of options that change how ops compute, run before the fusions."""
    if options is None:
        return []
    passes = [NonStableSoftmax()] if options.enableNonStableSoftmax else []
    if options.groupNormStridedChannelGrouping:
        passes.append(StridedGroupNorm())
    if half_partials(options):
        passes.append(HalfPartialMatMuls())
    if conv_half_partials(options):
        passes.append(HalfPartialConvs())
    if lstm_half_partials(options):
        passes.append(HalfPartialLstms())
    return passes


_PARTIALS_TYPES = ("", "float", "half")


def half_partials(options) -> bool:
    """Whether ``partialsTypeMatMuls`` (or ``matmulOptions["partialsType"]``) asks for float16
    matmul partials; raises for a value other than "", "float" or "half"."""
    value = options.partialsTypeMatMuls
    if not isinstance(value, str) or value.lower() not in _PARTIALS_TYPES:
        raise popart_exception(
            f"SessionOptions.partialsTypeMatMuls = {value!r}: use \"float\" (or \"\", the "
            f"default) for float32 partials, or \"half\" for float16 partials."
        )
    # matmulOptions["partialsType"] asks the same when partialsTypeMatMuls is unset.
    return matmul_half_partials(options)


def _fold_multiple(options) -> bool:
    """enableConstantFoldingOfMultipleConsumers (True without options)."""
    return options is None or options.enableConstantFoldingOfMultipleConsumers


def check_passes(options) -> list:
    """The debug-check passes, last so they mark every op the other passes added."""
    passes = [FloatingPointChecks()] if options.enableFloatingPointChecks else []
    if options.opxModifyChecking or options.opxAliasChecking:
        passes.append(KernelChecks(options.opxModifyChecking, options.opxAliasChecking))
    return passes


def multi_ipu_passes(options, placement: Placement, loss_id: str | None, depth: int,
                     depth_name: str) -> list:
    """The passes after the session's own: placement of the ops they added, pipeline stages,
    recomputation (training only), then stashes and inter-IPU copies."""
    passes = [PlaceRemainingOps(placement),
              AssignPipelineStages(options, loss_id, depth, depth_name)]
    if loss_id is not None:
        passes.append(Recompute(options.autoRecomputation))
    if placement.mode is VirtualGraphMode.ExecutionPhases:
        # After recomputation: the clones run in the backward phases too.
        passes.append(ExecutionPhases(options, loss_id is not None))
    stash_all = loss_id is None and options.stashAllTensorsInferencePipeline
    return passes + [InsertPipelineStashes(stash_all), InsertIpuCopies(placement)]


def training_passes(options, loss_id: str, optimizer, accumulation_factor: int,
                    replication_factor: int = 1, ipus_per_replica: int = 1,
                    batches_per_step: int = 1) -> list:
    """Passes for a TrainingSession, in order (docs/training.md).

    ``replication_factor`` is the global replication factor (all replicas of all instances):
    the gradient all-reduce and the Mean reduction span it.

    ``optimizer`` provides ``apply``, ``getLossScalingVal`` and ``loss_scaling_is_const``
    (``popart_backend.optim``). What it added ends in ``Ir.optimizer_tensors``, which the
    session reads.
    """
    loss_factor, grad_factor = reduction_factors(options, accumulation_factor,
                                                 replication_factor)
    loss_scaling = float(optimizer.getLossScalingVal())
    const_scaling = optimizer.loss_scaling_is_const()
    # ensureFp32LossScaleTensor: autodiff seeds without the scale, Fp32LossScale applies it.
    fp32_scale = options.ensureFp32LossScaleTensor
    seed = loss_scaling * loss_factor if const_scaling and not fp32_scale else loss_factor
    placement = _placement(options, ipus_per_replica)
    # Fusions whose fused op has a gradient, before placement (they keep the settings of the
    # ops they replace) and autodiff. Virtual graphs before autodiff: every gradient op
    # inherits its forward op's IPU.
    passes: list = [FoldConstants(_fold_multiple(options)), *numerics_passes(options),
                    TrainingSemantics(),
                    FuseMatMulAdd(training=True), FuseGelu(training=True),
                    FuseLayerNorm(training=True), FuseAttention(training=True),
                    GatherRowsEarly(training=True), ApplyPatterns(), AssignVirtualGraphs(placement)]
    als = options.automaticLossScalingSettings
    if als.enabled and (als.gradientTensorTrackingMethod
                        is GradientTensorTrackingMethod.ConvAndMatmulGradients):
        passes.append(TrackConvAndMatmulGradients())  # the histogram's gradients, named
    passes.append(Autodiff(loss_id, seed,
                           stitch_strategy=options.autodiffSettings.stitchStrategy))
    if half_partials(options):
        passes.append(HalfPartialMatMuls())  # the gradient products autodiff added
    if lstm_half_partials(options):
        passes.append(HalfPartialLstms())  # the LSTM gradients autodiff added
    # Gradient ops inherit their forward op's settings: clear half partials they cannot honour.
    passes.append(HalfPartialConvs(unmark_unsupported=True))
    passes.append(FuseSliceGradSum())  # split gradients autodiff summed: one Concat
    passes.append(FuseTiedGatherGrad())  # a tied embedding's rows added into its product grad
    # The cross-entropy's softmax once, in the forward, its gradient written over it.
    passes.append(FuseCrossEntropyGrad())
    if options.decomposeGradSum:
        passes.append(DecomposeGradSums())  # the gradient sums autodiff added
    if fp32_scale:
        passes.append(Fp32LossScale(loss_id, loss_scaling, const_scaling))
    elif not const_scaling:
        passes.append(SeedLossScaling(loss_id, loss_scaling))
    # Ir.weight_grads (set by autodiff) is rewritten by each of the next passes in turn.
    # With accumulation the optimizer runs once per weight update, in the outer fragment.
    context = OUTER if options.enableGradientAccumulation else ExecutionContext.Normal
    if options.enableGradientAccumulation:
        passes.append(AccumulateGradients(
            accumulation_factor, options.accumulationAndReplicationReductionType,
            options.meanAccumulationAndReplicationReductionStrategy,
            optimizer.accumulator_dtype))
    # Gradients summed over all (global) replicas before the update.
    passes.append(AllReduceGradients(
        context, replication_factor,
        mean=options.accumulationAndReplicationReductionType is ReductionType.Mean))
    grad_scale = grad_factor / loss_scaling if const_scaling else grad_factor
    passes.append(ApplyOptimizer(optimizer, context, grad_scale))
    passes.append(GroupOptimizerState())  # a grouped weight's state: one value per group
    if options.automaticLossScalingSettings.enabled:
        passes.append(AutomaticLossScaling(options.automaticLossScalingSettings, context))
    if options.enableGradientAccumulation:
        passes.append(ResetAccumulators())
    # Replicated tensor sharding rewrites the reductions and updates built above.
    local_replicas = options.replicatedGraphCount if options.enableReplicatedGraphs else 1
    passes.append(ShardVariables(options, replication_factor, local_replicas))
    if options.enableStochasticRounding:
        passes.append(StochasticRounding())  # after the optimizer: its updates round too
    # Only with delayVarUpdates off: by default PopART holds every weight gradient until the
    # updates at the end of the backward pass, and the device model must see those gradients.
    passes.append(FuseGradIntoUpdate(placement.mode is VirtualGraphMode.Off
                                     and not placement.pipelining
                                     and not options.delayVarUpdates))
    passes.append(WireRandomSeed())
    passes.append(InplaceVariants())
    if options.enableGradientAccumulation:
        depth, depth_name = accumulation_factor, "gradient accumulation factor"
    else:
        depth, depth_name = batches_per_step, "batchesPerStep"
    checks = check_passes(options)
    return passes + multi_ipu_passes(options, placement, loss_id, depth, depth_name) + checks


class ApplyOptimizer:
    """Pass: ``optimizer.apply`` over ``Ir.weight_grads``, in ``context``; what it added goes to
    ``Ir.optimizer_tensors``.

    Before:  Gradient___w/allreduced = ReplicatedAllReduce(Gradient___w)
    After:   Gradient___w/allreduced = ReplicatedAllReduce(Gradient___w)
             UpdatedVar___w = SGDUpdate(w, Gradient___w/allreduced)    # writes w in place
    """

    name = "apply_optimizer"

    def __init__(self, optimizer, context: ExecutionContext, grad_scale: float):
        self.optimizer = optimizer
        self.context = context
        self.grad_scale = grad_scale

    def run(self, ir) -> bool:
        gradients = dict(ir.weight_grads)
        ir.optimizer_tensors = self.optimizer.apply(ir, gradients, self.context,
                                                    self.grad_scale)
        return bool(gradients)


def run_passes(ir, passes, debug: bool = False) -> None:
    for p in passes:
        changed = p.run(ir)
        _log.debug("pass %s: %s", p.name, "changed" if changed else "no change")
        if debug:
            verify(ir.main)
