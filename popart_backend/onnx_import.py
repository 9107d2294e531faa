"""ONNX ModelProto (path, bytes or proto) -> Ir, resolving each node through the op registry.

Constant folding runs while nodes are added, so an op needing a constant operand (Reshape's
shape, Slice's starts ...) sees the folded value of the shape arithmetic before it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from . import ops  # noqa: F401  (registers every op)
from .dtypes import DataType
from .errors import ModelError, ShapeError, UnsupportedOpError, popart_exception
from .ir.ir import Ir
from .ir.op import OpSettings, RecomputeType
from .ir.tensor import TensorInfo, TensorKind
from .ops.fused import FUSED_DOMAIN
from .ops.registry import AI_ONNX, const_input_positions, make_attrs, normalize_domain, resolve
from .transforms.const_fold import try_fold
from .onnx_sequences import StaticSequences

_log = logging.getLogger("popart:ir")

# Node attributes the Builder / frontend write for placement (spec §3.6); not op attributes.
ANNOTATION_PREFIX = "__"


@dataclasses.dataclass
class LoadedModel:
    proto: onnx.ModelProto
    base_dir: Path  # folder external data is read from


def load_model(model) -> LoadedModel:
    """Accept a file path, serialized bytes or a ModelProto (F2). Raises ModelError when unreadable."""
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
        return LoadedModel(proto, path.resolve().parent)
    raise ModelError(
        f"A model must be a path, bytes or onnx.ModelProto, not {type(model).__name__}."
    )


def initializer_value(init: onnx.TensorProto, base_dir: Path) -> np.ndarray:
    """The numpy value of an initializer, reading external data only from inside ``base_dir``."""
    if init.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in init.external_data}
        location = info.get("location", "")
        target = (base_dir / location).resolve()
        if not location or os.path.isabs(location) or not target.is_relative_to(base_dir.resolve()):
            raise ModelError(
                f"Initializer '{init.name}' stores its data in '{location}', outside the model's "
                f"folder '{base_dir}'. External data is read only from the model's folder; move "
                f"the file next to the model."
            )
        if not target.is_file():
            raise ModelError(
                f"Initializer '{init.name}': external data file '{target}' does not exist."
            )
        dtype = DataType.from_onnx(init.data_type).numpy
        offset = int(info.get("offset", 0))
        count = int(np.prod(init.dims, dtype=np.int64))
        with open(target, "rb") as f:
            f.seek(offset)
            raw = f.read(count * dtype.itemsize)
        if len(raw) != count * dtype.itemsize:
            raise ModelError(
                f"Initializer '{init.name}': external file '{location}' holds {len(raw)} bytes at "
                f"offset {offset}, {count * dtype.itemsize} needed."
            )
        return np.frombuffer(raw, dtype=dtype).reshape(tuple(init.dims)).copy()
    return numpy_helper.to_array(init).copy()


def attribute_value(attr: onnx.AttributeProto):
    """A Python value for an ONNX attribute (tensors as numpy arrays, graphs as GraphProto)."""
    value = onnx.helper.get_attribute_value(attr)
    if attr.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(value)
    if attr.type == onnx.AttributeProto.TENSORS:
        return tuple(numpy_helper.to_array(v) for v in value)
    if attr.type == onnx.AttributeProto.STRING:
        return value.decode("utf-8")
    if attr.type == onnx.AttributeProto.STRINGS:
        return tuple(v.decode("utf-8") for v in value)
    if isinstance(value, list):
        return tuple(value)
    return value


def node_settings(node: onnx.NodeProto, annotations: dict) -> OpSettings:
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
    )


def tensor_info_of(value_info: onnx.ValueInfoProto, shape_info: dict) -> TensorInfo:
    """Static TensorInfo of a graph input; unknown dims must come from ``inputShapeInfo`` (F7)."""
    name = value_info.name
    if name in shape_info:
        return shape_info[name]
    ttype = value_info.type.tensor_type
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
    return TensorInfo(DataType.from_onnx(ttype.elem_type), tuple(dims))


def import_model(
    model,
    input_shape_info: dict[str, TensorInfo] | None = None,
    constant_weights: bool = False,
    strict_op_versions: bool = True,
) -> Ir:
    """Build the forward Ir of ``model``.

    Float initializers read as data become VARIABLE tensors (CONST when ``constant_weights``:
    inference sessions with SessionOptions.constantWeights); other initializers are CONST.
    Graph inputs without initializer are host STREAMs.
    """
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    proto = loaded.proto
    opsets = {normalize_domain(o.domain): o.version for o in proto.opset_import}
    opsets.setdefault(AI_ONNX, 1 if not proto.opset_import else opsets.get(AI_ONNX, 1))
    ir = Ir(opsets)
    graph = ir.main
    shape_info = dict(input_shape_info or {})

    initializer_names = set()
    weight_uses = _weight_uses(proto.graph, opsets)
    for init in proto.graph.initializer:
        value = initializer_value(init, loaded.base_dir)
        info = TensorInfo.of(value)
        # A weight is a float initializer read as data by some op. Integer initializers and
        # operands only read at compile time (shapes, axes, scales) stay constants.
        is_weight = info.dtype.is_float and init.name in weight_uses
        kind = TensorKind.VARIABLE if is_weight and not constant_weights else TensorKind.CONST
        graph.add_tensor(init.name, info, kind, value)
        initializer_names.add(init.name)
    for value_info in proto.graph.input:
        if value_info.name in initializer_names:
            continue
        graph.add_tensor(value_info.name, tensor_info_of(value_info, shape_info), TensorKind.STREAM)
        graph.inputs.append(value_info.name)

    sequences = StaticSequences(graph)
    for node in _nodes_in_order(proto.graph):
        if sequences.handles(node):
            values = {a.name: attribute_value(a) for a in node.attribute}
            sequences.add(node, values, node_settings(node, {}))
            continue
        for name in node.input:
            if sequences.is_sequence(name):
                raise UnsupportedOpError(
                    f"{node.op_type} '{node.name}' reads the sequence '{name}'; only the ONNX "
                    f"sequence ops may consume sequences on the simulated IPU."
                )
        add_node(ir, node, strict_op_versions)

    for out in proto.graph.output:
        if sequences.is_sequence(out.name):
            raise UnsupportedOpError(
                f"Graph output '{out.name}' is a sequence; outputs must be tensors."
            )
        graph.tensor(out.name)  # raises naming the missing output
        graph.outputs.append(out.name)
    _log.debug("imported %d ops, %d tensors", len(graph.ops), len(graph.tensors))
    return ir


def add_node(ir: Ir, node: onnx.NodeProto, strict: bool = True):
    """Resolve, create and connect the op of one NodeProto, folding it when constant."""
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
    where = f"{node.op_type} '{node.name or node.output[0]}'"
    values, annotations = {}, {}
    for attr in node.attribute:
        target = annotations if attr.name.startswith(ANNOTATION_PREFIX) else values
        target[attr.name] = attribute_value(attr)
    attrs = make_attrs(cls, version, values, where)
    op = cls(attrs, node_settings(node, annotations), version)
    graph = ir.main
    for name in node.input:
        if name and name not in graph.tensors:
            raise ModelError(f"{where}: input '{name}' is not produced by any node or input.")
    graph.add_op(op, list(node.input), list(node.output))
    try_fold(graph, op)
    return op


def _weight_uses(graph: onnx.GraphProto, opsets: dict[str, int]) -> set[str]:
    """Names some node reads as data, i.e. not only as a compile-time operand of its op."""
    used = set()
    for node in graph.node:
        const_positions = const_input_positions(
            node.op_type, normalize_domain(node.domain), opsets.get(normalize_domain(node.domain), 0)
        )
        used.update(n for i, n in enumerate(node.input) if n and i not in const_positions)
    return used


def _nodes_in_order(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Nodes in topological order (ONNX requires it, but some producers do not comply)."""
    known = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending = list(graph.node)
    ordered = []
    while pending:
        rest = []
        for node in pending:
            if all(n in known for n in node.input):
                ordered.append(node)
                known.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            missing = sorted({n for node in rest for n in node.input if n not in known})
            raise ModelError(
                f"{len(rest)} node(s) read tensors no node or input produces: {missing[:10]}. "
                f"First: {rest[0].op_type} '{rest[0].name}'."
            )
        pending = rest
    return ordered
