"""Builder: PopART's API for writing an ONNX ModelProto by hand.

A Builder starts empty or from an existing model (path, bytes or ModelProto), adds
inputs, initializers, op nodes (through the generated opset objects of ``opsets.py``) and
outputs, and returns the model with ``getModelProto()``. Placement and other annotations are
written as ``__``-prefixed node attributes by the methods ``Builder`` inherits from
``annotations.BuilderAnnotations``; the importer turns them into ``OpSettings``.
"""

from __future__ import annotations

import copy
import logging
import os
import re
from pathlib import Path
from typing import Iterable

import numpy as np
import onnx
import onnx.shape_inference
from onnx import AttributeProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from ..dtypes import DataType
from ..errors import ModelError, popart_exception
from ..files import write_bytes_atomic
from ..importer.graph_walk import captured_names
from ..importer.onnx_model import LoadedModel, import_model, initializer_value, load_model
from ..ir.op import RecomputeType
from ..ir.tensor import TensorInfo as IrTensorInfo
from ..tensorinfo import (
    INPUT_SETTINGS_KEY_PREFIX,
    InputSettings,
    TensorInfo,
    encode_input_settings,
)
from .annotations import BuilderAnnotations, annotation_attribute, python_attribute
from .base import AI_GRAPHCORE, AI_ONNX, AI_ONNX_ML, Opset
from .opsets import MAX_ONNX_OPSET, MIN_ONNX_OPSET, opset_class
from .variable_settings import VariableSettings

__all__ = ["Builder", "RecomputeType"]

_log = logging.getLogger("popart:builder")
_LOGGED: set[str] = set()


def _log_once(key: str, message: str, *args) -> None:
    if key not in _LOGGED:
        _LOGGED.add(key)
        _log.warning(message, *args)


def _check_variable_settings(settings, tensor_id: str) -> None:
    if not isinstance(settings, VariableSettings):
        raise popart_exception(
            f"addInitializedInputTensor('{tensor_id}'): variableSettings must be a "
            f"VariableSettings, got {type(settings).__name__}."
        )


DEFAULT_ONNX_OPSET = 10

_OPSET_NAME = re.compile(r"aiOnnxOpset(\d+)$")


class Builder(BuilderAnnotations):
    """Build (or extend) an ONNX model the PopART way."""

    def __init__(self, modelProtoOrFilename=None, opsets: dict | None = None):  # noqa: N803
        self._opsets: dict[str, int] = {}  # domain -> version fixed so far
        self._used_domains: set[str] = set()
        self._external_dir: Path | None = None
        self._context: dict[str, list] = {}
        self._name_scopes: list[str] = []
        self._opset_objects: dict[tuple[str, int], Opset] = {}
        self._analysis: tuple[int, onnx.ModelProto] | None = None
        self._ir_cache: tuple[int, dict] | None = None  # revision, tensor id -> Ir
        self._revision = 0
        if modelProtoOrFilename is None:
            self._model = helper.make_model(helper.make_graph([], "BuilderGraph", [], []))
            self._model.producer_name = "popart_backend"
            self._new_model = True
        else:
            self._model = self._load(modelProtoOrFilename)
            self._new_model = False
            for entry in self._model.opset_import:
                domain = AI_ONNX if entry.domain in ("", AI_ONNX) else entry.domain
                self._opsets[domain] = entry.version
                self._used_domains.add(domain)
        self._graph = self._model.graph
        self._ids: set[str] = set()
        self._node_names: set[str] = {n.name for n in self._graph.node if n.name}
        self._producer: dict[str, onnx.NodeProto] = {}
        for value in list(self._graph.input) + list(self._graph.value_info):
            self._ids.add(value.name)
        self._ids.update(init.name for init in self._graph.initializer)
        for node in self._graph.node:
            for out in node.output:
                if out:
                    self._ids.add(out)
                    self._producer[out] = node
        # Subgraph builders (createSubgraphBuilder) share one id space with their root: ONNX
        # names are unique across a model and its subgraphs.
        self._parent: Builder | None = None
        self._taken: set[str] = set(self._ids)
        for domain, version in (opsets or {}).items():
            self._fix_opset(AI_ONNX if domain in ("", AI_ONNX) else domain, int(version))

    @staticmethod
    def _load(model) -> onnx.ModelProto:
        if isinstance(model, onnx.ModelProto):
            return copy.deepcopy(model)
        if isinstance(model, (str, os.PathLike)) and not isinstance(model, bytes):
            path = Path(model)
            if not path.is_file():
                raise ModelError(f"Builder: ONNX model file '{path}' does not exist.")
            try:
                return onnx.load(str(path))  # external data is read from the model's folder
            except Exception as exc:  # protobuf/IO errors have no common base
                raise ModelError(f"Builder: could not read ONNX model '{path}': {exc}") from None
        if isinstance(model, (bytes, bytearray)):
            return load_model(bytes(model)).proto
        raise ModelError(
            f"Builder(modelProtoOrFilename): expected a path, bytes or onnx.ModelProto, not "
            f"{type(model).__name__}."
        )

    # --- opsets -------------------------------------------------------------------

    def _fix_opset(self, domain: str, version: int, name: str | None = None) -> None:
        fixed = self._opsets.get(domain)
        if fixed is not None and fixed != version:
            if domain == AI_ONNX:
                raise popart_exception(
                    f"Invalid opset '{name or f'aiOnnxOpset{version}'}' selected. Opset for "
                    f"domain ai.onnx already defined as {fixed}"
                )
            raise popart_exception(
                f"Invalid opset {version} for domain {domain}: already defined as {fixed}."
            )
        if domain == AI_ONNX and fixed is None and not MIN_ONNX_OPSET <= version <= MAX_ONNX_OPSET:
            raise popart_exception(
                f"ai.onnx opset {version} is not available in the Builder; it supports opsets "
                f"{MIN_ONNX_OPSET}..{MAX_ONNX_OPSET}."
            )
        if domain == AI_GRAPHCORE and version != 1:
            raise popart_exception(
                f"ai.graphcore opset {version} does not exist; the only version is 1."
            )
        self._opsets[domain] = version

    def _opset(self, domain: str, version: int, name: str) -> Opset:
        self._fix_opset(domain, version, name)
        key = (domain, version)
        if key not in self._opset_objects:
            cls_name = {AI_ONNX: f"aiOnnxOpset{version}", AI_GRAPHCORE: "aiGraphcoreOpset1"}.get(
                domain, f"aiOnnxMlOpset{version}"
            )
            self._opset_objects[key] = opset_class(domain, version, cls_name)(self)
        return self._opset_objects[key]

    @property
    def aiOnnx(self) -> Opset:  # noqa: N802 - PopART's names
        """The ai.onnx opset of this builder: fixed by ``opsets``, the loaded model or the first
        ``aiOnnxOpsetN`` used; opset 10 otherwise."""
        version = self._opsets.get(AI_ONNX, DEFAULT_ONNX_OPSET)
        return self._opset(AI_ONNX, version, f"aiOnnxOpset{version}")

    @property
    def aiGraphcore(self) -> Opset:  # noqa: N802
        return self._opset(AI_GRAPHCORE, 1, "aiGraphcoreOpset1")

    aiGraphcoreOpset1 = aiGraphcore

    @property
    def aiOnnxMlOpset1(self) -> Opset:  # noqa: N802
        return self._opset(AI_ONNX_ML, 1, "aiOnnxMlOpset1")

    def __getattr__(self, item: str):
        match = _OPSET_NAME.match(item)
        if match is None:
            raise AttributeError(f"'Builder' object has no attribute '{item}'")
        version = int(match.group(1))
        if not MIN_ONNX_OPSET <= version <= MAX_ONNX_OPSET:
            raise AttributeError(
                f"Builder has no {item}: ai.onnx opsets {MIN_ONNX_OPSET}..{MAX_ONNX_OPSET} are "
                f"available."
            )
        return self._opset(AI_ONNX, version, item)

    # --- nodes -------------------------------------------------------------------------------

    def _unique_id(self, base: str) -> str:
        candidate, n = base, 0
        while candidate in self._ids or candidate in self._taken:
            n += 1
            candidate = f"{base}/{n}"
        self._ids.add(candidate)
        self._taken.add(candidate)
        return candidate

    def _unique_node_name(self, base: str) -> str:
        candidate, n = base, 0
        while candidate in self._node_names:
            n += 1
            candidate = f"{base}_{n}"
        self._node_names.add(candidate)
        return candidate

    def _changed(self) -> None:
        self._revision += 1

    def _check_known(self, ids: Iterable[str], where: str) -> None:
        unknown = [i for i in ids if i and not self._visible(i)]
        if unknown:
            raise popart_exception(
                f"{where}: input(s) {unknown} are not tensors of this builder. Use ids returned "
                f"by addInputTensor, addInitializedInputTensor or an op method."
            )

    def _add_node(self, op_type: str, domain: str, inputs: list[str], num_outputs: int,
                  attributes: list[AttributeProto], debug_context: str) -> list[str]:
        scope = self._scope()
        base = debug_context or op_type
        outputs = [self._unique_id(f"{scope}{base}:{i}") for i in range(num_outputs)]
        node = helper.make_node(
            op_type, inputs, outputs, name=self._unique_node_name(scope + base),
            domain="" if domain == AI_ONNX else domain,
        )
        node.attribute.extend(attributes)
        for key, stack in self._context.items():
            if stack and not any(a.name == key for a in node.attribute):
                node.attribute.append(annotation_attribute(key, stack[-1]))
        self._graph.node.append(node)
        node = self._graph.node[-1]  # append copies; keep the stored message
        for out in outputs:
            self._producer[out] = node
        self._used_domains.add(domain)
        self._changed()
        _log.log(5, "%s %s(%s) -> %s", domain, op_type, ", ".join(inputs), ", ".join(outputs))
        return outputs

    def customOp(  # noqa: N802 - PopART's names
        self,
        opName: str,  # noqa: N803
        opVersion: int,  # noqa: N803
        domain: str,
        inputs: list[str],
        attributes: dict | None = None,
        numOutputs: int = 1,  # noqa: N803
        name: str = "",
    ) -> list[str]:
        """A node of a custom op; attribute types follow the Python values."""
        domain = domain or AI_ONNX
        if domain == AI_ONNX:
            raise popart_exception(
                f"customOp('{opName}'): use builder.aiOnnx.{opName.lower()} for ai.onnx ops."
            )
        where = f"customOp {domain}::{opName}"
        if isinstance(inputs, str) or not all(isinstance(i, str) for i in inputs):
            raise popart_exception(f"{where}: inputs must be a list of tensor ids.")
        self._check_known(inputs, where)
        self._fix_opset(domain, int(opVersion))
        attrs = [python_attribute(k, v) for k, v in (attributes or {}).items()]
        return self._add_node(opName, domain, list(inputs), int(numOutputs), attrs, name)

    def reshape_const(self, aiOnnx: Opset, args: list[str], shape,  # noqa: N803
                      debugContext: str = "") -> str:  # noqa: N803
        """Reshape ``args[0]`` to the constant ``shape`` (a Constant node feeds Reshape)."""
        if len(args) != 1:
            raise popart_exception(f"reshape_const: takes one input id, got {list(args)}.")
        prefix = debugContext or "Reshape"
        const = aiOnnx.constant(np.asarray(shape, dtype=np.int64), debugContext=prefix + "_shape")
        return aiOnnx.reshape([args[0], const], debugContext=debugContext)

    # --- inputs, initializers, outputs ---------------------------------------------

    def addInputTensor(self, *args, **kwargs) -> str:  # noqa: N802
        """``addInputTensor(TensorInfo, settings=InputSettings(), debugContext="")`` or
        ``addInputTensor(dataType: str, shape, settings=InputSettings(), debugContext="")``."""
        args = list(args)
        if "debugPrefix" in kwargs:
            kwargs["debugContext"] = kwargs.pop("debugPrefix")
        first = args.pop(0) if args else kwargs.pop("tensorInfo", kwargs.pop("dataType", None))
        if isinstance(first, IrTensorInfo):
            first = TensorInfo.from_ir(first)
        if isinstance(first, TensorInfo):
            info = first
        elif isinstance(first, (str, DataType)):
            shape = args.pop(0) if args else kwargs.pop("shape", None)
            if shape is None:
                raise popart_exception(
                    f"addInputTensor('{first}'): give the shape too, e.g. "
                    f"addInputTensor('FLOAT', [2, 3])."
                )
            info = TensorInfo(first, shape)
        else:
            raise popart_exception(
                f"addInputTensor: expected a TensorInfo or a data type string and a shape, got "
                f"{type(first).__name__} {first!r}."
            )
        settings, debug_context = InputSettings(), ""
        for value in args:
            if isinstance(value, InputSettings):
                settings = value
            elif isinstance(value, str):
                debug_context = value
            else:
                raise popart_exception(
                    f"addInputTensor: unexpected argument {value!r}; after the tensor info come "
                    f"an InputSettings and a debugContext string."
                )
        settings = kwargs.pop("settings", settings)
        debug_context = kwargs.pop("debugContext", debug_context)
        if kwargs:
            raise popart_exception(f"addInputTensor: unknown argument(s) {sorted(kwargs)}.")
        if not isinstance(settings, InputSettings):
            raise popart_exception(
                f"addInputTensor: settings must be an InputSettings, not {settings!r}."
            )
        if info.metaShape():
            raise popart_exception(
                f"addInputTensor: {info!r} has metaShape {info.metaShape()}; inputs sharded "
                f"over replicas are not modelled. Give the TensorInfo without a metaShape."
            )
        tensor_id = self._unique_id(self._scope() + (debug_context or "input"))
        self._graph.input.append(
            helper.make_tensor_value_info(tensor_id, info.dtype.onnx, info.shape())
        )
        if not settings.is_default():
            entry = self._model.metadata_props.add()
            entry.key = INPUT_SETTINGS_KEY_PREFIX + tensor_id
            entry.value = encode_input_settings(settings)
        self._changed()
        return tensor_id

    def addInitializedInputTensor(self, initVal, *args, **kwargs) -> str:  # noqa: N802,N803
        """An initializer holding ``initVal``: a weight in training.

        ``(initVal, debugContext="")`` or ``(initVal, variableSettings, debugContext="")``.
        With ``VariableSettings`` of several replica groups, ``initVal`` holds one value per
        group along a leading dimension (see ``variable_settings.py``); the settings are
        recorded in the model's metadata."""
        settings = kwargs.pop("variableSettings", None)
        if args and isinstance(args[0], VariableSettings):
            settings, args = args[0], args[1:]
        debugContext = kwargs.pop("debugContext", args[0] if args else "")  # noqa: N806
        if kwargs or len(args) > 1:
            raise popart_exception(
                "addInitializedInputTensor: expected (initVal, debugContext) or (initVal, "
                f"variableSettings, debugContext); got extra {args[1:]!r} {sorted(kwargs)}."
            )
        array = np.asarray(initVal)
        if array.dtype == object and not all(isinstance(v, (str, bytes)) for v in array.flat):
            raise popart_exception(
                "addInitializedInputTensor: an object array can only hold strings (a STRING "
                f"tensor); got {sorted({type(v).__name__ for v in array.flat})}. Give a numpy "
                f"array of numbers or strings."
            )
        DataType.from_numpy(array.dtype)  # raises for dtypes ONNX cannot hold
        if not isinstance(debugContext, str):
            raise popart_exception("addInitializedInputTensor: debugContext must be a string.")
        if settings is not None:
            _check_variable_settings(settings, debugContext)
        tensor_id = self._unique_id(self._scope() + (debugContext or "init_input"))
        self._graph.initializer.append(numpy_helper.from_array(array, tensor_id))
        if settings is not None:
            settings._record(self._model, tensor_id)
        self._changed()
        return tensor_id

    def addOutputTensor(self, outputName: str) -> None:  # noqa: N802,N803
        """Mark ``outputName`` as an ONNX graph output. Anchoring is separate."""
        self._check_known([outputName], "addOutputTensor")
        if outputName in self.getOutputTensorIds():
            raise popart_exception(f"addOutputTensor: '{outputName}' is already an output.")
        self._graph.output.append(helper.make_empty_tensor_value_info(outputName))
        self._changed()

    # --- introspection -----------------------------------------------------------------

    def _proto(self) -> onnx.ModelProto:
        model = copy.deepcopy(self._model)
        domains = {d: v for d, v in self._opsets.items() if d in self._used_domains}
        domains.setdefault(AI_ONNX, self._opsets.get(AI_ONNX, DEFAULT_ONNX_OPSET))
        del model.opset_import[:]
        for domain, version in sorted(domains.items()):
            model.opset_import.append(
                helper.make_opsetid("" if domain == AI_ONNX else domain, version)
            )
        if self._new_model:
            minimum = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
            # IR 7 and later let initializers stay out of the graph inputs.
            model.ir_version = max(minimum, 7)
        return model

    def getModelProto(self) -> bytes:  # noqa: N802
        return self._proto().SerializeToString()

    def saveModelProto(self, filename) -> None:  # noqa: N802
        """Write the model; externally saved initializers must sit in the same folder."""
        folder = Path(filename).resolve().parent
        if self._external_dir is not None and self._external_dir != folder:
            raise popart_exception(
                f"saveModelProto('{filename}'): initializers were saved externally into "
                f"'{self._external_dir}', and the model must sit in that folder to find them. "
                f"Save the model there."
            )
        write_bytes_atomic(filename, self.getModelProto())

    def saveInitializersExternally(self, ids: Iterable[str], filename) -> None:  # noqa: N802
        """Move the data of initializers ``ids`` to ``filename``; the model keeps a reference
        by file name, so keep the file next to the saved model."""
        ids = [ids] if isinstance(ids, str) else list(dict.fromkeys(ids))
        inits = {init.name: init for init in self._graph.initializer}
        missing = [i for i in ids if i not in inits]
        if missing:
            raise popart_exception(
                f"saveInitializersExternally: {missing} are not initializers; initializers are "
                f"{sorted(inits)}."
            )
        path = Path(filename).resolve()
        if self._external_dir is not None and self._external_dir != path.parent:
            raise popart_exception(
                f"saveInitializersExternally: external data already lives in "
                f"'{self._external_dir}'; use one folder for all external data."
            )
        # Initializers already in that file are written again, or replacing it would lose them.
        ids += [init.name for init in self._graph.initializer
                if init.name not in ids and init.data_location == onnx.TensorProto.EXTERNAL
                and {e.key: e.value for e in init.external_data}.get("location") == path.name]
        # Build the new initializers first: the model changes only once the file is in place.
        offset, chunks, updated = 0, [], []
        for tensor_id in ids:
            value = initializer_value(inits[tensor_id], self._external_dir or path.parent)
            init = numpy_helper.from_array(value, tensor_id)
            raw = init.raw_data
            chunks.append(raw)
            set_external_data(init, path.name, offset=offset, length=len(raw))
            init.data_location = onnx.TensorProto.EXTERNAL
            init.ClearField("raw_data")
            updated.append((inits[tensor_id], init))
            offset += len(raw)
        write_bytes_atomic(path, b"".join(chunks))
        for old, new in updated:
            old.CopyFrom(new)
        self._external_dir = path.parent
        self._changed()

    def getInputTensorIds(self) -> list[str]:  # noqa: N802
        """Graph inputs fed from the host (initializers are listed by getTrainableTensorIds)."""
        inits = {init.name for init in self._graph.initializer}
        return [v.name for v in self._graph.input if v.name not in inits]

    def getOutputTensorIds(self) -> list[str]:  # noqa: N802
        return [v.name for v in self._graph.output]

    def getValueTensorIds(self) -> list[str]:  # noqa: N802
        """Ids produced by nodes that are not graph outputs (ONNX's ``value_info`` tensors)."""
        outputs = set(self.getOutputTensorIds())
        return [o for n in self._graph.node for o in n.output if o and o not in outputs]

    def getTrainableTensorIds(self) -> list[str]:  # noqa: N802
        return [init.name for init in self._graph.initializer]

    def isInitializer(self, tensorId: str) -> bool:  # noqa: N802,N803
        return any(init.name == tensorId for init in self._graph.initializer)

    def setGraphName(self, name: str) -> None:  # noqa: N802
        self._graph.name = name

    # --- subgraphs ---------------------------------------------------------------------

    def createSubgraphBuilder(self) -> "Builder":  # noqa: N802
        """A child builder whose graph is passed to ``logical_if``, ``loop``, ``scan`` or
        ``aiGraphcore.call``. It shares the model's opsets and id space; its ops may read the
        tensors of enclosing builders (``addInputTensorFromParentGraph`` declares one, as
        PopART asks). Its ``addInputTensor`` / ``addUntypedInputTensor`` add the subgraph's
        formal inputs, ``addOutputTensor`` its outputs."""
        child = Builder.__new__(Builder)
        child._opsets = self._opsets  # one opset per domain for the model and its subgraphs
        child._used_domains = self._used_domains
        child._external_dir = None
        child._context = {}
        child._name_scopes = []
        child._opset_objects = {}
        child._analysis = None
        child._ir_cache = None
        child._revision = 0
        child._model = helper.make_model(helper.make_graph([], "subgraph", [], []))
        child._new_model = True
        child._graph = child._model.graph
        child._ids = set()
        child._node_names = self._node_names
        child._producer = {}
        child._parent = self
        child._taken = self._taken
        count = getattr(self, "_subgraph_count", 0)
        self._subgraph_count = count + 1
        child.setGraphName(f"{self._graph.name or 'graph'}_subgraph{count}")
        return child

    _createSubgraphBuilder = createSubgraphBuilder  # noqa: N815 - PopART's binding name

    def embedReplicationFactor(self, replicationFactor: int) -> None:  # noqa: N802,N803
        """Record the replication factor in the model's metadata (key ``replicationFactor``).
        Sessions take theirs from SessionOptions, so the value is information only."""
        if not isinstance(replicationFactor, int) or replicationFactor < 1:
            raise popart_exception(
                f"embedReplicationFactor: expected a positive int, got {replicationFactor!r}."
            )
        _log_once("embedReplicationFactor", "Builder.embedReplicationFactor(%d) stores the value "
                  "in the model only: sessions replicate as SessionOptions.replicatedGraphCount "
                  "says.", replicationFactor)
        props = [p for p in self._model.metadata_props if p.key != "replicationFactor"]
        del self._model.metadata_props[:]
        self._model.metadata_props.extend(props)
        entry = self._model.metadata_props.add()
        entry.key, entry.value = "replicationFactor", str(replicationFactor)
        self._changed()

    def aiOnnxOpsetVersion(self, version: int) -> None:  # noqa: N802
        """Choose the ai.onnx opset ``aiOnnx`` builds with (fixed once chosen, as PopART)."""
        self._fix_opset(AI_ONNX, int(version), f"aiOnnxOpset{version}")

    def _visible(self, tensor_id: str) -> bool:
        """A tensor of this builder or of an enclosing one (ONNX outer-scope reference)."""
        parent = self._parent
        return tensor_id in self._ids or (parent is not None and parent._visible(tensor_id))

    def addInputTensorFromParentGraph(self, tensorId: str) -> None:  # noqa: N802,N803
        """Declare that this subgraph reads ``tensorId`` of an enclosing builder. ONNX reads it
        by name from the enclosing graph, so nothing is added to the subgraph's inputs."""
        if self._parent is None:
            raise popart_exception(
                f"addInputTensorFromParentGraph('{tensorId}'): this builder has no parent; call "
                f"it on a builder made by createSubgraphBuilder()."
            )
        if not self._parent._visible(tensorId):
            raise popart_exception(
                f"addInputTensorFromParentGraph('{tensorId}'): the parent builder has no tensor "
                f"'{tensorId}'."
            )
        self._ids.add(tensorId)

    def addUntypedInputTensor(self, debugContext: str = "") -> str:  # noqa: N802,N803
        """A subgraph input without type or shape: the op taking the subgraph gives them
        (Loop's iteration number and condition, carried values, Scan slices)."""
        tensor_id = self._unique_id(self._scope() + (debugContext or "input"))
        self._graph.input.append(helper.make_empty_tensor_value_info(tensor_id))
        self._changed()
        return tensor_id

    def subgraph_proto(self) -> onnx.GraphProto:
        """A copy of this builder's graph, for a graph attribute of a subgraph op."""
        if not self._graph.output:
            raise popart_exception(
                f"Subgraph '{self._graph.name}' has no outputs; mark them with addOutputTensor."
            )
        return copy.deepcopy(self._graph)

    def getTensorShape(self, tensorId: str) -> list[int]:  # noqa: N802,N803
        """Static shape of ``tensorId``: ONNX shape inference, else the backend's own (which
        also covers ai.graphcore and custom ops)."""
        return list(self._tensor_info(tensorId).shape)

    def getTensorDtypeString(self, tensorId: str) -> str:  # noqa: N802,N803
        """Lower-case numpy-style element type, e.g. ``"float32"``."""
        return self._tensor_info(tensorId).dtype.lcase

    def _tensor_info(self, tensor_id: str) -> IrTensorInfo:
        if tensor_id not in self._ids:
            raise popart_exception(
                f"Tensor '{tensor_id}' is not in this builder's model. Known ids: "
                f"{sorted(self._ids)[:20]}{' ...' if len(self._ids) > 20 else ''}."
            )
        info = self._onnx_inferred_info(tensor_id)
        if info is not None:
            return info
        ir = self._import_for_analysis(tensor_id)
        return ir.main.tensors[tensor_id].info

    def _onnx_inferred_info(self, tensor_id: str) -> IrTensorInfo | None:
        for init in self._graph.initializer:
            if init.name == tensor_id:
                return IrTensorInfo(DataType.from_onnx(init.data_type), tuple(init.dims))
        if self._analysis is None or self._analysis[0] != self._revision:
            proto = self._proto()
            try:
                inferred = onnx.shape_inference.infer_shapes(
                    proto, check_type=False, strict_mode=False, data_prop=True
                )
            except onnx.shape_inference.InferenceError:
                inferred = proto  # the backend's own inference below reports the real error
            self._analysis = (self._revision, inferred)
        graph = self._analysis[1].graph
        for value in list(graph.input) + list(graph.value_info) + list(graph.output):
            if value.name != tensor_id:
                continue
            ttype = value.type.tensor_type
            if not ttype.elem_type or not ttype.HasField("shape"):
                return None
            dims = [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]
            if any(d is None for d in dims):
                return None
            return IrTensorInfo(DataType.from_onnx(ttype.elem_type), tuple(dims))
        return None

    def _import_for_analysis(self, tensor_id: str):
        """The backend's Ir of the part of the model ``tensor_id`` depends on (nodes after it,
        which may use ops without a kernel yet, do not matter)."""
        if self._ir_cache is None or self._ir_cache[0] != self._revision:
            self._ir_cache = (self._revision, {})
        irs = self._ir_cache[1]
        if tensor_id not in irs:
            model = self._proto()
            needed, nodes, pending = {tensor_id}, [], [tensor_id]
            while pending:
                node = self._producer.get(pending.pop())
                if node is None or any(n is node for n in nodes):
                    continue
                nodes.append(node)
                for name in (*node.input, *captured_names(node)):
                    if name and name not in needed:
                        needed.add(name)
                        pending.append(name)
            kept = [n for n in model.graph.node if any(o in needed for o in n.output)]
            del model.graph.node[:]
            model.graph.node.extend(kept)
            del model.graph.output[:]
            model.graph.output.append(helper.make_empty_tensor_value_info(tensor_id))
            base_dir = self._external_dir or Path.cwd()
            try:
                irs[tensor_id] = import_model(LoadedModel(model, base_dir), constant_weights=True)
            except popart_exception as exc:
                raise type(exc)(
                    f"getTensorShape('{tensor_id}'): ONNX shape inference gives no static "
                    f"shape, and importing the model into the backend failed: {exc}"
                ) from None
        return irs[tensor_id]
