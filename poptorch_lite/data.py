"""Data loading in combined batches.

``DataLoader`` is a real ``torch.utils.data.DataLoader`` whose batch is the *combined* batch:
``batch_size × deviceIterations × replicationFactor × gradientAccumulation`` samples, so one
item feeds one wrapper call. ``AsynchronousDataAccessor`` loads batches on a background thread
into a bounded queue so the host prepares the next batch while the device runs.

With several processes (``Options.Distributed``) each process reads its own contiguous
share of a map-style dataset, a whole number of combined batches, so every process makes the
same number of calls: process p of P reads samples ``p·per .. (p+1)·per - 1`` with ``per =
combined · (len // (combined · P))``. ``shuffle=True`` needs ``Options.randomSeed``: every
process draws the same global permutation per epoch (seed + epoch) and takes its share of it,
rotated by the epoch's leftovers so different samples are left out each epoch.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import warnings

import torch
import torch.utils.data
from torch.utils._pytree import tree_flatten, tree_unflatten

from .errors import Error
from .options.options import Options

__all__ = ["AsynchronousDataAccessor", "DataLoader", "DataLoaderMode"]

_log = logging.getLogger("poptorch_lite")
_LOGGED: set[str] = set()


def _log_no_effect(what: str, why: str) -> None:
    """Log once per process that an argument has no effect here (WARNING)."""
    if what not in _LOGGED:
        _LOGGED.add(what)
        _log.warning("%s has no effect in poptorch_lite: %s.", what, why)


class DataLoaderMode(enum.IntEnum):
    Sync = 0
    Async = 1
    AsyncRebatched = 2


def combined_batch_factor(options: Options) -> int:
    return (options.device_iterations * options.input_replicas
            * options.Training.gradient_accumulation)


class DataLoader(torch.utils.data.DataLoader):
    """``DataLoader(options, dataset, batch_size=1, shuffle=None, ..., drop_last=True,
    mode=DataLoaderMode.Sync)``: each item is one call's combined batch."""

    def __init__(self, options: Options, dataset, batch_size: int = 1, shuffle=None,
                 num_workers: int = 0, drop_last: bool = True, persistent_workers=None,
                 auto_distributed_partitioning: bool = True, mode=DataLoaderMode.Sync,
                 async_options: dict | None = None, rebatched_worker_size=None,
                 batch_sampler=None, **kwargs):
        if not isinstance(options, Options):
            raise Error(f"DataLoader: the first argument must be poptorch_lite.Options, got "
                        f"{type(options).__name__}.")
        if not isinstance(mode, DataLoaderMode):
            raise TypeError(f"DataLoader: mode must be a DataLoaderMode, got {mode!r}.")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be an int >= 1, got {batch_size!r}.")
        options._freeze()
        self._options = options
        self.micro_batch_size = batch_size
        factor = combined_batch_factor(options)
        self.combinedBatchSize = batch_size * factor
        shuffle = bool(shuffle) if shuffle is not None else False
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        self._mode = mode
        process_id, processes = options.Distributed.process_id_and_count
        distributed = auto_distributed_partitioning and processes > 1
        if distributed and batch_sampler is not None:
            raise Error(f"DataLoader: batch_sampler cannot be split between the {processes} "
                        f"processes automatically; pass auto_distributed_partitioning=False and "
                        f"give each process its own sampler.")
        if distributed and isinstance(dataset, torch.utils.data.IterableDataset):
            raise Error(f"DataLoader: an IterableDataset cannot be split between the "
                        f"{processes} processes automatically; pass "
                        f"auto_distributed_partitioning=False and shard it in the dataset "
                        f"(e.g. by Options.Distributed.processId).")
        if distributed:
            if shuffle and options.random_seed is None:
                raise Error("DataLoader: shuffle=True with several processes needs "
                            "Options.randomSeed(...) so every process draws the same global "
                            "permutation.")
            if "sampler" in kwargs:
                raise Error("DataLoader: a sampler cannot be split between processes "
                            "automatically; pass auto_distributed_partitioning=False.")
            kwargs["sampler"] = _ProcessShareSampler(
                len(dataset), self.combinedBatchSize, process_id, processes, shuffle,
                options.random_seed)
            shuffle = False
        if batch_sampler is not None:
            if batch_size != 1 or shuffle:
                raise Error("DataLoader: batch_sampler excludes batch_size != 1 and shuffle "
                            "(torch's rule); the sampler defines the micro-batches.")
            batch_sampler = _CombinedBatchSampler(batch_sampler, factor)
            super().__init__(dataset, batch_sampler=batch_sampler, num_workers=num_workers,
                             persistent_workers=persistent_workers, **kwargs)
        else:
            if distributed:
                pass  # the share is whole combined batches; the sampler logs what it leaves
            elif hasattr(dataset, "__len__") and not isinstance(
                    dataset, torch.utils.data.IterableDataset):
                total = len(dataset)
                rest = total % self.combinedBatchSize
                if rest and drop_last:
                    warnings.warn(
                        f"DataLoader: {rest} of {total} samples are dropped: the combined batch "
                        f"is {self.combinedBatchSize} = batch_size({batch_size}) × "
                        f"deviceIterations × replicas × gradientAccumulation ({factor}) and "
                        f"drop_last=True. Pass drop_last=False to keep them (the short last "
                        f"batch then needs its own wrapper).", UserWarning, stacklevel=2)
                elif rest and mode is DataLoaderMode.Sync:
                    warnings.warn(
                        f"DataLoader: the last batch has {rest} samples instead of "
                        f"{self.combinedBatchSize} (drop_last=False). A compiled wrapper only "
                        f"takes the batch size it was compiled for, so that batch needs its "
                        f"own wrapper (or padding); drop_last=True drops it.", UserWarning,
                        stacklevel=2)
                elif rest:
                    # As PopTorch: asynchronous loading with drop_last=False rebatches, which
                    # yields only whole combined batches.
                    warnings.warn(
                        f"DataLoader: {rest} of {total} samples do not fill a combined batch "
                        f"of {self.combinedBatchSize}; asynchronous loading with "
                        f"drop_last=False rebatches and leaves them out of the epoch, since "
                        f"a compiled wrapper only takes whole combined batches.", UserWarning,
                        stacklevel=2)
                    if mode is DataLoaderMode.Async:
                        mode = DataLoaderMode.AsyncRebatched
                        self._mode = mode
            super().__init__(dataset, batch_size=self.combinedBatchSize, shuffle=shuffle,
                             num_workers=num_workers, drop_last=drop_last,
                             persistent_workers=persistent_workers, **kwargs)
        self._accessor = None
        if mode is not DataLoaderMode.Sync:
            rebatched = None
            if mode is DataLoaderMode.AsyncRebatched:
                rebatched = rebatched_worker_size or self.combinedBatchSize
                if rebatched > self.combinedBatchSize:
                    raise Error(f"DataLoader: rebatched_worker_size {rebatched} exceeds the "
                                f"combined batch {self.combinedBatchSize}.")
                if rebatched != self.combinedBatchSize:
                    _log_no_effect("DataLoader(rebatched_worker_size=...)",
                                   "workers load whole combined batches, which yields the same "
                                   "batches; AsyncRebatched runs as Async")
            accessor_options = dict(async_options or {})
            if rebatched is not None and self.combinedBatchSize > 1:
                # Whole combined batches only: a short rest at the end of an epoch is left out.
                accessor_options.setdefault("rebatched_size", self.combinedBatchSize)
            self._accessor = AsynchronousDataAccessor(self, **accessor_options)

    @property
    def options(self) -> Options:
        return self._options

    def __iter__(self):
        accessor = self._accessor
        if accessor is not None and threading.current_thread() is not accessor._thread:
            return iter(accessor)  # the accessor's worker thread reads the plain loader
        return super().__iter__()

    def terminate(self) -> None:
        if self._accessor is not None:
            self._accessor.terminate()


class _ProcessShareSampler(torch.utils.data.Sampler):
    """This process's contiguous share of the dataset (whole combined batches), see above."""

    def __init__(self, length: int, combined: int, process_id: int, processes: int,
                 shuffle: bool, seed: int | None):
        self.per_process = combined * (length // (combined * processes))
        if self.per_process == 0:
            raise Error(f"DataLoader: {length} samples are fewer than one combined batch "
                        f"({combined}) per process for {processes} processes.")
        self.length = length
        self.offset = process_id * self.per_process
        self.leftovers = length - processes * self.per_process
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        if self.leftovers:
            _log.info("DataLoader: %d of %d samples are left out per epoch (%d processes x %d "
                      "samples)", self.leftovers, length, processes, self.per_process)

    def __iter__(self):
        epoch, self.epoch = self.epoch, self.epoch + 1
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.length, generator=generator)
            order = torch.roll(order, shifts=epoch * self.leftovers)
        else:
            order = torch.arange(self.length)
        return iter(order[self.offset:self.offset + self.per_process].tolist())

    def __len__(self) -> int:
        return self.per_process


class _CombinedBatchSampler(torch.utils.data.Sampler):
    """Concatenates ``factor`` consecutive batches of a user batch sampler."""

    def __init__(self, batch_sampler, factor: int):
        self.batch_sampler = batch_sampler
        self.factor = factor

    def __iter__(self):
        group = []
        for count, batch in enumerate(self.batch_sampler, start=1):
            group.extend(batch)
            if count % self.factor == 0:
                yield group
                group = []

    def __len__(self) -> int:
        return len(self.batch_sampler) // self.factor


_END = object()


class AsynchronousDataAccessor:
    """Iterate a DataLoader (or any iterable) on a background thread.

    ``buffer_size`` batches are prepared ahead. ``load_indefinitely=True`` restarts the
    underlying iterable for every epoch. ``rebatched_size``: the worker concatenates (and
    splits) the loaded batches along dim 0 into batches of this many samples; a short rest at
    the end of an epoch is dropped (logged). Call ``terminate()`` to stop the worker.

    The worker is a thread of this process: ``sharing_strategy`` (how worker processes share
    tensors) and ``miss_sleep_time_in_ms`` (the wait of a polling consumer; this one blocks on
    the queue) have no effect and are logged once when given.
    """

    def __init__(self, dataset, buffer_size: int = 3, miss_sleep_time_in_ms: float = 0.1,
                 load_indefinitely: bool = True, early_preload: bool = False,
                 sharing_strategy=None, rebatched_size=None):
        if isinstance(dataset, DataLoader) and dataset._accessor is not None and (
                dataset._accessor is not self and getattr(dataset, "_in_accessor", False)):
            raise Error("AsynchronousDataAccessor: this DataLoader already has an accessor.")
        if rebatched_size is not None and rebatched_size <= 1:
            raise ValueError(f"AsynchronousDataAccessor: rebatched_size must be > 1, got "
                             f"{rebatched_size}.")
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"AsynchronousDataAccessor: buffer_size must be >= 1, got "
                             f"{buffer_size!r}.")
        if sharing_strategy is not None:
            _log_no_effect("AsynchronousDataAccessor(sharing_strategy=...)",
                           "the worker is a thread of this process, so tensors are not shared "
                           "between processes")
        if miss_sleep_time_in_ms != 0.1:
            _log_no_effect("AsynchronousDataAccessor(miss_sleep_time_in_ms=...)",
                           "the consumer blocks on the queue and wakes when a batch arrives")
        self._rebatched_size = rebatched_size
        self._dataset = dataset
        if isinstance(dataset, DataLoader):
            dataset._in_accessor = True
        self._buffer_size = buffer_size
        self._load_indefinitely = load_indefinitely
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._iterating = False
        if early_preload:
            self._start()

    def __len__(self) -> int:
        if self._rebatched_size is None:
            return len(self._dataset)
        batch = getattr(self._dataset, "batch_size", None)
        if batch is None:
            raise TypeError("AsynchronousDataAccessor: len() with rebatched_size needs a "
                            "DataLoader with a batch_size.")
        samples = len(self._dataset) * batch
        if not getattr(self._dataset, "drop_last", True):  # the last batch may be short
            samples = min(samples, len(self._dataset.dataset))
        return samples // self._rebatched_size

    def _epoch(self):
        """One pass over the dataset, rebatched when ``rebatched_size`` is set."""
        if self._rebatched_size is None:
            yield from self._dataset
            return
        size, pending, count = self._rebatched_size, [], 0
        spec = None
        for item in self._dataset:
            leaves, spec = tree_flatten(item)
            pending.append(leaves)
            count += len(leaves[0])
            while count >= size:
                joined = [torch.cat(parts) for parts in zip(*pending)]
                yield tree_unflatten([leaf[:size] for leaf in joined], spec)
                count -= size
                pending = [[leaf[size:] for leaf in joined]] if count else []
        if count:
            _log.info("AsynchronousDataAccessor: %d sample(s) at the end of the epoch do not "
                      "fill a batch of rebatched_size %d; dropped.", count, size)

    def _start(self) -> None:
        self._stop.clear()
        self._queue = queue.Queue(maxsize=self._buffer_size)
        self._thread = threading.Thread(target=self._worker, name="poptorch_lite-data",
                                        daemon=True)
        try:
            self._thread.start()
        except RuntimeError as exc:
            raise Error(f"AsynchronousDataAccessor: worker thread failed to start ({exc}).") \
                from exc

    def _worker(self) -> None:
        q = self._queue
        try:
            while not self._stop.is_set():
                for item in self._epoch():
                    if not self._put(q, item):
                        return
                if not self._put(q, _END) or not self._load_indefinitely:
                    return
        except Exception as exc:  # handed to the consumer, which re-raises it
            self._put(q, _WorkerFailure(exc))

    def _put(self, q: queue.Queue, item) -> bool:
        while not self._stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _ensure_started(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            if self._thread is not None and self._queue is not None and not self._queue.empty():
                return  # the finished worker left an epoch in the queue: consume it
            self._start()

    def __iter__(self):
        self._ensure_started()
        return self

    def __next__(self):
        """The next prepared batch; StopIteration at the end of each epoch (the next call
        starts the following one)."""
        self._ensure_started()
        item = self._queue.get()
        if item is _END:
            raise StopIteration
        if isinstance(item, _WorkerFailure):
            raise Error(f"AsynchronousDataAccessor: the worker failed: "
                        f"{type(item.exc).__name__}: {item.exc}") from item.exc
        return item

    def terminate(self) -> None:
        """Stop the worker thread and drop prepared batches."""
        self._stop.set()
        if self._thread is not None:
            while self._queue is not None and not self._queue.empty():
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            self._thread.join(timeout=5)
        self._thread = None

    def __del__(self):
        if getattr(self, "_thread", None) is not None:
            self._stop.set()


class _WorkerFailure:
    def __init__(self, exc: Exception):
        self.exc = exc
