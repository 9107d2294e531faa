"""Lowering: the session's Ir plus its data flow -> a ``Program`` the simulated device executes.

A Program names everything the device needs and nothing about how the IR was built: the
schedule of the main graph, the host input streams read every micro-batch, the anchor streams
written back (with the arithmetic already applied), the weights, and the loop counts of
one ``run()`` (batches per step × accumulation factor × local replicas, in that nesting).

Training programs have two fragments (docs/training.md): ops of the ``Normal`` context run
every micro-batch, ops of the ``AccumulateOuterFragment`` once per weight update, after the
last micro-batch of its accumulation window. Only variables may carry values between them.

A pipelined program also says which stage runs each op, host stream and anchor,
and its depth G (micro-batches per pipeline run): the simulator runs the fill/main/flush cycles
literally. Its schedule lists the Normal ops stage by stage, each stage's inter-IPU copies after
its compute, so slot lifetimes computed over it hold in every cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dataflow import (
    AnchorReturnType,
    DataFlow,
    anchor_fetches_per_run,
    anchor_shape,
)
from ..errors import popart_exception, popart_internal_exception
from ..ir.graph import Graph
from ..ir.ir import Ir
from ..ir.op import ExecutionContext, Op
from ..ir.tensor import TensorInfo, TensorKind, TensorRole

# The variable the device writes before each micro-batch (transforms/random_seed.py).
RANDOM_SEED_ID = "randomSeed___"


@dataclass(frozen=True)
class InputStream:
    """A host tensor fed once per micro-batch per replica (``[mb, *S]`` each time).
    ``broadcast`` (InputSettings(ReplicatedStreamMode.Broadcast)): the host array has no
    replica dimension; every replica of a micro-batch reads the same value."""

    id: str
    info: TensorInfo
    broadcast: bool = False


@dataclass(frozen=True)
class AnchorStream:
    """A tensor returned to the host, with its return type and per-run chunk count."""

    id: str
    info: TensorInfo
    art: AnchorReturnType
    fetches_per_run: int  # nelms(T) chunks one run writes, all replicas together
    host_shape: tuple[int, ...]  # initAnchorArrays() shape


@dataclass
class Program:
    """What one session runs on the simulated device."""

    graph: Graph
    schedule: list[Op]
    inputs: list[InputStream]
    # Model inputs nothing reads (e.g. only their shape was used and got folded): a buffer
    # given for them is ignored with a warning.
    unused_inputs: frozenset[str]
    anchors: list[AnchorStream]
    weights: list[str]  # VARIABLE tensors (device-resident, host-visible)
    batches_per_step: int
    accumulation_factor: int
    replication_factor: int
    ipus_per_replica: int
    # The random-seed variable when some op reads it, else None.
    random_seed_id: str | None = None
    # True when some op runs in the accumulate outer fragment (once per weight update).
    has_outer_fragment: bool = False
    # Pipelining (0 stages: not pipelined): stages P, depth G, the stage of each input stream
    # (its first reader's) and of each anchor (its producer's), in ``inputs``/``anchors`` order.
    num_stages: int = 0
    pipeline_depth: int = 0
    input_stages: tuple[int, ...] = ()
    anchor_stages: tuple[int, ...] = ()
    # Op outputs aliasing device state that must keep their slot for the whole run (stashes).
    persistent: tuple[str, ...] = ()

    @property
    def windowed(self) -> bool:
        """Whether the micro-batches run in accumulation windows (one pipeline run each)."""
        return self.has_outer_fragment or self.accumulation_factor > 1

    @property
    def micro_batches_per_run(self) -> int:
        return self.batches_per_step * self.accumulation_factor * self.replication_factor


def lower(ir: Ir, data_flow: DataFlow, replication_factor: int = 1,
          accumulation_factor: int = 1) -> Program:
    """Build the Program of ``ir``'s main graph for ``data_flow``."""
    graph = ir.main
    bps = data_flow.batchesPerStep()
    anchors = []
    for anchor_id in data_flow.anchors():
        tensor = graph.tensors.get(anchor_id)
        if tensor is None:
            # The session checked anchors on the imported graph; a pass must keep them.
            raise popart_internal_exception(
                f"Anchor '{anchor_id}' disappeared from the IR during the passes; passes must "
                f"keep every tensor listed in ir.anchors."
            )
        art = data_flow.art(anchor_id)
        anchors.append(AnchorStream(
            id=anchor_id,
            info=tensor.info,
            art=art,
            fetches_per_run=anchor_fetches_per_run(art, bps, accumulation_factor,
                                                   replication_factor),
            host_shape=anchor_shape(art, tensor.info.shape, bps, accumulation_factor,
                                    replication_factor),
        ))
    anchored = {a.id for a in anchors}
    inputs, unused = [], set()
    for tensor_id in graph.inputs:
        tensor = graph.tensors[tensor_id]
        if tensor.kind is not TensorKind.STREAM:
            continue
        if tensor.consumers or tensor_id in anchored:
            inputs.append(InputStream(tensor_id, tensor.info))
        else:
            unused.add(tensor_id)
    # Stash ring buffers are device-only state: no host copy.
    weights = [t.id for t in graph.tensors.values()
               if t.kind is TensorKind.VARIABLE and t.id != RANDOM_SEED_ID
               and t.role is not TensorRole.STASH]
    schedule = graph.topo_order()
    has_outer = _check_fragments(graph, schedule, anchors)
    stages = [op.settings.pipeline_stage for op in schedule
              if op.settings.execution_context is ExecutionContext.Normal]
    num_stages = max(s for s in stages if s is not None) + 1 if any(
        s is not None for s in stages) else 0
    pipeline = {}
    if num_stages:
        schedule = _stage_order(schedule)
        pipeline = dict(
            num_stages=num_stages,
            # Accumulation: one pipeline per weight update (or, in a training session's
            # forward-only program, per accumulation window); else one over batchesPerStep.
            pipeline_depth=accumulation_factor if has_outer or accumulation_factor > 1 else bps,
            input_stages=tuple(_stage_of(graph.tensors[i.id], num_stages) for i in inputs),
            anchor_stages=tuple(_stage_of(graph.tensors[a.id], num_stages) for a in anchors),
        )
    ipus = [op.settings.ipu for op in schedule if op.settings.ipu is not None]
    return Program(
        graph=graph,
        schedule=schedule,
        inputs=inputs,
        unused_inputs=frozenset(unused),
        anchors=anchors,
        weights=weights,
        batches_per_step=bps,
        accumulation_factor=accumulation_factor,
        replication_factor=replication_factor,
        ipus_per_replica=max(ipus) + 1 if ipus else 1,
        random_seed_id=RANDOM_SEED_ID if RANDOM_SEED_ID in graph.tensors else None,
        has_outer_fragment=has_outer,
        persistent=tuple(op.outputs[0].id for op in schedule
                         if op.output_persists),
        **pipeline,
    )


def _stage_order(schedule: list[Op]) -> list[Op]:
    """Normal ops grouped by stage, each stage's compute before its end-of-cycle copies; other
    fragments after, each in schedule order."""
    contexts = list(ExecutionContext)

    def key(op: Op):
        normal = op.settings.execution_context is ExecutionContext.Normal
        return (contexts.index(op.settings.execution_context),
                op.settings.pipeline_stage if normal else 0,
                normal and op.runs_between_cycles)

    return sorted(schedule, key=key)


def _stage_of(tensor, num_stages: int) -> int:
    """The stage after which a tensor holds a micro-batch's value: its producer's; a stream's
    first reader's; a variable's or constant's, the last stage."""
    normal = ExecutionContext.Normal
    producer = tensor.producer
    if producer is not None and producer.settings.execution_context is normal:
        # A copy's value lands at the end of its stage's cycle, for the next stage to read.
        return producer.settings.pipeline_stage + producer.runs_between_cycles
    if tensor.kind is TensorKind.STREAM:
        readers = [op.settings.pipeline_stage for op in tensor.consumers
                   if op.settings.execution_context is normal]
        if readers:
            return min(readers)
    return num_stages - 1


def _check_fragments(graph: Graph, schedule: list[Op], anchors: list[AnchorStream]) -> bool:
    """Check that only variables cross from the outer fragment; True if it has ops."""
    outer = ExecutionContext.AccumulateOuterFragment
    outer_ops = [op for op in schedule if op.settings.execution_context is outer]
    for op in schedule:
        if op.settings.execution_context is outer:
            continue
        for t in op.inputs:
            if t is not None and t.producer is not None and (
                t.producer.settings.execution_context is outer
            ):
                raise popart_internal_exception(
                    f"{op.debug_name} runs every micro-batch but reads '{t.id}', which "
                    f"{t.producer.debug_name} computes in the accumulate outer fragment; only "
                    f"variables may cross fragments."
                )
    for anchor in anchors:
        producer = graph.tensors[anchor.id].producer
        if producer is not None and producer.settings.execution_context is outer:
            raise popart_exception(
                f"Anchor '{anchor.id}' is computed by {producer.debug_name} once per weight "
                f"update (the accumulate outer fragment), not every micro-batch, so it has no "
                f"value per micro-batch to return. Anchor the weight or the gradient "
                f"'Gradient___<weight>' instead, or read weights with weightsToHost()."
            )
    return bool(outer_ops)
