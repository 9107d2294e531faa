"""Reading the tensors an ONNX model stores (initializers, Constant and other tensor attributes,
in the main graph and in subgraphs) as a file from an untrusted source may hold them.

Before any byte is read or allocated: the element type must be known, the declared size must
pass the resource guard (``limits.py``), raw data must have the size the dims and type say,
and external data is read only from a file inside the model's folder. Anything onnx or numpy
would raise while decoding becomes a ``ModelError`` naming the tensor.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ..dtypes import DataType
from ..errors import ModelError, ResourceLimitError, popart_exception
from ..limits import MAX_SUBGRAPH_DEPTH, check_bytes, declared_bytes

__all__ = ["check_model_bounds", "tensor_value"]


def _dtype(tensor: onnx.TensorProto, what: str) -> DataType:
    try:
        dtype = DataType.from_onnx(tensor.data_type)
    except popart_exception as exc:
        raise ModelError(f"{what}: {exc}") from None
    if dtype is DataType.UNDEFINED:
        raise ModelError(f"{what}: has no element type (data_type 0). Set its data_type.")
    return dtype


def declared_tensor_bytes(tensor: onnx.TensorProto, what: str) -> int:
    """Bytes the dims and type of ``tensor`` declare (refusing negative dims)."""
    return declared_bytes(tensor.dims, _dtype(tensor, what).bits, what)


def _external_bytes(tensor: onnx.TensorProto, base_dir: Path | None, num_bytes: int,
                    what: str) -> bytes:
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    if base_dir is None:
        raise ModelError(
            f"{what} stores its data in the external file '{location}', but this model has no "
            f"folder to read it from. Load the model from its .onnx file."
        )
    root = base_dir.resolve()
    target = (root / location).resolve() if location and "\x00" not in location else root
    if not location or os.path.isabs(location) or target == root or not target.is_relative_to(
            root):
        raise ModelError(
            f"{what} stores its data in '{location}', outside the model's folder '{base_dir}'. "
            f"External data is read only from the model's folder; move the file next to the "
            f"model."
        )
    if not target.is_file():
        raise ModelError(f"{what}: external data file '{target}' does not exist.")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else num_bytes
    except ValueError:
        raise ModelError(
            f"{what}: external data offset {info.get('offset')!r} / length "
            f"{info.get('length')!r} are not integers."
        ) from None
    if offset < 0 or length < num_bytes:
        raise ModelError(
            f"{what}: external data at offset {offset} with length {length}; the dims and type "
            f"need {num_bytes} bytes at a non-negative offset."
        )
    with open(target, "rb") as f:
        f.seek(offset)
        raw = f.read(num_bytes)
    if len(raw) != num_bytes:
        raise ModelError(
            f"{what}: external file '{location}' holds {len(raw)} bytes at offset {offset}, "
            f"{num_bytes} needed."
        )
    return raw


def tensor_value(tensor: onnx.TensorProto, base_dir: Path | None, what: str) -> np.ndarray:
    """The numpy value of a stored tensor (``what`` names it in errors, e.g. "Initializer 'w'").

    External data is read only from inside ``base_dir`` (None: external data is refused).
    Raises ResourceLimitError when the declared size is over the guard, ModelError when the
    stored data does not match the declared dims and type.
    """
    dtype = _dtype(tensor, what)
    dims = [int(d) for d in tensor.dims]
    num_bytes = declared_bytes(dims, dtype.bits, what)
    check_bytes(num_bytes, f"{what} ({dtype.name}{dims})")
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        inline = onnx.TensorProto()
        inline.CopyFrom(tensor)
        del inline.external_data[:]
        inline.data_location = onnx.TensorProto.DEFAULT
        inline.raw_data = _external_bytes(tensor, base_dir, num_bytes, what)
        tensor = inline
    elif tensor.raw_data and dtype is not DataType.STRING and dtype.bits % 8 == 0 and (
            len(tensor.raw_data) != num_bytes):
        raise ModelError(
            f"{what}: raw_data holds {len(tensor.raw_data)} bytes, but {dtype.name}{dims} "
            f"needs {num_bytes} ({dtype.bits // 8} per element). Rewrite the tensor with "
            f"numpy_helper.from_array."
        )
    try:
        # onnx decodes raw bytes of every type (ml_dtypes arrays for float8, int4 ...).
        value = numpy_helper.to_array(tensor).copy()
    except Exception as exc:  # onnx/numpy decoding errors (ValueError, TypeError ...)
        raise ModelError(
            f"{what}: its data does not decode as {dtype.name}{dims} "
            f"({type(exc).__name__}: {exc})."
        ) from None
    if tuple(value.shape) != tuple(dims):
        raise ModelError(
            f"{what}: its data decodes to shape {list(value.shape)}, the tensor declares {dims}."
        )
    return value


def _subgraphs(graph: onnx.GraphProto):
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield node, attr.g
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield node, sub


def _check_text(values, where: str) -> None:
    """Protobuf hands back invalid UTF-8 in string fields as bytes: refuse such names."""
    for value in values:
        if not isinstance(value, str):
            raise ModelError(
                f"{where}: the name {value!r} is not valid UTF-8 text. The file is corrupt or "
                f"not an ONNX model."
            )


def _check_graph_text(graph: onnx.GraphProto) -> None:
    _check_text([graph.name], "A graph name")
    _check_text([v.name for v in (*graph.input, *graph.output, *graph.value_info)],
                f"Graph '{graph.name}' inputs and outputs")
    _check_text([t.name for t in graph.initializer], f"Graph '{graph.name}' initializers")
    for node in graph.node:
        _check_text([node.name, node.op_type, node.domain], f"Graph '{graph.name}' nodes")
        where = f"{node.op_type} '{node.name}'"
        _check_text([*node.input, *node.output], f"{where} inputs and outputs")
        _check_text([a.name for a in node.attribute], f"{where} attributes")


def check_model_bounds(model: onnx.ModelProto) -> None:
    """Before anything is read: every name is text, subgraphs nest at most MAX_SUBGRAPH_DEPTH
    deep, and the declared bytes of all initializers and tensor attributes (every graph) pass
    the resource guard."""
    _check_text([o.domain for o in model.opset_import], "The model's opset domains")
    total, stack = 0, [(model.graph, 0)]
    while stack:
        current, depth = stack.pop()
        _check_graph_text(current)
        for init in current.initializer:
            total += declared_tensor_bytes(init, f"Initializer '{init.name}'")
        for node in current.node:
            for attr in node.attribute:
                tensors = [attr.t] if attr.type == onnx.AttributeProto.TENSOR else (
                    list(attr.tensors) if attr.type == onnx.AttributeProto.TENSORS else [])
                for t in tensors:
                    total += declared_tensor_bytes(
                        t, f"{node.op_type} '{node.name}' attribute '{attr.name}'")
        for node, sub in _subgraphs(current):
            if depth + 1 > MAX_SUBGRAPH_DEPTH:
                raise ResourceLimitError(
                    f"{node.op_type} '{node.name}': subgraphs nest more than "
                    f"{MAX_SUBGRAPH_DEPTH} levels deep. Flatten the model's control flow."
                )
            stack.append((sub, depth + 1))
    check_bytes(total, "The model's initializers and constant attributes")
