"""The run journal: what a failed ``run()`` needs to put device state back, saved lazily.

A run must change no state when it fails (docs/security.md). Copying every state tensor before
each run costs a pass over all weights and optimizer state, as much as an optimizer step. The
journal instead acts at the first in-place write of each state tensor within a run:

- ops whose kernels know their writes (``JournaledWrites``: the optimizer updates, the
  accumulators) write that first new value out of place into a spare buffer
  (``spare_for``), then ``settle`` swaps the storages of the tensor and the spare: the tensor
  object (held by slots and aliases) now has the new value, the spare the old one. No copy at
  all; the spare of one run is the destination of the next (ping-pong buffers).
- any other in-place write of state is preceded by ``save``: a copy into the spare.

``rollback`` swaps every settled tensor back and copies every saved one back, so the tensor
objects (and storages of saved ones) hold their values of the start of the run; ``commit`` forgets the saves. Later writes of a tensor in the same run
(more micro-batches, accumulation) go in place: its start value is already safe.

The SGD updates that end a run of one micro-batch skip the journal altogether: the run loop
runs them last, after the anchor writes, in place with one fused call (device/update_tail.py).

A storage swap changes what a view taken earlier sees: a view of a state tensor keeps the old
storage. The plan pins the state tensors an aliasing op may take a view of (``begin``): those
are always saved by copy and copied back, never swapped.
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["JournaledWrites", "StateJournal"]


class JournaledWrites:
    """Mixin of ops whose kernel records its own in-place writes of state in a journal: the
    plan calls ``journaled_kernel(journal, *inputs)`` instead of ``kernel(*inputs)``."""

    def journaled_kernel(self, journal: "StateJournal | None", *inputs):
        raise NotImplementedError


def _swap(a: torch.Tensor, b: torch.Tensor) -> None:
    """Exchange the storages (and layouts) of two tensors of one shape and dtype, in place."""
    storage, offset, stride = a.untyped_storage(), a.storage_offset(), a.stride()
    a.set_(b.untyped_storage(), b.storage_offset(), b.size(), b.stride())
    b.set_(storage, offset, a.size(), stride)


class StateJournal:
    """Start values of the state tensors a run has written so far (see the module doc)."""

    __slots__ = ("is_open", "_saved", "_copied", "_pinned", "_spares", "_prune_at")

    def __init__(self):
        self.is_open = False
        # id(tensor) -> (tensor, spare holding its start value).
        self._saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._copied: set[int] = set()  # of those, the saved (copied) ones: copy back
        self._pinned: set[int] = set()  # tensors whose storage must stay (views may exist)
        # id(tensor) -> (weak ref to the tensor, spare): kept across runs, so steady state
        # allocates nothing; entries of dead tensors (a slot rebound to a new tensor) are
        # dropped when the table has doubled since the last sweep.
        self._spares: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self._prune_at = 16

    def begin(self, pinned=()) -> None:
        """Open for a run; ``pinned`` tensors are saved by copy, never swapped."""
        self._saved.clear()
        self._copied.clear()
        self._pinned = {id(x) for x in pinned}
        self.is_open = True

    def commit(self) -> None:
        self._saved.clear()
        self._copied.clear()
        self.is_open = False

    def rollback(self) -> None:
        for key, (tensor, spare) in self._saved.items():
            if key in self._copied:
                tensor.copy_(spare)
            else:
                _swap(tensor, spare)
        self.commit()

    def _spare(self, x: torch.Tensor) -> torch.Tensor:
        entry = self._spares.get(id(x))
        if entry is not None and entry[0]() is x:
            spare = entry[1]
            if spare.shape == x.shape and spare.dtype == x.dtype and spare.stride() == x.stride():
                return spare
        if len(self._spares) >= self._prune_at:
            self._spares = {k: e for k, e in self._spares.items() if e[0]() is not None}
            self._prune_at = 2 * len(self._spares) + 16
        spare = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
        self._spares[id(x)] = (weakref.ref(x), spare)
        return spare

    def spare_for(self, x: torch.Tensor) -> torch.Tensor:
        """Where to write ``x``'s next value: a spare buffer for the first write of ``x`` in an
        open journal (write it out of place, reading ``x``, then call ``settle``), else ``x``
        itself (write in place)."""
        if not self.is_open or id(x) in self._saved:
            return x
        if id(x) in self._pinned:
            self.save(x)
            return x
        return self._spare(x)

    def settle(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """``out`` (from ``spare_for(x)``) holds x's new value: make it x's, keep the old."""
        if out is not x:
            _swap(x, out)
            self._saved[id(x)] = (x, out)

    def save(self, x) -> None:
        """Before an in-place write of ``x`` that does not go through ``spare_for``."""
        if (not self.is_open or not isinstance(x, torch.Tensor) or id(x) in self._saved
                or x.numel() == 0):
            return
        spare = self._spare(x)
        spare.copy_(x)
        self._saved[id(x)] = (x, spare)
        self._copied.add(id(x))

    def save_all(self, tensors) -> None:
        if self.is_open:
            for x in tensors:
                self.save(x)
