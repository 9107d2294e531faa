"""Phased execution (P43): ``SerialPhasedExecution`` / ``ParallelPhasedExecution`` as backend
execution phases.

Each phase of the strategy holds one ``Stage`` (its blocks); every op traced in one of those
blocks gets the ``__execution_phase`` of its phase (ops before any block: phase 0) and the
session runs with ``VirtualGraphMode.ExecutionPhases``:

- ``ParallelPhasedExecution``: ``executionPhaseSettings.stages = 2``, phase p on IPU p % 2
  (even phases on one IPU, odd phases on the other); ``SerialPhasedExecution``: ``stages = 1``,
  every phase on one IPU, one after another.
- The backward pass runs the phases back from the last one (the backend's numbering).
- Tensor liveness (``setTensorsLiveness``; ``sendTensorsOffChipAfterFwd`` sets
  ``OffChipAfterFwd``) becomes tensor locations: ``AlwaysLive`` (the default) keeps everything
  on chip; ``OffChipAfterFwd`` puts the activations the backward pass reads in streaming memory
  (loaded while the previous phase runs); ``OffChipAfterFwdNoOverlap`` the same, loaded at the
  start of the phase that reads them; ``OffChipAfterEachPhase`` also streams the weights in and
  out of every phase that uses them.
- ``useSeparateBackwardPhase`` is logged once as having no effect: the simulated backward
  phases already run after every forward phase.

A phase with several stages (several IPUs inside one phase) is refused with an ``Error``.
"""

from __future__ import annotations

import logging

import onnx
from onnx import helper

import popart_backend as popart

from . import blocks
from .errors import Error

__all__ = ["PHASE_ATTR", "apply_phase_options", "is_phased", "place_phased"]

PHASE_ATTR = "__execution_phase"

_log = logging.getLogger("poptorch_lite")
_logged: set[str] = set()


def is_phased(strategy) -> bool:
    return isinstance(strategy, (blocks.SerialPhasedExecution, blocks.ParallelPhasedExecution))


def _expected_ipu(strategy, index: int) -> int:
    return 0 if isinstance(strategy, blocks.SerialPhasedExecution) else index % 2


def _phase_blocks(strategy) -> dict[str, int]:
    """block id -> phase index, checking one stage per phase and the IPUs given."""
    name = type(strategy).__name__
    where: dict[str, int] = {}
    serial_ipus: set[int] = set()
    for index, phase in enumerate(strategy.phases):
        if len(phase.stages) != 1:
            raise Error(
                f"{name}: phase {index} has {len(phase.stages)} stages; the simulated IPUs run "
                f"each phase on one IPU. Give each phase one Stage (a Stage may hold several "
                f"blocks: Stage('a', 'b')).")
        stage = phase.stages[0]
        given = set(phase._ipus or ()) | ({stage._ipu} if stage._ipu is not None else set())
        if isinstance(strategy, blocks.SerialPhasedExecution):
            serial_ipus |= given
        elif given - {index % 2}:
            raise Error(
                f"{name}: phase {index} is set to IPU {sorted(given)}, but parallel phases "
                f"alternate between two IPUs: even phases on IPU 0, odd phases on IPU 1. Use "
                f".ipus({index % 2}) for phase {index} or leave the IPUs unset.")
        for block in stage.blocks:
            if block in where:
                raise Error(f"{name}: block '{block}' is in phases {where[block]} and {index}; "
                            f"a block runs in one phase.")
            where[block] = index
    if len(serial_ipus) > 1:
        raise Error(f"{name}: the phases are set to IPUs {sorted(serial_ipus)}, but serial "
                    f"phases all run on the same IPU. Give every phase the same IPU or none.")
    return where


def place_phased(proto: onnx.ModelProto, strategy) -> blocks.Placement:
    """Write ``__execution_phase`` on every node of ``proto`` (in place) from its block and
    the strategy's phases; returns the placement (one StagePlacement per phase)."""
    name = type(strategy).__name__
    if not strategy.phases:
        raise Error(f"{name}: no phases given; list them, e.g. {name}(['block0'], ['block1']).")
    where = _phase_blocks(strategy)
    graph = proto.graph
    resolved, ipus = blocks._node_blocks(graph)
    known = [b for b in ipus if b != blocks._DEFAULT]
    missing = [b for b in known if b not in where]
    if missing:
        raise Error(
            f"{name}: block(s) {', '.join(map(repr, missing))} ran in forward but are in no "
            f"phase of the execution strategy. Known blocks: {', '.join(map(repr, known))}. "
            f"Add them to a phase.")
    if isinstance(strategy, blocks.SerialPhasedExecution):
        _log_serial_ipus(strategy, {ipus[b] for b in known} - {None})
    for block in known:
        expected = _expected_ipu(strategy, where[block])
        if isinstance(strategy, blocks.ParallelPhasedExecution) and ipus[block] not in (
                None, expected):
            raise Error(
                f"{name}: block '{block}' has ipu_id={ipus[block]}, but it is in phase "
                f"{where[block]}, which runs on IPU {expected} (even phases on IPU 0, odd on "
                f"IPU 1). Change its ipu_id or its phase.")
    for node, block in zip(graph.node, resolved):
        blocks._strip(node, (blocks.IPU_ATTR, blocks.STAGE_ATTR, blocks.BLOCK_ATTR, PHASE_ATTR))
        node.attribute.append(helper.make_attribute(PHASE_ATTR, int(where.get(block, 0))))
    count = len(strategy.phases)
    stages = 1 if isinstance(strategy, blocks.SerialPhasedExecution) else min(2, count)
    placements = [blocks.StagePlacement(index, index % stages, list(phase.stages[0].blocks))
                  for index, phase in enumerate(strategy.phases)]
    return blocks.Placement("phased", placements, stages, phases=count, phase_stages=stages)


def _log_serial_ipus(strategy, block_ipus: set[int]) -> None:
    """Serial phases all run on IPU 0 here: log once an IPU other than 0 asked for by a
    phase, a stage or a block's ipu_id (every simulated IPU is the same, so which one the
    phases share changes no number)."""
    given = set(block_ipus)
    for phase in strategy.phases:
        given |= set(phase._ipus or ()) | {s._ipu for s in phase.stages if s._ipu is not None}
    if given - {0} and "serial_ipu" not in _logged:
        _logged.add("serial_ipu")
        _log.warning("SerialPhasedExecution: IPU(s) %s given to the phases or their blocks have "
                     "no effect: serial phases share one IPU, which is IPU 0 in the simulator "
                     "(every simulated IPU is the same, so the numbers do not change).",
                     sorted(given - {0}))


def apply_phase_options(options: popart.SessionOptions, placement: blocks.Placement,
                        strategy) -> None:
    """The backend options of a phased placement: the mode, phases, stages, and the tensor
    locations of the strategy's liveness."""
    options.virtualGraphMode = popart.VirtualGraphMode.ExecutionPhases
    options.enablePipelining = False
    settings = options.executionPhaseSettings
    settings.phases, settings.stages = placement.phases, placement.phase_stages
    liveness = strategy.liveness
    off_chip = popart.TensorStorage.OffChip
    if liveness is not blocks.Liveness.AlwaysLive:
        options.activationTensorLocationSettings.location.storage = off_chip
    if liveness is blocks.Liveness.OffChipAfterFwdNoOverlap:
        settings.activationIOSchedule = popart.ExecutionPhaseIOSchedule.OnDemand
    if liveness is blocks.Liveness.OffChipAfterEachPhase:
        options.weightTensorLocationSettings.location.storage = off_chip
    if strategy.separate_backward_phase and "separate" not in _logged:
        _logged.add("separate")
        _log.warning("%s.useSeparateBackwardPhase(True) has no effect in the simulated IPU: "
                     "the backward phases already run after every forward phase.",
                     type(strategy).__name__)
