"""Ir: the main graph plus what the whole model shares (opsets, anchors, options)."""

from __future__ import annotations

from .graph import Graph


class Ir:
    """The intermediate representation of one session's model."""

    MAIN = "maingraph"

    def __init__(self, opsets: dict[str, int] | None = None):
        self.opsets: dict[str, int] = dict(opsets or {})
        self.graphs: dict[str, Graph] = {}
        self.main = self.create_graph(self.MAIN)
        # Filled by the session: tensor ids the host reads back after a run.
        self.anchors: list[str] = []
        # Training issue: id of the final loss tensor, if any.
        self.loss_id: str | None = None
        # Variables stored as per-replica shards (replicated tensor sharding, filled by
        # transforms/rts.py): id -> transforms.rts.Sharding. Their info is one shard; their
        # data stays the full host value (the host view of a sharded tensor is unsharded).
        self.sharded_variables: dict = {}

    def create_graph(self, graph_id: str) -> Graph:
        graph = Graph(graph_id, self)
        self.graphs[graph_id] = graph
        return graph

    def opset(self, domain: str = "ai.onnx") -> int:
        return self.opsets.get(domain, 1)
