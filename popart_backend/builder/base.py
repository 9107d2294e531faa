"""What every module of the builder package shares, below all of them: the domain names,
``make_attribute`` (a Python value as an AttributeProto of a given type), the ``NodeWriter``
protocol (the part of ``Builder`` an opset object writes its nodes through) and the ``Opset``
base class of the opset objects.

The opsets (``opsets.py``), the hand-written ai.graphcore methods (``nested.py``) and the
annotation API (``annotations.py``) import this module; ``builder.py`` composes them all. None of
them imports ``builder.py``: an opset object reaches its Builder only through ``NodeWriter``.
"""

from __future__ import annotations

import enum
from typing import Iterable, Protocol

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from ..errors import popart_exception

AI_ONNX = "ai.onnx"
AI_ONNX_ML = "ai.onnx.ml"
AI_GRAPHCORE = "ai.graphcore"



def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, enum.Enum)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, enum.Enum
    )


def make_attribute(name: str, value, attr_type: int, where: str) -> AttributeProto:
    """An AttributeProto of the schema's type; raises naming the op when the value does not fit."""

    def bad(expected: str):
        return popart_exception(
            f"{where}: attribute '{name}' expects {expected}, got {type(value).__name__} "
            f"{value!r}."
        )

    if isinstance(value, enum.Enum) and attr_type in (AttributeProto.INT, AttributeProto.FLOAT):
        value = value.value
    if attr_type == AttributeProto.INT:
        if isinstance(value, (bool, np.bool_)):
            value = int(value)
        if not _is_int(value):
            raise bad("an int")
        return helper.make_attribute(name, int(value), attr_type=attr_type)
    if attr_type == AttributeProto.FLOAT:
        if not _is_number(value):
            raise bad("a float")
        return helper.make_attribute(name, float(value), attr_type=attr_type)
    if attr_type == AttributeProto.STRING:
        if not isinstance(value, (str, bytes)):
            raise bad("a string")
        return helper.make_attribute(name, value, attr_type=attr_type)
    if attr_type in (AttributeProto.INTS, AttributeProto.FLOATS, AttributeProto.STRINGS):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise bad("a list")
        items = list(value.tolist() if isinstance(value, np.ndarray) else value)
        if attr_type == AttributeProto.INTS:
            items = [int(v) if isinstance(v, (bool, np.bool_)) else v for v in items]
            if not all(_is_int(v) for v in items):
                raise bad("a list of ints")
            items = [int(v) for v in items]
        elif attr_type == AttributeProto.FLOATS:
            if not all(_is_number(v) for v in items):
                raise bad("a list of floats")
            items = [float(v) for v in items]
        elif not all(isinstance(v, (str, bytes)) for v in items):
            raise bad("a list of strings")
        return helper.make_attribute(name, items, attr_type=attr_type)
    if attr_type == AttributeProto.TENSOR:
        if isinstance(value, onnx.TensorProto):
            return helper.make_attribute(name, value, attr_type=attr_type)
        if isinstance(value, (np.ndarray, np.generic, int, float, bool)):
            return helper.make_attribute(
                name, numpy_helper.from_array(np.asarray(value)), attr_type=attr_type
            )
        raise bad("a numpy array")
    if attr_type == AttributeProto.TENSORS:
        return helper.make_attribute(
            name,
            [v if isinstance(v, onnx.TensorProto) else numpy_helper.from_array(np.asarray(v))
             for v in value],
            attr_type=attr_type,
        )
    if attr_type == AttributeProto.GRAPH:
        graph = value.subgraph_proto() if hasattr(value, "subgraph_proto") else value
        if not isinstance(graph, onnx.GraphProto):
            raise bad("a subgraph builder (builder.createSubgraphBuilder()) or a GraphProto")
        return helper.make_attribute(name, graph)
    if attr_type in (AttributeProto.SPARSE_TENSOR, AttributeProto.TYPE_PROTO):
        return helper.make_attribute(name, value, attr_type=attr_type)
    raise popart_exception(
        f"{where}: attribute '{name}' has type {AttributeProto.AttributeType.Name(attr_type)}, "
        f"which the Builder cannot write yet."
    )


class NodeWriter(Protocol):
    """The part of ``Builder`` an opset object writes nodes through."""

    def _check_known(self, ids: Iterable[str], where: str) -> None:
        """Raise unless every id is a tensor of the builder (or of an enclosing one)."""

    def _fix_opset(self, domain: str, version: int, name: str | None = None) -> None:
        """Fix ``domain``'s opset version for the model; raise if another one is fixed."""

    def _add_node(self, op_type: str, domain: str, inputs: list[str], num_outputs: int,
                  attributes: list[AttributeProto], debug_context: str) -> list[str]:
        """Append a node with the builder's annotations; returns its output ids."""


class Opset:
    """Base of the generated opset classes; ``builder.aiOnnx`` etc. are instances."""

    domain: str = AI_ONNX
    version: int = 0
    name: str = ""

    def __init__(self, builder: NodeWriter):
        self.builder = builder

    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        raise AttributeError(
            f"{self.name} has no op '{item}'. Op methods are lower-case ONNX names of "
            f"{self.domain} opset {self.version} (e.g. 'add', 'matmul', 'reducesum')."
        )

    def __repr__(self) -> str:
        return f"<{self.name}: {self.domain} opset {self.version}>"
