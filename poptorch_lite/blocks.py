"""Model partitioning annotations: blocks, stages and execution strategies.

Blocks are recorded while ``torch.export`` runs ``forward``: the current block ``(user_id,
ipu_id, serial)`` is put into the FX node metadata (``node.meta["custom"]``) of every op traced
while it is active; tracing.py hands it to ``annotate_node``, which writes the block's id
(``__block_id``) and its IPU into the ONNX node. On CPU (not tracing) blocks do nothing.

Before the session is built, ``place_model`` turns blocks into placement with the execution
strategy: every node gets ``__ipu_number`` and ``__pipeline_stage``.

- Ops before any block go to IPU 0, stage 0; ops the exporter adds without a source op take
  the block of what they read, or of where they were emitted.
- ``AutoStage.SameAsIpu`` (default): stage = the block's ``ipu_id``; ``AutoIncrement``: blocks
  numbered in the order they first run; explicit ``Stage`` lists: stage = position in the list.
- Stages must not decrease along the forward graph (pipelined); adjacent stages on the same IPU
  merge and stages are renumbered 0..P-1, as the backend requires.

Example: ``BeginBlock(model.enc, "enc", ipu_id=0); BeginBlock(model.head, "head", ipu_id=1)``
gives stage 0 on IPU 0 for the encoder and stage 1 on IPU 1 for the head and the loss; with
training the backend adds the backward stages 2 (IPU 1) and ... (``2L - s``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools

import onnx
import torch
import torch.fx.traceback as fx_traceback
from onnx import helper

from .errors import Error

__all__ = [
    "AutoStage",
    "BeginBlock",
    "BlockId",
    "Block",
    "BlockFunction",
    "ExecutionStrategy",
    "Liveness",
    "ParallelPhasedExecution",
    "Phase",
    "PipelinedExecution",
    "SerialPhasedExecution",
    "ShardedExecution",
    "Stage",
    "isRunningOnIpu",
    "removeBlocks",
]

META_KEY = "poptorch_lite_block"
_HOOK_ATTR = "_poptorch_lite_block_hook"

IPU_ATTR = "__ipu_number"
STAGE_ATTR = "__pipeline_stage"
BLOCK_ATTR = "__block_id"  # which block an ONNX node was traced in (read by place_model)

# PopTorch's type of block ids (``BeginBlock(m, "id")``): a string.
BlockId = str

_state = {"tracing": False, "auto_id": None, "serial": 0}


@contextlib.contextmanager
def tracing_blocks():
    """Active while the frontend traces: blocks write FX metadata only inside it."""
    _state["tracing"] = True
    _state["auto_id"] = None
    _state["serial"] = 0
    _set_current(None)
    try:
        yield
    finally:
        _set_current(None)
        _state["tracing"] = False


def isRunningOnIpu() -> bool:  # noqa: N802 - PopTorch's name
    """True while the frontend traces ``forward`` for the IPU, False when it runs on CPU."""
    return bool(_state["tracing"])


def _current():
    return (fx_traceback.current_meta.get("custom") or {}).get(META_KEY)


def _set_current(block) -> None:
    if not _state["tracing"]:
        return
    custom = dict(fx_traceback.current_meta.get("custom") or {})
    if block is None:
        custom.pop(META_KEY, None)
    else:
        custom[META_KEY] = block
    fx_traceback.current_meta["custom"] = custom


def _block_id(user_id):
    if user_id is None and _state["auto_id"] is not None:
        user_id = str(_state["auto_id"])
        _state["auto_id"] += 1
    return None if user_id is None else str(user_id)


def _new_block(user_id, ipu_id) -> tuple:
    """(user_id, ipu_id, serial): the serial tells id-less blocks apart."""
    _state["serial"] += 1
    return (_block_id(user_id), _check_ipu(ipu_id), _state["serial"])


def _check_ipu(ipu_id):
    if ipu_id is not None and (not isinstance(ipu_id, int) or ipu_id < 0):
        raise ValueError(f"ipu_id must be a non-negative int or None, got {ipu_id!r}.")
    return ipu_id


class Block:
    """``with Block(user_id, ipu_id):`` puts the ops traced inside on ``ipu_id``."""

    def __init__(self, user_id=None, ipu_id: int | None = None):
        self.user_id = user_id
        self.ipu_id = _check_ipu(ipu_id)
        self._previous = None

    @staticmethod
    def useAutoId() -> None:  # noqa: N802 - PopTorch's name
        """Number id-less blocks "0", "1", ... from here on (call at the top of forward)."""
        _state["auto_id"] = 0

    @staticmethod
    def start(user_id=None, ipu_id: int | None = None) -> None:
        """Start a block that lasts until the next block starts."""
        _set_current(_new_block(user_id, ipu_id))

    def __enter__(self):
        self._previous = _current()
        _set_current(_new_block(self.user_id, self.ipu_id))
        return self

    def __exit__(self, *exc_info):
        _set_current(self._previous)
        return False


def BlockFunction(user_id=None, ipu_id: int | None = None):  # noqa: N802
    """Decorator running a function inside ``Block(user_id, ipu_id)``."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with Block(user_id, ipu_id):
                return fn(*args, **kwargs)

        return wrapper

    return decorate


def BeginBlock(layer_to_call, user_id=None, ipu_id: int | None = None):  # noqa: N802
    """Start a block when ``layer_to_call`` runs; it lasts until the next block starts."""
    _check_ipu(ipu_id)
    if not isinstance(layer_to_call, torch.nn.Module):
        if callable(layer_to_call):
            # Legacy form: wrap a plain callable so the block starts when it is called.
            @functools.wraps(layer_to_call)
            def call(*args, **kwargs):
                Block.start(user_id, ipu_id)
                return layer_to_call(*args, **kwargs)

            return call
        raise Error(f"BeginBlock: expected a torch.nn.Module or a callable, got "
                    f"{type(layer_to_call).__name__}.")
    if getattr(layer_to_call, _HOOK_ATTR, None) is not None:
        raise Error(f"BeginBlock: module {type(layer_to_call).__name__} already starts a block; "
                    f"call poptorch_lite.removeBlocks(module) first to re-annotate it.")

    def hook(_module, _inputs):
        Block.start(user_id, ipu_id)

    handle = layer_to_call.register_forward_pre_hook(hook)
    object.__setattr__(layer_to_call, _HOOK_ATTR, handle)
    layer_to_call._poptorch_lite_block = (user_id, ipu_id)
    return layer_to_call


def removeBlocks(module: torch.nn.Module) -> None:  # noqa: N802
    """Remove every BeginBlock hook from ``module`` and its submodules."""
    for sub in module.modules():
        handle = getattr(sub, _HOOK_ATTR, None)
        if handle is not None:
            handle.remove()
            object.__setattr__(sub, _HOOK_ATTR, None)
            sub.__dict__.pop("_poptorch_lite_block", None)


def block_annotations(module: torch.nn.Module) -> dict[str, tuple]:
    """Module path -> (user_id, ipu_id) for every BeginBlock'ed submodule (for ``__repr__``)."""
    return {name: sub._poptorch_lite_block for name, sub in module.named_modules()
            if getattr(sub, "_poptorch_lite_block", None) is not None}


# --- stages and strategies ----------------------------------------------------------------------


class AutoStage(enum.IntEnum):
    SameAsIpu = 0
    AutoIncrement = 1


class Liveness(enum.IntEnum):
    AlwaysLive = 0
    OffChipAfterFwd = 1
    OffChipAfterFwdNoOverlap = 2
    OffChipAfterEachPhase = 3


class Stage:
    """A pipeline stage made of block ids: ``Stage("A", "B").ipu(1)``."""

    def __init__(self, *block_ids):
        self.blocks = [str(b) for b in block_ids]
        self._ipu = None

    def ipu(self, ipu: int) -> "Stage":
        self._ipu = _check_ipu(ipu)
        return self

    def __repr__(self) -> str:
        return f"Stage({', '.join(map(repr, self.blocks))}).ipu({self._ipu})"


class ExecutionStrategy:
    """Base of the strategies accepted by ``Options.setExecutionStrategy``."""

    def __init__(self, *stages):
        self.stages = []
        seen = set()
        for stage in stages:
            if isinstance(stage, (str, int)):
                stage = Stage(stage)
            elif isinstance(stage, (list, tuple)):
                stage = Stage(*stage)
            if not isinstance(stage, Stage):
                raise TypeError(f"{type(self).__name__}: expected Stage objects, block ids or "
                                f"lists of block ids, got {type(stage).__name__}.")
            for block in stage.blocks:
                if block in seen:
                    raise Error(f"{type(self).__name__}: block '{block}' is in two stages.")
                seen.add(block)
            self.stages.append(stage)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.stages))})"

    def _all_stages(self) -> list[Stage]:
        return self.stages

    def stage(self, block_id) -> Stage:
        """The Stage holding ``block_id`` (e.g. to pin it: ``strategy.stage("B").ipu(1)``)."""
        block = str(block_id)
        stages = self._all_stages()
        for stage in stages:
            if block in stage.blocks:
                return stage
        if not stages:
            raise Error(f"{type(self).__name__}.stage({block_id!r}): this strategy numbers "
                        f"stages automatically, so it has no Stage objects to look up; list "
                        f"the stages explicitly, e.g. {type(self).__name__}(Stage({block!r}), "
                        f"...), to address them.")
        known = [b for s in stages for b in s.blocks]
        raise Error(f"{type(self).__name__}.stage({block_id!r}): no stage holds block "
                    f"{block!r}; known blocks: {', '.join(map(repr, known))}.")


class PipelinedExecution(ExecutionStrategy):
    def __init__(self, *stages):
        self.auto_stage = AutoStage.SameAsIpu
        if len(stages) == 1 and isinstance(stages[0], AutoStage):
            self.auto_stage = stages[0]
            stages = ()
        super().__init__(*stages)


class ShardedExecution(PipelinedExecution):
    pass


class Phase:
    def __init__(self, *stages):
        self.stages = [s if isinstance(s, Stage) else Stage(*(s if isinstance(s, (list, tuple))
                                                               else [s])) for s in stages]
        self._ipus = None

    def stage(self, idx: int) -> Stage:
        """The phase's ``idx``-th Stage."""
        if not isinstance(idx, int) or not -len(self.stages) <= idx < len(self.stages):
            raise Error(f"Phase.stage({idx!r}): the phase has {len(self.stages)} stage(s); "
                        f"give an index in 0..{len(self.stages) - 1}.")
        return self.stages[idx]

    def ipus(self, *ipus: int) -> "Phase":
        if len(ipus) != len(self.stages):
            raise Error(f"Phase.ipus: {len(ipus)} IPU(s) given for {len(self.stages)} stage(s).")
        self._ipus = ipus
        return self


class _PhasedExecution(ExecutionStrategy):
    def __init__(self, *phases):
        if any(isinstance(p, AutoStage) for p in phases):
            raise Error(f"{type(self).__name__}: phased execution has no automatic stages; "
                        f"list the phases explicitly.")
        self.phases = [p if isinstance(p, Phase) else Phase(*(p if isinstance(p, (list, tuple))
                                                              else [p])) for p in phases]
        super().__init__()
        self.separate_backward_phase = False
        self.liveness = Liveness.AlwaysLive  # tensor locations between phases (phased.py)

    def _all_stages(self) -> list[Stage]:
        return [stage for phase in self.phases for stage in phase.stages]

    def phase(self, index: int) -> Phase:
        return self.phases[index]

    def useSeparateBackwardPhase(self, use: bool = True):  # noqa: N802
        self.separate_backward_phase = bool(use)
        return self


class SerialPhasedExecution(_PhasedExecution):
    def setTensorsLiveness(self, liveness: Liveness):  # noqa: N802
        self.liveness = Liveness(liveness)
        return self


class ParallelPhasedExecution(_PhasedExecution):
    def sendTensorsOffChipAfterFwd(self, off_chip: bool = True):  # noqa: N802
        self.off_chip_after_fwd = bool(off_chip)
        self.liveness = Liveness.OffChipAfterFwd if off_chip else Liveness.AlwaysLive
        return self


# --- placement: blocks + strategy -> __ipu_number / __pipeline_stage ------------------------------


def annotate_node(node: onnx.NodeProto, block) -> None:
    """Record the block ``(user_id, ipu_id, serial)`` a node was traced in (tracing.py calls
    this). The IPU is written at once so the traced model shows it; ``place_model`` rewrites
    both placement attributes from the execution strategy before compiling."""
    user_id, ipu_id, serial = block
    key = user_id if user_id is not None else f"#{serial}"
    node.attribute.append(helper.make_attribute(BLOCK_ATTR, key))
    if ipu_id is not None:
        node.attribute.append(helper.make_attribute(IPU_ATTR, int(ipu_id)))
        node.attribute.append(helper.make_attribute(STAGE_ATTR, int(ipu_id)))


@dataclasses.dataclass
class StagePlacement:
    """One pipeline stage after merging: its IPU and the block ids it runs."""

    stage: int
    ipu: int
    blocks: list[str]


@dataclasses.dataclass
class Placement:
    """Where a traced model runs: stages (forward only) and IPUs per replica."""

    strategy: str  # "single", "pipelined", "sharded" or "phased" (phased.py)
    stages: list[StagePlacement]  # phased: one per phase
    ipus_per_replica: int
    phases: int = 0  # phased: the forward phases
    phase_stages: int = 0  # phased: IPUs the phases alternate over (executionPhaseSettings)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def pipelined(self) -> bool:
        return self.strategy == "pipelined"

    @property
    def multi_ipu(self) -> bool:
        return self.ipus_per_replica > 1


_DEFAULT = "<before any block>"


AVAILABLE_MEMORY_ATTR = "__available_memory"
_MATRIX_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})


def apply_memory_proportions(proto: onnx.ModelProto, proportions: dict) -> None:
    """``Options.setAvailableMemoryProportion({"IPU0": p, ...})``: every MatMul, Gemm and
    Conv placed on IPU k that has no proportion of its own (``set_available_memory``) gets
    "IPUk"'s value, which the backend's planner uses to bound the op's temporary memory and
    choose its plan (fewer temporaries, more cycles)."""
    for key in proportions:
        if not str(key)[3:].isdigit():
            raise Error(f"Options.setAvailableMemoryProportion: keys are 'IPU' and an IPU "
                        f"number, e.g. 'IPU0'; got {key!r}.")
    for node in proto.graph.node:
        if node.op_type not in _MATRIX_OPS or _attr(node, AVAILABLE_MEMORY_ATTR) is not None:
            continue
        value = proportions.get(f"IPU{_attr(node, IPU_ATTR) or 0}")
        if value is not None:
            node.attribute.append(helper.make_attribute(AVAILABLE_MEMORY_ATTR, float(value)))


def _attr(node: onnx.NodeProto, name: str):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return None


def _strip(node: onnx.NodeProto, names) -> None:
    keep = [a for a in node.attribute if a.name not in names]
    del node.attribute[:]
    node.attribute.extend(keep)


def _node_blocks(graph: onnx.GraphProto) -> tuple[list[str], dict[str, int | None]]:
    """The block of every node (by index) and each block's ipu_id, in first-run order.

    Nodes without a block (ops before any block, ops the exporter adds) take the latest block
    among the ops they read, else the block active where the exporter emitted them (the one of
    the last annotated node before them; "before any block" at the start). Constants go with
    their first reader.
    """
    nodes = list(graph.node)
    own = []
    ipus: dict[str, int | None] = {}
    for node in nodes:
        key = _attr(node, BLOCK_ATTR)
        if isinstance(key, bytes):
            key = key.decode()
        own.append(key)
        if key is None:
            continue
        ipu = _attr(node, IPU_ATTR)
        if key in ipus and ipus[key] is not None and ipu is not None and ipus[key] != ipu:
            raise Error(f"Block '{key}' is used with two IPUs ({ipus[key]} and {ipu}); a block "
                        f"id names one block, so give every use of it the same ipu_id.")
        if key not in ipus or ipus[key] is None:
            ipus[key] = ipu
    producer = {out: i for i, node in enumerate(nodes) for out in node.output}
    rank = {key: k for k, key in enumerate(dict.fromkeys(b for b in own if b is not None))}
    resolved: list[str | None] = list(own)
    constants = [i for i, node in enumerate(nodes)
                 if own[i] is None and node.op_type == "Constant"]
    active = _DEFAULT  # the block whose ops the exporter is emitting
    for i, node in enumerate(nodes):
        if own[i] is not None:
            active = own[i]
            continue
        if node.op_type == "Constant":
            continue  # placed with its first reader below
        # The latest block among the (non-constant) ops it reads, else the active block.
        sources = [resolved[producer[name]] for name in node.input if name in producer
                   and resolved[producer[name]] is not None]
        resolved[i] = max(sources, key=lambda b: rank.get(b, -1)) if sources else active
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(i)
    for i in constants:
        first = [r for out in nodes[i].output for r in readers.get(out, [])
                 if resolved[r] is not None]
        resolved[i] = resolved[min(first)] if first else _DEFAULT
    if _DEFAULT in resolved:
        ipus = {_DEFAULT: 0, **ipus}
    return resolved, ipus


def _stage_ranks(strategy, ipus: dict[str, int | None]) -> dict[str, tuple[int, int]]:
    """block -> (stage rank, ipu) before merging, per the strategy."""
    known = [b for b in ipus if b != _DEFAULT]
    ranks: dict[str, tuple[int, int]] = {}
    if strategy.stages:
        where = {}
        for index, stage in enumerate(strategy.stages):
            for block in stage.blocks:
                where[block] = (index, stage)
        missing = [b for b in known if b not in where]
        if missing:
            raise Error(
                f"{type(strategy).__name__}: block(s) {', '.join(map(repr, missing))} ran in "
                f"forward but are in no stage of the execution strategy. Known blocks: "
                f"{', '.join(map(repr, known))}. Add them to a Stage(...).")
        for block in known:
            index, stage = where[block]
            ipu = stage._ipu
            if ipu is None:
                given = {ipus[b] for b in stage.blocks if ipus.get(b) is not None}
                if len(given) > 1:
                    raise Error(f"Stage({', '.join(map(repr, stage.blocks))}) holds blocks on "
                                f"IPUs {sorted(given)}; a stage runs on one IPU: set it with "
                                f"Stage(...).ipu(n).")
                ipu = given.pop() if given else index
            ranks[block] = (index, ipu)
    elif strategy.auto_stage is AutoStage.AutoIncrement:
        for index, block in enumerate(known):
            ranks[block] = (index, ipus[block] if ipus[block] is not None else index)
    else:
        for block in known:
            if ipus[block] is None:
                raise Error(
                    f"Block '{block}' has no ipu_id, but the execution strategy numbers stages "
                    f"by IPU (AutoStage.SameAsIpu, the default). Give it one "
                    f"(BeginBlock(module, '{block}', ipu_id=n)), or use "
                    f"PipelinedExecution(AutoStage.AutoIncrement) or explicit Stage(...)s.")
            ranks[block] = (ipus[block], ipus[block])
    if _DEFAULT in ipus:
        ranks[_DEFAULT] = (-1, 0)  # before every stage, on IPU 0
    return ranks


def place_model(proto: onnx.ModelProto, strategy) -> Placement:
    """Write ``__ipu_number`` / ``__pipeline_stage`` on every node of ``proto`` (in place) from
    its blocks and ``strategy`` (None = ``PipelinedExecution()``); returns the placement."""
    strategy = PipelinedExecution() if strategy is None else strategy
    if isinstance(strategy, _PhasedExecution):
        raise Error(f"{type(strategy).__name__}: phased strategies are placed by "
                    f"phased.place_phased, not place_model.")
    graph = proto.graph
    resolved, ipus = _node_blocks(graph)
    ranks = _stage_ranks(strategy, ipus) if ipus else {}
    if not ranks or {ipu for _, ipu in ranks.values()} == {0}:
        # Everything on IPU 0: a plain single-IPU model.
        for node in graph.node:
            _strip(node, (IPU_ATTR, STAGE_ATTR, BLOCK_ATTR))
        blocks = [b for b in dict.fromkeys(resolved) if b is not None]
        return Placement("single", [StagePlacement(0, 0, blocks)], 1)
    sharded = isinstance(strategy, ShardedExecution)
    if not sharded:
        _check_order(graph, resolved, ranks)
    # Merge adjacent stages on one IPU; renumber 0..P-1.
    merged: dict[int, int] = {}
    stages: list[StagePlacement] = []
    for rank in sorted({r for r, _ in ranks.values()}):
        ipu = next(i for r, i in ranks.values() if r == rank)
        on_rank = [b for b, (r, _) in ranks.items() if r == rank]
        if len({ranks[b][1] for b in on_rank}) > 1:
            raise Error(f"Stage {rank} holds blocks on different IPUs "
                        f"({', '.join(f'{b!r}: {ranks[b][1]}' for b in on_rank)}); a pipeline "
                        f"stage runs on one IPU.")
        if stages and stages[-1].ipu == ipu:
            stages[-1].blocks += on_rank
        else:
            stages.append(StagePlacement(len(stages), ipu, on_rank))
        merged[rank] = stages[-1].stage
    for node, block in zip(graph.node, resolved):
        rank, ipu = ranks[block]
        _strip(node, (IPU_ATTR, STAGE_ATTR, BLOCK_ATTR))
        node.attribute.append(helper.make_attribute(IPU_ATTR, int(ipu)))
        node.attribute.append(helper.make_attribute(STAGE_ATTR, int(merged[rank])))
    for stage in stages:
        stage.blocks = [b for b in stage.blocks if b != _DEFAULT] or [_DEFAULT]
    ipus_per_replica = max(s.ipu for s in stages) + 1
    kind = "sharded" if sharded or len(stages) == 1 else "pipelined"
    return Placement(kind, stages, ipus_per_replica)


def _check_order(graph: onnx.GraphProto, resolved: list[str], ranks: dict) -> None:
    """Pipelined: no op may read a value of a later stage (stages run forward in order)."""
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output}
    for i, node in enumerate(graph.node):
        mine = ranks[resolved[i]][0]
        for name in node.input:
            j = producer.get(name)
            if j is None:
                continue
            theirs = ranks[resolved[j]][0]
            if theirs > mine:
                raise Error(
                    f"Pipeline stages decrease along the model: '{node.name}' in block "
                    f"'{resolved[i]}' (stage {mine}) reads '{name}' from block "
                    f"'{resolved[j]}' (stage {theirs}). Stage ids must not decrease along the "
                    f"forward graph; reorder the blocks/stages, or use ShardedExecution to "
                    f"place ops freely without pipelining.")


def check_pipeline_depth(placement: Placement, training: bool, accumulation: int,
                         device_iterations: int) -> None:
    """The depth rules (the backend checks too; this message is the user's)."""
    if not placement.pipelined:
        return
    p = placement.num_stages
    if training and accumulation < 2 * p - 1:
        raise Error(
            f"Pipelined training over {p} forward stages needs "
            f"Options.Training.gradientAccumulation >= 2 x {p} - 1 = {2 * p - 1} (the backward "
            f"pass doubles the stages, the last forward stage is shared), got "
            f"gradientAccumulation({accumulation}). Raise gradientAccumulation, or use "
            f"ShardedExecution to run the stages one after another.")
    if not training and device_iterations < p:
        raise Error(
            f"Pipelined inference over {p} stages needs Options.deviceIterations >= {p} "
            f"(one micro-batch per stage fills the pipeline), got deviceIterations("
            f"{device_iterations}). Raise deviceIterations, or use ShardedExecution.")


def schedule_summary(placement: Placement, training: bool, accumulation: int,
                     device_iterations: int, replicas: int) -> str:
    """Text: stages per IPU and the fill / main / flush cycle counts."""
    lines = [(f"execution: {placement.strategy}, {placement.ipus_per_replica} IPU(s) per "
              f"replica x {replicas} replica(s) = {placement.ipus_per_replica * replicas} IPU(s)")]
    p = placement.num_stages
    total = 2 * p - 1 if training and placement.pipelined else p
    for stage in placement.stages:
        back = ""
        if training and placement.pipelined:
            backward = 2 * (p - 1) - stage.stage
            back = (f" + backward stage {backward}" if backward != stage.stage
                    else " (loss, its backward too)")
        lines.append(f"  stage {stage.stage}{back}: IPU {stage.ipu}, blocks "
                     f"{', '.join(stage.blocks)}")
    if placement.pipelined:
        depth = accumulation if training else device_iterations
        fill = flush = total - 1
        main = depth - total + 1
        runs = device_iterations if training else 1
        lines.append(f"  pipeline: {total} stages (forward{' + backward' if training else ''}); "
                     f"per {'weight update' if training else 'run'}: {depth} micro-batches in "
                     f"{depth + total - 1} cycles = fill {fill} + main {main} + flush {flush}"
                     f"{f', x {runs} updates per call' if runs > 1 else ''}")
    return "\n".join(lines)
