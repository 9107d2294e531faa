"""DOT (Graphviz) snapshots of the IR at PopART's check points.

Check points: ``FWD0`` right after the ONNX import, ``FWD1`` after the forward passes (before
autodiff; for inference, after all passes), ``BWD0`` right after autodiff, ``PREALIAS`` after
every pass (the simulator has no in-placing pass, so it equals ``FINAL``) and ``FINAL``. They are
chosen by ``SessionOptions.dotChecks`` plus ``POPART_DOT_CHECKS`` (names joined by ':', ``ALL``
for every one). Each writes ``<logDir>/<check>_<graph>.dot`` with the lower-case check name and
graph ``r`` for the main graph (subgraphs by id, or every graph in ``<check>_all.dot`` when
``separateCallOpPdfs`` is False).

Only schedule positions ``[max(0, firstDotOp), min(finalDotOp, nOps))`` are drawn. An op is a
box labelled ``"<k>. <type> (<opId>)"`` (+ `` (<opId>:<name>)`` with ``dotOpNames``, `` vgid:``,
`` pp:`` for placement, `` ts:<tileSet>``), olive (#6B8E23) when it works in place. A tensor is
an egg labelled ``"<info> nc:<consumers>"`` (+ graph input/output index), red for streams, gold
for constants, blue for variables, black otherwise. Edges carry the tensor id and shape;
scheduling constraints without a data edge are grey and dotted.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Mapping, Sequence

from ..errors import popart_exception
from ..files import confined_path, write_text_atomic
from ..options.enums import DotCheck
from .graph import Graph
from .ir import Ir
from .op import Op
from .tensor import Tensor, TensorKind

__all__ = ["CHECK_NAMES", "ENV_VAR", "DotWriter", "parse_dot_checks", "write_dot"]

ENV_VAR = "POPART_DOT_CHECKS"
CHECK_NAMES = {
    DotCheck.Fwd0: "FWD0",
    DotCheck.Fwd1: "FWD1",
    DotCheck.Bwd0: "BWD0",
    DotCheck.PreAlias: "PREALIAS",
    DotCheck.Final: "FINAL",
}
_BY_NAME = {**{v: k for k, v in CHECK_NAMES.items()}, "ALL": DotCheck.All}
INPLACE_COLOUR = "#6B8E23"
_TENSOR_COLOURS = {
    TensorKind.STREAM: "red",
    TensorKind.CONST: "gold",
    TensorKind.VARIABLE: "blue",
    TensorKind.ACT_GRAD: "black",
}
_log = logging.getLogger("popart:ir")


def parse_dot_checks(text: str) -> set[DotCheck]:
    """``"FWD0:FINAL"`` -> {DotCheck.Fwd0, DotCheck.Final}; raises on an unknown name."""
    checks = set()
    for name in filter(None, text.split(":")):
        if name not in _BY_NAME:
            raise popart_exception(
                f"Unrecognised dot check '{name}' in {ENV_VAR}='{text}'. Known checks: "
                f"{', '.join(_BY_NAME)}, joined by ':'."
            )
        checks.add(_BY_NAME[name])
    return checks


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _op_node(op: Op) -> str:
    return _quote(f"n_{op.id}")


def _shape(t: Tensor) -> str:
    return "[" + ",".join(str(d) for d in t.info.shape) + "]"


class DotWriter:
    """Writes the check points a session's options (and the environment) ask for."""

    def __init__(self, options, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        checks = set(options.dotChecks) | parse_dot_checks(env.get(ENV_VAR, ""))
        if DotCheck.All in checks:
            checks = set(CHECK_NAMES)
        self.checks = checks
        self.log_dir = Path(options.logDir or ".")
        self.first_op = options.firstDotOp
        self.final_op = options.finalDotOp
        self.op_names = options.dotOpNames
        self.separate = options.separateCallOpPdfs

    def enabled(self, check: DotCheck) -> bool:
        return check in self.checks

    def write(self, ir: Ir, check: DotCheck, order: Sequence[Op] | None = None) -> list[Path]:
        """Write ``check``'s files if it is enabled; ``order`` is the main graph's schedule
        (default: its topological order). Returns the files written."""
        if not self.enabled(check):
            return []
        self.log_dir.mkdir(parents=True, exist_ok=True)
        name = CHECK_NAMES[check].lower()
        graphs = [(g, list(order) if g is ir.main and order is not None else g.topo_order())
                  for g in ir.graphs.values()]
        if not self.separate:
            body = [line for g, ops in graphs for line in self._graph_lines(g, ops)]
            return [self._write_file(self.log_dir / f"{name}_all.dot", body)]
        paths = []
        for g, ops in graphs:
            label = "r" if g is ir.main else g.id
            # Graph ids come from the model's node names: no path separators in file names.
            label = label.replace("/", "_").replace("\\", "_")
            paths.append(self._write_file(self.log_dir / f"{name}_{label}.dot",
                                          self._graph_lines(g, ops)))
        return paths

    def _write_file(self, path: Path, body: list[str]) -> Path:
        _log.info("Writing dot file %s", path)
        confined_path(self.log_dir, path.name, "DOT file")
        write_text_atomic(path, "\n".join(["digraph net {", 'size="6,6";', *body, "}"]) + "\n")
        return path

    def _graph_lines(self, graph: Graph, order: Sequence[Op]) -> list[str]:
        start, end = max(0, self.first_op), min(self.final_op, len(order))
        if order and start >= end:
            raise popart_exception(
                f"Invalid dot range [{self.first_op}, {self.final_op}) for graph "
                f"'{graph.id}' with {len(order)} ops: set SessionOptions.firstDotOp < "
                f"finalDotOp and firstDotOp < {len(order)}."
            )
        lines: list[str] = []
        drawn: set[str] = set()
        shown = {op.id for op in order[start:end]}

        def tensor_node(t: Tensor) -> None:
            if t.id in drawn:
                return
            drawn.add(t.id)
            label = f"{t.info} nc:{len(t.consumers)}"
            if t.id in graph.inputs:
                label += f" in:{graph.inputs.index(t.id)}"
            if t.id in graph.outputs:
                label += f" out:{graph.outputs.index(t.id)}"
            lines.append(f"{_quote(t.id)} [shape=egg, color={_TENSOR_COLOURS[t.kind]}, "
                         f"label={_quote(label)}];")

        for k in range(start, end):
            op = order[k]
            lines.append(f"{_op_node(op)} [shape=box, label={_quote(self._op_label(k, op))}"
                         + (f", color={_quote(INPLACE_COLOUR)}" if op.modifies_inputs else "")
                         + "];")
            for t in op.inputs:
                if t is not None:
                    tensor_node(t)
                    lines.append(f"{_quote(t.id)} -> {_op_node(op)} "
                                 f"[label={_quote(f'{t.id} {_shape(t)}')}];")
            for t in op.outputs:
                if t is not None:
                    tensor_node(t)
                    lines.append(f"{_op_node(op)} -> {_quote(t.id)} "
                                 f"[label={_quote(f'{t.id} {_shape(t)}')}];")
        for after, befores in sorted(graph.constraints.items()):
            for before in sorted(befores):
                if after in shown and before in shown:
                    lines.append(f"{_quote(f'n_{before}')} -> {_quote(f'n_{after}')} "
                                 f"[color=grey, style=dotted];")
        return lines

    def _op_label(self, k: int, op: Op) -> str:
        s = op.settings
        label = f"{k}. {op.op_type} ({op.id})"
        if self.op_names:
            label += f" ({op.id}:{s.name})"
        if s.ipu is not None:
            label += f" vgid:{s.ipu}"
        if s.execution_phase is not None:
            label += f" pp:{s.execution_phase}"
        # IO tiles are not built yet: every op runs on the compute tiles.
        return label + " ts:Compute"

    def run_passes(self, ir: Ir, passes: Sequence, run_passes, debug: bool = False) -> None:
        """Run ``passes`` with ``run_passes`` (transforms.pipeline.run_passes) one at a time,
        writing FWD1 before autodiff (or after the last pass without one), BWD0 after it,
        then PREALIAS and FINAL."""
        names = [p.name for p in passes]
        has_autodiff = "autodiff" in names
        for p in passes:
            if p.name == "autodiff":
                self.write(ir, DotCheck.Fwd1)
            run_passes(ir, [p], debug)
            if p.name == "autodiff":
                self.write(ir, DotCheck.Bwd0)
        if not has_autodiff:
            self.write(ir, DotCheck.Fwd1)
        self.write(ir, DotCheck.PreAlias)
        self.write(ir, DotCheck.Final)


def write_dot(ir: Ir, check: DotCheck, options, order: Sequence[Op] | None = None) -> list[Path]:
    """One-off: write ``check`` for ``options`` (and ``POPART_DOT_CHECKS``)."""
    return DotWriter(options).write(ir, check, order)
