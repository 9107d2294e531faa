"""TensorInfo (dtype + static shape) and Tensor (a value in a Graph, with its producer/consumers)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..dtypes import DataType

if TYPE_CHECKING:
    from .graph import Graph
    from .op import Op


@dataclass(frozen=True)
class TensorInfo:
    """Element type and static shape of a tensor. Shapes are always fully known in the IR."""

    dtype: DataType
    shape: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @classmethod
    def of(cls, array) -> "TensorInfo":
        """The info of a numpy array or torch tensor."""
        if isinstance(array, np.ndarray) or np.isscalar(array):
            array = np.asarray(array)
            return cls(DataType.from_numpy(array.dtype), array.shape)
        return cls(DataType.from_torch(array.dtype), tuple(array.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def nelms(self) -> int:
        return math.prod(self.shape)

    @property
    def num_bytes(self) -> int:
        # Packed: 4-bit and 2-bit types share bytes (DataType.bits).
        return (self.nelms * self.dtype.bits + 7) // 8

    def with_shape(self, shape) -> "TensorInfo":
        return TensorInfo(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DataType) -> "TensorInfo":
        return TensorInfo(dtype, self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.short}[{','.join(str(d) for d in self.shape)}]"


class TensorKind(enum.Enum):
    """What a tensor is, which decides where its value comes from at run time."""

    STREAM = "stream"  # fed from the host every micro-batch
    VARIABLE = "variable"  # device-resident state, written by weightsFromHost
    CONST = "const"  # compile-time constant
    ACT_GRAD = "actgrad"  # produced by an op


class TensorRole(enum.Enum):
    """What a VARIABLE holds; decides which host IO and settings apply (docs/training.md)."""

    WEIGHT = "weight"
    OPTIMIZER_STATE = "optimizer_state"
    ACCUMULATOR = "accumulator"
    OPTIMIZER_PARAM = "optimizer_param"  # non-const hyper-parameter, set by the host
    # BatchNorm running mean/var, variables a graph op writes in place (CopyVarUpdate): not trained
    RUNNING_STAT = "running_stat"
    STEP = "step"  # counters
    STASH = "stash"  # pipeline ring buffers and their indices: device-only, no host copy


class Tensor:
    """A tensor of a Graph. Only Graph methods change ``producer`` and ``consumers``."""

    def __init__(
        self, tensor_id: str, info: TensorInfo, kind: TensorKind, graph: "Graph", data=None
    ):
        self.id = tensor_id
        self.info = info
        self.kind = kind
        self.graph = graph
        # Host value of CONST and VARIABLE tensors, as a numpy array of exactly ``info``.
        self.data: np.ndarray | None = data
        self.producer: Op | None = None
        self.consumers: list[Op] = []
        self.role: TensorRole | None = TensorRole.WEIGHT if kind is TensorKind.VARIABLE else None

    @property
    def is_const(self) -> bool:
        return self.kind is TensorKind.CONST

    def __repr__(self) -> str:
        return f"Tensor({self.id!r}, {self.info}, {self.kind.value})"
