"""How the gradient of a subgraph op gets the forward values it reads
(``SessionOptions.autodiffSettings.stitchStrategy``), for autodiff (transforms/autodiff.py).

The gradient body of an If or Call (``ops/control_flow.grad_body``) starts as a copy of the
forward body followed by the backward ops. With RecomputeAllNonInputs (the default) and
RecomputeMinimal that copy stays: the gradient recomputes the forward values it reads. With
AddFwdOutputs and SafeAddFwdOutputs, ``stitch`` turns each forward value the backward ops read
into an extra output of the forward body, hence of the forward op, and into an input of the
gradient body, whose copied forward ops are deleted. Those values then stay live from the
forward op to its gradient op (more memory) and nothing is computed twice (fewer cycles). A
Call's gradient takes only the arguments its body still reads, so an argument only the
deleted copy read is not kept alive until the backward.

Before (recompute):                       After (AddFwdOutputs):
  y = Call<f>(x)                            y, t' = Call<f>(x)
     f(a): t = Sin(a); o = Mul(t, t)           f(a): t = Sin(a); o = Mul(t, t); returns o, t
  dx = Call<f_grad>(x, dy)                  dx = Call<f_grad>(x, dy, t')
     f_grad: t = Sin(a); o = Mul(t, t);        f_grad: dt = Mul(dy, t') ...; no Sin, no Mul(t, t)
             dt = Mul(dy, t) ...

An If gives both branches the extra outputs (each returns zeros in the places of the other
branch's values). Ops whose gradient cannot take forward values as outputs (Loop and Scan:
an iteration's values are not outputs of the op; the other subgraph ops; an op whose body
another op holds too) recompute: SafeAddFwdOutputs logs it once per op type, AddFwdOutputs
refuses the model. A subgraph op inside a body recomputes in its own gradient body (logged
once).
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import popart_exception
from ..ir.graph import Graph
from ..ir.op import Op
from ..ir.tensor import TensorKind
from ..ops.control_flow import Body, SubgraphOp
from ..options.enums import AutodiffStitchStrategy

_log = logging.getLogger("popart:transform")
_ADD = (AutodiffStitchStrategy.AddFwdOutputs, AutodiffStitchStrategy.SafeAddFwdOutputs)
_RECOMPUTE = AutodiffStitchStrategy.RecomputeAllNonInputs
_LOGGED: set[tuple[str, str]] = set()


def _log_once(key: tuple[str, str], message: str) -> None:
    if key not in _LOGGED:
        _LOGGED.add(key)
        _log.warning(message)


class Stitcher:
    """The stitch strategy of one autodiff: ``adds_outputs(op)`` says, before ``op.grad``
    runs, whether that gradient takes forward values as extra outputs of ``op``."""

    def __init__(self, strategy: AutodiffStitchStrategy = _RECOMPUTE, nested: bool = False):
        self.strategy = strategy
        self.nested = nested  # the autodiff of a body (If/Call gradient bodies)
        self.considered = False  # did a subgraph op of the main graph get differentiated?

    def inner(self) -> "Stitcher":
        """The stitcher of a nested autodiff, growing a gradient body."""
        return Stitcher(self.strategy, nested=True)

    def adds_outputs(self, op: Op) -> bool:
        if self.strategy not in _ADD or not isinstance(op, SubgraphOp):
            return False
        option = f"SessionOptions.autodiffSettings.stitchStrategy = {self.strategy.name}"
        self.considered = True
        if self.nested:
            _log_once(("nested", self.strategy.name), (
                f"{option}: {op.debug_name} sits inside the body of another subgraph op; its "
                f"gradient body recomputes the forward values it needs (only subgraph ops of "
                f"the main graph return them as extra outputs)."))
            return False
        if op.adds_fwd_outputs and not _shared_bodies(op):
            return True
        why = (op.fwd_outputs_blocker if not op.adds_fwd_outputs else
               "one of its bodies is also the body of another op")
        if self.strategy is AutodiffStitchStrategy.AddFwdOutputs:
            raise popart_exception(
                f"{option}: the gradient of {op.debug_name} cannot take its forward values as "
                f"extra outputs: {why}. Use AutodiffStitchStrategy.SafeAddFwdOutputs (which "
                f"recomputes them for such ops) or a recompute strategy "
                f"(RecomputeAllNonInputs, the default).")
        _log_once(("safe", op.op_type), (
            f"{option}: the gradient of {op.op_type} ops such as {op.debug_name} recomputes "
            f"the forward values it needs, because {why}."))
        return False

    def log_if_unused(self, has_subgraphs: bool) -> None:
        """After the main graph's autodiff: say once that an AddFwdOutputs strategy had no
        effect because no gradient went through the model's subgraph ops (a model without
        subgraphs is logged by the session's check_stitch_strategy)."""
        if self.strategy in _ADD and has_subgraphs and not self.nested and not self.considered:
            _log_once(("unused", self.strategy.name), (
                f"SessionOptions.autodiffSettings.stitchStrategy = {self.strategy.name} has no "
                f"effect: no gradient flows through a subgraph op (If, Call, Loop, Scan) of "
                f"this model, so there are no forward values to stitch."))


def _shared_bodies(op: SubgraphOp) -> bool:
    """Does another op of the Ir hold one of ``op``'s body graphs? (Adding outputs would
    change that op's body too.)"""
    mine = {id(b.graph) for b in op.bodies()}
    for graph in op.graph.ir.graphs.values():
        for other in graph.ops.values():
            if other is not op and isinstance(other, SubgraphOp) and any(
                    id(b.graph) in mine for b in other.bodies()):
                return True
    return False


def stitch(op: SubgraphOp, pairs: list[tuple[Body, Body]]) -> list[Body]:
    """Give forward ``op`` extra outputs for the forward values its gradient bodies read, and
    make those bodies read them (by id) instead of recomputing them. ``pairs`` are (forward
    body, its gradient body), one per body of ``op``, in output order of the bodies. Returns
    the gradient bodies, without the formal inputs they no longer read (a Call's gradient
    then takes only the arguments it needs: ``Body.formal`` says which)."""
    needs = [_needed(fwd, grad) for fwd, grad in pairs]
    existing = [_existing_outputs(op, fwd, grad) for fwd, grad in pairs]
    added = [[t for t in need if t not in known] for need, known in zip(needs, existing)]
    graph: Graph = op.graph
    for j, (fwd, _) in enumerate(pairs):
        for i, ids in enumerate(added):
            for tid in ids:
                if i == j:
                    fwd.graph.outputs.append(tid)
                    continue
                info = pairs[i][0].graph.tensors[tid].info
                zeros = fwd.graph.unique_id(f"{tid}/placeholder")
                fwd.graph.add_const(zeros, np.zeros(info.shape, info.dtype.numpy))
                fwd.graph.outputs.append(zeros)
    for i, ids in enumerate(added):
        for tid in ids:
            outer = _free_id(f"{tid}/fwd_output", graph, pairs[i][1].graph)
            graph.append_output(op, outer, pairs[i][0].graph.tensors[tid].info)
            existing[i][tid] = outer
    op.bodies_changed()
    for (fwd, grad), need, known in zip(pairs, needs, existing):
        _read_instead_of_recompute(grad, fwd, {tid: known[tid] for tid in need})
    _log.debug("autodiff: %s returns %d forward values for its gradient", op.debug_name,
               sum(len(ids) for ids in added))
    return [_without_unread_formals(grad) for _, grad in pairs]


def _without_unread_formals(grad: Body) -> Body:
    """``grad`` without the formal inputs nothing in it reads any more (the deleted forward
    copy read them)."""
    graph = grad.graph
    unread = [t for t in grad.formal
              if not graph.tensors[t].consumers and t not in graph.outputs]
    if not unread:
        return grad
    graph.inputs = [t for t in graph.inputs if t not in unread]
    for tid in unread:
        graph.remove_tensor(graph.tensors[tid])
    return Body(graph, grad.num_formal - len(unread))


def _forward_ops(fwd: Body, grad: Body) -> list[Op]:
    """The ops of ``grad`` copied from ``fwd`` (they produce tensors of the forward body)."""
    tensors = fwd.graph.tensors
    return [o for o in grad.graph.ops.values()
            if o.grad_of is None and any(t is not None for t in o.outputs)
            and all(t is None or (t.id in tensors and tensors[t.id].producer is not None)
                    for t in o.outputs)]


def _needed(fwd: Body, grad: Body) -> list[str]:
    """Forward values computed in ``fwd`` that the backward ops of ``grad`` read, in order."""
    copied = {o.id for o in _forward_ops(fwd, grad)}
    needed: list[str] = []

    def need(tensor) -> None:
        if tensor is not None and tensor.producer is not None and tensor.producer.id in copied \
                and tensor.id not in needed:
            needed.append(tensor.id)

    for o in grad.graph.topo_order():
        if o.id not in copied:
            for t in o.inputs:
                need(t)
    for tid in grad.graph.outputs:
        need(grad.graph.tensors[tid])
    return needed


def _existing_outputs(op: SubgraphOp, fwd: Body, grad: Body) -> dict[str, str]:
    """{body tensor id: op output id} for the body's outputs the op already returns (unless
    the gradient body uses that id for another tensor)."""
    return {tid: out.id for tid, out in zip(fwd.outputs, op.outputs)
            if out is not None and (out.id == tid or out.id not in grad.graph.tensors)}


def _free_id(base: str, *graphs: Graph) -> str:
    tid, n = base, 0
    while any(tid in g.tensors for g in graphs):
        n += 1
        tid = f"{base}__{n}"
    return tid


def _read_instead_of_recompute(grad: Body, fwd: Body, outer: dict[str, str]) -> None:
    """Delete the forward copy from ``grad``; it reads each needed value ``tid`` as the
    enclosing graph's ``outer[tid]`` (a captured input) instead."""
    graph = grad.graph
    for o in _forward_ops(fwd, grad):
        graph.remove_op(o)
    for tid, outer_id in outer.items():
        tensor = graph.tensors[tid]
        if outer_id == tid:
            tensor.kind = TensorKind.STREAM
        else:
            new = graph.add_tensor(outer_id, tensor.info, TensorKind.STREAM)
            graph.replace_all_uses(tensor, new)
            graph.remove_tensor(tensor)
        graph.inputs.append(outer_id)
    keep = set(graph.outputs) | set(grad.formal)
    # Captured inputs only the deleted copy read (their liveness would reach the gradient).
    graph.inputs = [t for t in graph.inputs if t in keep or graph.tensors[t].consumers]
    for tensor in list(graph.tensors.values()):
        if (tensor.producer is None and not tensor.consumers and tensor.id not in keep
                and tensor.id not in graph.inputs):
            graph.remove_tensor(tensor)
