"""The annotation API of the Builder.

Placement (``virtualGraph``, ``pipelineStage``, ``executionPhase``), recomputation, name scopes,
backend hints and the generic node-attribute API all end up as node attributes; the ``__``
names are the contract with the importer (which maps ``__ipu_number``,
``__pipeline_stage``, ``__execution_phase``, ``__recompute_output_in_backward_pass`` and
``__schedule_priority`` into OpSettings) and with the PyTorch frontend, which writes the same
names. ``Builder`` inherits these methods from ``BuilderAnnotations``.
"""

from __future__ import annotations

import enum
from typing import Iterable

import numpy as np
import onnx
from onnx import AttributeProto, helper

from ..errors import popart_exception
from ..ir.op import RecomputeType
from .base import make_attribute

# Node attribute names.
IPU_ATTR = "__ipu_number"
PIPELINE_STAGE_ATTR = "__pipeline_stage"
EXECUTION_PHASE_ATTR = "__execution_phase"
RECOMPUTE_ATTR = "__recompute_output_in_backward_pass"
OUTPUT_LOCATION_ATTR = "__output_tensor_location"
PARTIALS_TYPE_ATTR = "__partials_type"
AVAILABLE_MEMORY_ATTR = "__available_memory"
CONV_DITHERING_ATTR = "__enable_conv_dithering"
EXCLUDE_PATTERNS_ATTR = "__exclude_patterns"
SCHEDULE_PRIORITY_ATTR = "__schedule_priority"
OUTLINE_ATTR = "__outline"
INPLACE_NAMES_ATTR = "__inplace_op_names"
INPLACE_PRIORITIES_ATTR = "__inplace_op_priorities"
SERIALIZE_MODE_ATTR = "__serialize_matmul_mode"
SERIALIZE_FACTOR_ATTR = "__serialize_matmul_factor"
SERIALIZE_PRECISION_ATTR = "__serialize_matmul_precision"
COMM_GROUP_ATTR = "__collectiveCommGroup"

_SERIALIZE_MODES = ("none", "input_channels", "reducing_dim", "output_channels")


def enum_int(value) -> int:
    return value.value if isinstance(value, enum.Enum) else int(value)


def _tensor_location_ints(location) -> list[int]:
    """``[storage, loadTileSet, storageTileSet, rts, commGroupType, groupSize]``."""
    if isinstance(location, (list, tuple)):
        return [int(v) for v in location]
    domain = getattr(location, "shardingDomain", None)
    return [
        enum_int(location.storage),
        enum_int(location.loadTileSet),
        enum_int(location.storageTileSet),
        enum_int(location.replicatedTensorSharding),
        enum_int(domain.type) if domain is not None else 0,
        int(domain.replicaGroupSize) if domain is not None else 0,
    ]


def python_attribute(name: str, value) -> AttributeProto:
    """An AttributeProto whose type follows the Python value (addNodeAttribute, customOp)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return make_attribute(name, int(value), AttributeProto.INT, "addNodeAttribute")
    if isinstance(value, (float, np.floating)):
        return make_attribute(name, value, AttributeProto.FLOAT, "addNodeAttribute")
    if isinstance(value, str):
        return make_attribute(name, value, AttributeProto.STRING, "addNodeAttribute")
    if isinstance(value, np.ndarray) and value.ndim > 0:
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value) and value:
            kind = AttributeProto.STRINGS
        elif any(isinstance(v, (float, np.floating)) for v in value):
            kind = AttributeProto.FLOATS
        else:
            kind = AttributeProto.INTS
        return make_attribute(name, value, kind, "addNodeAttribute")
    raise popart_exception(
        f"Attribute '{name}': values of type {type(value).__name__} cannot be stored on a node; "
        f"use an int, float, string or a list of one of them."
    )


def annotation_attribute(key: str, value) -> AttributeProto:
    """The node attribute a context manager's value becomes."""
    if key == SCHEDULE_PRIORITY_ATTR:
        return make_attribute(key, float(value), AttributeProto.FLOAT, key)
    if key == OUTLINE_ATTR:
        return make_attribute(key, value, AttributeProto.STRINGS, key)
    if key in (COMM_GROUP_ATTR, OUTPUT_LOCATION_ATTR):
        return make_attribute(key, value, AttributeProto.INTS, key)
    return make_attribute(key, enum_int(value), AttributeProto.INT, key)


class Annotate:
    """Context manager pushing one annotation value for the nodes created inside it."""

    def __init__(self, builder: "BuilderAnnotations", key: str, value):
        self._builder, self._key, self._value = builder, key, value

    def __enter__(self):
        self._builder._context.setdefault(self._key, []).append(self._value)
        return self

    def __exit__(self, *exc):
        self._builder._context[self._key].pop()
        return False


class NameContextManager:
    """Context manager of ``Builder.nameScope(name)``: pushes one name scope."""

    def __init__(self, builder: "BuilderAnnotations", name: str):
        self._builder, self._name = builder, name

    def __enter__(self):
        self._builder._name_scopes.append(self._name)
        return self

    def __exit__(self, *exc):
        self._builder._name_scopes.pop()
        return False


class BuilderAnnotations:
    """The annotation half of Builder: node attributes, placement, hints.

    Expects the Builder's ``_graph``, ``_ids``, ``_producer``, ``_context``, ``_name_scopes``
    and ``_changed()``.
    """

    def _scope(self) -> str:
        return "".join(scope + "/" for scope in self._name_scopes)

    def checkpointOutput(self, nodeOutputNames: Iterable[str]) -> list[str]:  # noqa: N802,N803
        """An Identity per id, annotated RecomputeType.Checkpoint; returns the new ids."""
        ids = [nodeOutputNames] if isinstance(nodeOutputNames, str) else list(nodeOutputNames)
        results = []
        with Annotate(self, RECOMPUTE_ATTR, RecomputeType.Checkpoint):
            for tensor_id in ids:
                results.append(self.aiOnnx.identity([tensor_id], debugContext="Checkpoint"))
        return results

    # --- node lookup and the node-attribute API ----------------------------------------

    @staticmethod
    def _id_list(ids) -> list[str]:
        return [ids] if isinstance(ids, str) else list(ids)

    def _node_of(self, ids, where: str) -> onnx.NodeProto:
        """The one node producing every id in ``ids``."""
        nodes = self._nodes_of(ids, where)
        if len(nodes) != 1:
            raise popart_exception(
                f"{where}: {self._id_list(ids)} are outputs of {len(nodes)} different nodes; "
                f"name outputs of one node."
            )
        return nodes[0]

    def _nodes_of(self, ids, where: str) -> list[onnx.NodeProto]:
        ids = self._id_list(ids)
        if not ids:
            raise popart_exception(f"{where}: no tensor ids given.")
        nodes: list[onnx.NodeProto] = []
        for tensor_id in ids:
            node = self._producer.get(tensor_id)
            if node is None:
                what = "a graph input or initializer" if tensor_id in self._ids else "unknown"
                raise popart_exception(
                    f"{where}: '{tensor_id}' is {what}, not the output of an op; annotations "
                    f"go on op outputs."
                )
            if not any(node is n for n in nodes):
                nodes.append(node)
        return nodes

    @staticmethod
    def _set_attribute(node: onnx.NodeProto, attribute: AttributeProto) -> None:
        for i, existing in enumerate(node.attribute):
            if existing.name == attribute.name:
                del node.attribute[i]
                break
        node.attribute.append(attribute)

    @staticmethod
    def _find_attribute(node: onnx.NodeProto, name: str) -> AttributeProto | None:
        for attribute in node.attribute:
            if attribute.name == name:
                return attribute
        return None

    def _annotate(self, ids, attribute: AttributeProto, where: str) -> None:
        for node in self._nodes_of(ids, where):
            self._set_attribute(node, attribute)
        self._changed()

    def addNodeAttribute(self, attributeName: str, attributeValue,  # noqa: N802,N803
                         nodeOutputNames) -> None:  # noqa: N803
        node = self._node_of(nodeOutputNames, "addNodeAttribute")
        if self._find_attribute(node, attributeName) is not None:
            raise popart_exception(
                f"addNodeAttribute: node '{node.name}' already has attribute '{attributeName}'; "
                f"removeNodeAttribute it first."
            )
        node.attribute.append(python_attribute(attributeName, attributeValue))
        self._changed()

    def nodeHasAttribute(self, attributeName: str, nodeOutputNames) -> bool:  # noqa: N802,N803
        node = self._node_of(nodeOutputNames, "nodeHasAttribute")
        return self._find_attribute(node, attributeName) is not None

    def _get_attribute(self, name: str, ids, kind: int, where: str):
        node = self._node_of(ids, where)
        attribute = self._find_attribute(node, name)
        if attribute is None:
            raise popart_exception(
                f"{where}: node '{node.name}' ({node.op_type}) has no attribute '{name}'; it has "
                f"{[a.name for a in node.attribute]}."
            )
        if attribute.type != kind:
            raise popart_exception(
                f"{where}: attribute '{name}' of node '{node.name}' is "
                f"{AttributeProto.AttributeType.Name(attribute.type)}, not "
                f"{AttributeProto.AttributeType.Name(kind)}."
            )
        value = helper.get_attribute_value(attribute)
        if kind == AttributeProto.STRING:
            return value.decode("utf-8")
        if kind == AttributeProto.STRINGS:
            return [v.decode("utf-8") for v in value]
        return list(value) if isinstance(value, (list, tuple)) or kind in (
            AttributeProto.INTS, AttributeProto.FLOATS) else value

    def getInt64NodeAttribute(self, attributeName: str, nodeOutputNames) -> int:  # noqa: N802,N803
        return self._get_attribute(attributeName, nodeOutputNames, AttributeProto.INT,
                                   "getInt64NodeAttribute")

    def getInt64VectorNodeAttribute(self, attributeName: str,  # noqa: N802,N803
                                    nodeOutputNames) -> list[int]:  # noqa: N803
        return self._get_attribute(attributeName, nodeOutputNames, AttributeProto.INTS,
                                   "getInt64VectorNodeAttribute")

    def getFloatNodeAttribute(self, attributeName: str,  # noqa: N802,N803
                              nodeOutputNames) -> float:  # noqa: N803
        return self._get_attribute(attributeName, nodeOutputNames, AttributeProto.FLOAT,
                                   "getFloatNodeAttribute")

    def getFloatVectorNodeAttribute(self, attributeName: str,  # noqa: N802,N803
                                    nodeOutputNames) -> list[float]:  # noqa: N803
        return self._get_attribute(attributeName, nodeOutputNames, AttributeProto.FLOATS,
                                   "getFloatVectorNodeAttribute")

    def getStringNodeAttribute(self, attributeName: str, nodeOutputNames) -> str:  # noqa: N802,N803
        return self._get_attribute(attributeName, nodeOutputNames, AttributeProto.STRING,
                                   "getStringNodeAttribute")

    def getStringVectorNodeAttribute(self, attributeName: str,  # noqa: N802,N803
                                     nodeOutputNames) -> list[str]:  # noqa: N803
        return self._get_attribute(attributeName, nodeOutputNames, AttributeProto.STRINGS,
                                   "getStringVectorNodeAttribute")

    def removeNodeAttribute(self, attributeName: str, nodeOutputNames) -> None:  # noqa: N802,N803
        node = self._node_of(nodeOutputNames, "removeNodeAttribute")
        for i, attribute in enumerate(node.attribute):
            if attribute.name == attributeName:
                del node.attribute[i]
                self._changed()
                return
        raise popart_exception(
            f"removeNodeAttribute: node '{node.name}' has no attribute '{attributeName}'."
        )

    def getAllNodeAttributeNames(self, nodeOutputNames) -> list[str]:  # noqa: N802,N803
        node = self._node_of(nodeOutputNames, "getAllNodeAttributeNames")
        return [a.name for a in node.attribute]

    # --- placement annotations ------------------------------

    def _placement(self, key: str, label: str, arg, value):
        """``label(ids, value)`` annotates nodes; ``label(value)`` is a context manager."""
        if value is None and isinstance(arg, (int, np.integer)) and not isinstance(arg, bool):
            return Annotate(self, key, int(arg))
        value = 0 if value is None else value
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise popart_exception(f"{label}: value must be an int, not {value!r}.")
        self._annotate(arg, make_attribute(key, int(value), AttributeProto.INT, label), label)
        return None

    def _context_value(self, key: str, label: str):
        stack = self._context.get(key)
        if not stack:
            raise popart_exception(
                f"{label}: no value is set by an enclosing context manager; check "
                f"{label.replace('get', 'has')}() first or pass tensor ids."
            )
        return stack[-1]

    def _node_int(self, key: str, ids, label: str) -> int:
        return self._get_attribute(key, ids, AttributeProto.INT, label)

    def virtualGraph(self, nodeOutputNames, value: int | None = None):  # noqa: N802,N803
        """``virtualGraph(ids, ipu)`` sets the IPU of the nodes producing ``ids``;
        ``with virtualGraph(ipu):`` sets it for every node created inside."""
        return self._placement(IPU_ATTR, "virtualGraph", nodeOutputNames, value)

    def getVirtualGraph(self, nodeOutputNames=None) -> int:  # noqa: N802,N803
        if nodeOutputNames is None:
            return self._context_value(IPU_ATTR, "getVirtualGraph")
        return self._node_int(IPU_ATTR, nodeOutputNames, "getVirtualGraph")

    def hasVirtualGraph(self, nodeOutputNames=None) -> bool:  # noqa: N802,N803
        if nodeOutputNames is None:
            return bool(self._context.get(IPU_ATTR))
        return self.nodeHasAttribute(IPU_ATTR, nodeOutputNames)

    def pipelineStage(self, nodeOutputNames, value: int | None = None):  # noqa: N802,N803
        return self._placement(PIPELINE_STAGE_ATTR, "pipelineStage", nodeOutputNames, value)

    def getPipelineStage(self, nodeOutputNames=None) -> int:  # noqa: N802,N803
        if nodeOutputNames is None:
            return self._context_value(PIPELINE_STAGE_ATTR, "getPipelineStage")
        return self._node_int(PIPELINE_STAGE_ATTR, nodeOutputNames, "getPipelineStage")

    def hasPipelineStage(self, nodeOutputNames=None) -> bool:  # noqa: N802,N803
        if nodeOutputNames is None:
            return bool(self._context.get(PIPELINE_STAGE_ATTR))
        return self.nodeHasAttribute(PIPELINE_STAGE_ATTR, nodeOutputNames)

    def executionPhase(self, nodeOutputNames, value: int | None = None):  # noqa: N802,N803
        return self._placement(EXECUTION_PHASE_ATTR, "executionPhase", nodeOutputNames, value)

    def getExecutionPhase(self, nodeOutputNames=None) -> int:  # noqa: N802,N803
        if nodeOutputNames is None:
            return self._context_value(EXECUTION_PHASE_ATTR, "getExecutionPhase")
        return self._node_int(EXECUTION_PHASE_ATTR, nodeOutputNames, "getExecutionPhase")

    def hasExecutionPhase(self, nodeOutputNames=None) -> bool:  # noqa: N802,N803
        if nodeOutputNames is None:
            return bool(self._context.get(EXECUTION_PHASE_ATTR))
        return self.nodeHasAttribute(EXECUTION_PHASE_ATTR, nodeOutputNames)

    def recomputeOutputInBackwardPass(self, nodeOutputNames,  # noqa: N802,N803
                                      value=RecomputeType.Recompute) -> None:
        value = value if isinstance(value, RecomputeType) else RecomputeType(int(value))
        self._annotate(
            nodeOutputNames,
            make_attribute(RECOMPUTE_ATTR, value.value, AttributeProto.INT, RECOMPUTE_ATTR),
            "recomputeOutputInBackwardPass",
        )

    def getRecomputeOutputInBackwardPass(self, nodeOutputNames) -> bool:  # noqa: N802,N803
        """True when the producing node is annotated RecomputeType.Recompute."""
        node = self._node_of(nodeOutputNames, "getRecomputeOutputInBackwardPass")
        attribute = self._find_attribute(node, RECOMPUTE_ATTR)
        return attribute is not None and attribute.i == RecomputeType.Recompute.value

    def recomputeOutput(self, value=RecomputeType.Recompute) -> Annotate:  # noqa: N802
        value = value if isinstance(value, RecomputeType) else RecomputeType(int(value))
        return Annotate(self, RECOMPUTE_ATTR, value)

    def schedulePriority(self, value: float) -> Annotate:  # noqa: N802
        return Annotate(self, SCHEDULE_PRIORITY_ATTR, float(value))

    def outlineAttributes(self, attributes: dict) -> Annotate:  # noqa: N802
        """Outlining hints for every node created inside, stored as [key, value, key, ...]."""
        flat = [str(s) for key, value in attributes.items() for s in (key, value)]
        return Annotate(self, OUTLINE_ATTR, flat)

    def commGroup(self, type=0, groupSize: int = 0) -> Annotate:  # noqa: N802,A002
        return Annotate(self, COMM_GROUP_ATTR, [enum_int(type), int(groupSize)])

    def outputTensorLocation(self, nodeOutputNames, value=None):  # noqa: N802,N803
        """``outputTensorLocation(ids, TensorLocation(...))``, or ``with
        outputTensorLocation(TensorLocation(...)):``."""
        if value is None:
            return Annotate(self, OUTPUT_LOCATION_ATTR, _tensor_location_ints(nodeOutputNames))
        self._annotate(
            nodeOutputNames,
            make_attribute(OUTPUT_LOCATION_ATTR, _tensor_location_ints(value),
                           AttributeProto.INTS, "outputTensorLocation"),
            "outputTensorLocation",
        )
        return None

    def nameScope(self, name: str) -> "NameContextManager":  # noqa: N802
        """Prefix ``name/`` to the ids and node names created inside (nests)."""
        if not name or "/" in name:
            raise popart_exception(f"nameScope: '{name}' must be a non-empty name without '/'.")
        return NameContextManager(self, name)

    def getNameScope(self, name: str = "") -> str:  # noqa: N802
        return self._scope() + name

    # --- backend hints -----------------------------------------------------------

    def setPartialsType(self, nodeOutputName: str, partialsType: str) -> None:  # noqa: N802,N803
        kind = partialsType.lower()
        if kind not in ("float", "half"):
            raise popart_exception(
                f"setPartialsType('{nodeOutputName}'): partials type '{partialsType}' is not "
                f"'float' or 'half'."
            )
        self._annotate(nodeOutputName,
                       make_attribute(PARTIALS_TYPE_ATTR, kind, AttributeProto.STRING, ""),
                       "setPartialsType")

    def getPartialsType(self, nodeOutputName: str) -> str:  # noqa: N802,N803
        """The partials type set on the node, or "float" (the default of the convolutions and
        matmuls that read it)."""
        node = self._node_of(nodeOutputName, "getPartialsType")
        attribute = self._find_attribute(node, PARTIALS_TYPE_ATTR)
        return attribute.s.decode("utf-8") if attribute is not None else "float"

    def setAvailableMemoryProportion(  # noqa: N802
        self, nodeOutputName, availableMemoryProportion: float  # noqa: N803
    ) -> None:
        value = float(availableMemoryProportion)
        if not 0.0 < value <= 1.0:
            raise popart_exception(
                f"setAvailableMemoryProportion: {value} is not in (0, 1]."
            )
        self._annotate(nodeOutputName,
                       make_attribute(AVAILABLE_MEMORY_ATTR, value, AttributeProto.FLOAT, ""),
                       "setAvailableMemoryProportion")

    def setEnableConvDithering(self, nodeOutputName, value: bool) -> None:  # noqa: N802,N803
        self._annotate(nodeOutputName,
                       make_attribute(CONV_DITHERING_ATTR, int(bool(value)), AttributeProto.INT,
                                      ""),
                       "setEnableConvDithering")

    def setSerializeMatMul(self, nodeOutputNames, mode: str, factor: int = 0,  # noqa: N802,N803
                           keep_precision: bool = False) -> None:
        if mode not in _SERIALIZE_MODES:
            raise popart_exception(
                f"setSerializeMatMul: unsupported mode '{mode}'; use one of "
                f"{list(_SERIALIZE_MODES)}."
            )
        for node in self._nodes_of(nodeOutputNames, "setSerializeMatMul"):
            if node.op_type != "MatMul":
                raise popart_exception(
                    f"setSerializeMatMul: node '{node.name}' is a {node.op_type}, not a MatMul."
                )
        label = "setSerializeMatMul"
        self._annotate(nodeOutputNames, make_attribute(SERIALIZE_MODE_ATTR, mode,
                                                       AttributeProto.STRING, label), label)
        if mode != "none":
            self._annotate(nodeOutputNames, make_attribute(SERIALIZE_FACTOR_ATTR, int(factor),
                                                           AttributeProto.INT, label), label)
            self._annotate(nodeOutputNames,
                           make_attribute(SERIALIZE_PRECISION_ATTR, int(bool(keep_precision)),
                                          AttributeProto.INT, label), label)

    def excludePatterns(self, nodeOutputName, patternNames: list[str]) -> None:  # noqa: N802,N803
        self._annotate(nodeOutputName,
                       make_attribute(EXCLUDE_PATTERNS_ATTR, list(patternNames),
                                      AttributeProto.STRINGS, "excludePatterns"),
                       "excludePatterns")

    def setInplacePreferences(self, nodeOutputName, prefs: dict) -> None:  # noqa: N802,N803
        label = "setInplacePreferences"
        self._annotate(nodeOutputName, make_attribute(
            INPLACE_NAMES_ATTR, list(prefs), AttributeProto.STRINGS, label), label)
        self._annotate(nodeOutputName, make_attribute(
            INPLACE_PRIORITIES_ATTR, [float(v) for v in prefs.values()], AttributeProto.FLOATS,
            label), label)
