"""IPU-specific ops usable inside ``forward``.

Each op is a ``torch.library`` custom op (eager kernel + fake kernel + autograd), so it runs on
CPU like any torch op, is kept opaque by ``torch.export``, and is translated to its
``ai.graphcore`` ONNX node through ``translation_table()`` (schemas registered at import).
"""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import onnx
import onnx.defs
import torch
from onnxscript import ir
from onnxscript import values as onnxscript_values

import popart_backend as popart

from ..blocks import AVAILABLE_MEMORY_ATTR
from ..errors import Error

__all__ = ["custom_op", "identity_loss", "nop", "set_available_memory", "ipu_print_tensor"]

GRAPHCORE = "ai.graphcore"
_REDUCTIONS = {"sum": 0, "mean": 1, "none": 2}


# --- identity_loss ------------------------------------------------------------------------------


@torch.library.custom_op("poptorch_lite::identity_loss", mutates_args=())
def _identity_loss(x: torch.Tensor, reduction: int) -> torch.Tensor:
    if reduction == 0:
        return x.sum()
    if reduction == 1:
        return x.mean()
    return x.clone()


@_identity_loss.register_fake
def _(x, reduction):
    return x.new_empty(()) if reduction in (0, 1) else torch.empty_like(x)


def _identity_loss_backward(ctx, grad):
    x_shape, reduction, numel = ctx.x_shape, ctx.reduction, ctx.numel
    if reduction == 0:
        return grad.expand(x_shape), None
    if reduction == 1:
        return (grad / numel).expand(x_shape), None
    return grad, None


def _identity_loss_setup(ctx, inputs, output):
    x, reduction = inputs
    ctx.x_shape = x.shape
    ctx.numel = x.numel()
    ctx.reduction = reduction


_identity_loss.register_autograd(_identity_loss_backward, setup_context=_identity_loss_setup)


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    """Mark ``x`` as the loss: ``"sum"`` ⇒ Σx, ``"mean"`` ⇒ mean(x), ``"none"`` ⇒ x."""
    if not isinstance(x, torch.Tensor):
        raise Error(f"identity_loss: expected a tensor, got {type(x).__name__}.")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"identity_loss: reduction must be 'sum', 'mean' or 'none', got "
                         f"{reduction!r}.")
    return _identity_loss(x, _REDUCTIONS[reduction])


# --- identity-like helpers ----------------------------------------------------------------------


def nop(tensor: torch.Tensor) -> torch.Tensor:
    """An identity the compiler never removes; on the simulated IPU a plain identity."""
    return tensor


@torch.library.custom_op("poptorch_lite::available_memory", mutates_args=())
def _available_memory(x: torch.Tensor, proportion: float) -> torch.Tensor:
    return x.clone()


@_available_memory.register_fake
def _(x, proportion):
    return torch.empty_like(x)


_available_memory.register_autograd(lambda ctx, grad: (grad, None),
                                    setup_context=lambda ctx, inputs, output: None)


def set_available_memory(tensor: torch.Tensor, available_memory_proportion: float):
    """Memory hint for the op that produced ``tensor``; numerically an identity. The matmul or
    convolution producing it (a Linear's bias add is looked through) gets the proportion,
    which bounds its planner temporaries on the simulated IPU (lower: less memory, more
    cycles). On another producer the backend logs once that it has no effect."""
    if not isinstance(tensor, torch.Tensor):
        raise Error(f"set_available_memory: expected a tensor, got {type(tensor).__name__}.")
    proportion = float(available_memory_proportion)
    if not 0.0 < proportion <= 1.0:
        raise ValueError(f"set_available_memory: the proportion must be in (0, 1], got "
                         f"{available_memory_proportion} (0 would leave the op no temporary "
                         f"memory, which PopART's setAvailableMemoryProportion refuses). Pass a "
                         f"small positive value such as 0.01 for the least memory.")
    return _available_memory(tensor, proportion)


@torch.library.custom_op("poptorch_lite::print_tensor", mutates_args=())
def _print_tensor(x: torch.Tensor, title: str, print_gradient: bool) -> torch.Tensor:
    print(title, x)
    return x.clone()


@_print_tensor.register_fake
def _(x, title, print_gradient):
    return torch.empty_like(x)


def _print_tensor_setup(ctx, inputs, output):
    ctx.title, ctx.print_gradient = inputs[1], inputs[2]


def _print_tensor_backward(ctx, grad):
    if ctx.print_gradient:
        # The title PopART gives a printed gradient, as the device prints it.
        print(f"Gradient___{ctx.title}", grad)
    return grad, None, None


_print_tensor.register_autograd(_print_tensor_backward, setup_context=_print_tensor_setup)

_PRINT_FORMAT_DEFAULTS = {"summarise_threshold": 1000, "edge_items": 3, "max_line_width": 80,
                          "digits": 4, "float_format": "auto", "separator": ", ",
                          "open_bracket": "(", "close_bracket": ")"}
_logged: set[str] = set()


def ipu_print_tensor(tensor: torch.Tensor, title: str = "", print_gradient: bool = True,
                     summarise_threshold: int = 1000, edge_items: int = 3,
                     max_line_width: int = 80, digits: int = 4, float_format: str = "auto",
                     separator: str = ", ", open_bracket: str = "(", close_bracket: str = ")"):
    """Identity that prints ``tensor`` each time it runs, and its gradient too with
    ``print_gradient``. On the IPU it is an ``ai.graphcore::PrintTensor`` node, printed
    by the simulator as ``<title>: <values>`` (the gradient as ``Gradient___<title>``); run
    eagerly on CPU it prints with torch's format. The formatting arguments are checked and
    logged once as having no effect (the simulator prints every value)."""
    if not isinstance(tensor, torch.Tensor):
        raise Error(f"ipu_print_tensor: expected a tensor, got {type(tensor).__name__}.")
    if not isinstance(title, str):
        raise Error(f"ipu_print_tensor: title must be a string, got {title!r}.")
    if float_format not in ("auto", "fixed", "scientific", "none"):
        raise ValueError(f"ipu_print_tensor: float_format must be 'auto', 'fixed', "
                         f"'scientific' or 'none', got {float_format!r}.")
    given = {"summarise_threshold": summarise_threshold, "edge_items": edge_items,
             "max_line_width": max_line_width, "digits": digits, "float_format": float_format,
             "separator": separator, "open_bracket": open_bracket,
             "close_bracket": close_bracket}
    changed = sorted(k for k, v in given.items() if v != _PRINT_FORMAT_DEFAULTS[k])
    if changed and "print_format" not in _logged:
        _logged.add("print_format")
        logging.getLogger("poptorch_lite").warning(
            "ipu_print_tensor: %s have no effect; tensors are printed with every value.",
            ", ".join(changed))
    return _print_tensor(tensor, title, bool(print_gradient))


# --- ONNX translation -----------------------------------------------------------------------------

_GC = onnxscript_values.Opset(GRAPHCORE, 1)


def _register_schemas() -> None:
    if onnx.defs.has("IdentityLoss", GRAPHCORE):
        return
    schema = onnx.defs.OpSchema(
        "IdentityLoss", GRAPHCORE, 1,
        inputs=[onnx.defs.OpSchema.FormalParameter("x", "T")],
        outputs=[onnx.defs.OpSchema.FormalParameter("y", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(double)"], "")],
        attributes=[onnx.defs.OpSchema.Attribute("reduction", onnx.defs.OpSchema.AttrType.INT,
                                                 "0 sum, 1 mean, 2 none")],
    )
    onnx.defs.register_schema(schema)
    if not onnx.defs.has("PrintTensor", GRAPHCORE):
        onnx.defs.register_schema(onnx.defs.OpSchema(
            "PrintTensor", GRAPHCORE, 1,
            inputs=[onnx.defs.OpSchema.FormalParameter("x", "T")],
            outputs=[onnx.defs.OpSchema.FormalParameter("y", "T")],
            type_constraints=[("T", _ONNX_TYPES, "")],
            attributes=[onnx.defs.OpSchema.Attribute("print_gradient", _AttrType.INT, ""),
                        onnx.defs.OpSchema.Attribute("title", _AttrType.STRING, "")]))


def _translate_print_tensor(x, title: str, print_gradient: bool):
    return _GC.PrintTensor(x, print_gradient=int(print_gradient), title=title)


def _translate_identity_loss(x, reduction: int):
    return _GC.IdentityLoss(x, reduction=reduction)


def _translate_available_memory(x, proportion: float):
    value = _GC.Nop(x)
    value.producer().attributes[_MEMORY_MARK] = ir.AttrFloat32(_MEMORY_MARK, float(proportion))
    return value


_MEMORY_MARK = "__available_memory_mark"
_MEMORY_ATTR = AVAILABLE_MEMORY_ATTR  # the op's own proportion, as the builder writes it
_MATRIX_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Gather"})


def apply_available_memory(proto: onnx.ModelProto) -> None:
    """Move each ``set_available_memory`` mark (a Nop carrying the proportion) onto the node
    producing the marked tensor as its ``__available_memory`` annotation, in the main graph
    and in the bodies of ``for_loop`` / ``cond``. A Linear exported as MatMul + Add has its
    bias Add looked through to the MatMul. The Nop is then bypassed (its readers read the
    marked tensor), so the hint adds no op and blocks no fusion; it stays only where it names
    a graph output. A mark on a tensor no op of its graph produces (a model input, a value
    from outside a body) is logged once."""
    _apply_marks(proto.graph, {i.name for i in proto.graph.initializer})


def _apply_marks(graph: onnx.GraphProto, outer_constants: set[str]) -> None:
    producers = {out: node for node in graph.node for out in node.output}
    constants = outer_constants | {i.name for i in graph.initializer} | {
        out for node in graph.node if node.op_type == "Constant" for out in node.output}
    bypassed: dict[str, str] = {}
    for node in graph.node:
        for body in _bodies(node):
            _apply_marks(body, constants)
        marks = [a for a in node.attribute if a.name == _MEMORY_MARK]
        if not marks:
            continue
        node.attribute.remove(marks[0])
        bypassed[node.output[0]] = node.input[0]
        target = producers.get(node.input[0])
        if target is not None and target.op_type == "Add":
            matrix = [producers[i] for i in target.input if i in producers
                      and producers[i].op_type in _MATRIX_OPS]
            if len(matrix) == 1 and any(i in constants for i in target.input):
                target = matrix[0]
        if target is None:
            _log_once("set_available_memory:input", (
                f"set_available_memory on '{node.input[0]}' has no effect: no op of its graph "
                f"produces it (a model input, or a value from outside a for_loop / cond body). "
                f"Mark the output of the matmul or convolution itself."))
            continue
        kept = [a for a in target.attribute if a.name != _MEMORY_ATTR]
        del target.attribute[:]
        target.attribute.extend(kept)
        target.attribute.append(onnx.helper.make_attribute(_MEMORY_ATTR, marks[0].f))
    _bypass(graph, bypassed)


def _bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The subgraphs of ``node`` (the bodies of a Loop, the branches of an If)."""
    bodies: list[onnx.GraphProto] = []
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            bodies.append(attribute.g)
        bodies.extend(attribute.graphs)
    return bodies


def _bypass(graph: onnx.GraphProto, bypassed: dict[str, str]) -> None:
    """Make the readers of each marked Nop output ``out`` read ``bypassed[out]`` (through
    chains of marks), and drop the Nops whose output is not a graph output."""
    def source(name: str) -> str:
        while name in bypassed:
            name = bypassed[name]
        return name

    def reroute(nodes) -> None:  # a body reads outer values by name: reroute it too
        for node in nodes:
            for k, name in enumerate(node.input):
                if name in bypassed:
                    node.input[k] = source(name)
            for body in _bodies(node):
                reroute(body.node)

    if not bypassed:
        return
    reroute(graph.node)
    outputs = {o.name for o in graph.output}
    keep = [n for n in graph.node
            if not (n.op_type == "Nop" and n.output and n.output[0] in bypassed
                    and n.output[0] not in outputs)]
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)


def _log_once(key: str, message: str) -> None:
    if key not in _logged:
        _logged.add(key)
        logging.getLogger("poptorch_lite").warning(message)




# --- custom_op ----------------------------------------------------------------------------
#
# One torch.library op per (domain, name, version, output count), defined on first use: its
# fake kernel returns tensors shaped like ``example_outputs``, its eager kernel (a model run on
# CPU) and autograd call the op registered in popart_backend.custom, and its ONNX translation
# emits the node ``domain::name`` with the attributes, under an ONNX schema registered for it.

_ONNX_TYPES = ["tensor(float)", "tensor(float16)", "tensor(double)", "tensor(bfloat16)",
               "tensor(int8)", "tensor(int16)", "tensor(int32)", "tensor(int64)",
               "tensor(uint8)", "tensor(bool)"]
_AttrType = onnx.defs.OpSchema.AttrType
_CUSTOM_TORCH_OPS: dict[tuple, object] = {}  # key -> torch custom op
_CUSTOM_TRANSLATIONS: dict = {}  # torch op overload -> ONNX translation


def _attribute_type(key: str, value):
    """ONNX attribute type of a custom_op attribute value; ValueError for anything else."""
    if not isinstance(key, str) or not key.isidentifier() or not key.isascii():
        raise ValueError(f"custom_op: attribute names must be ASCII identifiers, got {key!r}.")
    if isinstance(value, str) and not value.isascii():
        raise ValueError(f"custom_op: attribute '{key}' = {value!r} is not ASCII.")
    if isinstance(value, bool) or isinstance(value, int):
        return _AttrType.INT
    if isinstance(value, float):
        return _AttrType.FLOAT
    if isinstance(value, str):
        return _AttrType.STRING
    if isinstance(value, (list, tuple)) and value:
        kinds = {_attribute_type(key, v) for v in value}
        if len(kinds) == 1:
            return {_AttrType.INT: _AttrType.INTS, _AttrType.FLOAT: _AttrType.FLOATS,
                    _AttrType.STRING: _AttrType.STRINGS}[kinds.pop()]
        raise ValueError(f"custom_op: attribute '{key}' = {value!r} mixes types; lists must be "
                         f"all int, all float or all str.")
    raise ValueError(f"custom_op: attribute '{key}' = {value!r} ({type(value).__name__}) must "
                     f"be a float, int, str or a non-empty homogeneous list of them.")


def _register_custom_schema(domain: str, name: str, version: int, num_outputs: int,
                            attr_types: dict) -> None:
    """An ONNX schema for ``domain::name`` (exporters need one to emit the node)."""
    if onnx.defs.has(name, version, domain):
        existing = onnx.defs.get_schema(name, version, domain)
        same = (len(existing.outputs) == num_outputs
                and {a: existing.attributes[a].type for a in existing.attributes} == attr_types)
        if same:
            return
        onnx.defs.deregister_schema(name, version, domain)
    formal = onnx.defs.OpSchema.FormalParameter
    schema = onnx.defs.OpSchema(
        name, domain, version,
        inputs=[formal("inputs", "T", param_option=onnx.defs.OpSchema.FormalParameterOption
                       .Variadic, is_homogeneous=False)],
        outputs=[formal(f"output{i}", f"T{i}") for i in range(num_outputs)],
        type_constraints=[("T", _ONNX_TYPES, "")]
        + [(f"T{i}", _ONNX_TYPES, "") for i in range(num_outputs)],
        attributes=[onnx.defs.OpSchema.Attribute(k, t, "") for k, t in attr_types.items()],
    )
    onnx.defs.register_schema(schema)


def _custom_torch_op(domain: str, name: str, version: int, num_outputs: int):
    key = (domain, name, version, num_outputs)
    if key in _CUSTOM_TORCH_OPS:
        return _CUSTOM_TORCH_OPS[key]
    mangled = re.sub(r"\W", "_", f"custom__{domain}__{name}__v{version}__n{num_outputs}")
    returns = "Tensor" if num_outputs == 1 else f"({', '.join(['Tensor'] * num_outputs)})"
    schema = f"(Tensor[] inputs, str attributes, str outputs) -> {returns}"

    def as_result(tensors):
        return tensors[0] if num_outputs == 1 else tuple(tensors)

    def eager(inputs, attributes, outputs):
        arrays = [x.detach().cpu().numpy() for x in inputs]
        try:
            results = popart.custom.run_forward(domain, name, version, json.loads(attributes),
                                                arrays)
        except Exception as exc:
            raise Error(f"custom_op '{domain}::{name}' (version {version}) cannot run on the "
                        f"CPU: {exc}") from exc
        return as_result([torch.from_numpy(np.array(r)) for r in results[:num_outputs]])

    def fake(inputs, attributes, outputs):
        specs = json.loads(outputs)
        device = inputs[0].device if inputs else None
        return as_result([torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                          for shape, dtype in specs])

    op = torch.library.custom_op(f"poptorch_lite::{mangled}", eager, mutates_args=(),
                                 schema=schema)
    op.register_fake(fake)

    def setup_context(ctx, inputs, output):
        xs, attributes, _ = inputs
        outs = [output] if num_outputs == 1 else list(output)
        ctx.save_for_backward(*xs, *outs)
        ctx.num_inputs, ctx.attributes = len(xs), attributes

    def backward(ctx, *grads):
        saved = [t.detach().numpy() for t in ctx.saved_tensors]
        xs, outs = saved[:ctx.num_inputs], saved[ctx.num_inputs:]
        dys = [g.detach().numpy() if g is not None else np.zeros_like(o)
               for g, o in zip(grads, outs)]
        dxs = popart.custom.run_backward(domain, name, version, json.loads(ctx.attributes),
                                         xs, outs, dys)
        return [None if d is None else torch.from_numpy(np.array(d)) for d in dxs], None, None

    op.register_autograd(backward, setup_context=setup_context)
    opset = onnxscript_values.Opset(domain, version)

    def translate(inputs, attributes, outputs):
        return getattr(opset, name)(*inputs, **json.loads(attributes))

    _CUSTOM_TORCH_OPS[key] = op
    _CUSTOM_TRANSLATIONS[op._opoverload] = translate
    return op


def custom_op(inputs, name: str, domain: str, domain_version: int, example_outputs,
              attributes: dict | None = None) -> list[torch.Tensor]:
    """Call the backend custom op ``domain::name`` (popart_backend.custom).

    Returns a list of tensors shaped like ``example_outputs``. The op is traced into the ONNX
    graph as a ``domain::name`` node carrying ``attributes`` (float, int, str or homogeneous
    lists, ASCII) and runs with the registered backend op; an unregistered op is reported when
    the model compiles. Run eagerly on CPU, it calls the registered op's numpy compute (and
    its grad ops for autograd).
    """
    inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    if not inputs or not all(isinstance(x, torch.Tensor) for x in inputs):
        raise Error(f"custom_op '{name}': inputs must be a non-empty list of tensors.")
    outputs = (list(example_outputs) if isinstance(example_outputs, (list, tuple))
               else [example_outputs])
    if not outputs or not all(isinstance(x, torch.Tensor) for x in outputs):
        raise Error(f"custom_op '{name}': example_outputs must be a non-empty list of tensors.")
    if not isinstance(name, str) or not name.isidentifier() or not isinstance(domain, str):
        raise ValueError(f"custom_op: name must be an identifier and domain a string, got "
                         f"{name!r}, {domain!r}.")
    attributes = dict(attributes or {})
    attr_types = {key: _attribute_type(key, value) for key, value in attributes.items()}
    values = {k: list(v) if isinstance(v, tuple) else v for k, v in attributes.items()}
    version = int(domain_version)
    _register_custom_schema(domain, name, version, len(outputs), attr_types)
    op = _custom_torch_op(domain, name, version, len(outputs))
    specs = json.dumps([[list(t.shape), str(t.dtype).removeprefix("torch.")] for t in outputs])
    result = op(inputs, json.dumps(values, sort_keys=True), specs)
    return [result] if len(outputs) == 1 else list(result)


_register_schemas()


def translation_table() -> dict:
    """``custom_translation_table`` entries for ``torch.onnx.export``."""
    table = {torch.ops.poptorch_lite.identity_loss.default: _translate_identity_loss,
             torch.ops.poptorch_lite.print_tensor.default: _translate_print_tensor,
             torch.ops.poptorch_lite.available_memory.default: _translate_available_memory}
    table.update(_CUSTOM_TRANSLATIONS)
    return table
