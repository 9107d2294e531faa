"""Capture a ``torch.nn.Module`` as an annotated ONNX model.

Pipeline: ``torch.export.export(strict=False)`` -> ``torch.onnx.export(ep, dynamo=True,
optimize=False, opset_version=18)`` (the legacy TorchScript exporter only on request) -> lite
passes:

(a) map ONNX initializers to ``named_parameters()`` / ``named_buffers()`` names (``param_map``);
(b) write ``__source`` (the user's ``file:line``), ``__ipu_number`` / ``__pipeline_stage``
    (from blocks) node annotations and module-path node names;
(c) check every node's op against the backend and report *all* unsupported ones in one Error
    before compiling.

The backend is reached only through ONNX and the public ``popart_backend`` API.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import logging
import warnings
from typing import Any

import onnx
import torch
import torch.fx.traceback as fx_traceback
from onnx import helper
from torch.export.graph_signature import InputKind, TensorArgument
from torch.utils import _pytree as pytree

import popart_backend as popart

from . import blocks, buffers, export_errors, export_passes, loss_marks, ops, translations
from .errors import Error, location_from_stack_trace
from .signatures import InputSignature, LeafSpec, bind_inputs, check_combined_batch, flatten_inputs

__all__ = ["InputSignature", "LeafSpec", "TracedModel", "bind_inputs", "check_combined_batch",
           "flatten_inputs", "trace", "unsupported_nodes"]

_log = logging.getLogger("poptorch_lite")

OPSET = 18
SOURCE_ATTR = "__source"
IPU_ATTR = "__ipu_number"
STAGE_ATTR = "__pipeline_stage"
_STACK_KEY = "pkg.torch.onnx.stack_trace"
_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
_FX_NODE_KEY = "pkg.torch.onnx.fx_node"


# --- the traced model --------------------------------------------------------------------------


@dataclasses.dataclass
class TracedModel:
    """An annotated ONNX model plus the tables the wrapper needs to feed and read it."""

    proto: onnx.ModelProto
    signature: InputSignature
    input_names: list[str | None]  # per input leaf: ONNX graph input, None if not an input
    output_names: list[str]  # ONNX graph outputs in output-leaf order
    output_spec: Any  # pytree spec of forward's result
    output_constants: dict[int, Any]  # output-leaf index -> non-tensor value
    output_leaf_sources: list[int | None]  # output-leaf index -> index into output_names
    param_map: dict[str, str]  # ONNX initializer name -> parameter/buffer FQN
    node_locations: dict[str, str]  # ONNX node name -> user file:line
    exporter: str
    # FQNs of the buffers forward updates in place (CopyVarUpdate nodes; BatchNorm's running
    # statistics, which the backend updates itself, are not listed)
    updated_buffers: tuple[str, ...] = ()
    # In-place updates of forward's own state and inputs :
    updated_parameters: tuple[str, ...] = ()  # parameter FQNs among updated_buffers
    # (input leaf index, ONNX output with its new value): read back into the caller's tensor
    input_updates: tuple[tuple[int, str], ...] = ()
    mutation_locations: dict[str, str] = dataclasses.field(default_factory=dict)  # FQN/leaf path
    loss_outputs: tuple[str, ...] = ()  # outputs computed by a torch loss function


def _model_state_names(model: torch.nn.Module) -> dict[str, str]:
    """Every parameter/buffer FQN, tied aliases included -> the FQN ``named_parameters()``
    reports (the first one), so a tied weight stays one device tensor under one name."""
    canonical: dict[int, str] = {}
    names: dict[str, str] = {}
    for getter in (model.named_parameters, model.named_buffers):
        for name, tensor in getter(remove_duplicate=False):
            names[name] = canonical.setdefault(id(tensor), name)
    return names


_TORCHLIB_REGISTRIES: dict = {}


@contextlib.contextmanager
def _cached_torchlib_registry():
    """Reuse the exporter's op registry between exports.

    torch.onnx rebuilds its ~500-function torchlib registry on every export (~1.5 s, most of
    a small model's export time); the registry only depends on the opset, so one copy per
    opset is kept and each export gets fresh per-target lists (custom translations are added
    to those). Falls back to torch's behaviour when its internals are not as expected.
    """
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        yield
        return
    registry_cls = getattr(_registration, "ONNXRegistry", None)
    original = registry_cls.__dict__.get("from_torchlib") if registry_cls else None
    if not isinstance(original, classmethod):
        yield
        return

    def from_torchlib(cls, opset_version=OPSET):
        cached = _TORCHLIB_REGISTRIES.get((cls, opset_version))
        if cached is None:
            cached = original.__func__(cls, opset_version=opset_version)
            _TORCHLIB_REGISTRIES[(cls, opset_version)] = cached
        fresh = cls()
        fresh._opset_version = cached._opset_version
        fresh.functions = {k: list(v) for k, v in cached.functions.items()}
        return fresh

    registry_cls.from_torchlib = classmethod(from_torchlib)
    try:
        yield
    finally:
        registry_cls.from_torchlib = original


@contextlib.contextmanager
def _quiet_export():
    """Silence the exporter's progress prints and optional-dependency warnings."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.onnx._internal.exporter",
                                                "torch.onnx._internal.exporter._registration",
                                                "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            with contextlib.redirect_stdout(io.StringIO()):
                yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _trace_args(leaves: list, signature: InputSignature, divisor: int) -> list:
    """Leaves as seen by one micro-batch: batched tensors sliced to dim0 / divisor."""
    out = []
    for leaf, spec in zip(leaves, signature.leaves):
        if spec.is_tensor and spec.shape:
            out.append(leaf[: spec.shape[0] // divisor].detach().contiguous())
        elif spec.is_tensor:
            out.append(leaf.detach())
        else:
            out.append(leaf)
    return out


def trace(model: torch.nn.Module, leaves: list, signature: InputSignature, divisor: int,
          exporter: str = "dynamo", excludes: tuple[str, ...] = ()) -> TracedModel:
    """Export ``model`` for one micro-batch of the given inputs and annotate the ONNX model."""
    micro = _trace_args(leaves, signature, divisor)
    named = pytree.tree_unflatten(micro, signature.treedef)
    forward_params = inspect.signature(model.forward).parameters
    args, kwargs = [], {}
    for name, param in forward_params.items():
        value = named[name]
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            args.extend(value)
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            kwargs.update(value)
        elif param.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[name] = value
        else:
            args.append(value)
    if exporter == "torchscript":
        traced = _export_torchscript(model, tuple(args), kwargs, micro, signature)
    else:
        traced = _export_dynamo(model, tuple(args), kwargs, micro, signature, excludes)
    return traced


def _export_dynamo(model, args, kwargs, micro, signature, excludes) -> TracedModel:
    mutations = buffers.Mutations.of(model)
    with _quiet_export(), fx_traceback.preserve_node_meta(), blocks.tracing_blocks(), \
            _cached_torchlib_registry(), buffers.capture_mutations(mutations), \
            loss_marks.marking_losses():
        try:
            with export_passes.kept_tensor_attributes(model):
                ep = torch.export.export(model, args, kwargs, strict=False)
        except Exception as exc:  # every export failure is reported with the hint below
            export_errors.refuse_unsupported_loss(exc, excludes)
            buffers.refuse_data_updates(exc)
            raise Error(
                f"torch.export could not capture the model: {type(exc).__name__}: "
                f"{export_errors.first_lines(str(exc), 12)}\n{export_errors.export_hint(exc)}",
                type="trace_error", location=export_errors.user_frame(exc, excludes)) from exc
        export_passes.drop_dynamo_markers(ep)
        export_passes.freeze_constant_updates(ep, excludes)
        out_spec, user_outputs = export_passes.strip_constant_outputs(ep)
        try:
            table = {**translations.translation_table(), **ops.translation_table()}
            program = torch.onnx.export(ep, dynamo=True, optimize=False, opset_version=OPSET,
                                        verbose=False, custom_translation_table=table)
        except Exception as exc:  # the exporter's ConversionError / TorchExportError ...
            raise export_errors.conversion_error(exc, ep, excludes, table) from exc
    buffers.check_assignments(mutations)
    proto = program.model_proto
    ops.control_flow.fix_trip_counts(proto.graph)  # for_loop: constant trip counts
    decomposed = getattr(program, "exported_program", None) or ep
    fx_custom = {n.name: dict(n.meta.get("custom") or {}) for n in decomposed.graph.nodes}

    state_names = _model_state_names(model)
    sig = ep.graph_signature
    placeholder_to_fqn = dict(sig.inputs_to_parameters)
    placeholder_to_fqn.update(sig.inputs_to_buffers)
    param_map = {}
    for init in proto.graph.initializer:
        if init.name in state_names:
            param_map[init.name] = state_names[init.name]
        elif init.name in placeholder_to_fqn:
            param_map[init.name] = state_names.get(placeholder_to_fqn[init.name],
                                                   placeholder_to_fqn[init.name])
    _constants_as_nodes(proto, param_map)

    # User inputs: the ONNX graph inputs follow ep's user inputs, which follow the leaves
    # that are tensors (non-tensor leaves are specialised into the graph).
    initializer_names = {i.name for i in proto.graph.initializer}
    graph_inputs = [i.name for i in proto.graph.input if i.name not in initializer_names]
    # Only tensor user inputs become graph inputs; torch.export also lists the non-tensor
    # arguments it specialised (ConstantArgument), which must not shift the pairing.
    user_inputs = [
        spec.arg.name for spec in sig.input_specs
        if spec.kind is InputKind.USER_INPUT and isinstance(spec.arg, TensorArgument)
    ]
    input_names: list[str | None] = []
    tensor_index = 0
    for spec in signature.leaves:
        if not spec.is_tensor:
            input_names.append(None)
            continue
        name = user_inputs[tensor_index] if tensor_index < len(user_inputs) else None
        tensor_index += 1
        input_names.append(name if name in graph_inputs else None)

    updated = buffers.add_buffer_updates(proto, decomposed, mutations, param_map, model,
                                         state_names)
    output_names = [o.name for o in proto.graph.output][:mutations.user_outputs]
    leaf_of = {name: index for index, name in enumerate(input_names) if name is not None}
    input_updates = []
    for placeholder, output in buffers.add_input_updates(proto, mutations):
        if placeholder not in leaf_of:
            raise Error(f"forward updates its input '{placeholder}' in place, but that input "
                        f"is not a graph input of the exported model.", type="input_mutation")
        input_updates.append((leaf_of[placeholder], output))
    locations = buffers.mutation_locations(ep, decomposed, excludes)
    for placeholder, index in leaf_of.items():
        if placeholder in locations:
            locations[signature.leaves[index].path] = locations.pop(placeholder)
    parameters = tuple(state_names.get(p, p) for p in sorted(mutations.parameters))
    locations.update({state_names.get(k, k): v for k, v in list(locations.items())})
    output_constants, sources = {}, []
    position = 0
    for i, name in enumerate(user_outputs):
        if not isinstance(name, str):  # a non-tensor value forward returned
            output_constants[i] = name.value
            sources.append(None)
        else:
            sources.append(position)
            position += 1
    losses = loss_marks.loss_outputs(proto, fx_custom,
                                     lambda meta: _fx_name(meta.get(_FX_NODE_KEY, "")))
    node_locations = _annotate_nodes(proto, fx_custom, excludes)
    return TracedModel(proto, signature, input_names, output_names, out_spec, output_constants,
                       sources, param_map, node_locations, "dynamo", updated, parameters,
                       tuple(input_updates), locations, losses)


def _export_torchscript(model, args, kwargs, micro, signature) -> TracedModel:
    """Legacy exporter (opt-in): data-dependent branches are frozen, names partly lost."""
    warnings.warn("Options.Jit.exporter('torchscript'): the legacy exporter freezes "
                  "data-dependent branches and loses some parameter names.", UserWarning,
                  stacklevel=4)
    tensor_leaves = [leaf for leaf, spec in zip(micro, signature.leaves) if spec.is_tensor]
    input_names = [spec.path.replace("[", "_").replace("]", "").replace("'", "")
                   for spec in signature.leaves if spec.is_tensor]
    # This exporter runs forward on the real tensors: keep them as they were, and refuse
    # in-place updates of inputs and parameters, which its graph would drop.
    watched = {f"input {spec.path}": leaf for leaf, spec in zip(micro, signature.leaves)
               if spec.is_tensor}
    watched.update(model.named_parameters(remove_duplicate=False))
    watched.update(model.named_buffers(remove_duplicate=False))
    saved = {name: (tensor._version, tensor.detach().clone()) for name, tensor in watched.items()}
    buffer = io.BytesIO()
    failure = None
    try:
        with torch.no_grad():
            result = model(*args, **kwargs)
        out_leaves, out_spec = pytree.tree_flatten(result)
        output_names = [f"output_{i}" for i, leaf in enumerate(out_leaves)
                        if isinstance(leaf, torch.Tensor)]
        with _quiet_export():
            torch.onnx.export(model, args, buffer, kwargs=kwargs or None, dynamo=False,
                              opset_version=OPSET, input_names=input_names,
                              output_names=output_names, do_constant_folding=False)
    except Exception as exc:  # e.g. "Unsupported: ONNX does not support label_smoothing"
        failure = exc
    changed = [name for name, (version, _) in saved.items() if watched[name]._version != version]
    with torch.no_grad():
        for name in changed:
            watched[name].copy_(saved[name][1])
    skip = buffers.batch_norm_statistics(model)
    updated = [name for name in changed if name not in skip]
    if updated:
        raise Error(f"forward updates {', '.join(repr(n) for n in updated)} in place; the "
                    f"legacy TorchScript exporter (Options.Jit.exporter('torchscript')) cannot "
                    f"capture in-place updates, so they would be lost. Use the default exporter "
                    f"(Options.Jit.exporter('dynamo')).", type="trace_error") from failure
    if isinstance(failure, Error):
        raise failure
    if failure is not None:
        raise Error(f"the legacy TorchScript exporter could not export the model: "
                    f"{type(failure).__name__}: "
                    f"{export_errors.first_lines(str(failure), 12)}\nThe default "
                    f"exporter (Options.Jit.exporter('dynamo')) may support it.",
                    type="trace_error") from failure
    proto = onnx.load_from_string(buffer.getvalue())
    state_names = _model_state_names(model)
    param_map = {i.name: state_names[i.name] for i in proto.graph.initializer
                 if i.name in state_names}
    graph_inputs = {i.name for i in proto.graph.input}
    names_iter = iter(input_names)
    in_names = [(lambda n: n if n in graph_inputs else None)(next(names_iter))
                if spec.is_tensor else None for spec in signature.leaves]
    del tensor_leaves
    constants, sources, position = {}, [], 0
    for i, leaf in enumerate(out_leaves):
        if isinstance(leaf, torch.Tensor):
            sources.append(position)
            position += 1
        else:
            constants[i] = leaf
            sources.append(None)
    return TracedModel(proto, signature, in_names, output_names, out_spec, constants, sources,
                       param_map, {}, "torchscript")


def _constants_as_nodes(proto: onnx.ModelProto, param_map: dict[str, str]) -> None:
    """Initializers that are no parameter or buffer become ``Constant`` nodes.

    torch.export lifts tensor constants (e.g. a loss's ``weight=`` / ``pos_weight=`` tensor
    made outside the module) into initializers, and the backend trains every float
    initializer: left as initializers, they would be updated by the optimizer.
    """
    constants = [init for init in proto.graph.initializer if init.name not in param_map]
    if not constants:
        return
    names = {init.name for init in constants}
    nodes = [helper.make_node("Constant", [], [init.name], name=f"constant/{init.name}",
                              value=init) for init in constants]
    kept = [init for init in proto.graph.initializer if init.name not in names]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(kept)
    inputs = [i for i in proto.graph.input if i.name not in names]
    del proto.graph.input[:]
    proto.graph.input.extend(inputs)
    existing = list(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes + existing)


def _annotate_nodes(proto: onnx.ModelProto, fx_custom: dict, excludes) -> dict[str, str]:
    """Write __source / block annotations and module-path names; returns name -> location."""
    locations = {}
    used_names = set()
    conv_counts: dict = {}
    for index, node in enumerate(proto.graph.node):
        meta = {p.key: p.value for p in node.metadata_props}
        location = location_from_stack_trace(meta.get(_STACK_KEY, ""), excludes)
        scopes = _scopes(meta.get(_SCOPES_KEY, ""))
        base = "/".join(s for s in scopes[:-1] if s) if scopes else ""
        name = f"{base}/{node.op_type}" if base else (node.name or f"{node.op_type}_{index}")
        # NameScope / Attribute / MultiConv contexts the node was traced in (ops/scopes.py)
        recorded = fx_custom.get(_fx_name(meta.get(_FX_NODE_KEY, "")), {})
        name = ops.scopes.annotate_node(node, recorded.get(ops.scopes.SCOPES_KEY, ()),
                                        conv_counts) + name
        if name in used_names:
            name = f"{name}_{index}"
        used_names.add(name)
        node.name = name
        if location:
            node.attribute.append(helper.make_attribute(SOURCE_ATTR, location))
            locations[name] = location
        fx_name = _fx_name(meta.get(_FX_NODE_KEY, ""))
        block = fx_custom.get(fx_name, {}).get(blocks.META_KEY)
        if block is not None:
            blocks.annotate_node(node, block)
    return locations


def _scopes(text: str) -> list[str]:
    if not text.startswith("["):
        return []
    try:
        import ast

        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return [str(v) for v in value]


def _fx_name(text: str) -> str:
    # "%linear : [num_users=1] = call_function[...]" -> "linear"
    return text[1:].split(" ", 1)[0] if text.startswith("%") else ""


# --- unsupported ops -----------------------------------------------------------------------------

_SUPPORT_CACHE: dict[tuple[str, str, int], bool] = {}


def _opsets(proto: onnx.ModelProto) -> dict[str, int]:
    return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}


def backend_supports(domain: str, op_type: str, opset: int) -> bool:
    """Whether popart_backend can build ``domain::op_type`` at ``opset`` (cached).

    Uses ``popart.getSupportedOperations`` when the backend provides it; otherwise asks the
    backend by building a one-node model whose node has no inputs: an unsupported op fails
    with ``UnsupportedOpError`` while resolving, a supported one fails later (missing inputs).
    """
    key = (domain, op_type, opset)
    if key in _SUPPORT_CACHE:
        return _SUPPORT_CACHE[key]
    supported_fn = getattr(popart, "getSupportedOperations", None)
    if supported_fn is not None:
        wanted = "ai.onnx" if domain in ("", "ai.onnx") else domain
        supported = any(
            getattr(o, "domain", "") in (wanted, "" if wanted == "ai.onnx" else wanted)
            and getattr(o, "type", None) == op_type and getattr(o, "version", 0) <= opset
            for o in supported_fn(False))
    else:
        supported = _probe(domain, op_type, opset)
    _SUPPORT_CACHE[key] = supported
    return supported


def _probe(domain: str, op_type: str, opset: int) -> bool:
    node = helper.make_node(op_type, [], ["probe_out"], domain=domain)
    graph = helper.make_graph(
        [node], "probe", [],
        [helper.make_tensor_value_info("probe_out", onnx.TensorProto.FLOAT, None)])
    opset_ids = [helper.make_opsetid("", OPSET)]
    if domain not in ("", "ai.onnx"):
        opset_ids.append(helper.make_opsetid(domain, opset))
    else:
        opset_ids = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opset_ids)
    try:
        popart.InferenceSession(model, popart.DataFlow(1, {}),
                                popart.DeviceManager().createCpuDevice(),
                                userOptions=popart.SessionOptions())
    except popart.UnsupportedOpError:
        return False
    except Exception:  # noqa: BLE001 - resolution succeeded; the node is just incomplete
        return True
    return True


def unsupported_nodes(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every node whose op the backend lacks, in graph order."""
    opsets = _opsets(proto)
    bad = []
    for node in proto.graph.node:
        domain = "" if node.domain == "ai.onnx" else node.domain
        if not backend_supports(domain, node.op_type, opsets.get(domain, OPSET)):
            bad.append(node)
    return bad


def check_supported(traced: TracedModel) -> None:
    """Raise one Error listing all unsupported nodes with their source lines."""
    bad = unsupported_nodes(traced.proto)
    if not bad:
        return
    opsets = _opsets(traced.proto)
    lines = []
    for node in bad:
        domain = node.domain or "ai.onnx"
        where = traced.node_locations.get(node.name, "unknown source line")
        lines.append(f"  {domain}::{node.op_type} (opset {opsets.get(node.domain, OPSET)}) "
                     f"'{node.name}' at {where}")
    kinds = sorted({(n.domain or "ai.onnx") + "::" + n.op_type for n in bad})
    first = traced.node_locations.get(bad[0].name, "")
    raise Error(
        f"{len(bad)} op(s) of the traced model are not supported by the simulated IPU "
        f"({', '.join(kinds)}):\n" + "\n".join(lines)
        + "\nRewrite these lines with supported torch operations, or register a custom op in "
        "popart_backend for them.", type="unsupported_op", location=first)
