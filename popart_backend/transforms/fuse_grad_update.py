"""Pass (training): a weight gradient that is one matrix product read only by its SGD update is
computed inside the update (``SGDMatMulUpdate``, ops/fused_grad.py), saving the gradient tensor
and a pass over it.

Before:  dW = popart.fused::LinearBiasWeightGrad(dY, X)        # f32[N, K]
         Gradient___w = Identity(dW)
         UpdatedVar___w = SGDUpdate(w, Gradient___w, Accl___w, ...)
After:   UpdatedVar___w = popart.fused::SGDMatMulUpdate(w, dY, X, Accl___w, ...)

With gradient accumulation the product goes into its accumulator the same way:

Before:  Accum___w/accumulated = Accumulate(Accum___w, Gradient___w[, count])
After:   Accum___w/accumulated = popart.fused::MatMulAccumulate(Accum___w, dY, X[, count])

The producer is ``LinearBiasWeightGrad`` or the weight operand's ``GemmGrad``, and every
tensor from it to the update has that one reader and is not observed by the host (anchors,
graph outputs). Gradients that are all-reduced or reduce-scattered before the update, or also
read by a global-norm clip factor, have other readers or producers, so they stay as they are;
so do accumulators of another dtype than the gradient (accumType). Not fused either: Nesterov, stochastic rounding, skip-on-overflow (their
settings are checked, the pass runs after the passes that set them), float16 partials,
mixed dtypes, and models spread over IPUs, pipeline stages or execution phases.

It runs only with ``SessionOptions.delayVarUpdates = False``. By default (True) PopART keeps
every weight gradient until the updates at the end of the backward pass; fusing would move the
update and hide those gradients from the memory model. With the option off the gradient lives
from its product to its update, the two adjacent ops fused here, so the memory model misses
only that one transient buffer.
"""

from __future__ import annotations

from ..ops.accumulate import Accumulate
from ..ops.fused import LinearBiasWeightGrad
from ..ops.fused_grad import MatMulAccumulate, SGDMatMulUpdate
from ..ops.matmul import GemmGrad
from ..ops.optimizer_updates import SGDUpdate
from .fuse_common import only_consumer, replace_chain, same_placement


def _operands(op):
    """(dY-or-X input ids, a_transposed, b_transposed, product scale) of a weight-gradient
    product, or None when ``op`` is not one."""
    if (op is None or op.settings.half_partials
            or not isinstance(op, (LinearBiasWeightGrad, GemmGrad))):
        return None
    dy, other = op.inputs[0], op.inputs[1]
    if dy is None or other is None:
        return None
    if isinstance(op, LinearBiasWeightGrad):
        # dW = Xᵀ·dY, or dYᵀ·X for a weight kept as [N, K].
        if op.attrs.transposed_weight:
            return (dy, other), True, False, 1.0
        return (other, dy), True, False, 1.0
    if isinstance(op, GemmGrad) and op.attrs.operand == 1:
        at = op.attrs
        if len(dy.info.shape) != 2 or len(other.info.shape) != 2:
            return None
        # dB' = A'ᵀ·dY (dYᵀ·A' when transB), A' = Aᵀ when transA.
        if at.transB:
            return (dy, other), True, bool(at.transA), float(at.alpha)
        return (other, dy), not at.transA, False, float(at.alpha)
    return None


class FuseGradIntoUpdate:
    """Pass: weight-gradient products folded into their SGD updates (module doc)."""

    name = "fuse_grad_update"

    def __init__(self, single_placement: bool = True):
        # False when the model is spread over IPUs, stages or phases: nothing is fused.
        self.single_placement = single_placement

    def run(self, ir) -> bool:
        if not self.single_placement:
            return False
        graph = ir.main
        accumulators = {a.tensor_id for a in ir.accumulators.values()}
        changed = False
        for op in list(graph.ops.values()):
            if type(op) is SGDUpdate:
                changed |= self._fuse_update(graph, op)
            elif type(op) is Accumulate and op.inputs[0].id in accumulators:
                changed |= self._fuse_accumulate(graph, op)
        return changed

    def _fuse_update(self, graph, update) -> bool:
        if (update.settings.stochastic_rounding or update.settings.skip_on_overflow
                or update.attrs.nesterov != 0.0 or "nesterov" in update.attrs.dynamic):
            return False
        weight, state = update.inputs[0], update.inputs[2:]
        if state[0] is not None and state[0].info.dtype != weight.info.dtype:
            return False
        found = _product_chain(update, weight)
        if found is None:
            return False
        chain, (a, b), a_t, b_t, scale = found
        fused = SGDMatMulUpdate.from_update(update, a_t, b_t, scale)
        ids = [weight.id, a.id, b.id, *(t.id if t is not None else "" for t in state)]
        _replace(graph, chain, fused, ids)
        return True

    def _fuse_accumulate(self, graph, accumulate) -> bool:
        accum, count = accumulate.inputs[0], accumulate.inputs[2:]
        found = _product_chain(accumulate, accum)
        if found is None:
            return False
        chain, (a, b), a_t, b_t, scale = found
        fused = MatMulAccumulate.from_accumulate(accumulate, a_t, b_t, scale)
        ids = [accum.id, a.id, b.id, *(t.id if t is not None else "" for t in count)]
        _replace(graph, chain, fused, ids)
        return True


def _product_chain(reader, target):
    """(chain of ops from the gradient product to ``reader``, operands, a_transposed,
    b_transposed, scale) when ``reader``'s input 1 is a product only it reads (through
    Identities), on the same placement and in ``target``'s dtype; else None."""
    chain = [reader]
    tensor = reader.inputs[1]
    while True:
        if tensor is None or only_consumer(tensor) is not chain[0] or tensor.producer is None:
            return None
        op = tensor.producer
        chain.insert(0, op)
        if op.op_type == "Identity" and op.domain == "ai.onnx":
            tensor = op.inputs[0]
            continue
        break
    found = _operands(op)
    if found is None or not same_placement(chain):
        return None
    (a, b), a_t, b_t, scale = found
    dtype = target.info.dtype
    if a.info.dtype != dtype or b.info.dtype != dtype or reader.inputs[1].info.dtype != dtype:
        return None
    return chain, (a, b), a_t, b_t, scale


def _replace(graph, chain, fused, ids) -> None:
    """``replace_chain``, the fused op keeping the chain's schedule constraints (those
    ``Graph.add_op`` derives for a new writer of the state, every current reader first, would
    also put the readers that ran after the old op, such as an accumulator's reset, before it).
    The gradient tensors the chain made are recorded in ``Ir.fused_gradients``."""
    befores, afters = _constraints(graph, chain)
    if graph.ir is not None:
        graph.ir.fused_gradients.update(
            (t.id, t.info) for op in chain[:-1] for t in op.outputs if t is not None)
    replace_chain(graph, chain, fused, ids, chain[-1].outputs[0])
    graph.constraints.pop(fused.id, None)
    for op_id in befores:
        if op_id in graph.ops and op_id != fused.id:
            graph.add_constraint(graph.ops[op_id], fused)
    for op_id in afters:
        if op_id in graph.ops and op_id != fused.id:
            graph.add_constraint(fused, graph.ops[op_id])


def _constraints(graph, chain) -> tuple[set[int], set[int]]:
    """Ids of the ops scheduled before and after the ops of ``chain`` by constraints (not data
    edges), outside the chain: the fused op keeps them."""
    ids = {op.id for op in chain}
    befores = set().union(*(graph.constraints.get(i, set()) for i in ids)) - ids
    afters = {later for later, before in graph.constraints.items()
              if before & ids and later not in ids}
    return befores, afters
