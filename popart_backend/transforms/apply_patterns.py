"""Pass: the IR rewrites of the PopART patterns that have an effect in our model (F8), in
every graph, except on ops that exclude the pattern (the builder's ``excludePatterns``).

Each rewrite runs only when its pattern is enabled in ``Ir.patterns`` (the session's
``Patterns``); ``options/patterns.py`` lists the patterns and what each changes. The new ops
keep the settings (placement, name) of the op they replace and write tensors with the same
ids, so anchors, outputs and later consumers are untouched. The pass runs after the fusions
(which match the ops some rewrites replace) and, in training, before autodiff.

Before:  s = Sum(a, b)                   After:  s = Add(a, b)               # SumToAdd
         n = Scale(x, scale=-1)                  n = Neg(x)                  # NegativeOneScale
         e = Expand(h, shape)                    c = Cast(h, to=FLOAT)       # ExpandCast
         y = Cast(e, to=FLOAT)                   y = Expand(c, shape)
         t = Transpose(x, perm=[0,2,1])          t = Reshape(x, [4,3,1])     # x f32[4,1,3]
         p, q = Split(x, axis=0)                 p = Slice(x, [0], [2], [0]) # SplitOp
                                                 q = Slice(x, [2], [4], [0])
         u = Upsample(x, scales)                 u = Resize(x, scales)       # UpsampleToResize
         m = Mul(x, <const 0.5>)                 m = Scale(x, scale=0.5)     # DecomposeBinary...
         z = Slice(x, s, e, ax, <steps 2>)       z0 = Slice(x, s, e, ax)     # Slice2SliceSubsample
                                                 z = Subsample(z0, strides=[2])
"""

from __future__ import annotations

import logging

import numpy as np

from ..ir.op import Op
from ..ir.tensor import Tensor, TensorKind
from ..ops.registry import create_op
from .fuse_common import is_observed, scalar_value

_log = logging.getLogger("popart:pattern")

_GC = "ai.graphcore"


class ApplyPatterns:
    """Pass: run the enabled pattern rewrites over every graph (the main graph and the If,
    Loop, Scan and Call bodies), each op once, except on ops whose ``excludePatterns``
    (``OpSettings.excluded_patterns``) names the pattern. A rewrite that takes two ops
    (ExpandCast) needs both to allow it."""

    name = "apply_patterns"

    def run(self, ir) -> bool:
        enabled = set(ir.patterns.enabledPatterns())
        changed = False
        for graph in list(ir.graphs.values()):
            for op in graph.topo_order():
                if op.id not in graph.ops:
                    continue  # removed by an earlier rewrite (ExpandCast takes two ops)
                rewrite = _REWRITES.get((op.domain, op.op_type))
                if rewrite is None or rewrite[0] not in enabled:
                    continue
                if rewrite[0] in op.settings.excluded_patterns:
                    _log.debug("pattern %s: %s excludes it", rewrite[0], op.debug_name)
                elif rewrite[1](graph, op):
                    _log.debug("pattern %s applied to %s", rewrite[0], op.debug_name)
                    changed = True
        return changed


# --- helpers ------------------------------------------------------------------------------------


def _new(graph, op_type: str, old: Op, inputs: list[str], output: str, version: int,
         domain: str = "ai.onnx", **attrs) -> Tensor:
    """Add ``op_type`` with ``old``'s settings, writing a fresh id based on ``output``."""
    out = graph.unique_id(f"{output}/{op_type}")
    op = create_op(op_type, attrs, old.settings, version=version, domain=domain,
                   where=f"pattern rewrite of {old.debug_name}")
    graph.add_op(op, inputs, [out])
    return graph.tensors[out]


def _const(graph, base: str, values) -> str:
    return graph.add_const(graph.unique_id(base), np.asarray(values, dtype=np.int64)).id


def _take_over(graph, removed: list[Op], pairs: list[tuple[Tensor, Tensor]]) -> None:
    """Remove ``removed``; each new tensor of ``pairs`` replaces (and takes the id of) its old
    one. Inner tensors of the removed ops that nobody reads any more are deleted."""
    for old, new in pairs:
        graph.replace_all_uses(old, new)
    inner = [t for op in removed for t in (*op.inputs, *op.outputs) if t is not None]
    for op in removed:
        graph.remove_op(op)
    for old, new in pairs:
        graph.remove_tensor(old)
        del graph.tensors[new.id]
        graph.outputs = [old.id if t == new.id else t for t in graph.outputs]
        new.id = old.id
        graph.tensors[old.id] = new
    gone = {old.id for old, _ in pairs}
    for t in dict.fromkeys(inner):
        if (t.id not in gone and t.kind in (TensorKind.ACT_GRAD, TensorKind.CONST)
                and t.producer is None and not t.consumers and not is_observed(t)
                and graph.tensors.get(t.id) is t):
            graph.remove_tensor(t)


def _ints(tensor: Tensor | None) -> list[int] | None:
    if tensor is None or not tensor.is_const:
        return None
    return [int(v) for v in np.asarray(tensor.data).reshape(-1)]


# --- the rewrites (each returns True when it changed the graph) ---------------------------------


def _sum_to_add(graph, op: Op) -> bool:
    if len(op.inputs) != 2 or any(t is None for t in op.inputs):
        return False
    out = op.outputs[0]
    new = _new(graph, "Add", op, [t.id for t in op.inputs], out.id, 7)
    _take_over(graph, [op], [(out, new)])
    return True


def _negative_one_scale(graph, op: Op) -> bool:
    if op.attrs.scale != -1.0:
        return False
    out = op.outputs[0]
    new = _new(graph, "Neg", op, [op.inputs[0].id], out.id, 6)
    _take_over(graph, [op], [(out, new)])
    return True


def _expand_cast(graph, cast: Op) -> bool:
    expanded = cast.inputs[0]
    expand = expanded.producer
    if (expand is None or expand.op_type != "Expand" or expand.domain != "ai.onnx"
            or len(expanded.consumers) != 1 or is_observed(expanded)
            or "ExpandCast" in expand.settings.excluded_patterns):
        return False
    x, shape = expand.inputs[0], expand.inputs[1]
    out = cast.outputs[0]
    small = _new(graph, "Cast", cast, [x.id], x.id, cast.version, to=cast.attrs.to)
    new = _new(graph, "Expand", expand, [small.id, shape.id], out.id, expand.version)
    _take_over(graph, [expand, cast], [(out, new)])
    return True


def _transpose(graph, op: Op) -> bool:
    x, out = op.inputs[0], op.outputs[0]
    rank = x.info.rank
    perm = list(op.attrs.perm) if op.attrs.perm is not None else list(range(rank))[::-1]
    perm = [p % rank for p in perm] if rank else perm
    if perm == list(range(rank)):
        new = _new(graph, "Identity", op, [x.id], out.id, 1)
    else:
        moved = [p for p in perm if x.info.shape[p] != 1]
        if moved != sorted(moved):
            return False  # the element order changes: a real transpose
        shape = _const(graph, f"{out.id}/shape", list(out.info.shape))
        new = _new(graph, "Reshape", op, [x.id, shape], out.id, 5)
    _take_over(graph, [op], [(out, new)])
    return True


def _split(graph, op: Op) -> bool:
    x = op.inputs[0]
    if any(t is None for t in op.outputs) or not x.info.rank:
        return False
    axis = op.attrs.axis % x.info.rank
    pairs, start = [], 0
    for out in op.outputs:
        end = start + out.info.shape[axis]
        ids = [_const(graph, f"{out.id}/{what}", [v]) for what, v in
               (("starts", start), ("ends", end), ("axes", axis))]
        pairs.append((out, _new(graph, "Slice", op, [x.id, *ids], out.id, 10)))
        start = end
    _take_over(graph, [op], pairs)
    return True


def _upsample(graph, op: Op) -> bool:
    if op.version < 9 or len(op.inputs) < 2 or op.inputs[1] is None:
        return False  # versions 1 and 7 give scales as attributes
    out = op.outputs[0]
    new = _new(graph, "Resize", op, [op.inputs[0].id, op.inputs[1].id], out.id, 10,
               mode=op.attrs.mode)
    _take_over(graph, [op], [(out, new)])
    return True


def _mul_const_scalar(graph, op: Op) -> bool:
    if len(op.inputs) != 2 or op.version < 7:
        return False  # Mul-6 may carry broadcast attributes
    a, b = op.inputs
    out = op.outputs[0]
    for x, c in ((a, b), (b, a)):
        value = scalar_value(c)
        if (value is not None and x is not None and x.info == out.info
                and x.info.dtype.is_float and c.info.dtype == x.info.dtype):
            new = _new(graph, "Scale", op, [x.id], out.id, 1, domain=_GC, scale=value)
            _take_over(graph, [op], [(out, new)])
            return True
    return False


def _slice_subsample(graph, op: Op) -> bool:
    if op.version < 10 or len(op.inputs) < 5 or op.inputs[4] is None:
        return False
    steps = _ints(op.inputs[4])
    if steps is None or any(s < 1 for s in steps) or all(s == 1 for s in steps):
        return False
    x, out = op.inputs[0], op.outputs[0]
    rank = x.info.rank
    axes = _ints(op.inputs[3]) if op.inputs[3] is not None else list(range(len(steps)))
    if axes is None:
        return False
    strides = [1] * rank
    for axis, step in zip(axes, steps):
        strides[axis % rank] = step
    ids = [t.id if t is not None else "" for t in op.inputs[:4]]
    unit = _new(graph, "Slice", op, ids, out.id, op.version)
    new = _new(graph, "Subsample", op, [unit.id], out.id, 1, domain=_GC, strides=strides)
    _take_over(graph, [op], [(out, new)])
    return True


# (domain, op type) -> (pattern name, rewrite)
_REWRITES = {
    ("ai.onnx", "Sum"): ("SumToAdd", _sum_to_add),
    (_GC, "Scale"): ("NegativeOneScale", _negative_one_scale),
    ("ai.onnx", "Cast"): ("ExpandCast", _expand_cast),
    ("ai.onnx", "Transpose"): ("TransposeToIdentityOrReshapePattern", _transpose),
    ("ai.onnx", "Split"): ("SplitOp", _split),
    ("ai.onnx", "Upsample"): ("UpsampleToResize", _upsample),
    ("ai.onnx", "Mul"): ("DecomposeBinaryConstScalar", _mul_const_scalar),
    ("ai.onnx", "Slice"): ("Slice2SliceSubsample", _slice_subsample),
}
