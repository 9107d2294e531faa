"""The static memory plan of an execution plan: op outputs written into preallocated arenas.

Without it every kernel allocates its output afresh each step (and the allocator hands back
pages it has to fault in again). With it, ``plan_arena`` picks at plan time the op outputs
that can live in a preallocated buffer and places them in one flat arena per dtype, by
liveness: two outputs share bytes when their lifetimes (first write .. last read, in the plan's
order, both ends included) do not overlap. The ops producing them declare an into-kernel
(``Op.writes_into``, ``Op.kernel_into(out, *inputs)``) and write their result into their view
of the arena; every other op keeps allocating.

An output gets a buffer only when all of this holds (anything else keeps today's fresh
allocation, so the plan is safe by construction rather than by cleverness):

- its op declares ``writes_into``, has one output, no debug check, no stochastic rounding, no
  journaled or in-place writes (``modifies_inputs``), no aliasing (``aliases_inputs``), runs
  its plain kernel (no STRING codes, no unsigned wrap-around) and is neither a collective, an
  inter-stage copy nor persistent;
- the output is an op-produced (ACT_GRAD) tensor of a static, non-empty shape and a dtype
  torch writes with ``out=`` (float16/32/64, bfloat16, int32/64), the same dtype as every data
  input (the const inputs, e.g. axes, aside), except that a floating-point output may have
  integer inputs (labels, gather indices: they select, they are not written) and a cast's
  (Cast, CastLike) input any dtype (its into-kernel converts with ``out.copy_(x)``, the
  conversion ``x.to(dtype)`` makes);
- it is not kept (anchors, persistent tensors, a body's outputs: the host reads them after a
  run, so no later step may overwrite them), and no view or in-place alias of it is kept;
- it and every alias of it are read in the fragment (``ExecutionContext``) that produced it.

Aliases extend lifetimes: the output of an ``aliases_inputs`` op (a view) or of an op writing
an input in place shares the roots of those inputs, and a root lives until its last alias is
read. A pipelined plan (``num_stages`` > 0) gets no arena: its stages interleave micro-batches
within a cycle, which a single order does not describe.

Scratch: an op may ask for temporaries of its own (``Op.scratch_infos``: the log-softmax of a
loss, per-label factors, a 0-d tensor holding a Python scalar that torch would otherwise wrap
afresh each call). ``plan_scratch`` gives each a buffer live during that op's step only, and
the step runs ``op.kernel_scratch(out, *scratch, *inputs)`` (``out`` the output's buffer or
None). The same conditions hold as for output buffers, except that the op may write inputs in
place when none of them is state (variables, kept tensors) and may alias its inputs (its
kernel must not return a view of a scratch buffer); its output need not be eligible.

No multi-output buffers: torch's ``out=`` forms of the multi-output kernels of the workloads
(``native_layer_norm``, ``native_layer_norm_backward``, the attention kernels) are composites
that allocate their results and copy them into ``out`` (no fewer allocations, and slower), so
those ops keep allocating.

The arenas of a plan are allocated when the plan binds a replica's slots (``bind``), one set
per replica, with ``torch.empty`` (pages are touched at the first write) and reused by every
later step. An output that ``device/layout.py`` takes to be channels-last gets a channels-last
view of its bytes (the same bytes, other strides). ``enabled`` (module flag) turns the whole
thing off, for tests comparing both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..ir.op import Op
from ..ir.tensor import TensorKind
from ..ops.cast import CastBase
from ..ops.rounding import generic_rounding
from ..ops.state_journal import JournaledWrites
from ..ops.string_tensors import kernel_for

__all__ = ["ArenaLayout", "eligible_output", "enabled", "plan_arena", "plan_scratch",
           "runs_plain_kernel"]

# Testing switch: False plans no arena (every kernel allocates, as before the static plan).
enabled = True

# Element alignment of each buffer's offset (64 bytes for float32), for vectorised kernels.
_ALIGN_BYTES = 64

_DTYPES = frozenset({DataType.FLOAT, DataType.FLOAT16, DataType.DOUBLE, DataType.BFLOAT16,
                     DataType.INT32, DataType.INT64})
# Integer inputs a floating-point output may have (labels, indices; held as int64 if uint32).
_INDEX_DTYPES = frozenset({DataType.INT32, DataType.INT64, DataType.UINT32})


@dataclass(frozen=True)
class Buffer:
    """Where one op output lives: ``numel`` elements at ``offset`` of its dtype's arena."""

    dtype: torch.dtype
    offset: int
    shape: tuple[int, ...]
    start: int  # plan position of the writing op
    end: int  # plan position of the last read of it or of an alias of it
    channels_last: bool = False  # a 4-D view with channels-last strides (device/layout.py)


@dataclass
class ArenaLayout:
    """The buffers of a plan, keyed by the slot of the output each holds, and the size (in
    elements) of each dtype's arena."""

    buffers: dict[int, Buffer]
    sizes: dict[torch.dtype, int]

    @property
    def num_bytes(self) -> int:
        return sum(n * torch.empty((), dtype=d).element_size() for d, n in self.sizes.items())

    def bind(self) -> dict[int, torch.Tensor]:
        """Fresh arenas for one replica: output slot -> its view of the arena."""
        with torch.inference_mode(False):  # normal tensors: the run loop writes them
            arenas = {d: torch.empty(n, dtype=d) for d, n in self.sizes.items()}
            return {s: _view(arenas[b.dtype], b) for s, b in self.buffers.items()}


def _view(arena: torch.Tensor, b: Buffer) -> torch.Tensor:
    flat = arena[b.offset:b.offset + math.prod(b.shape)]
    if b.channels_last:
        n, c, h, w = b.shape
        return flat.view(n, h, w, c).permute(0, 3, 1, 2)
    return flat.view(b.shape)


def _eligible(op: Op, ins: tuple, outs: tuple, keep: set[int]) -> bool:
    if not op.writes_into or len(outs) != 1 or outs[0] < 0 or outs[0] in keep:
        return False
    if not runs_plain_kernel(op):
        return False
    tensor = op.outputs[0]
    info = tensor.info
    if tensor.kind is not TensorKind.ACT_GRAD or info.dtype not in _DTYPES:
        return False
    if any(not isinstance(n, int) or n < 0 for n in info.shape) or info.nelms == 0:
        return False
    # A cast's into-kernel converts explicitly (out.copy_(x)); other kernels given an out= of
    # another dtype than their inputs' would compute in the inputs' promoted dtype and
    # convert (or refuse), so they keep their inputs' dtype.
    converts = isinstance(op, CastBase)
    floating = info.dtype.torch.is_floating_point
    for i, t in enumerate(op.inputs):
        if t is None or i in op.const_inputs or t.info.dtype is info.dtype or converts:
            continue
        if not (floating and t.info.dtype in _INDEX_DTYPES):
            return False
    return _into_matches(type(op), "kernel_into")


def eligible_output(op: Op, ins: tuple, outs: tuple) -> bool:
    """Whether ``op``'s output could take a buffer were it not kept (``device/recycle.py``
    writes large kept outputs into their previous run's storage under the same conditions)."""
    return _eligible(op, ins, outs, set())


def _into_matches(cls: type, name: str) -> bool:
    """False when a subclass redefines ``kernel`` below the class defining ``name`` (an
    into- or scratch kernel: the inherited one would compute the base's result)."""
    kernel = next(c for c in cls.__mro__ if "kernel" in c.__dict__)
    into = next(c for c in cls.__mro__ if name in c.__dict__)
    return issubclass(into, kernel)


def runs_plain_kernel(op: Op, in_place: bool = False) -> bool:
    """True when the plan runs ``op``'s own kernel unwrapped: no debug check, no rounding,
    no journaled writes, no STRING codes, not a collective, an inter-stage copy or a
    persistent output; and no in-place writes nor aliasing unless ``in_place`` (scratch
    only: the caller makes sure they write no state; scratch buffers are private to the step,
    so outputs that are views of inputs do not concern them). Only such ops get arena
    buffers or scratch."""
    settings = op.settings
    checks = settings.checks
    return not (checks.floating_point or checks.modify or checks.alias
                or settings.stochastic_rounding or (op.modifies_inputs and not in_place)
                or (op.aliases_inputs and not in_place) or op.collective or op.runs_between_cycles
                or op.output_persists or isinstance(op, JournaledWrites) or generic_rounding(op)
                or kernel_for(op) != op.kernel)


def plan_scratch(raw_steps: list[tuple[Op, tuple, tuple]], num_stages: int,
                 first_slot: int, state: set[int]) -> dict[int, tuple[int, list[int]]]:
    """The scratch buffers of the plan's ops (``Op.scratch_infos``): plan position -> (that
    position, the placeholder slots of its scratch buffers, numbered from ``first_slot``).
    Empty for a pipelined plan or with the arena off. An op writing one of the ``state``
    slots in place (its writes are journaled) gets none."""
    found: dict[int, tuple[int, list[int]]] = {}
    if not enabled or num_stages:
        return found
    slot = first_slot
    for position, (op, ins, _outs) in enumerate(raw_steps):
        infos = op.scratch_infos()
        if (not infos or not runs_plain_kernel(op, in_place=True)
                or any(ins[i] in state for i in op.modifies_inputs if i < len(ins))
                or not _into_matches(type(op), "kernel_scratch")):
            continue
        if any(i.dtype not in _DTYPES and i.dtype is not DataType.BOOL for i in infos):
            continue
        found[position] = (position, list(range(slot, slot + len(infos))))
        slot += len(infos)
    return found


def plan_arena(raw_steps: list[tuple[Op, tuple, tuple]], keep: set[int],
               num_stages: int = 0, channels_last: set[int] | None = None,
               scratch: dict[int, tuple[int, list[int]]] | None = None) -> ArenaLayout:
    """The arena layout of ``raw_steps`` ((op, input slots, output slots) in plan order);
    ``keep`` are the slots that must survive the execution (see the module doc);
    ``channels_last`` the 4-D output slots whose views get channels-last strides;
    ``scratch`` (from ``plan_scratch``) the scratch placeholders, each live during its step."""
    if not enabled or num_stages:
        return ArenaLayout({}, {})
    scratch_candidates: dict[int, list] = {}
    for position, slots in (scratch or {}).values():
        op = raw_steps[position][0]
        for s, info in zip(slots, op.scratch_infos()):
            scratch_candidates[s] = [position, position, info.dtype.torch, tuple(info.shape),
                                     op.settings.execution_context]
    # Candidates: output slot -> (position, dtype, shape, fragment).
    candidates: dict[int, list] = {}
    for position, (op, ins, outs) in enumerate(raw_steps):
        if _eligible(op, ins, outs, keep):
            info = op.outputs[0].info
            candidates[outs[0]] = [position, position, info.dtype.torch, tuple(info.shape),
                                   op.settings.execution_context]
    if not candidates:
        return ArenaLayout(*_place(scratch_candidates, set()))
    # Roots: which candidates a slot's value may share storage with.
    roots: dict[int, set[int]] = {s: {s} for s in candidates}
    dropped: set[int] = set()
    for position, (op, ins, outs) in enumerate(raw_steps):
        context = op.settings.execution_context
        for s in ins:
            for r in roots.get(s, ()):
                entry = candidates[r]
                entry[1] = max(entry[1], position)
                if entry[4] is not context:
                    dropped.add(r)
        sources = ins if op.aliases_inputs else [ins[i] for i in op.modifies_inputs
                                                 if i < len(ins)]
        shared = set().union(*(roots.get(s, set()) for s in sources)) if sources else set()
        if shared:
            for s in outs:
                if s >= 0:
                    roots[s] = roots.get(s, set()) | shared
                    if s in keep:
                        dropped |= shared
    for s in dropped:
        del candidates[s]
    candidates.update(scratch_candidates)
    return ArenaLayout(*_place(candidates, channels_last or set()))


def _place(candidates: dict[int, list],
           channels_last: set[int]) -> tuple[dict[int, Buffer], dict[torch.dtype, int]]:
    """Greedy by size: the largest buffers first, each at the lowest aligned offset clear of
    the already placed buffers whose lifetimes overlap its own."""
    buffers: dict[int, Buffer] = {}
    sizes: dict[torch.dtype, int] = {}
    by_dtype: dict[torch.dtype, list[int]] = {}
    for s, (_start, _end, dtype, _shape, _ctx) in candidates.items():
        by_dtype.setdefault(dtype, []).append(s)
    for dtype, slots in by_dtype.items():
        align = max(1, _ALIGN_BYTES // torch.empty((), dtype=dtype).element_size())
        slots.sort(key=lambda s: (-math.prod(candidates[s][3]), candidates[s][0]))
        placed: list[tuple[int, int, int, int]] = []  # (offset, end offset, start, end)
        top = 0
        for s in slots:
            start, end, _dtype, shape, _ctx = candidates[s]
            numel = math.prod(shape)
            busy = sorted((lo, hi) for lo, hi, a, b in placed if a <= end and start <= b)
            offset = 0
            for lo, hi in busy:
                if offset + numel <= lo:
                    break
                offset = max(offset, -(-hi // align) * align)
            placed.append((offset, offset + numel, start, end))
            top = max(top, offset + numel)
            buffers[s] = Buffer(dtype, offset, shape, start, end,
                                s in channels_last and len(shape) == 4)
        sizes[dtype] = -(-top // align) * align
    return buffers, sizes
