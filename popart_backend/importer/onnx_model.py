"""ONNX ModelProto (path, bytes or proto) -> Ir, resolving each node through the op registry.

Constant folding runs while nodes are added, so an op needing a constant operand (Reshape's
shape, Slice's starts ...) sees the folded value of the shape arithmetic before it.

Graph attributes (If branches, Loop and Scan bodies, Call callees) become subgraphs of the Ir,
imported with their formal inputs typed by the op; a name a subgraph reads from an enclosing
graph becomes a captured input of the subgraph and an extra input of the op (constants are
copied instead, so folding works inside bodies). An If whose condition is a constant is
replaced by its chosen branch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from pathlib import Path

import numpy as np
import onnx

from .. import ops  # noqa: F401  (registers every op)
from ..dtypes import DataType
from ..errors import (
    ModelError,
    ResourceLimitError,
    ShapeError,
    UnsupportedOpError,
    popart_exception,
)
from ..ir.ir import CHECKPOINT_PREFIXES, Ir
from ..ir.op import OpSettings, RecomputeType
from ..ir.replica_grouping import grouped_variable, variable_settings_from_model
from ..ir.tensor import TensorInfo, TensorKind, TensorRole
from ..limits import ENV_VAR, check_bytes
from ..ops.control_flow import Body, Loop, SubgraphOp
from ..ops.fused import FUSED_DOMAIN
from ..options.patterns import excluded_pattern_names
from ..ops.registry import (
    AI_ONNX,
    const_input_positions,
    create_op,
    find,
    make_attrs,
    modified_input_positions,
    normalize_domain,
    resolve,
)
from ..transforms.const_fold import try_fold
from .annotations import check_supported, log_unread, planning_settings
from .fold_policy import unfolded_outputs
from .gradient_op import add_gradient, is_gradient_node
from .graph_walk import captured_names, nodes_in_order
from .sequences import StaticSequences
from .tensor_data import check_model_bounds, tensor_value
from .value_io import ValueIO

_log = logging.getLogger("popart:ir")
# Model metadata "__frozen_variable:<initializer name>" = "1": a variable that is not trained
# (Ir.frozen_variables). poptorch_lite writes it for requires_grad=False parameters and
# read-only float buffers; a model without it trains every float variable, as PopART.
FROZEN_VARIABLE_KEY_PREFIX = "__frozen_variable:"

# Node attributes the Builder / frontend write for placement; not op attributes.
ANNOTATION_PREFIX = "__"


@dataclasses.dataclass
class LoadedModel:
    proto: onnx.ModelProto
    base_dir: Path  # folder external data is read from
    path: Path | None = None  # the .onnx file, when loaded from one


def load_model(model) -> LoadedModel:
    """Accept a file path, serialized bytes or a ModelProto. Raises ModelError when unreadable."""
    if isinstance(model, onnx.ModelProto):
        return LoadedModel(model, Path.cwd())
    if isinstance(model, (bytes, bytearray)):
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(bytes(model))
        except Exception as exc:  # protobuf's DecodeError
            raise ModelError(
                f"Could not parse the {len(model)} model bytes as an ONNX ModelProto ({exc}). "
                f"Pass builder.getModelProto(), a .onnx path or an onnx.ModelProto."
            ) from None
        if not proto.graph.node and not proto.graph.input and not proto.graph.output:
            raise ModelError(
                f"The {len(model)} model bytes parse to an empty ONNX model (no graph). "
                f"Pass builder.getModelProto(), a .onnx path or an onnx.ModelProto."
            )
        return LoadedModel(proto, Path.cwd())
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise ModelError(
                f"ONNX model file '{path}' does not exist"
                + (" (if you passed serialized bytes as str, pass bytes)." if len(str(model)) > 255 else ".")
            )
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as exc:
            raise ModelError(f"Could not read ONNX model '{path}': {exc}") from None
        return LoadedModel(proto, path.resolve().parent, path.resolve())
    raise ModelError(
        f"A model must be a path, bytes or onnx.ModelProto, not {type(model).__name__}."
    )


def initializer_value(init: onnx.TensorProto, base_dir: Path | None) -> np.ndarray:
    """The numpy value of an initializer, reading external data only from inside ``base_dir``
    (checked against the resource guard first: importer/tensor_data.py)."""
    return tensor_value(init, base_dir, f"Initializer '{init.name}'")


def attribute_value(attr: onnx.AttributeProto, base_dir: Path | None = None):
    """A Python value for an ONNX attribute (tensors as numpy arrays, graphs as GraphProto).

    Tensor attributes with external data read it only from inside ``base_dir``."""
    try:
        value = onnx.helper.get_attribute_value(attr)
    except Exception as exc:  # onnx's ValueError for an attribute of no or unknown type
        raise ModelError(f"Attribute '{attr.name}': {exc}") from None
    what = f"Attribute '{attr.name}'"
    if attr.type == onnx.AttributeProto.TENSOR:
        return tensor_value(value, base_dir, what)
    if attr.type == onnx.AttributeProto.TENSORS:
        return tuple(tensor_value(v, base_dir, what) for v in value)
    try:
        if attr.type == onnx.AttributeProto.STRING:
            return value.decode("utf-8")
        if attr.type == onnx.AttributeProto.STRINGS:
            return tuple(v.decode("utf-8") for v in value)
    except UnicodeDecodeError:
        raise ModelError(f"{what}: its strings are not UTF-8.") from None
    if isinstance(value, list):
        return tuple(value)
    return value


def split_annotations(node: onnx.NodeProto, base_dir: Path | None = None) -> tuple[dict, dict]:
    """(ONNX attribute values, PopART ``__`` annotations) of a node."""
    values, annotations = {}, {}
    for attr in node.attribute:
        target = annotations if attr.name.startswith(ANNOTATION_PREFIX) else values
        target[attr.name] = attribute_value(attr, base_dir)
    return values, annotations


def node_settings(node: onnx.NodeProto, annotations: dict) -> OpSettings:
    """The OpSettings of ``node`` from its ``__`` annotations; the ones nothing reads are
    logged once per name (importer/annotations.py)."""
    log_unread(annotations)
    scope = node.name.rsplit("/", 1)[0] if "/" in node.name else ""
    recompute = annotations.get("__recompute_output_in_backward_pass")
    return OpSettings(
        name=node.name or (node.output[0] if node.output else node.op_type),
        scope=scope,
        ipu=annotations.get("__ipu_number"),
        pipeline_stage=annotations.get("__pipeline_stage"),
        execution_phase=annotations.get("__execution_phase"),
        recompute=RecomputeType(recompute) if recompute is not None else RecomputeType.Undefined,
        schedule_priority=float(annotations.get("__schedule_priority", 0.0)),
        source=str(annotations.get("__source", "")),
        comm_group=_comm_group(annotations.get("__collectiveCommGroup")),
        excluded_patterns=excluded_pattern_names(annotations.get("__exclude_patterns", ()),
                                                 _node_where(node)),
        **planning_settings(annotations, _node_where(node)),
    )


def _comm_group(value) -> tuple[int, int] | None:
    """The ``[type, size]`` of a ``__collectiveCommGroup`` annotation, as a tuple."""
    if value is None:
        return None
    if len(value) != 2:
        raise ModelError(
            f"Annotation __collectiveCommGroup must be [commGroupType, groupSize], got "
            f"{list(value)}."
        )
    return int(value[0]), int(value[1])


def tensor_info_of(value_info: onnx.ValueInfoProto, shape_info: dict) -> TensorInfo:
    """Static TensorInfo of a graph input; unknown dims must come from ``inputShapeInfo``."""
    name = value_info.name
    if name in shape_info:
        return shape_info[name]
    ttype = value_info.type.tensor_type
    if value_info.type.HasField("optional_type"):  # a present optional tensor (sequences.py)
        ttype = value_info.type.optional_type.elem_type.tensor_type
    if not ttype.HasField("shape"):
        raise ShapeError(
            f"Input '{name}' has no shape in the model. Give it with "
            f"InputShapeInfo().add('{name}', TensorInfo(dtype, shape))."
        )
    dims = []
    for i, d in enumerate(ttype.shape.dim):
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(d.dim_value)
        else:
            label = d.dim_param or "?"
            raise ShapeError(
                f"Input '{name}' has unknown dimension {i} ('{label}'). Shapes on the simulated "
                f"IPU are static: give it with InputShapeInfo().add('{name}', TensorInfo(...))."
            )
    info = TensorInfo(DataType.from_onnx(ttype.elem_type), tuple(dims))
    check_bytes(info.num_bytes, f"Input '{name}' {info}")
    return info


def import_model(
    model,
    input_shape_info: dict[str, TensorInfo] | None = None,
    constant_weights: bool = False,
    strict_op_versions: bool = True,
    fold_multiple_consumers: bool = True,
    replicas: int | None = None,
) -> Ir:
    """Build the forward Ir of ``model``.

    ``fold_multiple_consumers`` False (SessionOptions.enableConstantFoldingOfMultipleConsumers):
    constant expressions reading a tensor with several readers stay unfolded
    (importer/fold_policy.py). ``replicas``: the session's global replication factor.

    Float initializers read as data become VARIABLE tensors (CONST when ``constant_weights``:
    inference sessions with SessionOptions.constantWeights); other initializers are CONST.
    Graph inputs without initializer are host STREAMs.
    """
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    proto = loaded.proto
    check_model_bounds(proto)  # names, nesting depth and declared bytes, before reading any
    opsets = {normalize_domain(o.domain): o.version for o in proto.opset_import}
    opsets.setdefault(AI_ONNX, 1 if not proto.opset_import else opsets.get(AI_ONNX, 1))
    ir = Ir(opsets)
    ir.replicas = replicas  # the span of CommGroup All collectives (ops/collectives.py)
    graph = ir.main
    shape_info = dict(input_shape_info or {})

    scope = _Scope(ir, graph, strict_op_versions, base_dir=loaded.base_dir)
    if not fold_multiple_consumers:
        scope.keep_unfolded = unfolded_outputs(proto.graph, opsets)
    ir.value_io = ValueIO()  # sequence / optional graph inputs and outputs (importer/sequences.py)
    initializer_names = set()
    weight_uses = _weight_uses(proto.graph, opsets)
    state = _modified_in_place(proto.graph, opsets)
    read_names = (weight_uses | state | {n for node in proto.graph.node for n in node.input}
                  | {o.name for o in proto.graph.output})
    variable_settings = variable_settings_from_model(proto)
    for init in proto.graph.initializer:
        value = initializer_value(init, loaded.base_dir)
        if init.name.startswith(CHECKPOINT_PREFIXES) and init.name not in read_names:
            # Training state saved by modelToHost: the pass that creates it takes the value.
            ir.restored_state[init.name] = value
            continue
        info = TensorInfo.of(value)
        # A weight is a float initializer read as data by some op. Integer initializers and
        # operands only read at compile time (shapes, axes, scales) stay constants. An
        # initializer some op writes in place (CopyVarUpdate) is state: a variable of any
        # dtype, even with constant weights.
        is_weight = info.dtype.is_float and init.name in weight_uses and not constant_weights
        kind = TensorKind.VARIABLE if is_weight or init.name in state else TensorKind.CONST
        tensor = graph.add_tensor(init.name, info, kind, value)
        if init.name in variable_settings and replicas is not None:
            _group_variable(ir, tensor, variable_settings[init.name], replicas)
        if init.name in state:
            tensor.role = TensorRole.RUNNING_STAT  # state the graph updates: never trained
        initializer_names.add(init.name)
    ir.frozen_variables = _frozen_variables(proto, graph)
    for value_info in proto.graph.input:
        if value_info.name in initializer_names:
            continue
        if scope.sequences.add_graph_input(value_info, shape_info, ir.value_io):
            continue
        graph.add_tensor(value_info.name, tensor_info_of(value_info, shape_info), TensorKind.STREAM)
        graph.inputs.append(value_info.name)

    for node in nodes_in_order(proto.graph):
        scope.add(node)

    for out in proto.graph.output:
        if scope.sequences.add_graph_output(out.name, ir.value_io):
            continue
        graph.tensor(out.name)  # raises naming the missing output
        graph.outputs.append(out.name)
    _log.debug("imported %d ops, %d tensors", len(graph.ops), len(graph.tensors))
    return ir


def _frozen_variables(proto, graph) -> frozenset[str]:
    """The variables the model's ``__frozen_variable:`` metadata marks as not trained. A marked
    initializer imported as a constant is not trained anyway; a mark naming no initializer or
    with a value other than "1" is a ModelError."""
    frozen = set()
    for prop in proto.metadata_props:
        if not prop.key.startswith(FROZEN_VARIABLE_KEY_PREFIX):
            continue
        name = prop.key[len(FROZEN_VARIABLE_KEY_PREFIX):]
        tensor = graph.tensors.get(name)
        if prop.value != "1" or tensor is None:  # read before the nodes: initializers only
            raise ModelError(
                f"Model metadata '{prop.key}' = '{prop.value}': a frozen-variable mark needs "
                f"the value \"1\" and the name of an initializer of the main graph"
                f"{'' if tensor is not None else f' (there is no tensor {name!r})'}. Remove "
                f"the entry or fix its name.")
        if tensor.kind is TensorKind.VARIABLE:
            frozen.add(name)
    return frozenset(frozen)


def _group_variable(ir: Ir, tensor, settings, replicas: int) -> None:
    """Record a replica-grouped variable (ir/replica_grouping.py); its info becomes one
    replica's value, its data stays the host value (one entry per group)."""
    grouping = grouped_variable(settings, replicas, tensor.id)
    if grouping.num_groups == 1 and grouping.retrieval != "AllReplicas":
        return  # one value shared by every replica: a plain variable
    shape = tensor.info.shape
    if grouping.num_groups > 1:
        if tensor.kind is not TensorKind.VARIABLE:
            raise ModelError(
                f"Initializer '{tensor.id}' has VariableSettings with {grouping.num_groups} "
                f"replica groups but is imported as a constant (constantWeights, or not a "
                f"float weight); a grouped value needs a variable. Build the session with "
                f"SessionOptions.constantWeights = False."
            )
        if not shape or shape[0] != grouping.num_groups:
            raise ModelError(
                f"Variable '{tensor.id}' has shape {list(shape)}; its VariableSettings give "
                f"{grouping.num_groups} groups of replicas {[list(g) for g in grouping.groups]} "
                f"over {replicas} replicas, so its initial value needs a leading dimension of "
                f"{grouping.num_groups} (one value per group)."
            )
        tensor.info = TensorInfo(tensor.info.dtype, tuple(shape[1:]))
    elif tensor.kind is not TensorKind.VARIABLE:
        return  # AllReplicas of a constant: every replica holds the one value
    ir.grouped_variables[tensor.id] = grouping


def _node_where(node: onnx.NodeProto) -> str:
    return f"{node.op_type} '{node.name or (node.output[0] if node.output else '')}'"


@contextlib.contextmanager
def _model_errors(node: onnx.NodeProto):
    """Errors onnx, numpy or torch raise on a malformed node become ModelError naming it."""
    try:
        yield
    except popart_exception:
        raise
    except MemoryError:
        raise ResourceLimitError(
            f"{_node_where(node)}: the host ran out of memory importing it. Lower "
            f"{ENV_VAR} so the resource guard refuses such models before allocating."
        ) from None
    except Exception as exc:  # re-raised with the node; nothing carries on
        raise ModelError(
            f"{_node_where(node)}: the node is malformed or unsupported "
            f"({type(exc).__name__}: {exc})."
        ) from exc


def add_node(ir: Ir, node: onnx.NodeProto, strict: bool = True, scope: "_Scope | None" = None):
    """Resolve, create and connect the op of one NodeProto, folding it when constant.

    ``scope`` is the graph being imported (default: the main graph); subgraph attributes of
    the node are imported into subgraphs of ``ir`` as the op's bodies (ops.control_flow)."""
    with _model_errors(node):
        return _add_node(ir, node, strict, scope)


def _add_node(ir: Ir, node: onnx.NodeProto, strict: bool, scope: "_Scope | None"):
    domain = normalize_domain(node.domain)
    if domain == FUSED_DOMAIN:
        raise ModelError(
            f"Node '{node.name or node.op_type}' uses the internal domain '{FUSED_DOMAIN}', which "
            f"only the compile-time fusion passes may create. Use the ONNX ops it fuses instead."
        )
    opset = ir.opsets.get(domain)
    if opset is None:
        raise ModelError(
            f"Node '{node.name or node.op_type}' uses domain '{domain}', which the model does not "
            f"import (opset_import has {sorted(ir.opsets)})."
        )
    cls, version = resolve(node.op_type, domain, opset, strict)
    where = _node_where(node)
    values, annotations = split_annotations(node, scope.base_dir if scope is not None else None)
    attrs = make_attrs(cls, version, values, where)
    op = cls(attrs, node_settings(node, annotations), version)
    reset = check_supported(op, where)
    if reset:
        op.settings = dataclasses.replace(op.settings, **reset)
    graph = scope.graph if scope is not None else ir.main
    for name in node.input:
        if name and scope is not None:
            scope.lookup(name, where)
        if name and name not in graph.tensors:
            raise ModelError(f"{where}: input '{name}' is not produced by any node or input.")
    inputs = list(node.input)
    if issubclass(cls, SubgraphOp):
        if scope is None:
            scope = _Scope(ir, graph, strict)
        operands = [graph.tensors[n].info if n else None for n in node.input]
        bodies = {}
        for name in cls.body_attrs:
            if name not in values:  # an optional subgraph (FlexAttention's modifiers)
                continue
            bodies[name] = scope.import_body(
                values[name], op.body_input_infos(name, operands), f"{where} {name}", node, name
            )
        op.attrs = dataclasses.replace(attrs, **bodies)
        inputs += op.captured_ids()
    graph.add_op(op, inputs, list(node.output))
    _check_sizes(op, where)
    if scope is None or not node.output or node.output[0] not in scope.keep_unfolded:
        try_fold(graph, op)
    return op


def _check_sizes(op, where: str) -> None:
    """The resource guard on what the op declares: each output, and a Loop's work (its constant
    trip count times the bytes of its body), before anything computes or allocates them."""
    for tensor in op.outputs:
        if tensor is not None:
            check_bytes(tensor.info.num_bytes, f"{where}: output '{tensor.id}' {tensor.info}")
    if isinstance(op, Loop) and op.inputs and op.inputs[0] is not None and op.inputs[0].is_const:
        trips = int(np.asarray(op.inputs[0].data).reshape(-1)[0])
        body_bytes = sum(t.info.num_bytes for t in op.attrs.body.graph.tensors.values())
        check_bytes(max(trips, 0) * max(body_bytes, 1),
                    f"{where}: {trips} iterations over a body of {body_bytes} bytes")


class _Scope:
    """One graph being imported, inside the scopes of its enclosing graphs (ONNX lexical
    scoping: a body may read any tensor of an enclosing graph by name)."""

    def __init__(self, ir: Ir, graph, strict: bool, parent: "_Scope | None" = None,
                 base_dir: Path | None = None):
        self.ir = ir
        self.graph = graph
        self.strict = strict
        self.parent = parent
        # The folder external data (of initializers and tensor attributes) is read from.
        self.base_dir = parent.base_dir if parent is not None else base_dir
        self.sequences = StaticSequences(graph, self)
        # Node outputs whose constant expression stays unfolded (importer/fold_policy.py).
        self.keep_unfolded: set[str] = set()

    def add(self, node: onnx.NodeProto) -> None:
        """Import one node: a sequence op, a constant If (inlined) or an op."""
        with _model_errors(node):
            self._add(node)

    def _add(self, node: onnx.NodeProto) -> None:
        domain = normalize_domain(node.domain)
        found = find(node.op_type, domain, self.ir.opsets.get(domain, 0))
        if found is not None and found[0].expands_at_import(node, self.sequences):
            cls, version = found
            # The ops a sequence node becomes keep its placement (__ipu_number ...).
            values, annotations = split_annotations(node, self.base_dir)
            where = f"{node.op_type} '{node.name or node.output[0]}'"
            attrs = make_attrs(cls, version, values, where)
            self.sequences.add(cls, node, attrs, node_settings(node, annotations))
            return
        if is_gradient_node(node):
            for name in node.input:
                self.lookup(name, f"Gradient '{node.name}'")
            values, annotations = split_annotations(node, self.base_dir)
            add_gradient(self.graph, node, values, node_settings(node, annotations))
            return
        for name in node.input:
            if self.sequences.is_sequence(name):
                raise UnsupportedOpError(
                    f"{node.op_type} '{node.name}' reads the sequence '{name}'; only the ONNX "
                    f"sequence ops may consume sequences on the simulated IPU."
                )
            if self.sequences.is_value(name):
                raise ShapeError(
                    f"{node.op_type} '{node.name}' reads the optional '{name}', which is empty "
                    f"(compiled absent); only the Optional* ops may read an empty optional."
                )
        if node.op_type == "If" and normalize_domain(node.domain) == AI_ONNX and node.input:
            self.lookup(node.input[0], f"If '{node.name}'")
            cond = self.graph.tensors.get(node.input[0])
            if cond is not None and cond.is_const:
                self._inline_if(node, bool(np.asarray(cond.data).all()))
                return
        add_node(self.ir, node, self.strict, self)

    def lookup(self, name: str, where: str) -> None:
        """Make ``name`` a tensor of this graph: a captured input (or a copied constant) when
        an enclosing graph holds it. Unknown names are left for the caller to report."""
        if name in self.graph.tensors or self.parent is None:
            return
        if self.parent.sequences.is_value(name):
            raise UnsupportedOpError(
                f"{where}: reads the sequence '{name}' of an enclosing graph; subgraphs may only "
                f"read tensors of enclosing graphs."
            )
        self.parent.lookup(name, where)
        outer = self.parent.graph.tensors.get(name)
        if outer is None:
            return
        if outer.is_const:
            self.graph.add_const(name, outer.data)
        else:
            self.graph.add_tensor(name, outer.info, TensorKind.STREAM)
            self.graph.inputs.append(name)

    def import_body(self, proto: onnx.GraphProto, input_infos: list[TensorInfo], where: str,
                    node: onnx.NodeProto, attr: str):
        """The Body of a GraphProto attribute, its formal inputs typed ``input_infos``."""
        if not isinstance(proto, onnx.GraphProto):
            raise ModelError(
                f"{where}: attribute '{attr}' must be a graph, got {type(proto).__name__}."
            )
        if len(proto.input) != len(input_infos):
            raise ModelError(
                f"{where}: the body declares {len(proto.input)} inputs, the op binds "
                f"{len(input_infos)} ({[str(i) for i in input_infos]})."
            )
        base = f"{self.graph.id}/{node.name or node.output[0]}/{attr}"
        graph_id, n = base, 0
        while graph_id in self.ir.graphs:
            n += 1
            graph_id = f"{base}__{n}"
        body = _Scope(self.ir, self.ir.create_graph(graph_id), self.strict, self)
        for value_info, info in zip(proto.input, input_infos):
            body.graph.add_tensor(value_info.name, info, TensorKind.STREAM)
            body.graph.inputs.append(value_info.name)
        body._add_graph_content(proto, where)
        return Body(body.graph, len(input_infos))

    def _add_graph_content(self, proto: onnx.GraphProto, where: str) -> None:
        """Initializers, nodes and outputs of a subgraph into this scope's graph."""
        for init in proto.initializer:
            self.graph.add_const(init.name, initializer_value(init, self.base_dir))
        for node in nodes_in_order(proto, outer_ok=True):
            self.add(node)
        for out in proto.output:
            self._add_output(out.name, where)

    def _add_output(self, name: str, where: str) -> None:
        if self.sequences.is_sequence(name):
            raise UnsupportedOpError(
                f"{where}: body output '{name}' is a sequence; outputs must be tensors."
            )
        self.lookup(name, where)
        if name not in self.graph.tensors:
            raise ModelError(f"{where}: body output '{name}' is not produced by any node or input.")
        self.graph.outputs.append(name)

    def _inline_if(self, node: onnx.NodeProto, cond: bool) -> None:
        """An If with a constant condition: the chosen branch's nodes join this graph and
        Identity ops give its outputs the If's output names."""
        attrs = {a.name: attribute_value(a, self.base_dir) for a in node.attribute}
        branch = attrs["then_branch" if cond else "else_branch"]
        where = f"If '{node.name or node.output[0]}'"
        if len(branch.output) < len([o for o in node.output if o]):
            raise ModelError(
                f"{where}: the chosen branch has {len(branch.output)} outputs, the node "
                f"{len(node.output)}."
            )
        for init in branch.initializer:
            self.graph.add_const(init.name, initializer_value(init, self.base_dir))
        for inner in nodes_in_order(branch, outer_ok=True):
            self.add(inner)
        settings = node_settings(node, {})
        for out, name in zip(node.output, (o.name for o in branch.output)):
            if not out:
                continue
            if self.sequences.is_value(name):  # a sequence or empty optional: alias it
                self.sequences.alias(name, out, settings, where)
                self.sequences.origin.setdefault(out, settings)
                continue
            self.lookup(name, where)
            identity = create_op("Identity", settings=settings, where=where)
            self.graph.add_op(identity, [name], [out])
            try_fold(self.graph, identity)


def _modified_in_place(graph: onnx.GraphProto, opsets: dict[str, int]) -> set[str]:
    """Names some node of the main graph writes in place (its op's ``modifies_inputs``)."""
    modified = set()
    for node in graph.node:
        domain = normalize_domain(node.domain)
        positions = modified_input_positions(node.op_type, domain, opsets.get(domain, 0))
        modified.update(node.input[i] for i in positions if i < len(node.input) and node.input[i])
    return modified


def _weight_uses(graph: onnx.GraphProto, opsets: dict[str, int]) -> set[str]:
    """Names some node reads as data, i.e. not only as a compile-time operand of its op."""
    used = set()
    for node in graph.node:
        const_positions = const_input_positions(
            node.op_type, normalize_domain(node.domain), opsets.get(normalize_domain(node.domain), 0)
        )
        used.update(n for i, n in enumerate(node.input) if n and i not in const_positions)
        used.update(captured_names(node))
    return used
