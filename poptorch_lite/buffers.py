"""Registered buffers that ``forward`` updates in place, as device state.

torch.export records an in-place buffer update (``+=``, ``copy_``, ``add_`` ...) as a
BUFFER_MUTATION output; the dynamo exporter translates its new value but drops it from the
graph. While exporting, ``capture_mutations`` keeps those values as extra graph outputs, and
``add_buffer_updates`` turns each into ``ai.graphcore::CopyVarUpdate(buffer, value)``, so the
backend holds the buffer as a variable and writes it every time the graph runs (per
micro-batch). BatchNorm's statistics are left to the backend's training form of
BatchNormalization. A buffer that ``forward`` assigns (``self.b = t``) or registers is refused:
torch.export cannot capture it, so it would be lost.

Parameters updated in place (PARAMETER_MUTATION) take the same path: device state in an
inference wrapper; a training wrapper refuses them at compile (executor/compilation.py). An
input of ``forward`` updated in place (USER_INPUT_MUTATION) gets a graph output of its own
(``add_input_updates``) that the wrapper writes back into the caller's tensor after each run.
Updates through ``.data`` escape torch.export and are refused (``refuse_data_updates``).
"""

from __future__ import annotations

import contextlib
import dataclasses

import onnx
import torch
from onnx import helper, numpy_helper
from torch.export.graph_signature import OutputKind

from .errors import Error, location_from_stack_trace
from .translations import GRAPHCORE

__all__ = ["Mutations", "add_buffer_updates", "add_input_updates", "batch_norm_statistics",
           "capture_mutations", "check_assignments", "mutation_locations",
           "refuse_data_updates"]


@dataclasses.dataclass
class Mutations:
    """Buffer updates seen while exporting: the exporter's buffer-mutation values kept as extra
    graph outputs (``values``: (ONNX value, buffer FQN)), and buffers that ``forward``
    assigned or registered instead of updating in place (``assigned``: FQNs)."""

    skip: frozenset[str]  # buffers the backend updates itself (BatchNorm statistics)
    modules: dict[int, str]  # id of each module of the traced model -> its path
    translated: bool = False
    user_outputs: int = 0
    values: list = dataclasses.field(default_factory=list)
    unresolved: list[str] = dataclasses.field(default_factory=list)
    assigned: list[str] = dataclasses.field(default_factory=list)
    # In-place updates of forward's tensor inputs: (ONNX value, user-input placeholder name)
    inputs: list = dataclasses.field(default_factory=list)
    parameters: set[str] = dataclasses.field(default_factory=set)  # updated parameter FQNs

    @classmethod
    def of(cls, model: torch.nn.Module) -> Mutations:
        return cls(skip=batch_norm_statistics(model),
                   modules={id(m): p for p, m in model.named_modules()})


@contextlib.contextmanager
def capture_mutations(mutations: Mutations):
    """Keep each in-place buffer update (``torch.export``'s BUFFER_MUTATION outputs) in the
    ONNX model, and note buffers ``forward`` assigns or registers.

    The dynamo exporter translates a mutation's new value but does not make it a graph output,
    so the value is pruned. Here the translation step appends those values to the graph
    outputs; ``add_buffer_updates`` then turns them into ``CopyVarUpdate`` nodes. ``forward``
    reassigning a buffer (``self.b = t``) goes through ``register_buffer``, which torch.export
    does not capture: the global registration hook records it so the trace can refuse it.
    """
    def on_register(module, name, tensor):
        # ``self.b += 1`` assigns the buffer its own (updated) tensor: that is in place.
        # torch.export registers buffers on modules of its own: those are not the user's.
        path = mutations.modules.get(id(module))
        if path is not None and module._buffers.get(name) is not tensor:
            mutations.assigned.append(f"{path}.{name}" if path else name)

    handle = torch.nn.modules.module.register_module_buffer_registration_hook(on_register)
    try:
        from torch.onnx._internal.exporter import _core
    except ImportError:
        _core = None
    original = getattr(_core, "_exported_program_to_onnx_program", None)

    def translate(exported_program, **kwargs):
        program = original(exported_program, **kwargs)
        mutations.translated = True
        _keep_mutation_values(exported_program, program.model.graph, mutations)
        return program

    if original is not None:
        _core._exported_program_to_onnx_program = translate
    try:
        yield
    finally:
        handle.remove()
        if original is not None:
            _core._exported_program_to_onnx_program = original


def _keep_mutation_values(exported_program, graph, mutations: Mutations) -> None:
    """Append the translated value of each buffer mutation to ``graph``'s outputs."""
    by_name = {}
    for node in graph:
        for value in node.outputs:
            by_name[value.name] = value
    for value in list(graph.inputs) + list(graph.initializers.values()):
        by_name[value.name] = value
        original_name = value.metadata_props.get("pkg.torch.onnx.original_node_name")
        if original_name:
            by_name[original_name] = value
    mutations.user_outputs = len(graph.outputs)
    outputs = set(map(id, graph.outputs))
    for spec in exported_program.graph_signature.output_specs:
        if spec.kind not in _STATE_MUTATIONS or spec.target in mutations.skip:
            continue
        value = by_name.get(spec.arg.name)
        if value is None:
            mutations.unresolved.append(spec.target)
            continue
        if spec.kind is OutputKind.USER_INPUT_MUTATION:
            mutations.inputs.append((value, spec.target))
        else:
            if spec.kind is OutputKind.PARAMETER_MUTATION:
                mutations.parameters.add(spec.target)
            mutations.values.append((value, spec.target))
        if id(value) not in outputs:
            graph.outputs.append(value)
            outputs.add(id(value))


_STATE_MUTATIONS = (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION,
                    OutputKind.USER_INPUT_MUTATION)


def batch_norm_statistics(model: torch.nn.Module) -> frozenset[str]:
    """The buffers of BatchNorm modules: a TrainingSession updates the running statistics
    itself (``num_batches_tracked`` is counted on the host), so their mutations are not copied."""
    names = set()
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            prefix = f"{path}." if path else ""
            names.update(prefix + n for n in ("running_mean", "running_var",
                                               "num_batches_tracked"))
    return frozenset(names)


def check_assignments(mutations: Mutations) -> None:
    """Refuse buffers that ``forward`` assigned or registered: the device would not see them."""
    if not mutations.assigned:
        return
    fqn = mutations.assigned[0]
    path, _, name = fqn.rpartition(".")
    owner = f"self.{path}" if path else "self"
    raise Error(
        f"forward assigns or registers the buffer '{fqn}' ({owner}.{name} = ...). The IPU "
        f"keeps buffers as device state that only in-place updates change, so the new tensor "
        f"would be lost after the call. Update it in place instead "
        f"({owner}.{name}.copy_(value), +=, add_(), ...), and register buffers in __init__.",
        type="buffer_assignment")


def add_buffer_updates(proto: onnx.ModelProto, decomposed, mutations: Mutations,
                    param_map: dict[str, str], model: torch.nn.Module,
                    state_names: dict[str, str]) -> tuple[str, ...]:
    """Turn the kept buffer-mutation outputs into ``ai.graphcore::CopyVarUpdate(buffer, value)``
    nodes, so the backend writes each buffer in place every time the graph runs; returns the
    updated buffer FQNs (adding an initializer, and its ``param_map`` entry, for a buffer the
    graph never read). Raises Error when a mutation could not be kept."""
    buffers = dict(model.named_buffers(remove_duplicate=False))
    buffers.update(model.named_parameters(remove_duplicate=False))
    sig = decomposed.graph_signature
    wanted = [target for target in (*sig.buffers_to_mutate.values(),
                                    *getattr(sig, "parameters_to_mutate", {}).values(),
                                    *sig.user_inputs_to_mutate.values())
              if target not in mutations.skip]
    if wanted and not mutations.translated:
        raise Error(
            f"forward updates {', '.join(repr(t) for t in wanted)} in place, but "
            f"this torch version's ONNX exporter (torch {torch.__version__}) does not expose "
            f"the updated values, so they cannot be kept on the device.",
            type="buffer_mutation")
    if mutations.unresolved:
        raise Error(
            f"forward updates {', '.join(repr(t) for t in mutations.unresolved)} "
            f"in place, but the exported ONNX graph has no value for the new contents; such an "
            f"update cannot be kept on the device.", type="buffer_mutation")
    graph = proto.graph
    # Drop the kept values from the outputs; an input's new value stays (add_input_updates).
    inputs = {value.name for value, _ in mutations.inputs}
    tail = [o for o in graph.output[mutations.user_outputs:] if o.name in inputs]
    del graph.output[mutations.user_outputs:]
    graph.output.extend(tail)
    initializers = {i.name for i in graph.initializer}
    updated = []
    for value, target in mutations.values:
        if value.name == target:
            continue  # the buffer copied onto itself
        if target not in initializers:
            # Never read before the update: the exporter dropped its initializer.
            buffer = buffers.get(target)
            if buffer is None:
                raise Error(f"forward updates '{target}' in place, but the model has no "
                            f"parameter or buffer of that name.", type="buffer_mutation")
            graph.initializer.append(numpy_helper.from_array(
                buffer.detach().cpu().numpy(), name=target))
            initializers.add(target)
            param_map[target] = state_names.get(target, target)
        graph.node.append(helper.make_node(
            "CopyVarUpdate", [target, value.name], [f"{target}__updated"],
            name=f"{target}/CopyVarUpdate", domain=GRAPHCORE))
        updated.append(param_map.get(target, target))
    if updated and not any(o.domain == GRAPHCORE for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(GRAPHCORE, 1))
    return tuple(updated)


def add_input_updates(proto: onnx.ModelProto, mutations: Mutations) -> list[tuple[str, str]]:
    """Give each in-place update of a tensor input of ``forward`` its own graph output, an
    ``Identity`` of the new value named ``<input>__updated``; the wrapper reads it back into
    the caller's tensor after each run, as eager torch would have changed it. Returns
    (user-input placeholder name, output name) pairs. Call after ``add_buffer_updates``."""
    graph = proto.graph
    infos = {o.name: o for o in graph.output}
    inputs = {i.name for i in graph.input}
    del graph.output[mutations.user_outputs:]  # the kept values (each gets its own below)
    updates = []
    for value, placeholder in mutations.inputs:
        if value.name == placeholder and placeholder in inputs:
            continue  # the input copied onto itself
        info = infos.get(value.name)
        if info is None:
            raise Error(f"forward updates its input '{placeholder}' in place, but the exported "
                        f"ONNX graph has no value for the new contents.", type="input_mutation")
        output = f"{placeholder}__updated"
        graph.node.append(helper.make_node("Identity", [value.name], [output],
                                           name=f"{placeholder}/InputUpdate"))
        updated = onnx.ValueInfoProto()
        updated.CopyFrom(info)
        updated.name = output
        graph.output.append(updated)
        updates.append((placeholder, output))
    return updates


def mutation_locations(exported, decomposed, excludes: tuple[str, ...] = ()) -> dict[str, str]:
    """The user's ``file:line`` of the in-place update behind each mutated input, parameter
    or buffer (by signature target), for error messages; "" when torch kept no trace."""
    nodes = {n.name: n for n in decomposed.graph.nodes}
    found = {}
    for spec in decomposed.graph_signature.output_specs:
        if spec.kind not in _STATE_MUTATIONS:
            continue
        node = nodes.get(spec.arg.name)
        location = _user_location(node, excludes) if node is not None else ""
        found[spec.target] = location or _inplace_location(exported, spec.target, excludes)
    return found


def _inplace_location(exported, target: str, excludes) -> str:
    """Location of the first mutating op (or no_grad region) of ``exported``'s graph that takes
    ``target``'s placeholder: the decomposed graph loses it for updates under no_grad."""
    placeholder = next((s.arg.name for s in exported.graph_signature.input_specs
                        if s.target == target or getattr(s.arg, "name", None) == target), None)
    for node in exported.graph.nodes:
        if node.op != "call_function" or placeholder not in {
                n.name for n in node.all_input_nodes}:
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is not None and not schema.is_mutable:
            continue
        for candidate in (node, *node.users):
            location = _user_location(candidate, excludes)
            if location:
                return location
    return ""


def _user_location(node, excludes) -> str:
    """``node``'s user ``file:line``; "" for code torch generated (``<eval_with_key>.3``)."""
    location = location_from_stack_trace(node.meta.get("stack_trace") or "", excludes)
    return "" if location.startswith("<") else location


def refuse_data_updates(exc: Exception) -> None:
    """Explain torch.export's failure on an update through ``.data`` (``self.w.data.mul_(2)``,
    ``x.data.add_(1)``): the update bypasses tracing, so it cannot be compiled."""
    if "fake tensor in the exported program constant" not in str(exc):
        return
    raise Error(
        "forward changes a tensor through `.data` (e.g. `self.w.data.mul_(0.5)` or "
        "`x.data.add_(1)`), or keeps a tensor made during the call: torch.export cannot trace "
        "updates through `.data`, so the device would never see them. Update the tensor itself "
        "in place instead (`with torch.no_grad(): self.w.mul_(0.5)`, `x.add_(1)`), or move the "
        f"update out of forward. (torch.export: {str(exc).splitlines()[0]})",
        type="trace_error") from exc
