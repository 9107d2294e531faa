"""Autodiff as an IR transform (DESIGN decision 4): grow the backward graph from the loss.

Each op writes its own gradient in ``grad(self, g)`` using the ``GradBuilder`` handed to it,
which creates ordinary IR ops. Gradients of every trainable variable end in tensors named
``Gradient___<variable id>``, so they can be anchored like any tensor (F35). The gradient of
any other tensor (a stream input, an activation) is grown and named ``Gradient___<id>`` only
when ``Ir.anchors`` asks for it: inputs need no update, so nothing computes their gradient
otherwise. Variables the model marks frozen (``Ir.frozen_variables``) are treated like inputs:
no gradient unless anchored, and never in ``Ir.weight_grads`` (not trained).

Before:  y = MatMul(x, w)           After:   y = MatMul(x, w)
         loss = IdentityLoss(y)              loss = IdentityLoss(y)
                                             Gradient___loss = <seed 1.0 * lossScaling>
                                             Gradient___y = IdentityLossGrad(Gradient___loss, y)
                                             Gradient___w = MatMul(Transpose(x), Gradient___y)
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import numpy as np

from ..errors import popart_exception, popart_internal_exception
from ..ir.graph import Graph
from ..ir.ir import Ir
from ..ir.op import Op
from ..ir.tensor import Tensor, TensorKind, TensorRole
from ..ops.registry import AI_ONNX, make_attrs, registered_versions, normalize_domain, _REGISTRY
from ..options.enums import AutodiffStitchStrategy
from .autodiff_stitch import Stitcher, stitch

GRADIENT_PREFIX = "Gradient___"
_RECOMPUTE = AutodiffStitchStrategy.RecomputeAllNonInputs
_log = logging.getLogger("popart:transform")


def has_grad(op: Op) -> bool:
    return type(op).grad is not Op.grad


class GradBuilder:
    """What an op's ``grad()`` sees: its forward tensors, output gradients, and op creation."""

    def __init__(self, autodiff: "Autodiff", op: Op, output_grads: list[str | None],
                 adds_fwd_outputs: bool = False):
        self._autodiff = autodiff
        self._op = op
        self._output_grads = output_grads
        self._adds_fwd_outputs = adds_fwd_outputs
        self.input_grads: dict[int, str] = {}

    # forward side
    def input(self, index: int) -> str:
        tensor = self._op.inputs[index]
        if tensor is None:
            raise popart_exception(f"{self._op.debug_name}: grad() read absent input {index}.")
        return tensor.id

    def output(self, index: int) -> str:
        return self._op.outputs[index].id

    def input_info(self, index: int):
        return self._op.inputs[index].info

    def output_info(self, index: int):
        return self._op.outputs[index].info

    def has_input(self, index: int) -> bool:
        return index < len(self._op.inputs) and self._op.inputs[index] is not None

    def needs_input_grad(self, index: int) -> bool:
        tensor = self._op.inputs[index] if index < len(self._op.inputs) else None
        return tensor is not None and tensor.id in self._autodiff.requires_grad

    # gradient side
    def output_grad(self, index: int) -> str:
        """Gradient of forward output ``index``; zeros when nothing downstream reaches the loss."""
        grad = self._output_grads[index] if index < len(self._output_grads) else None
        if grad is None:
            info = self._op.outputs[index].info
            grad = self.const(np.zeros(info.shape, info.dtype.numpy), "zeros")
        return grad

    def set_input_grad(self, index: int, grad_id: str) -> None:
        if not self.needs_input_grad(index):
            return
        want = self._op.inputs[index].info
        got = self._autodiff.graph.tensor(grad_id).info
        if got != want:
            raise popart_exception(
                f"{self._op.debug_name}: gradient of input {index} '{self.input(index)}' is {got}, "
                f"the input is {want} (a bug in this op's grad())."
            )
        self.input_grads[index] = grad_id

    def differentiate(self, graph: Graph, seeds: dict[str, str], wrt: Sequence[str]
                      ) -> dict[str, str]:
        """The backward of a subgraph (a body of If/Call), grown into ``graph`` by a nested
        autodiff; see ``Autodiff.differentiate``."""
        return Autodiff(None, stitcher=self._autodiff.stitcher.inner()).differentiate(
            graph, seeds, wrt)

    def stitch_forward(self, pairs: list) -> list:
        """(forward body, gradient body) pairs of this subgraph op: with the AddFwdOutputs
        strategies, the gradient bodies read the forward values they need as extra outputs of
        the op instead of recomputing them (transforms/autodiff_stitch.py). Returns the
        gradient bodies to use (a stitched one may have fewer formal inputs)."""
        if self._adds_fwd_outputs:
            return stitch(self._op, pairs)
        return [grad for _, grad in pairs]

    # op creation
    def op(self, op_type: str, *inputs: str | None, domain: str = AI_ONNX, num_outputs: int = 1,
           version: int | None = None, **attrs) -> str | list[str]:
        """Add an op (latest registered version unless given) reading ``inputs``."""
        return self._autodiff.add_op(self._op, op_type, list(inputs), domain, num_outputs,
                                     version, attrs)

    def const(self, value: np.ndarray, name: str = "const") -> str:
        graph = self._autodiff.graph
        tid = graph.unique_id(f"{GRADIENT_PREFIX}{self._op.settings.name or self._op.id}/{name}")
        graph.add_const(tid, np.asarray(value))
        return tid

    def reduce_to_shape(self, grad_id: str, shape: Sequence[int]) -> str:
        """Sum ``grad_id`` over the axes broadcasting added, so it has ``shape``."""
        graph = self._autodiff.graph
        grad_shape = graph.tensor(grad_id).info.shape
        shape = tuple(shape)
        if grad_shape == shape:
            return grad_id
        lead = len(grad_shape) - len(shape)
        axes = list(range(lead)) + [
            lead + i for i, d in enumerate(shape) if d == 1 and grad_shape[lead + i] != 1
        ]
        summed = grad_id
        if axes:
            summed = self.op("ReduceSum", grad_id, self.const(np.array(axes, np.int64), "axes"),
                             keepdims=1)
        return self.op("Reshape", summed, self.const(np.array(shape, np.int64), "shape"))


def anchored_gradients(ir: Ir) -> dict[str, str]:
    """{tensor id: anchor} for the anchors ``Gradient___<id>`` of main-graph tensors whose
    gradient does not exist yet (autodiff grows and names it)."""
    tensors = ir.main.tensors
    wanted = {}
    for anchor in ir.anchors:
        base = anchor[len(GRADIENT_PREFIX):]
        if anchor.startswith(GRADIENT_PREFIX) and anchor not in tensors and base in tensors:
            wanted[base] = anchor
    return wanted


def differentiated_variables(graph: Graph) -> set[str]:
    """The float variables of ``graph`` whose gradient autodiff grows: every one but those the
    model marks frozen (``Ir.frozen_variables``), unless a frozen one's gradient is anchored
    (then it is computed and returned, but still not trained)."""
    ir = graph.ir
    frozen = ir.frozen_variables if ir is not None else frozenset()
    anchored = anchored_gradients(ir) if frozen else {}
    return {t.id for t in graph.tensors.values()
            if t.kind is TensorKind.VARIABLE and t.info.dtype.is_float
            and (t.id not in frozen or t.id in anchored)}


class Autodiff:
    """Pass: add gradient ops for every trainable variable on a path to ``loss_id`` (module
    docstring); ``Ir.weight_grads`` maps each trained weight to its ``Gradient___<w>``."""

    name = "autodiff"

    def __init__(self, loss_id: str | None, loss_scaling: float = 1.0,
                 output_grads: dict[str, np.ndarray] | None = None,
                 stitch_strategy: AutodiffStitchStrategy = _RECOMPUTE,
                 stitcher: Stitcher | None = None):
        """Start from ``loss_id`` (a float scalar; its gradient is ``loss_scaling``), or, for
        op tests, from given gradients of arbitrary tensors (``output_grads``).
        ``stitch_strategy``: how subgraph gradients get forward values (autodiff_stitch.py)."""
        self.stitcher = stitcher or Stitcher(stitch_strategy)
        self.loss_id = loss_id
        self.loss_scaling = loss_scaling
        self.output_grads = dict(output_grads or {})
        self.graph: Graph | None = None
        self.requires_grad: set[str] = set()
        self.variable_grads: dict[str, str] = {}

    def run(self, ir: Ir) -> bool:
        graph = self.graph = ir.main
        seeds = dict(self.output_grads)
        if self.loss_id is not None:
            loss = graph.tensor(self.loss_id)
            if loss.info.nelms != 1 or not loss.info.dtype.is_float:
                raise popart_exception(
                    f"The loss '{loss.id}' must be a floating-point scalar to start the backward "
                    f"pass, but it is {loss.info}. Reduce it with reduction=Mean or Sum."
                )
            seeds[loss.id] = np.full(loss.info.shape, self.loss_scaling, loss.info.dtype.numpy)
        order = graph.topo_order()
        wanted = anchored_gradients(ir)
        self._check_wanted_dtypes(graph, wanted)
        self.requires_grad = self._forward_requires_grad(graph, order, wanted)
        reaches_loss: set[int] = set()
        grads: dict[str, list[str]] = {}
        for tid, value in seeds.items():
            tensor = graph.tensor(tid)
            reaches_loss |= self._backward_reaches(tensor)
            seed_id = graph.unique_id(GRADIENT_PREFIX + tid)
            graph.add_const(seed_id, np.asarray(value, tensor.info.dtype.numpy).reshape(tensor.info.shape))
            grads[tid] = [seed_id]

        start = self.loss_id or sorted(seeds)
        self._backprop(order, grads, reaches_loss, start)
        self.stitcher.log_if_unused(len(ir.graphs) > 1)

        changed = self._name_anchored(graph, wanted, grads, reaches_loss, start)
        for tid in sorted(ir.named_gradients - set(wanted)):  # named only where one exists
            tensor = graph.tensors.get(tid)
            if tensor is not None and tid in grads and tensor.kind is not TensorKind.VARIABLE:
                self._named_total(grads, tensor)
                changed = True
        for tensor in list(graph.tensors.values()):
            if tensor.kind is TensorKind.VARIABLE and tensor.id in grads:
                self.variable_grads[tensor.id] = self._named_total(grads, tensor)
                changed = True
        # The trained weights: running statistics, other state variables and frozen weights
        # (an anchored gradient of one is computed, not applied) are not trained.
        ir.weight_grads = {w: g for w, g in self.variable_grads.items()
                           if graph.tensors[w].role is TensorRole.WEIGHT
                           and w not in ir.frozen_variables}
        _log.debug("autodiff: gradients for %d variables", len(self.variable_grads))
        return changed

    def differentiate(self, graph: Graph, seeds: dict[str, str], wrt: Sequence[str]
                      ) -> dict[str, str]:
        """Grow the backward of a subgraph into it (If/Call gradient bodies): ``seeds`` maps
        forward tensor ids to the tensors holding their gradients; returns {wrt id: gradient
        id} for the tensors of ``wrt`` the seeds reach."""
        self.graph = graph
        order = graph.topo_order()
        self.requires_grad = set(wrt)
        for op in order:
            if op.stops_gradient:
                continue
            if any(t is not None and t.id in self.requires_grad for t in op.inputs):
                self.requires_grad.update(
                    t.id for t in op.outputs if t is not None and t.info.dtype.is_float)
        reaches: set[int] = set()
        for tid in seeds:
            reaches |= self._backward_reaches(graph.tensor(tid))
        grads = {tid: [seed] for tid, seed in seeds.items()}
        self._backprop(order, grads, reaches, sorted(seeds))
        return {w: self._total(grads, graph.tensor(w)) for w in wrt if w in grads}

    def _backprop(self, order: list[Op], grads: dict[str, list[str]], reaches: set[int],
                  start) -> None:
        """Call grad() of every op on a path from the seeds, in reverse order."""
        for op in reversed(order):
            if op.id not in reaches:
                continue
            if not any(t is not None and t.id in self.requires_grad for t in op.inputs):
                continue
            out_grads = [
                self._total(grads, t) if t is not None and t.id in grads else None
                for t in op.outputs
            ]
            if all(g is None for g in out_grads):
                continue
            if not has_grad(op):
                wanted = [t.id for t in op.inputs if t is not None and t.id in self.requires_grad]
                raise popart_exception(
                    f"{op.debug_name} has no gradient, but the backward pass from "
                    f"{start!r} needs one for its input(s) {wanted}. "
                    f"Detach the path (aiGraphcore.detach) or use an op with a gradient."
                )
            builder = GradBuilder(self, op, out_grads, self.stitcher.adds_outputs(op))
            op.grad(builder)
            for index, grad_id in builder.input_grads.items():
                grads.setdefault(op.inputs[index].id, []).append(grad_id)

    # --- helpers -----------------------------------------------------------------------------

    def _forward_requires_grad(self, graph: Graph, order: list[Op],
                               wanted: dict[str, str]) -> set[str]:
        need = differentiated_variables(graph)
        need.update(wanted)
        for op in order:
            if op.stops_gradient:
                continue
            if any(t is not None and t.id in need for t in op.inputs):
                need.update(t.id for t in op.outputs if t is not None and t.info.dtype.is_float)
        return need

    @staticmethod
    def _check_wanted_dtypes(graph: Graph, wanted: dict[str, str]) -> None:
        for tid, anchor in wanted.items():
            info = graph.tensors[tid].info
            if not info.dtype.is_float:
                raise popart_exception(
                    f"Anchor '{anchor}': tensor '{tid}' ({info}) has no gradient, because only "
                    f"floating-point tensors have gradients and it is {info.dtype.name}. Anchor "
                    f"the gradient of a floating-point tensor on the path to the loss instead."
                )

    def _name_anchored(self, graph: Graph, wanted: dict[str, str], grads: dict[str, list[str]],
                       reaches_loss: set[int], start) -> bool:
        """Give each anchored gradient of a non-variable tensor its ``Gradient___<id>`` name;
        raise for an anchored tensor no gradient reached. Variables are named by ``run``."""
        for tid, anchor in wanted.items():
            tensor = graph.tensors[tid]
            if tid not in grads:
                raise popart_exception(self._no_gradient_message(tensor, anchor, reaches_loss,
                                                                 start))
            if tensor.kind is TensorKind.VARIABLE:
                continue
            name = self._named_total(grads, tensor)
            if name != anchor:
                raise popart_internal_exception(
                    f"autodiff: the gradient of '{tid}' was named '{name}', not the anchored "
                    f"'{anchor}' (another tensor took that name first)."
                )
        return bool(wanted)

    @staticmethod
    def _no_gradient_message(tensor: Tensor, anchor: str, reaches_loss: set[int],
                             start) -> str:
        on_path = any(op.id in reaches_loss for op in tensor.consumers)
        if not on_path:
            why = (f"it is not on a path to the loss {start!r}: the loss does not depend on it "
                   f"(its readers: {sorted(op.debug_name for op in tensor.consumers) or 'none'})")
        else:
            why = (f"no gradient flows back to it from the loss {start!r}: every path from it to "
                   f"the loss goes through an op that passes no gradient to that input (a "
                   f"detach, a shape, index or comparison input, an integer-valued result)")
        return (f"Anchor '{anchor}': tensor '{tensor.id}' ({tensor.info}) has no gradient; "
                f"{why}. Anchor the gradient of a tensor the loss depends on through "
                f"differentiable ops.")

    @staticmethod
    def _backward_reaches(loss: Tensor) -> set[int]:
        seen: set[int] = set()
        stack = [loss]
        while stack:
            tensor = stack.pop()
            op = tensor.producer
            if op is None or op.id in seen:
                continue
            seen.add(op.id)
            stack.extend(t for t in op.inputs if t is not None)
        return seen

    def _total(self, grads: dict[str, list[str]], tensor: Tensor) -> str:
        parts = grads[tensor.id]
        if len(parts) > 1:
            out = self.graph.unique_id(GRADIENT_PREFIX + tensor.id)
            self._add(tensor.producer, "Sum", parts, AI_ONNX, [out], None, {})
            grads[tensor.id] = [out]
        return grads[tensor.id][0]

    def _named_total(self, grads, tensor: Tensor) -> str:
        """The variable's gradient under its reserved name ``Gradient___<id>``."""
        name = GRADIENT_PREFIX + tensor.id
        parts = grads[tensor.id]
        if len(parts) == 1 and parts[0] == name:
            return name
        if name in self.graph.tensors:
            name = self.graph.unique_id(name)
        op_type = "Sum" if len(parts) > 1 else "Identity"
        self._add(None, op_type, parts, AI_ONNX, [name], None, {})
        return name

    def add_op(self, forward: Op, op_type, inputs, domain, num_outputs, version, attrs):
        base = f"{GRADIENT_PREFIX}{forward.settings.name or forward.id}/{op_type}"
        outs = [self.graph.unique_id(f"{base}:{i}") for i in range(num_outputs)]
        self._add(forward, op_type, inputs, domain, outs, version, attrs)
        return outs[0] if num_outputs == 1 else outs

    def _add(self, forward: Op | None, op_type, inputs, domain, outs, version, attrs) -> Op:
        domain = normalize_domain(domain)
        versions = registered_versions(op_type, domain)
        if not versions:
            raise popart_exception(f"Gradient op {domain}::{op_type} is not registered.")
        version = version or versions[-1]
        cls = _REGISTRY[(domain, op_type)][version]
        where = f"gradient of {forward.debug_name if forward else 'variables'}"
        settings = (
            dataclasses.replace(forward.settings, name=f"{GRADIENT_PREFIX}{forward.settings.name}")
            if forward is not None
            else None
        )
        op = cls(make_attrs(cls, version, attrs, where), settings, version)
        op.grad_of = forward
        self.graph.add_op(op, [i or "" for i in inputs], outs)
        return op
