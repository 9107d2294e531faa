"""The intermediate representation: Ir, Graph, Op, Tensor, TensorInfo, OpSettings."""

from .graph import Graph
from .ir import Ir
from .op import ExecutionContext, NoAttrs, Op, OpSettings, RecomputeType
from .printer import format_graph, format_op
from .tensor import Tensor, TensorInfo, TensorKind, TensorRole
from .verify import verify

__all__ = [
    "ExecutionContext", "Graph", "Ir", "NoAttrs", "Op", "OpSettings", "RecomputeType", "Tensor", "TensorInfo",
    "TensorKind", "TensorRole", "format_graph", "format_op", "verify",
]
