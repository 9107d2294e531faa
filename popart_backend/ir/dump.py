"""The IR dump: the graphs of an Ir as JSON in PopART's format.

``{"<graph>": [op, ...], ...}`` with the main graph named ``maingraph`` (or the name the builder
gave the ONNX graph) and each op

    {"type", "version", "domain", "name",
     "inputs": [{"name", "shape", "type", "index"}], "outputs": [{"name", "index"}],
     "attributes": {...}}

where every value is a string; ops are in op-id order, not schedule order. The attributes are
PopART's placement attributes (``recompute``, ``__ipu_number``, ``tileSet``,
``__execution_phase``, ``__execution_context``, ``__pipeline_stage``, ``scope``,
``schedulePriority``; unset optional ones omitted) then the op's own.

``POPART_IR_DUMP=<file>`` asks the session to write it after preparing the IR, or when the
preparation fails (then the error is re-raised): ``maybe_dump_ir`` and ``dump_on_error``.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
from typing import Callable, Iterator

from ..files import write_text_atomic
from .graph import Graph
from .ir import Ir
from .op import Op, RecomputeType

__all__ = ["ENV_VAR", "dump_ir", "dump_on_error", "ir_to_json", "maybe_dump_ir"]

ENV_VAR = "POPART_IR_DUMP"
_log = logging.getLogger("popart:ir")


def format_shape(shape) -> str:
    """PopART's shape text: ``[2 3]``."""
    return "[" + " ".join(str(d) for d in shape) + "]"


def _value_text(value) -> str | None:
    """An attribute value as PopART writes it; None for an unset optional attribute."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return format_shape(_value_text(v) for v in value)
    return str(value)


def op_attributes(op: Op) -> dict[str, str]:
    """Placement attributes, then the op's own (values as strings)."""
    s = op.settings
    attrs = {"recompute": "YES" if s.recompute is RecomputeType.Recompute else "NO"}
    if s.ipu is not None:
        attrs["__ipu_number"] = str(s.ipu)
    attrs["tileSet"] = "Compute"  # IO tiles are not built yet: every op runs on compute tiles
    if s.execution_phase is not None:
        attrs["__execution_phase"] = str(s.execution_phase)
    attrs["__execution_context"] = s.execution_context.name
    if s.pipeline_stage is not None:
        attrs["__pipeline_stage"] = str(s.pipeline_stage)
    attrs["scope"] = s.scope
    attrs["schedulePriority"] = str(s.schedule_priority)
    for name, value in op.attr_dict().items():
        text = _value_text(value)
        if text is not None:
            attrs[name] = text
    return attrs


def op_to_json(op: Op) -> dict:
    return {
        "type": op.op_type,
        "version": str(op.version),
        "domain": op.domain,
        "name": op.settings.name,
        "inputs": [
            {"name": t.id, "shape": format_shape(t.info.shape), "type": t.info.dtype.name,
             "index": str(i)}
            for i, t in enumerate(op.inputs) if t is not None
        ],
        "outputs": [{"name": t.id, "index": str(i)} for i, t in enumerate(op.outputs)
                    if t is not None],
        "attributes": op_attributes(op),
    }


def graph_to_json(graph: Graph) -> list[dict]:
    return [op_to_json(graph.ops[i]) for i in sorted(graph.ops)]


def ir_to_json(ir: Ir, graph_name: str = "") -> dict[str, list[dict]]:
    """The dump as a dict; ``graph_name`` (the ONNX graph's name, if the builder set one)
    replaces ``maingraph``."""
    out = {}
    for gid, graph in ir.graphs.items():
        name = graph_name if graph is ir.main and graph_name else gid
        out[name] = graph_to_json(graph)
    return out


def dump_ir(ir: Ir, path, graph_name: str = "") -> None:
    _log.info("Writing ir to %s", path)
    write_text_atomic(path, json.dumps(ir_to_json(ir, graph_name)))


def maybe_dump_ir(ir: Ir, graph_name: str = "") -> None:
    """Write the dump to ``$POPART_IR_DUMP`` when it is set."""
    path = os.environ.get(ENV_VAR)
    if path:
        dump_ir(ir, path, graph_name)


@contextlib.contextmanager
def dump_on_error(get_ir: Callable[[], Ir | None], graph_name: str = "") -> Iterator[None]:
    """Around IR preparation: on an exception, dump the IR built so far (if any and if
    ``$POPART_IR_DUMP`` is set), then re-raise it."""
    try:
        yield
    except Exception:
        ir = get_ir()
        if ir is not None:
            maybe_dump_ir(ir, graph_name)
        raise
