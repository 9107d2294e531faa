"""Model partitioning annotations: blocks, stages and execution strategies (spec §2.3, P37-P45).

Blocks are recorded while ``torch.export`` runs ``forward``: the current block ``(user_id,
ipu_id)`` is put into the FX node metadata (``node.meta["custom"]``) of every op traced while it
is active; tracing.py turns it into the ``__ipu_number`` / ``__pipeline_stage`` ONNX node
attributes. On CPU (not tracing) blocks do nothing. The backend places ops by these attributes
once issue #5 builds pipelining; until then they are stored in the model only.
"""

from __future__ import annotations

import contextlib
import enum
import functools

import torch
import torch.fx.traceback as fx_traceback

from .errors import Error

__all__ = [
    "AutoStage",
    "BeginBlock",
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
    "removeBlocks",
]

META_KEY = "poptorch_lite_block"
_HOOK_ATTR = "_poptorch_lite_block_hook"

_state = {"tracing": False, "auto_id": None}


@contextlib.contextmanager
def tracing_blocks():
    """Active while the frontend traces: blocks write FX metadata only inside it."""
    _state["tracing"] = True
    _state["auto_id"] = None
    _set_current(None)
    try:
        yield
    finally:
        _set_current(None)
        _state["tracing"] = False


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


def _check_ipu(ipu_id):
    if ipu_id is not None and (not isinstance(ipu_id, int) or ipu_id < 0):
        raise ValueError(f"ipu_id must be a non-negative int or None, got {ipu_id!r}.")
    return ipu_id


class Block:
    """``with Block(user_id, ipu_id):`` puts the ops traced inside on ``ipu_id`` (P38)."""

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
        _set_current((_block_id(user_id), _check_ipu(ipu_id)))

    def __enter__(self):
        self._previous = _current()
        _set_current((_block_id(self.user_id), self.ipu_id))
        return self

    def __exit__(self, *exc_info):
        _set_current(self._previous)
        return False


def BlockFunction(user_id=None, ipu_id: int | None = None):  # noqa: N802
    """Decorator running a function inside ``Block(user_id, ipu_id)`` (P39)."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with Block(user_id, ipu_id):
                return fn(*args, **kwargs)

        return wrapper

    return decorate


def BeginBlock(layer_to_call, user_id=None, ipu_id: int | None = None):  # noqa: N802
    """Start a block when ``layer_to_call`` runs; it lasts until the next block starts (P37)."""
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
    """Remove every BeginBlock hook from ``module`` and its submodules (P45)."""
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


# --- stages and strategies (stored; the backend executes them from issue #5) -----------------


class AutoStage(enum.IntEnum):
    SameAsIpu = 0
    AutoIncrement = 1


class Liveness(enum.IntEnum):
    AlwaysLive = 0
    OffChipAfterFwd = 1
    OffChipAfterFwdNoOverlap = 2
    OffChipAfterEachPhase = 3


class Stage:
    """A pipeline stage made of block ids: ``Stage("A", "B").ipu(1)`` (P40)."""

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
        return self
