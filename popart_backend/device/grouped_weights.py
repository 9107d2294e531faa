"""Replica-grouped variables on the simulated device (``Ir.grouped_variables``,
ir/replica_grouping.py): each local replica holds its group's value of the variable.

The host value of a grouped variable has one entry per group (``[groups, *S]``, or ``S`` with
one group). Writing gives every replica its group's entry; reading gives the first replica of
each group, or every replica's value (``read_replicas``) for the retrieval modes that need
them. ``SimulatedDevice`` mixes this in.
"""

from __future__ import annotations

import numpy as np
import torch

from ..dtypes import to_host
from ..errors import popart_exception
from .plan import to_torch

__all__ = ["GroupedWeights"]


class GroupedWeights:
    """The grouped-variable part of ``SimulatedDevice`` (it uses ``plan``, ``comm`` and
    ``program``)."""

    @property
    def _grouped(self) -> dict:
        ir = self.program.graph.ir
        return ir.grouped_variables if ir is not None else {}

    def _write_all_groups(self) -> None:
        """At allocation: every replica gets its group's entry of the IR's host value."""
        for tensor_id, grouping in self._grouped.items():
            self._write_groups(tensor_id, grouping, self.plan.get_value(tensor_id))

    def _write_grouped(self, values: dict) -> dict:
        """Write the grouped variables of ``values`` (host arrays); return the others."""
        grouped = self._grouped
        rest = {}
        with torch.no_grad():
            for tensor_id, array in values.items():
                grouping = grouped.get(tensor_id)
                if grouping is None:
                    rest[tensor_id] = array
                else:
                    self._write_groups(tensor_id, grouping, to_torch(array))
        return rest

    def _write_groups(self, tensor_id: str, grouping, host: torch.Tensor) -> None:
        if tensor_id in self.program.graph.ir.sharded_variables:
            raise popart_exception(
                f"Variable '{tensor_id}' is both replica-grouped (VariableSettings) and sharded "
                f"(replicated tensor sharding); the simulator supports one or the other. Turn "
                f"replicated tensor sharding off for it."
            )
        slot = self.plan.slot[tensor_id]
        with torch.no_grad():
            for r, replica in enumerate(self.plan.replica_values):
                group = grouping.group_of(self.comm.offset + r)
                replica[slot] = (host[group] if grouping.num_groups > 1 else host).clone()

    def _replica_value(self, tensor_id: str, replica: int) -> np.ndarray:
        """Global ``replica``'s value; refused when another instance holds it."""
        local = replica - self.comm.offset
        if not 0 <= local < len(self.plan.replica_values):
            raise popart_exception(
                f"Reading replica-grouped variable '{tensor_id}' needs replica {replica}, "
                f"which another instance holds; read grouped variables from one instance "
                f"(all replicas local)."
            )
        return to_host(self.plan.replica_values[local][self.plan.slot[tensor_id]])

    def _read_grouped(self, ids) -> dict[str, np.ndarray]:
        """The host values of the grouped variables among ``ids``: each group's first
        replica."""
        out = {}
        for tensor_id in ids:
            grouping = self._grouped.get(tensor_id)
            if grouping is not None:
                firsts = [self._replica_value(tensor_id, g[0]) for g in grouping.groups]
                out[tensor_id] = np.stack(firsts) if len(firsts) > 1 else firsts[0].copy()
        return out

    def read_replicas(self, ids) -> dict[str, np.ndarray]:
        """Every replica's value of the given grouped variables: ``[replicas, *S]``."""
        return {tensor_id: np.stack([self._replica_value(tensor_id, r)
                                     for r in range(self._grouped[tensor_id].replicas)])
                for tensor_id in ids}
