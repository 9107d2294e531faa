"""Shared pieces of the ai.graphcore op modules (graphcore*.py): the domain alias, the integer
dtypes, the input checks several of them use, and the attribute conversions of their Builder
methods."""

from __future__ import annotations

import enum

import numpy as np

from ..dtypes import DataType
from ..errors import ShapeError, popart_exception
from ..ir.op import Op
from ..ir.signature import INT, AttrSpec
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


# --- attribute conversions of the ai.graphcore Builder methods (``Op.builder_method``) --------

_REDUCTION_TYPES = {"Sum": 0, "Mean": 1, "NoReduction": 2}


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, enum.Enum)


def reduction_type(value):
    """PopART's ReductionType (Sum=0, Mean=1, NoReduction=2) as the int the node stores."""
    if isinstance(value, enum.Enum):
        value = value.value if _is_int(value.value) else value.name
    if isinstance(value, str):
        if value not in _REDUCTION_TYPES:
            raise popart_exception(
                f"Unknown ReductionType '{value}'; use one of {list(_REDUCTION_TYPES)}."
            )
        return _REDUCTION_TYPES[value]
    return value


# The losses' ``reduction`` argument; Mean by default.
REDUCTION_ATTR = AttrSpec("reduction", INT, 1, convert=reduction_type)


def scatter_reduction(value):
    """PopART's ScatterReduction (Sum, Max, Min, None) as the lower-case string the node stores."""
    if isinstance(value, enum.Enum):
        value = value.value if isinstance(value.value, str) else value.name
    if isinstance(value, str) and value.lower() in ("mul", "noreduction"):
        value = {"mul": "mul", "noreduction": "none"}[value.lower()]
    if value == "mul":
        raise popart_exception(
            "ScatterReduction.Mul is not implemented by the simulated IPU's scatterreduce; use "
            "Sum, Max, Min or NoReduction."
        )
    if not isinstance(value, str) or value.lower() not in ("sum", "max", "min", "none"):
        raise popart_exception(
            f"Unknown ScatterReduction {value!r}; use Sum, Max, Min or None."
        )
    return value.lower()


def onnx_dtype(value):
    """A DataType, its name, a numpy dtype or an ONNX TensorProto code as the code."""
    if _is_int(value):
        return int(value)
    if isinstance(value, DataType):
        return value.onnx
    if isinstance(value, str):
        return DataType.from_string(value).onnx
    return DataType.from_numpy(value).onnx


def comm_group(value):
    """CommGroup (type, replicaGroupSize) as ``__collectiveCommGroup``'s ``[type, size]``."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        kind, size = value
    else:
        kind, size = value.type, value.replicaGroupSize
    return [kind.value if isinstance(kind, enum.Enum) else int(kind), int(size)]
