"""Constant folding (PopART's "ces" module): ops whose inputs are all constants become constants.

Exported graphs compute shapes with Shape/Gather/Concat chains; folding them at import lets
Reshape, Expand, Slice ... see constant operands, and shrinks the graph before scheduling.

Before:  s = Shape(x)   # x f32[2,3] (stream)        After:  r = Reshape(x, s2)
         s2 = Concat(s, c)                                    # s2 is const i64[3] = [2,3,1]
         r = Reshape(x, s2)
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from ..dtypes import to_host, to_storage
from ..errors import popart_exception
from ..ir.graph import Graph
from ..ir.op import Op
from ..limits import check_bytes
from ..ops.base import wrap_unsigned_outputs
from ..ops.string_tensors import kernel_for

_log = logging.getLogger("popart:ces")


def try_fold(graph: Graph, op: Op) -> bool:
    """Replace ``op`` by constants if its outputs are known at compile time. True if folded."""
    values = op.fold_from_infos()
    if values is None:
        if not op.foldable or any(t is not None and not t.is_const for t in op.inputs):
            return False
        # The guard before computing: a tiny model can ask to fold a constant of gigabytes.
        check_bytes(sum(t.info.num_bytes for t in op.outputs if t is not None),
                    f"{op.debug_name}: folding its outputs to constants")
        values = evaluate(op)
    for tensor, value in zip(op.outputs, values):
        if tensor is not None:
            # order='C', not ascontiguousarray, which turns 0-d values into shape [1].
            value = np.asarray(value, dtype=tensor.info.dtype.numpy, order="C")
            if value.shape != tensor.info.shape:
                raise popart_exception(
                    f"{op.debug_name}: folded output '{tensor.id}' has shape {list(value.shape)}, "
                    f"inference said {tensor.info}."
                )
    graph.remove_op(op)
    for tensor, value in zip(op.outputs, values):
        if tensor is not None:
            graph.make_const(tensor, np.asarray(value, dtype=tensor.info.dtype.numpy))
    _log.debug("folded %s", op.debug_name)
    return True


def evaluate(op: Op) -> list[np.ndarray]:
    """Run ``op``'s kernel on its constant inputs, exactly as the execution plan runs it.

    uint16/uint32 outputs are reduced modulo 2**bits by the plan's own wrapper
    (``wrap_unsigned_outputs``), so a folded constant holds the value the unfolded op would
    have computed rather than relying on the host conversion's cast to wrap a surrogate.
    """
    args = [None if t is None else to_torch(t.data) for t in op.inputs]
    with torch.no_grad():
        result = wrap_unsigned_outputs(op, kernel_for(op))(*args)
    results = result if isinstance(result, (tuple, list)) else [result]
    dtypes = [None if t is None else t.info.dtype for t in op.outputs]
    return [to_host(r, dtype) if isinstance(r, torch.Tensor) else np.asarray(r)
            for r, dtype in zip(results, dtypes)]


def to_torch(array: np.ndarray) -> torch.Tensor | np.ndarray:
    """STRING (object) arrays stay numpy: torch has no string type (ops/string_tensors.py)."""
    array = np.asarray(array)
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, copy=True, order="C")
    if array.dtype == object:
        return array
    return to_storage(array)


class FoldConstants:
    """Pass: fold every foldable op, in topological order. With ``multiple_consumers`` False
    (SessionOptions.enableConstantFoldingOfMultipleConsumers), an op reading a tensor that
    several ops read stays unfolded."""

    name = "fold_constants"

    def __init__(self, multiple_consumers: bool = True):
        self.multiple_consumers = multiple_consumers

    def run(self, ir) -> bool:
        changed = False
        for op in ir.main.topo_order():
            if not self.multiple_consumers and any(
                    t is not None and len({c.id for c in t.consumers}) > 1 for t in op.inputs):
                continue
            changed |= try_fold(ir.main, op)
        return changed
