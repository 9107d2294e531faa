"""SessionOptions.enableConstantFoldingOfMultipleConsumers = False at import: which nodes the
importer leaves unfolded.

The rule (the same as transforms/const_fold.py's ``FoldConstants`` applies to the IR): an op
whose inputs are all constants is not folded when one of its inputs has several readers.
Values a later op needs at compile time (Reshape's shape, Slice's starts ..., and everything
they are computed from) are always folded, or the op could not be built.
"""

from __future__ import annotations

from collections import Counter

import onnx

from ..ops.registry import const_input_positions, normalize_domain

__all__ = ["unfolded_outputs"]


def unfolded_outputs(graph: onnx.GraphProto, opsets: dict[str, int]) -> set[str]:
    """First output names of the nodes of ``graph`` to keep unfolded (see module docstring)."""
    readers = Counter(name for node in graph.node for name in node.input if name)
    producer = {out: node for node in graph.node for out in node.output if out}
    needed: set[str] = set()
    stack = []
    for node in graph.node:
        domain = normalize_domain(node.domain)
        positions = const_input_positions(node.op_type, domain, opsets.get(domain, 0))
        stack += [n for i, n in enumerate(node.input) if n and i in positions]
    while stack:  # everything a compile-time operand is computed from
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        if name in producer:
            stack += [n for n in producer[name].input if n]
    return {node.output[0] for node in graph.node
            if node.output and node.output[0] and not any(o in needed for o in node.output)
            and any(readers[n] > 1 for n in node.input if n)}
