"""Rewrites of the captured program before its ONNX export.

- plain tensor attributes keep their host values through the trace, and their in-place
  updates become out-of-place ops (PopTorch compiles them as constants);
- non-tensor outputs are taken out of the graph and returned as the constants they are;
- the ``_torchdynamo_disable*`` markers of higher-order ops are dropped.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind
from torch.utils import _pytree as pytree

from .errors import Error, location_from_stack_trace

__all__ = ["drop_dynamo_markers", "freeze_constant_updates", "kept_tensor_attributes",
           "strip_constant_outputs"]

_log = logging.getLogger("poptorch_lite")


@contextlib.contextmanager
def kept_tensor_attributes(model: torch.nn.Module):
    """Plain tensor attributes (neither parameters nor buffers) keep their values through the
    trace: torch.export runs forward on them, and they are constants of the compiled model."""
    saved = []
    for module in model.modules():
        registered = set(module._parameters) | set(module._buffers)
        saved.extend((value, value.detach().clone()) for key, value in vars(module).items()
                     if isinstance(value, torch.Tensor) and key not in registered)
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, value in saved:
                if not torch.equal(tensor, value):
                    tensor.copy_(value)


def freeze_constant_updates(ep, excludes) -> None:
    """In-place updates of a plain tensor attribute (not a registered buffer) become
    out-of-place ops, as PopTorch compiles them: the attribute is a constant of the compiled
    model, so each call sees the value forward computes from it, and nothing persists (the
    documented counter example returns 1 on every call). Logged once per attribute."""
    constants = {spec.arg.name: spec.target for spec in ep.graph_signature.input_specs
                 if spec.kind is InputKind.CONSTANT_TENSOR}
    changed = False
    for node in ep.graph.nodes:
        target = node.target
        if (node.op != "call_function" or not isinstance(target, torch._ops.OpOverload)
                or not node.args or getattr(node.args[0], "name", None) not in constants):
            continue
        schema = target._schema
        if not (schema.arguments and schema.arguments[0].alias_info is not None
                and schema.arguments[0].alias_info.is_write):
            continue
        packet = getattr(torch.ops.aten, schema.name.split("::")[-1].rstrip("_"), None)
        functional = getattr(packet, target._overloadname, None) if packet else None
        name = constants[node.args[0].name]
        location = location_from_stack_trace(node.meta.get("stack_trace") or "", excludes)
        if functional is None:
            raise Error(f"forward updates the tensor attribute '{name}' in place with "
                        f"{target}, which has no out-of-place form; register '{name}' as a "
                        f"buffer (module.register_buffer) to update it on the device.",
                        type="input_mutation", location=location)
        node.target = functional
        changed = True
        if name not in _FROZEN_LOGGED:
            _FROZEN_LOGGED.add(name)
            _log.warning("forward updates the tensor attribute '%s' in place (%s), but it is "
                         "not a registered buffer: the compiled model treats it as a constant, "
                         "so every call starts from its value at compile time and the update "
                         "does not persist. Register it with register_buffer to keep updates.",
                         name, location or "forward")
    if changed:
        ep.graph_module.recompile()


_FROZEN_LOGGED: set[str] = set()


def drop_dynamo_markers(ep) -> None:
    """Remove the ``_torchdynamo_disable*`` keys that torch's higher-order ops (``while_loop``
    behind ``for_loop``) leave in the nodes' custom metadata: with the metadata preserved,
    torch's decomposition pass finds them on placeholders with two different values and fails.
    They only mark dynamo-disabled regions, which nothing after export reads."""
    for module in ep.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in (graph.nodes if graph is not None else ()):
            custom = node.meta.get("custom")
            if custom and any(k.startswith("_torchdynamo_disable") for k in custom):
                node.meta["custom"] = {k: v for k, v in custom.items()
                                       if not k.startswith("_torchdynamo_disable")}


def strip_constant_outputs(ep) -> tuple[list, Any]:
    """Take forward's non-tensor outputs (ints, strings, None ...) out of ``ep``'s graph, which
    the ONNX exporter cannot translate. Returns forward's output spec (as traced) and one entry
    per user output in order: its graph name, or a ``ConstantArgument`` holding the value."""
    out_spec = ep.call_spec.out_spec
    specs = ep.graph_signature.output_specs
    user = [spec.arg.name if not isinstance(spec.arg, ConstantArgument) else spec.arg
            for spec in specs if spec.kind is OutputKind.USER_OUTPUT]
    keep = [i for i, spec in enumerate(specs) if not (
        spec.kind is OutputKind.USER_OUTPUT and isinstance(spec.arg, ConstantArgument))]
    if len(keep) == len(specs):
        return out_spec, user
    output = next(node for node in ep.graph.nodes if node.op == "output")
    values = output.args[0]
    output.args = (tuple(values[i] for i in keep),)
    kept_user = sum(1 for i in keep if specs[i].kind is OutputKind.USER_OUTPUT)
    ep.graph_signature.output_specs[:] = [specs[i] for i in keep]
    ep.module_call_graph[0].signature.out_spec = pytree.tree_flatten(
        tuple(range(kept_user)))[1]
    ep.graph_module.recompile()
    return out_spec, user
