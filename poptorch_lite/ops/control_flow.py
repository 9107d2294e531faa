"""On-device control flow inside ``forward``: ``for_loop`` and ``cond`` (P62).

Run eagerly on CPU both are plain Python (a loop, an ``if``), so autograd and the reference
numbers are torch's own. While the frontend traces for the IPU they become torch higher-order
ops that ``torch.export`` keeps as subgraphs and the ONNX exporter writes as ``Loop`` / ``If``
nodes; the backend runs and differentiates those (parameters the bodies use are outer-scope
values of the subgraphs, so they train).
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from torch._higher_order_ops.while_loop import while_loop

from ..blocks import isRunningOnIpu
from ..errors import Error

__all__ = ["cond", "for_loop"]  # fix_trip_counts is for tracing.py


def _tensor_list(what: str, values) -> list[torch.Tensor]:
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    for i, value in enumerate(values):
        if not isinstance(value, torch.Tensor):
            raise Error(f"{what}: element {i} is a {type(value).__name__}; only tensors can be "
                        f"passed in or returned.")
    return values


def _describe(tensors) -> str:
    return ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in tensors)


def _check_same(what: str, expected: list[torch.Tensor], got: list[torch.Tensor],
                expected_name: str, got_name: str) -> None:
    same = len(expected) == len(got) and all(
        a.shape == b.shape and a.dtype == b.dtype for a, b in zip(expected, got))
    if not same:
        raise Error(f"{what}: the {got_name} ({_describe(got)}) must match the {expected_name} "
                    f"({_describe(expected)}) in number, shape and dtype.")


def _tracing() -> bool:
    return isRunningOnIpu() or torch.compiler.is_exporting()


def for_loop(count: int, body, inputs) -> list[torch.Tensor]:
    """Run ``body(*inputs)`` ``count`` times, each iteration's outputs being the next one's
    inputs; returns the last outputs as a list (PopTorch's ``poptorch.for_loop``).

    ``body`` must return as many tensors as it takes, with the same shapes and dtypes (checked
    on the first iteration, also when tracing). On the IPU the loop is one ONNX ``Loop`` node
    (not unrolled); tensors ``body`` reads from the enclosing scope (parameters included) are
    loop-invariant inputs of the body. Raises ``Error`` for a non-int or negative count, a
    non-callable body or non-tensor inputs/outputs.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise Error(f"for_loop: count must be a non-negative Python int, got {count!r}. The trip "
                    f"count is fixed when the model compiles.")
    if not callable(body):
        raise Error(f"for_loop: body must be callable, got {type(body).__name__}.")
    inputs = _tensor_list("for_loop inputs", inputs)
    if not inputs:
        raise Error("for_loop: inputs must hold at least one tensor.")

    def step(values):
        outputs = _tensor_list("for_loop body output", body(*values))
        _check_same("for_loop", list(values), outputs, "loop inputs", "body outputs")
        return outputs

    if not _tracing():
        values = inputs
        for _ in range(count):
            values = step(values)
        return values
    if count == 0:
        return [x.clone() for x in inputs]
    # Checked once outside the loop (dynamo traces the loop body and cannot trace the check);
    # the values of this trial call are unused and leave the exported graph.
    step(inputs)

    def condition(counter, *values):
        return counter < count

    def loop_body(counter, *values):
        outputs = body(*values)
        outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        # A Loop body output may not alias its inputs (torch's rule): copy pass-throughs.
        return (counter + 1, *[o.clone() if any(o is v for v in values) else o
                               for o in outputs])

    start = torch.zeros((), dtype=torch.int64)
    results = while_loop(condition, loop_body, (start, *inputs))
    return list(results[1:])


def cond(condition, then_body, then_inputs, else_body, else_inputs) -> list[torch.Tensor]:
    """``then_body(*then_inputs)`` if ``condition`` is true, else ``else_body(*else_inputs)``;
    returns the branch's outputs as a list (PopTorch's ``poptorch.cond``).

    ``condition`` is a one-element tensor (bool or number, non-zero is true). Both branches
    must return the same number of tensors with the same shapes and dtypes. On the IPU both
    branches are traced into one ONNX ``If`` node; run on CPU only the taken branch runs.
    """
    if not isinstance(condition, torch.Tensor) or condition.numel() != 1:
        raise Error(f"cond: condition must be a one-element tensor, got "
                    f"{type(condition).__name__}"
                    + (f" of shape {list(condition.shape)}" if isinstance(condition, torch.Tensor)
                       else "") + ".")
    for name, body in (("then_body", then_body), ("else_body", else_body)):
        if not callable(body):
            raise Error(f"cond: {name} must be callable, got {type(body).__name__}.")
    then_inputs = _tensor_list("cond then_inputs", then_inputs)
    else_inputs = _tensor_list("cond else_inputs", else_inputs)
    predicate = condition.reshape(()) != 0 if condition.dtype != torch.bool \
        else condition.reshape(())
    if not _tracing():
        if bool(predicate):
            return _tensor_list("cond then_body output", then_body(*then_inputs))
        return _tensor_list("cond else_body output", else_body(*else_inputs))

    # Both branches are checked outside torch.cond (dynamo traces the branches and cannot
    # trace the check); the values of these trial calls are unused and leave the graph.
    then_outputs = _tensor_list("cond then_body output", then_body(*then_inputs))
    else_outputs = _tensor_list("cond else_body output", else_body(*else_inputs))
    _check_same("cond", then_outputs, else_outputs, "then_body outputs", "else_body outputs")
    split = len(then_inputs)

    def as_outputs(result, operands):
        result = list(result) if isinstance(result, (list, tuple)) else [result]
        return [o.clone() if any(o is v for v in operands) else o for o in result]

    def then_branch(*operands):
        return as_outputs(then_body(*operands[:split]), operands)

    def else_branch(*operands):
        return as_outputs(else_body(*operands[split:]), operands)

    try:
        results = torch.cond(predicate, then_branch, else_branch, (*then_inputs, *else_inputs))
    except Error:
        raise
    except Exception as exc:  # torch's own checks of the branches, reworded for the user
        raise Error(f"cond: the two branches could not be traced into one If: "
                    f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}. The branches "
                    f"must be pure torch code returning tensors of the same number, shapes "
                    f"and dtypes.") from exc
    return list(results)


def fix_trip_counts(graph: onnx.GraphProto) -> None:
    """Give the ``Loop`` nodes of ``for_loop`` their constant trip count (and subgraphs too).

    torch exports ``for_loop``'s ``while_loop`` as a Loop without a trip count whose body ends
    with ``cond_out = Less(counter + 1, count)``. The backend needs the trip count as a constant
    (its gradient unrolls the loop): the body's condition becomes a pass-through of its
    condition input, and the Loop gets ``M = count`` and ``cond = true``. Loops of another
    form are left as they are.
    """
    nodes = list(graph.node)
    for node in nodes:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                fix_trip_counts(attribute.g)
            for sub in attribute.graphs:
                fix_trip_counts(sub)
        if node.op_type != "Loop" or node.domain not in ("", "ai.onnx") or (
                node.input and node.input[0]):
            continue
        body = next(a.g for a in node.attribute if a.name == "body")
        count = _loop_count(body)
        producers = {out: n for n in graph.node for out in n.output}
        if count is None or len(node.input) < 3 or _constant(producers, node.input[2]) != 0:
            continue
        less = next(n for n in body.node if body.output[0].name in n.output)
        less.op_type, less.domain = "Identity", ""
        del less.input[:]
        less.input.append(body.input[1].name)
        del less.attribute[:]
        constants = [helper.make_node("Constant", [], [f"{node.name}/trip_count"],
                                      name=f"{node.name}/trip_count",
                                      value=numpy_helper.from_array(np.array(count, np.int64))),
                     helper.make_node("Constant", [], [f"{node.name}/always"],
                                      name=f"{node.name}/always",
                                      value=numpy_helper.from_array(np.array(True)))]
        node.input[0] = constants[0].output[0]
        node.input[1] = constants[1].output[0]
        position = list(graph.node).index(node)
        for offset, constant in enumerate(constants):
            graph.node.insert(position + offset, constant)


def _constant(producers: dict, name: str) -> int | None:
    """The integer value of ``name`` if a Constant (possibly through Expand/Cast) makes it."""
    node = producers.get(name)
    while node is not None and node.op_type in ("Expand", "Cast", "Identity"):
        node = producers.get(node.input[0])
    if node is None or node.op_type != "Constant":
        return None
    value = next((a for a in node.attribute if a.name == "value"), None)
    if value is None:
        return None
    array = numpy_helper.to_array(value.t)
    return int(array.reshape(())) if array.size == 1 and array.dtype.kind in "iu" else None


def _loop_count(body: onnx.GraphProto) -> int | None:
    """``count`` when the body's condition output is ``Less(counter + 1, Constant(count))``
    with ``counter`` its first carried value (the form ``for_loop`` writes)."""
    if len(body.input) < 3:
        return None
    producers = {out: n for n in body.node for out in n.output}
    cond = producers.get(body.output[0].name)
    if cond is None or cond.op_type != "Less":
        return None
    step = producers.get(cond.input[0])
    if step is None or step.op_type != "Add" or step.input[0] != body.input[2].name \
            or _constant(producers, step.input[1]) != 1:
        return None
    return _constant(producers, cond.input[1])
