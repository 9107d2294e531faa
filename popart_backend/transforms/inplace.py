"""Switch ops to their in-place variants where no other reader can notice (PopART's InPlace
pattern: the pass does nothing when ``Ir.patterns`` has InPlace off), in the main graph and
the subgraph bodies, except on ops that exclude InPlace (the builder's ``excludePatterns``).

An op offers variants through ``Op.inplace_variants() -> [(opid, priority)]`` (best first by
priority; the base class offers none) and ``make_inplace(opid)``, which turns it into the variant: the same node, whose
kernel now writes the inputs listed in ``modifies_inputs`` and returns them as outputs. Today
custom ops (``popart_backend.custom``) offer variants; built-in ops do not.

A variant is used only when each input it modifies is an activation that this op alone reads,
that is not anchored and not a graph output, and whose producer declares ``fresh_outputs``
(its outputs never alias a weight, a constant or a host buffer; many built-in kernels return
their input itself, so they do not qualify): then nothing can observe the overwritten value,
and no scheduling constraint is needed. In training the pass runs after autodiff, so a grad op reading the forward input
counts as a second reader and keeps the op out of place.

Before:  a = Add(x, b)                  After:  a = Add(x, b)
         y = Scale(a)                           y = ScaleInplace(a)   # writes a's storage
"""

from __future__ import annotations

import logging

from ..ir.ir import Ir

_log = logging.getLogger("popart:transform")


class InplaceVariants:
    """Pass: replace ops by their best in-place variant when it is safe."""

    name = "inplace_variants"

    def run(self, ir: Ir) -> bool:
        if not ir.patterns.isPatternEnabled("InPlace"):
            return False  # the InPlace pattern is off (Patterns)
        changed = False
        for graph in list(ir.graphs.values()):  # the main graph and every subgraph body
            protected = set(graph.outputs) | set(ir.anchors)
            for op in graph.topo_order():
                if "InPlace" in op.settings.excluded_patterns:
                    continue  # the builder's excludePatterns(..., ["InPlace"])
                for opid, _priority in sorted(op.inplace_variants(), key=lambda v: -float(v[1])):
                    modified = op.inplace_modifies(opid)
                    if all(self._safe(op, i, protected) for i in modified):
                        _log.debug("inplace: %s becomes %s", op.debug_name, opid)
                        op.make_inplace(opid)
                        changed = True
                        break
        return changed

    @staticmethod
    def _safe(op, index: int, protected: set[str]) -> bool:
        tensor = op.inputs[index] if index < len(op.inputs) else None
        return (tensor is not None
                and tensor.producer is not None
                and tensor.producer.fresh_outputs
                and tensor.id not in protected
                and len(tensor.consumers) == 1
                and tensor.producer.settings.execution_context is op.settings.execution_context)
