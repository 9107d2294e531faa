"""Pass: a Gather of a few rows moves up through the row-wise ops that made its data.

BERT's pooler reads token 0 of the last layer only (``x[:, 0]``): the exporters write a
Gather with a constant index on the sequence axis after the whole layer. Every op between the
last attention and that Gather treats rows on its own (the feed-forward products, GELU, the
residual adds, layer norms over the last axis), so computing them on the gathered rows alone
gives the same numbers with 1/seq of the work, forward and (after autodiff) backward.

Before:  h = LinearBias(x, W, b)           After:  xr = Gather(x, idx, axis=1)
         y = LayerNormalization(h, s, t)           hr = LinearBias(xr, W, b)
         r = Gather(y, idx, axis=1)                r  = LayerNormalization(hr, s, t)

The Gather moves above an op P when its data is P's only output in use, read by nothing but
Gathers of the same rows (merged into one), and P is

- an elementwise unary op (Relu, Tanh, Sigmoid, Identity, Erf, Neg, Abs, Exp, Gelu and the
  fused Gelu);
- Add, Sub, Mul or Div: inputs with the gathered axis (same length, no broadcast along it)
  are gathered, inputs that do not reach that axis (biases) are read as they are;
- LayerNormalization normalising axes after the gathered one (its axis kept counted from
  the end, so a scalar index that drops the axis keeps it right);
- the fused LinearBias, gathering rows of X on an axis other than its last.

The index must be a constant (the rows are known) and the ops on one IPU, stage, phase and
recomputation setting. Numbers are those of the full computation's rows: each op computes the
same rows with the same kernel.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import popart_internal_exception
from ..ir.op import Op
from ..ir.tensor import Tensor
from ..ops.base import normalize_axis
from ..ops.fused import FusedOp, Gelu, LinearBias
from ..ops.gather_scatter import Gather
from ..ops.norm import LayerNormalization
from .fuse_common import is_observed, replace_chain, same_placement

_UNARY = frozenset({"Relu", "Tanh", "Sigmoid", "Identity", "Erf", "Neg", "Abs", "Exp",
                    "Gelu"})
_BINARY = frozenset({"Add", "Sub", "Mul", "Div"})


def _is_row_gather(op: Op) -> bool:
    return (type(op) is Gather and op.inputs[1] is not None and op.inputs[1].is_const
            and op.outputs[0] is not None)


def _axis(op: Op) -> int:
    return normalize_axis(op, op.attrs.axis, op.inputs[0].info.rank)


def _same_rows(a: Op, b: Op) -> bool:
    """True when Gathers ``a`` and ``b`` take the same constant rows of the same axis."""
    if _axis(a) != _axis(b) or a.inputs[0] is not b.inputs[0]:
        return False
    x, y = a.inputs[1], b.inputs[1]
    return x is y or (x.data.dtype == y.data.dtype and x.data.shape == y.data.shape
                      and np.array_equal(x.data, y.data))


class GatherRowsEarly:
    name = "gather_rows_early"

    def __init__(self, training: bool = False):
        self.training = training

    def run(self, ir) -> bool:
        graph = ir.main
        changed = False
        progress = True
        while progress:
            progress = False
            for op in list(graph.ops.values()):
                if op.id in graph.ops and _is_row_gather(op) and self._hoist(graph, op):
                    progress = changed = True
        return changed

    # ------------------------------------------------------------------------------------

    def _hoist(self, graph, gather: Op) -> bool:
        x = gather.inputs[0]
        op = x.producer
        if op is None or is_observed(x) or op.outputs[0] is not x:
            return False
        if not all(c is gather or (_is_row_gather(c) and c.inputs[0] is x
                                   and _same_rows(c, gather) and not is_observed(c.outputs[0]))
                   for c in x.consumers):
            return False
        for t in op.outputs[1:]:
            if t is not None and (t.consumers or is_observed(t)):
                return False
        if self.training and not same_placement([op, gather]):
            return False
        axis = _axis(gather)
        plan = self._plan(op, x, axis, gather.inputs[1].info.rank)
        if plan is None:
            return False
        attrs, rows_axes = plan
        self._merge_duplicates(graph, gather, x)
        index = gather.inputs[1]
        input_ids = []
        for slot, t in enumerate(op.inputs):
            if t is None or rows_axes[slot] is None:
                input_ids.append(t.id if t is not None else "")
            else:
                input_ids.append(self._rows_of(graph, gather, t, rows_axes[slot], index).id)
        out = gather.outputs[0]
        if isinstance(op, FusedOp):
            infos = [graph.tensor(i).info if i else None for i in input_ids]
            new = type(op)(attrs, op.settings, infos, out.info)
        else:
            new = type(op)(attrs, op.settings, op.version)
        # Further outputs (a layer norm's saved statistics) are kept, for the rows.
        extra = [graph.unique_id(f"{t.id}/rows") if t is not None else ""
                 for t in op.outputs[1:]]
        replace_chain(graph, [op, gather], new, input_ids, out, extra_outputs=extra)
        if new.outputs[0].info != out.info:  # the same rows, by construction
            raise popart_internal_exception(
                f"{self.name}: {new.debug_name} gives {new.outputs[0].info} on the gathered "
                f"rows where the Gather it replaced gave {out.info}.")
        return True

    def _plan(self, op: Op, x: Tensor, axis: int, index_rank: int):
        """(attrs of the new op, per input: the axis to gather or None to read it whole), or
        None when the Gather cannot move above ``op``."""
        rank = x.info.rank
        if type(op) is Gelu or (op.domain == "ai.onnx" and op.op_type in _UNARY
                                and len(op.inputs) == 1):
            return op.attrs, [axis]
        if op.domain == "ai.onnx" and op.op_type in _BINARY and len(op.inputs) == 2:
            axes = []
            for t in op.inputs:
                at = axis - (rank - t.info.rank)
                if at < 0:
                    axes.append(None)  # broadcast over the gathered axis: read whole
                elif t.info.shape[at] == x.info.shape[axis]:
                    axes.append(at)
                else:
                    return None  # broadcast along the gathered axis itself
            return op.attrs, axes
        if type(op) is LayerNormalization:
            begin = normalize_axis(op, op.attrs.axis, rank)
            if axis >= begin:
                return None
            return dataclasses.replace(op.attrs, axis=begin - rank), [axis] + [None] * (
                len(op.inputs) - 1)
        if type(op) is LinearBias:
            if axis >= rank - 1 or rank - 1 + index_rank < 2:
                return None
            return op.attrs, [axis] + [None] * (len(op.inputs) - 1)
        return None

    @staticmethod
    def _merge_duplicates(graph, gather: Op, x: Tensor) -> None:
        """Let ``gather`` stand for every other Gather of the same rows of ``x``."""
        for other in list(x.consumers):
            if other is gather:
                continue
            dup = other.outputs[0]
            graph.replace_all_uses(dup, gather.outputs[0])
            graph.remove_op(other)
            graph.remove_tensor(dup)

    @staticmethod
    def _rows_of(graph, gather: Op, t: Tensor, axis: int, index: Tensor) -> Tensor:
        """The rows ``index`` of ``t`` along ``axis``: an existing Gather of them, or a new one."""
        for c in t.consumers:
            if (_is_row_gather(c) and c.inputs[0] is t and _axis(c) == axis
                    and (c.inputs[1] is index or (c.inputs[1].data.dtype == index.data.dtype
                                                  and np.array_equal(c.inputs[1].data,
                                                                     index.data)))
                    and c.inputs[1].data.shape == index.data.shape):
                return c.outputs[0]
        new = Gather(Gather.Attrs(axis=axis), gather.settings, gather.version)
        out_id = graph.unique_id(f"{t.id}/rows")
        graph.add_op(new, [t.id, index.id], [out_id])
        return new.outputs[0]
