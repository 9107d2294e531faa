"""Subgraph ops: If, Loop (ai.onnx) and Call (ai.graphcore), and the ``Body`` /
``SubgraphOp`` machinery they share with Scan (``scan.py``).

A subgraph is an IR Graph of the op's own Ir (``Ir.create_graph``), held in a ``Body``: the
graph plus how many of its leading inputs are *formal*, i.e. bound to the op's operands (Loop's
iteration number, condition and carried values; Scan's states and slices; Call's arguments).
The body's other inputs are *captured*: tensors of an enclosing graph the body reads by name
(ONNX outer-scope references). The op reads each captured tensor as an extra input of the same
id, appended after its ONNX operands, so the scheduler and the liveness see those reads.

Each op compiles one plan per body on its first execution and reuses it: running a body is
binding its inputs, executing the steps and reading its outputs. The compiler is the device's
``ExecutionPlan``, which device/plan.py hands over with ``use_body_compiler`` when it loads, so
ops never import the device; constant folding at import runs bodies through it as well.

Static shapes (the simulated IPU has no dynamic shapes):

- If: both branches must produce the same shapes; the importer folds an If whose condition is
  a constant to the chosen branch (exporters emit those), so only real runtime Ifs remain.
- Loop: carried values keep their shape across iterations. Scan outputs need a trip count known
  at compile time: a constant M and a condition that stays true (absent, or passed through
  unchanged by the body). A data-dependent condition is fine for carried values only.
- Scan (``scan.py``): every version (8 with a batch axis and sequence_lens, 9+ with axes and
  directions).

Gradients: If and Call differentiate their bodies with a nested autodiff (``GradBuilder.
differentiate``) into gradient bodies run by an If / Call of the same condition / arguments.
A gradient body recomputes the forward values it reads, unless the stitch strategy is
AddFwdOutputs / SafeAddFwdOutputs: then ``GradBuilder.stitch_forward`` makes them extra
outputs of the forward op that the gradient body reads (transforms/autodiff_stitch.py).
Loop and Scan (trip count known at compile time) unroll: the forward is recomputed one
iteration at a time as Calls of the body, which gives every iteration's inputs, and each
iteration's backward is a Call of the body's gradient graph, last iteration first. Nothing is
stashed; the cost is a second forward pass and a graph that grows with the trip count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, ClassVar, Protocol

import numpy as np
import torch

from ..dtypes import DataType
from ..errors import (ResourceLimitError, ShapeError, UnsupportedOpError, popart_exception,
                      popart_internal_exception)
from ..ir.graph import Graph
from ..ir.op import Op
from ..ir.tensor import TensorInfo, TensorKind
from ..limits import LOOP_ENV_VAR, max_loop_iterations
from .registry import AI_GRAPHCORE, create_op, register_op

_BOOL_SCALAR = TensorInfo(DataType.BOOL, ())
_INT64_SCALAR = TensorInfo(DataType.INT64, ())


class BodyPlan(Protocol):
    """A body compiled for execution (``device.plan.ExecutionPlan``): a slot per tensor id,
    the slot values and the steps that compute them."""

    slot: dict[str, int]
    values: list
    steps: list

    def execute_in_no_grad(self, steps: list | None = None, values: list | None = None) -> None:
        """Run ``steps`` over the slot values; the caller is inside ``torch.no_grad()``."""


# ``compile(graph, keep=output ids) -> BodyPlan``, set by the device (module docstring).
_compile_body: Callable[..., BodyPlan] | None = None


def use_body_compiler(compile_body: Callable[..., BodyPlan]) -> None:
    """Set how subgraph ops compile their bodies: device/plan.py passes ``ExecutionPlan``."""
    global _compile_body
    _compile_body = compile_body


@dataclass(frozen=True, eq=False)
class Body:
    """A subgraph of an op: ``graph.inputs`` are its formal inputs, then its captured ones."""

    graph: Graph
    num_formal: int

    @property
    def formal(self) -> list[str]:
        return self.graph.inputs[: self.num_formal]

    @property
    def captured(self) -> list[str]:
        return self.graph.inputs[self.num_formal :]

    @property
    def outputs(self) -> list[str]:
        return self.graph.outputs

    def output_infos(self) -> list[TensorInfo]:
        return [self.graph.tensors[t].info for t in self.graph.outputs]

    def __repr__(self) -> str:
        return f"Body({self.graph.id!r})"


class SubgraphOp(Op):
    """Base of ops holding bodies: captured inputs, body execution, printing and folding."""

    aliases_inputs = True  # a body may pass an input straight to an output

    # Names of the Attrs fields holding a Body, in the order their captured ids are appended.
    body_attrs: tuple[str, ...] = ()
    # Can the gradient take forward values as extra outputs of this op (stitch strategies
    # AddFwdOutputs, transforms/autodiff_stitch.py)? If not, why not.
    adds_fwd_outputs: ClassVar[bool] = False
    fwd_outputs_blocker: ClassVar[str] = "its gradient body recomputes its forward body"

    def bodies_changed(self) -> None:
        """Forget the compiled bodies (their outputs changed: autodiff stitching)."""
        self.__dict__.pop("_plans", None)
        self.__dict__.pop("_bindings", None)

    def bodies(self) -> list[Body]:
        return [getattr(self.attrs, name) for name in self.body_attrs]

    def body_input_infos(self, attr: str, operands: list[TensorInfo | None]) -> list[TensorInfo]:
        """Infos of the formal inputs of body ``attr`` given the op's operand infos (import)."""
        return []

    def captured_ids(self) -> list[str]:
        """The union of the bodies' captured ids, in body order: the op's trailing inputs."""
        seen: list[str] = []
        for body in self.bodies():
            seen.extend(t for t in body.captured if t not in seen)
        return seen

    def split_inputs(self, infos: tuple) -> tuple[list, list]:
        """(operand infos, captured infos); checks the trailing inputs are the captured ids."""
        captured = self.captured_ids()
        count = len(infos) - len(captured)
        tail = [t.id if t is not None else "" for t in self.inputs[count:]]
        if count < 0 or tail != captured:
            raise popart_exception(
                f"{self.debug_name}: its trailing inputs {tail} must be the tensors its bodies "
                f"read from the enclosing graph, {captured}."
            )
        return list(infos[:count]), list(infos[count:])

    @property
    def foldable(self) -> bool:  # a body drawing random numbers must run every time
        return all(op.foldable for body in self.bodies() for op in body.graph.ops.values())

    def attr_dict(self) -> dict:
        # dataclasses.asdict would deep-copy the bodies' graphs; show their ids instead.
        return {
            f.name: (v.graph.id if isinstance(v, Body) else v)
            for f in dataclasses.fields(self.attrs)
            for v in [getattr(self.attrs, f.name)]
        }

    def run_body(self, body: Body, formal: list, captured: list) -> list[torch.Tensor]:
        """Execute ``body`` once; ``captured`` are the op's captured input values, in op order."""
        plans = self.__dict__.setdefault("_plans", {})
        plan = plans.get(id(body))
        if plan is None:
            if _compile_body is None:
                raise popart_internal_exception(
                    f"{self.debug_name}: no body compiler is set; device/plan.py sets it "
                    f"(use_body_compiler) when popart_backend is imported."
                )
            plan = plans[id(body)] = _compile_body(body.graph, keep=body.graph.outputs)
            by_id = dict(zip(self.captured_ids(), range(len(captured))))
            self.__dict__.setdefault("_bindings", {})[id(body)] = (
                [plan.slot[t] for t in body.formal],
                [(plan.slot[t], by_id[t]) for t in body.captured],
                [plan.slot[t] for t in body.outputs],
            )
        formal_slots, captured_slots, output_slots = self._bindings[id(body)]
        values = plan.values
        for slot, value in zip(formal_slots, formal):
            values[slot] = value
        for slot, index in captured_slots:
            values[slot] = captured[index]
        plan.execute_in_no_grad(plan.steps)
        return [values[s] for s in output_slots]

    def result(self, values: list[torch.Tensor]):
        """Kernel return value: one tensor for a one-output node, else a tuple."""
        return values[0] if len(self.outputs) == 1 else tuple(values)

    def body_flops(self, body: Body) -> tuple[int, int]:
        flops = moved = 0
        for op in body.graph.ops.values():
            f, m = op.cost()
            flops, moved = flops + f, moved + m
        return flops, moved


def check_body_outputs(op: Op, body: Body, count: int, what: str) -> list[TensorInfo]:
    infos = body.output_infos()
    if len(infos) < count:
        raise ShapeError(
            f"{op.debug_name}: body '{body.graph.id}' has {len(infos)} outputs, at least {count} "
            f"needed ({what})."
        )
    return infos


# --- If --------------------------------------------------------------------------------------


@register_op("If", versions=(1, 11, 13, 16, 19, 21, 23, 24, 25))
class If(SubgraphOp):
    """outputs = then_branch() if cond else else_branch(); both branches have equal shapes."""

    @dataclass(frozen=True)
    class Attrs:
        then_branch: Body
        else_branch: Body

    body_attrs = ("then_branch", "else_branch")
    adds_fwd_outputs = True

    @classmethod
    def expands_at_import(cls, node, values) -> bool:
        """With sequence or optional outputs and a computed condition, the importer inlines
        both branches and selects each element with Where (importer/sequences.py)."""
        return values.if_makes_sequences(node)

    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        values.expand_if(node, attrs, settings, where)

    def infer(self, *infos):
        operands, _ = self.split_inputs(infos)
        if len(operands) != 1:
            raise ShapeError(f"{self.debug_name}: takes one operand (cond), got {len(operands)}.")
        cond = operands[0]
        if cond is None or cond.dtype != DataType.BOOL or cond.nelms != 1:
            raise ShapeError(f"{self.debug_name}: cond must be one bool, got {cond}.")
        then_infos = self.attrs.then_branch.output_infos()
        else_infos = self.attrs.else_branch.output_infos()
        if then_infos != else_infos:
            raise ShapeError(
                f"{self.debug_name}: the branches produce different outputs: then "
                f"{[str(i) for i in then_infos]}, else {[str(i) for i in else_infos]}. Shapes on "
                f"the simulated IPU are static, so both branches must agree unless the condition "
                f"is a constant (then the If folds to one branch)."
            )
        return then_infos

    def kernel(self, cond, *captured):
        body = self.attrs.then_branch if bool(cond) else self.attrs.else_branch
        return self.result(self.run_body(body, [], list(captured)))

    def cost(self):
        return max((self.body_flops(b) for b in self.bodies()), default=(0, 0))

    def grad(self, g):
        wrt = wanted_inputs(g, self, range(1, len(self.inputs)))
        if not wrt:
            return
        seeds = _output_grads(g, self)
        ids = [self.inputs[i].id for i in wrt]
        infos = [self.inputs[i].info for i in wrt]
        bodies = {
            name: grad_body(g, self, getattr(self.attrs, name), seeds, ids, infos, f"{name}_grad")
            for name in self.body_attrs
        }
        bodies = dict(zip(bodies, g.stitch_forward(
            [(getattr(self.attrs, name), body) for name, body in bodies.items()])))
        captured = _union(b.captured for b in bodies.values())
        outs = g.op("If", g.input(0), *captured, num_outputs=len(ids), version=self.version,
                    **bodies)
        outs = [outs] if isinstance(outs, str) else outs
        for index, grad_id in zip(wrt, outs):
            g.set_input_grad(index, grad_id)


# --- Call ------------------------------------------------------------------------------------


@register_op("Call", versions=1, domain=AI_GRAPHCORE)
class Call(SubgraphOp):
    """outputs = callee(args): the callee's formal inputs take the op's operands in order."""

    @dataclass(frozen=True)
    class Attrs:
        callee: Body

    body_attrs = ("callee",)
    adds_fwd_outputs = True

    def body_input_infos(self, attr, operands):
        return list(operands)

    def infer(self, *infos):
        operands, _ = self.split_inputs(infos)
        callee = self.attrs.callee
        formal = [callee.graph.tensors[t].info for t in callee.formal]
        if list(operands) != formal:
            raise ShapeError(
                f"{self.debug_name}: arguments {[str(i) for i in operands]} do not match the "
                f"callee '{callee.graph.id}' inputs {[str(i) for i in formal]}."
            )
        return callee.output_infos()

    def kernel(self, *xs):
        n = self.attrs.callee.num_formal
        return self.result(self.run_body(self.attrs.callee, list(xs[:n]), list(xs[n:])))

    def cost(self):
        return self.body_flops(self.attrs.callee)

    def grad(self, g):
        callee = self.attrs.callee
        n = callee.num_formal
        wrt = wanted_inputs(g, self, range(len(self.inputs)))
        if not wrt:
            return
        # Inside the callee an argument is its formal input; a captured tensor keeps its id.
        local = [callee.formal[i] if i < n else self.inputs[i].id for i in wrt]
        body = grad_body(g, self, callee, _output_grads(g, self), local,
                         [self.inputs[i].info for i in wrt], "callee_grad", keep_formal=True)
        (body,) = g.stitch_forward([(callee, body)])
        # The arguments the gradient body reads (stitched: maybe not all of them).
        args = [g.input(i) for i in range(n) if callee.formal[i] in body.formal]
        outs = g.op("Call", *args, *body.captured, domain=AI_GRAPHCORE,
                    num_outputs=len(local), callee=body)
        outs = [outs] if isinstance(outs, str) else outs
        for index, grad_id in zip(wrt, outs):
            g.set_input_grad(index, grad_id)


# --- gradient bodies -------------------------------------------------------------------------


def wanted_inputs(g, op: Op, indices) -> list[int]:
    """Input positions needing a gradient, each tensor once (float only)."""
    seen, wanted = set(), []
    for i in indices:
        t = op.inputs[i]
        if t is not None and g.needs_input_grad(i) and t.info.dtype.is_float and t.id not in seen:
            seen.add(t.id)
            wanted.append(i)
    return wanted


def _output_grads(g, op: Op) -> list[str | None]:
    return [
        g.output_grad(k) if t is not None and t.info.dtype.is_float else None
        for k, t in enumerate(op.outputs)
    ]


def _union(lists) -> list[str]:
    out: list[str] = []
    for ids in lists:
        out.extend(t for t in ids if t not in out)
    return out


def _unique_graph_id(ir, base: str) -> str:
    graph_id, n = base, 0
    while graph_id in ir.graphs:
        n += 1
        graph_id = f"{base}__{n}"
    return graph_id


def clone_graph(src: Graph, graph_id: str) -> Graph:
    """A copy of ``src`` (same tensor ids and ops) as a new graph of the same Ir."""
    dst = src.ir.create_graph(_unique_graph_id(src.ir, graph_id))
    for tid in src.inputs:
        dst.add_tensor(tid, src.tensors[tid].info, TensorKind.STREAM)
        dst.inputs.append(tid)
    for op in src.topo_order():
        for t in op.inputs:
            if t is not None and t.id not in dst.tensors:
                dst.add_const(t.id, t.data)
        clone = op.clone_with()
        dst.add_op(clone, [t.id if t is not None else "" for t in op.inputs],
                   [t.id if t is not None else "" for t in op.outputs])
    for tid in src.outputs:
        if tid not in dst.tensors:
            dst.add_const(tid, src.tensors[tid].data)
    dst.outputs = list(src.outputs)
    return dst


def grad_body(g, op: Op, body: Body, seeds: list[str | None], wrt: list[str],
              wrt_infos: list[TensorInfo], name: str, keep_formal: bool = False) -> Body:
    """The backward of ``body``: outputs the gradients of its tensors ``wrt`` (zeros where no
    path leads there) given the gradients ``seeds`` of its outputs, which it captures by id.

    The forward ops are recomputed inside the gradient body, so nothing is stashed."""
    graph = clone_graph(body.graph, f"{body.graph.id}/{name}")
    seed_of: dict[str, str] = {}
    for out_id, seed in zip(body.outputs, seeds):
        if seed is None:
            continue
        if seed not in graph.tensors:
            graph.add_tensor(seed, body.graph.tensors[out_id].info, TensorKind.STREAM)
            graph.inputs.append(seed)
        if out_id in seed_of:  # one tensor returned twice: its gradients add up
            total = graph.unique_id(f"{seed}/sum")
            graph.add_op(create_op("Sum", where=op.debug_name), [seed_of[out_id], seed], [total])
            seed = total
        seed_of[out_id] = seed
    present = [w for w in wrt if w in graph.tensors]
    grads = g.differentiate(graph, seed_of, present) if seed_of else {}
    outputs = []
    for w, info in zip(wrt, wrt_infos):
        if w in grads:
            outputs.append(grads[w])
            continue
        zeros = graph.unique_id(f"{w}/zero_grad")
        graph.add_const(zeros, np.zeros(info.shape, info.dtype.numpy))
        outputs.append(zeros)
    graph.outputs = outputs
    return Body(graph, body.num_formal if keep_formal else 0)


# --- Loop ------------------------------------------------------------------------------------


@register_op("Loop", versions=(1, 11, 13, 16, 19, 21, 23, 24, 25))
class Loop(SubgraphOp):
    """for i in range(M) while cond: (cond, carried..., scan...) = body(i, cond, carried...)."""

    @dataclass(frozen=True)
    class Attrs:
        body: Body

    body_attrs = ("body",)
    fwd_outputs_blocker = ("its gradient unrolls the iterations, and the values an iteration "
                           "computes are not outputs of the Loop")

    @classmethod
    def expands_at_import(cls, node, values) -> bool:
        """A loop carrying sequences, or reading one of an enclosing graph, is unrolled at
        import: constant trip count and condition (importer/sequences.py)."""
        return values.loop_needs_unrolling(node)

    @classmethod
    def expand(cls, values, node, attrs, settings, where):
        values.unroll_loop(node, attrs, settings, where)

    def body_input_infos(self, attr, operands):
        return [_INT64_SCALAR, _BOOL_SCALAR, *operands[2:]]

    def infer(self, *infos):
        operands, _ = self.split_inputs(infos)
        if len(operands) < 2:
            raise ShapeError(f"{self.debug_name}: takes M and cond before the carried values.")
        m, cond = operands[0], operands[1]
        if m is not None and (m.dtype != DataType.INT64 or m.nelms != 1):
            raise ShapeError(f"{self.debug_name}: M must be one int64, got {m}.")
        if cond is not None and (cond.dtype != DataType.BOOL or cond.nelms != 1):
            raise ShapeError(f"{self.debug_name}: cond must be one bool, got {cond}.")
        carried = operands[2:]
        body = self.attrs.body
        outs = check_body_outputs(self, body, 1 + len(carried), "cond and the carried values")
        if outs[0].dtype != DataType.BOOL or outs[0].nelms != 1:
            raise ShapeError(
                f"{self.debug_name}: body output 0 (cond) must be one bool, got {outs[0]}."
            )
        for k, (before, after) in enumerate(zip(carried, outs[1:])):
            if before != after:
                raise ShapeError(
                    f"{self.debug_name}: carried value {k} is {before} before an iteration and "
                    f"{after} after it. Shapes on the simulated IPU are static: a carried value "
                    f"must keep its shape and type."
                )
        scans = outs[1 + len(carried):]
        self._num_carried = len(carried)
        self._trip_count = None
        if scans:
            self._trip_count = self._static_trip_count()
        return [*carried, *(TensorInfo(s.dtype, (self._trip_count, *s.shape)) for s in scans)]

    def _static_trip_count(self, need: str = "its scan outputs need") -> int:
        m = self.inputs[0]
        cond = self.inputs[1]
        why = ""
        if m is None or not m.is_const:
            why = "the trip count M is not a constant"
        elif cond is not None and not (cond.is_const and bool(np.asarray(cond.data))):
            why = "the initial condition is not the constant true"
        elif not _passes_condition_through(self.attrs.body):
            why = "the body computes its condition (the loop may stop early)"
        if why:
            raise UnsupportedOpError(
                f"{self.debug_name}: {need} a number of iterations known at "
                f"compile time, but {why}. Shapes on the simulated IPU are static: use a "
                f"constant M with a condition the body passes through unchanged, or return "
                f"the values as loop-carried values instead of scan outputs."
            )
        return max(int(np.asarray(m.data).reshape(())), 0)

    def kernel(self, m, cond, *rest):
        n = self._num_carried
        carried, captured = list(rest[:n]), list(rest[n:])
        trip = int(m.reshape(())) if m is not None else None
        go = bool(cond) if cond is not None else True
        if trip is None and cond is None:
            raise popart_exception(f"{self.debug_name}: has neither M nor cond; it never ends.")
        limit = max_loop_iterations()
        if trip is not None and trip > limit:
            raise ResourceLimitError(
                f"{self.debug_name}: its trip count M is {trip}, more than the "
                f"{limit} iterations one Loop may run. Raise {LOOP_ENV_VAR} if the model "
                f"really needs it.")
        scans: list[list[torch.Tensor]] = []
        i = 0
        while go and (trip is None or i < trip):
            if i == limit:
                raise ResourceLimitError(
                    f"{self.debug_name}: its condition still holds after {limit} iterations, "
                    f"the most one Loop may run. Raise {LOOP_ENV_VAR} if the model really "
                    f"needs more.")
            outs = self.run_body(
                self.attrs.body, [torch.tensor(i, dtype=torch.int64), torch.tensor(go), *carried],
                captured)
            go = bool(outs[0])
            carried = outs[1 : 1 + n]
            if not scans:
                scans = [[] for _ in outs[1 + n:]]
            for acc, value in zip(scans, outs[1 + n:]):
                acc.append(value)
            i += 1
        results = list(carried)
        for k, tensor in enumerate(self.outputs[n:]):
            if tensor is None:
                results.append(None)
            elif scans and scans[k]:
                results.append(torch.stack(scans[k]))
            else:
                results.append(torch.zeros(tensor.info.shape, dtype=tensor.info.dtype.torch))
        return self.result(results)

    def cost(self):
        flops, moved = self.body_flops(self.attrs.body)
        m = self.inputs[0]
        trips = int(np.asarray(m.data).reshape(())) if m is not None and m.is_const else 1
        return flops * trips, moved * trips

    def grad(self, g):
        """Unrolled backward (see ``unrolled_calls``): the forward is recomputed one iteration
        at a time, each iteration's backward is a Call of the body's gradient graph."""
        body, n = self.attrs.body, self._num_carried
        num_operands = len(self.inputs) - len(self.captured_ids())
        captured = wanted_inputs(g, self, range(num_operands, len(self.inputs)))
        carried = [k for k in range(n) if self.inputs[2 + k] is not None
                   and self.inputs[2 + k].info.dtype.is_float]
        if not captured and not any(g.needs_input_grad(2 + k) for k in carried):
            return
        trips = self._trip_count
        if trips is None:
            trips = self._static_trip_count("its gradient (which unrolls the loop) needs")
        check_unroll(self, trips)
        cond = g.const(np.array(True), "cond_true")
        iters = [g.const(np.array(i, np.int64), f"iteration{i}") for i in range(trips)]
        # Forward recompute: the carried values at the start of each iteration.
        states = [[g.input(2 + k) for k in range(n)]]
        for i in range(trips):
            outs = call(g, body, [iters[i], cond, *states[-1]], len(body.outputs))
            states.append(outs[1 : 1 + n])
        # Backward, last iteration first.
        carried_grads = {k: g.output_grad(k) for k in carried}
        scan_seeds = {k: g.output_grad(n + k) for k, t in enumerate(self.outputs[n:])
                      if t is not None and t.info.dtype.is_float}
        local = [body.formal[2 + k] for k in carried] + [self.inputs[i].id for i in captured]
        infos = [self.inputs[2 + k].info for k in carried] + [self.inputs[i].info for i in captured]
        captured_grads: list[list[str]] = [[] for _ in captured]
        for i in reversed(range(trips)):
            seeds = [None, *(carried_grads.get(k) for k in range(n))]
            for k in range(len(body.outputs) - 1 - n):
                seeds.append(g.op("Gather", scan_seeds[k], iters[i], axis=0)
                             if k in scan_seeds else None)
            grads = call(g, grad_body(g, self, body, seeds, local, infos, f"iteration{i}_grad",
                                      keep_formal=True),
                         [iters[i], cond, *states[i]], len(local))
            carried_grads = dict(zip(carried, grads[: len(carried)]))
            for acc, grad_id in zip(captured_grads, grads[len(carried):]):
                acc.append(grad_id)
        for k in carried:
            g.set_input_grad(2 + k, carried_grads[k])
        sum_grads(g, self, captured, captured_grads)


def sum_grads(g, op: Op, indices: list[int], parts: list[list[str]]) -> None:
    """Set input ``indices[k]``'s gradient to the sum of ``parts[k]`` (zeros when empty: a loop
    that ran no iteration)."""
    for index, grads in zip(indices, parts):
        info = op.inputs[index].info
        if not grads:
            grad = g.const(np.zeros(info.shape, info.dtype.numpy), "zero_grad")
        else:
            grad = grads[0] if len(grads) == 1 else g.op("Sum", *grads)
        g.set_input_grad(index, grad)


# Loop and Scan gradients unroll their iterations; beyond this many the graph gets too large.
MAX_UNROLLED_ITERATIONS = 1024


def check_unroll(op: Op, trips: int) -> None:
    if trips > MAX_UNROLLED_ITERATIONS:
        raise UnsupportedOpError(
            f"{op.debug_name}: its gradient unrolls the {trips} iterations, more than "
            f"{MAX_UNROLLED_ITERATIONS}. Split the loop, or detach its inputs "
            f"(aiGraphcore.detach) if no gradient is needed through it."
        )


def call(g, body: Body, args: list[str], num_outputs: int) -> list[str]:
    """Outputs of a Call of ``body`` on ``args`` (its formal inputs) added by grad builder ``g``;
    the body's captured tensors are read by id from the enclosing graph."""
    outs = g.op("Call", *args, *body.captured, domain=AI_GRAPHCORE, num_outputs=num_outputs,
                callee=body)
    return [outs] if isinstance(outs, str) else list(outs)


def _passes_condition_through(body: Body) -> bool:
    """True when the body's condition output is its condition input (maybe through Identity)
    or the constant true: then the loop runs exactly M iterations."""
    tensor = body.graph.tensors[body.outputs[0]]
    while tensor.producer is not None and tensor.producer.op_type == "Identity":
        tensor = tensor.producer.inputs[0]
    if tensor.is_const:
        return bool(np.asarray(tensor.data).all())
    return len(body.formal) > 1 and tensor.id == body.formal[1]
