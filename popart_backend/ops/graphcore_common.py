"""Shared pieces of the ai.graphcore op modules (graphcore*.py): the domain alias, the integer
dtypes and the input checks several of them use."""

from __future__ import annotations

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .registry import AI_GRAPHCORE

GC = AI_GRAPHCORE
_INT_DTYPES = (DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64, DataType.UINT8)


def _require_float(op: Op, *infos: TensorInfo) -> None:
    for info in infos:
        if not info.dtype.is_float:
            raise ShapeError(f"{op.debug_name}: input {info} must be floating point.")


def _output_or_none(op: Op, index: int) -> str | None:
    """Id of output ``index`` when the node has it."""
    if index < len(op.outputs) and op.outputs[index] is not None:
        return op.outputs[index].id
    return None
