"""``GraphTransformer``: rewrites of an ONNX model before it is built (PopART's ONNX helpers):
element-type conversions, initializers to constants or to an external file, unused inputs
removed, training outputs of normalisation nodes added. Every rewrite edits the ModelProto;
``getModelProto()`` returns the result."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from ..dtypes import DataType
from ..errors import popart_exception
from ..importer.graph_walk import captured_names
from .builder import Builder

__all__ = ["GraphTransformer"]

# Attributes naming an element type (Cast "to", RandomNormal "dtype", ...).
_DTYPE_ATTRS = ("to", "dtype", "output_dtype")
_FIXED_POINT = (TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16, TensorProto.INT16,
                TensorProto.INT32, TensorProto.INT64, TensorProto.UINT32, TensorProto.UINT64,
                TensorProto.BOOL)


def _graphs(graph: onnx.GraphProto):
    """``graph`` and every subgraph below it."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _graphs(sub)


class GraphTransformer:
    """``GraphTransformer(modelProtoOrFilename)``: model bytes, a path or an onnx.ModelProto."""

    def __init__(self, modelProtoOrFilename):  # noqa: N803 - PopART's names
        self._builder = Builder(modelProtoOrFilename)

    @property
    def _model(self) -> onnx.ModelProto:
        return self._builder._model

    def getModelProto(self) -> bytes:  # noqa: N802
        return self._builder.getModelProto()

    def _changed(self) -> None:
        self._builder._changed()

    # --- structure --------------------------------------------------------------------------
    def removeUnusedInputs(self) -> None:  # noqa: N802
        """Drop main-graph inputs (and their initializers) that no node, subgraph or graph
        output reads."""
        graph = self._model.graph
        used = {o.name for o in graph.output}
        for sub in _graphs(graph):
            for node in sub.node:
                used.update(node.input)
                used.update(captured_names(node))
        kept = [i for i in graph.input if i.name in used]
        del graph.input[:]
        graph.input.extend(kept)
        inits = [i for i in graph.initializer if i.name in used]
        del graph.initializer[:]
        graph.initializer.extend(inits)
        self._changed()

    def prepareNodesForTraining(self) -> None:  # noqa: N802
        """Give every BatchNormalization node its training outputs (mean, var, saved mean,
        saved var), named ``<Y>_mean`` ... , so the node runs in training mode."""
        for sub in _graphs(self._model.graph):
            for node in sub.node:
                if node.op_type != "BatchNormalization" or len(node.output) != 1:
                    continue
                y = node.output[0]
                node.output.extend(
                    f"{y}_{suffix}" for suffix in ("mean", "var", "saved_mean", "saved_var"))
        self._changed()

    # --- element types ----------------------------------------------------------------------
    def _convert(self, src: int, dst: int, clip: bool = False) -> None:
        """Every ``src`` tensor, value info, constant and type attribute becomes ``dst``."""
        src_dt, dst_dt = DataType.from_onnx(src), DataType.from_onnx(dst)
        for graph in _graphs(self._model.graph):
            for value in (*graph.input, *graph.output, *graph.value_info):
                tensor_type = value.type.tensor_type
                if value.type.HasField("tensor_type") and tensor_type.elem_type == src:
                    tensor_type.elem_type = dst
            for i, init in enumerate(graph.initializer):
                if init.data_type == src:
                    graph.initializer[i].CopyFrom(self._converted(init, src_dt, dst_dt, clip))
            for node in graph.node:
                for attr in node.attribute:
                    if attr.type == AttributeProto.TENSOR and attr.t.data_type == src:
                        attr.t.CopyFrom(self._converted(attr.t, src_dt, dst_dt, clip))
                    elif (attr.type == AttributeProto.INT and attr.name in _DTYPE_ATTRS
                          and attr.i == src):
                        attr.i = dst
        self._changed()

    def _converted(self, tensor: TensorProto, src: DataType, dst: DataType,
                   clip: bool) -> TensorProto:
        value = numpy_helper.to_array(tensor, self._builder._external_dir or "")
        if dst.is_int and value.size:
            info = np.iinfo(dst.numpy)
            low, high = int(value.min()), int(value.max())
            if low < info.min or high > info.max:
                if not clip:
                    raise popart_exception(
                        f"GraphTransformer: '{tensor.name}' ({src.name}) holds values in "
                        f"[{low}, {high}], outside {dst.name}'s [{info.min}, {info.max}]. Pass "
                        f"clip=True to clip them."
                    )
                value = np.clip(value, info.min, info.max)
        return numpy_helper.from_array(value.astype(dst.numpy), tensor.name)

    def convertFloatsToHalfs(self) -> None:  # noqa: N802
        self._convert(TensorProto.FLOAT, TensorProto.FLOAT16)

    def convertUINT8ToINT32(self) -> None:  # noqa: N802
        self._convert(TensorProto.UINT8, TensorProto.INT32)

    def convertUINT16ToINT32(self) -> None:  # noqa: N802
        self._convert(TensorProto.UINT16, TensorProto.INT32)

    def convertINT8ToINT32(self) -> None:  # noqa: N802
        self._convert(TensorProto.INT8, TensorProto.INT32)

    def convertINT16ToINT32(self) -> None:  # noqa: N802
        self._convert(TensorProto.INT16, TensorProto.INT32)

    def convertINT64ToINT32(self, clip: bool = False) -> None:  # noqa: N802
        """INT64 -> INT32; values outside int32 raise, or are clipped when ``clip``."""
        self._convert(TensorProto.INT64, TensorProto.INT32, clip)

    def convertDoublesToFloats(self) -> None:  # noqa: N802
        self._convert(TensorProto.DOUBLE, TensorProto.FLOAT)

    def convertDoublesToHalfs(self) -> None:  # noqa: N802
        self._convert(TensorProto.DOUBLE, TensorProto.FLOAT16)

    def convertBFloats16ToFloat32(self) -> None:  # noqa: N802
        self._convert(TensorProto.BFLOAT16, TensorProto.FLOAT)

    # --- initializers -----------------------------------------------------------------------
    def convertInitializersToConstants(self, ids: Iterable[str]) -> None:  # noqa: N802
        """The listed initializers become Constant nodes (no longer weights or inputs)."""
        ids = [ids] if isinstance(ids, str) else list(ids)
        graph = self._model.graph
        inits = {init.name: init for init in graph.initializer}
        missing = [i for i in ids if i not in inits]
        if missing:
            raise popart_exception(
                f"convertInitializersToConstants: {missing} are not initializers; the "
                f"initializers are {sorted(inits)}."
            )
        constants = [
            helper.make_node("Constant", [], [i], name=f"{i}_Constant",
                             value=numpy_helper.from_array(
                                 numpy_helper.to_array(inits[i], self._builder._external_dir
                                                       or ""), i))
            for i in ids
        ]
        kept = [init for init in graph.initializer if init.name not in ids]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        inputs = [v for v in graph.input if v.name not in ids]
        del graph.input[:]
        graph.input.extend(inputs)
        nodes = constants + list(graph.node)
        del graph.node[:]
        graph.node.extend(nodes)
        self._changed()

    def convertAllFixedPointInitializersToConstants(self) -> None:  # noqa: N802
        """Every integer (and bool) initializer becomes a Constant node."""
        self.convertInitializersToConstants(
            [init.name for init in self._model.graph.initializer
             if init.data_type in _FIXED_POINT])

    def saveInitializersExternally(self, ids: Iterable[str], filename) -> None:  # noqa: N802
        """Move the data of initializers ``ids`` to ``filename`` (kept next to the model)."""
        self._builder.saveInitializersExternally(ids, filename)
