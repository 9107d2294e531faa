"""torch_cluster-style point-cloud ops inside ``forward``: ``fps`` (farthest point sampling)
and ``nearest`` (nearest-cluster search).

Both are exact sequential algorithms that the device model has no kernel for, so on the
simulated IPU each call becomes a host callback (``ops.cpu.CPU``: a backend custom op whose
compute runs the algorithm below on the host mid-graph); called eagerly on CPU they run it
directly. Output sizes are static, as in PopTorch: ``fps`` takes its batch layout as the
Python list ``ptr`` (segment start offsets plus the end), and ``nearest`` returns one index per
row of ``x``. Neither is differentiable (indices). Indices come back int64 on CPU and int32
from the IPU (the device has no 64-bit integers).

- ``fps(src, ptr, ratio=0.5, random_start=False)``: for each segment ``ptr[b]:ptr[b+1]`` of
  ``src`` [N, D], ``ceil(ratio · size)`` points: the first (or, with ``random_start``, one
  drawn with torch's host generator when the op runs, which ``Options.randomSeed`` does not
  seed: logged once), then repeatedly the point farthest
  (squared Euclidean distance) from those chosen so far, ties to the lowest index. Returns
  their indices into ``src``, segment by segment.
- ``nearest(x, y, batch_x=None, batch_y=None)``: for each row of ``x`` the index of the
  closest row of ``y`` (squared Euclidean distance, ties to the lowest index) among the rows of
  the same batch id (``batch_x``/``batch_y``: sorted int tensors, or None for one batch).
"""

from __future__ import annotations

import hashlib
import logging
import math

import torch

from ..blocks import isRunningOnIpu
from ..errors import Error
from .cpu import CPU

__all__ = ["fps", "nearest"]

_log = logging.getLogger("poptorch_lite")
_warned_random_start = False


def _check_points(name: str, arg: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.dim() != 2 \
            or not value.dtype.is_floating_point:
        raise Error(f"{name}: {arg} must be a float tensor of points [N, D], got "
                    f"{type(value).__name__}{list(getattr(value, 'shape', []))}.")
    return value


def _segments(ptr, n: int) -> list[int]:
    if isinstance(ptr, torch.Tensor):
        ptr = ptr.tolist()
    if not isinstance(ptr, (list, tuple)) or len(ptr) < 2 \
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in ptr):
        raise Error(f"fps: ptr must be a list of ints (segment offsets, then the end), e.g. "
                    f"[0, {n}], got {ptr!r}.")
    ptr = list(ptr)
    if ptr[0] != 0 or ptr[-1] != n or any(b <= a for a, b in zip(ptr, ptr[1:])):
        raise Error(f"fps: ptr must rise strictly from 0 to the number of points {n}, got "
                    f"{ptr}.")
    return ptr


def _fps_indices(src: torch.Tensor, ptr: list[int], ratio: float, random_start: bool):
    chosen = []
    points = src.detach().to(torch.float32)
    for start, end in zip(ptr, ptr[1:]):
        segment = points[start:end]
        count = math.ceil(ratio * (end - start))
        first = int(torch.randint(end - start, ())) if random_start else 0
        picks = [first]
        distance = ((segment - segment[first]) ** 2).sum(1)
        for _ in range(count - 1):
            far = int(torch.argmax(distance))
            picks.append(far)
            distance = torch.minimum(distance, ((segment - segment[far]) ** 2).sum(1))
        chosen += [start + p for p in picks]
    return torch.tensor(chosen, dtype=torch.int64)


def _batch_ids(name: str, batch, n: int) -> torch.Tensor:
    if batch is None:
        return torch.zeros(n, dtype=torch.int64)
    if not isinstance(batch, torch.Tensor) or list(batch.shape) != [n] \
            or batch.dtype.is_floating_point:
        raise Error(f"nearest: {name} must be an integer tensor [{n}] of batch ids, got "
                    f"{batch!r:.80}.")
    return batch.to(torch.int64)


def _nearest_indices(x, y, batch_x, batch_y) -> torch.Tensor:
    distance = ((x.detach().to(torch.float32)[:, None, :]
                 - y.detach().to(torch.float32)[None, :, :]) ** 2).sum(-1)
    other = batch_x[:, None] != batch_y[None, :]
    distance = distance.masked_fill(other, math.inf)
    return torch.argmin(distance, dim=1).to(torch.int64)


def _host_op(kind: str, key: str, function) -> CPU:
    """The host callback of one configuration (same key ⇒ same backend op)."""
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return CPU(function, f"poptorch_lite_{kind}_{digest}")


def fps(src: torch.Tensor, ptr, ratio: float = 0.5, random_start: bool = False):
    """Farthest point sampling (see the module docstring): indices into ``src``."""
    src = _check_points("fps", "src", src)
    ptr = _segments(ptr, src.shape[0])
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise Error(f"fps: ratio must be a number in (0, 1], got {ratio!r}.")
    random_start = bool(random_start)
    if not isRunningOnIpu():
        return _fps_indices(src, ptr, float(ratio), random_start)
    global _warned_random_start
    if random_start and not _warned_random_start:
        _warned_random_start = True
        _log.warning("fps(random_start=True) runs on the host during the step and draws its "
                     "start points from torch's host generator (set it with "
                     "torch.manual_seed), not from Options.randomSeed.")
    callback = _host_op("fps", f"{ptr}|{float(ratio)!r}|{random_start}|{list(src.shape)}",
                        lambda points: _fps_indices(points, ptr, float(ratio),
                                                    random_start).to(torch.int32))
    return callback(src)


def nearest(x: torch.Tensor, y: torch.Tensor, batch_x=None, batch_y=None):
    """Nearest-cluster search (see the module docstring): for each row of ``x``, the index of
    its closest row of ``y`` in the same batch."""
    x, y = _check_points("nearest", "x", x), _check_points("nearest", "y", y)
    if x.shape[1] != y.shape[1]:
        raise Error(f"nearest: x and y must have the same point size, got {list(x.shape)} and "
                    f"{list(y.shape)}.")
    if (batch_x is None) != (batch_y is None):
        raise Error("nearest: give both batch_x and batch_y, or neither.")
    bx = _batch_ids("batch_x", batch_x, x.shape[0])
    by = _batch_ids("batch_y", batch_y, y.shape[0])
    if not isRunningOnIpu():
        if batch_x is not None and not set(bx.tolist()) <= set(by.tolist()):
            raise Error("nearest: a batch id of batch_x has no point in y.")
        return _nearest_indices(x, y, bx, by)
    if batch_x is None:
        callback = _host_op("nearest", f"{list(x.shape)}|{list(y.shape)}",
                            lambda a, b: _nearest_indices(
                                a, b, torch.zeros(len(a), dtype=torch.int64),
                                torch.zeros(len(b), dtype=torch.int64)).to(torch.int32))
        return callback(x, y)
    callback = _host_op("nearest", f"{list(x.shape)}|{list(y.shape)}|batched",
                        lambda a, b, ba, bb: _nearest_indices(
                            a, b, ba.to(torch.int64), bb.to(torch.int64)).to(torch.int32))
    return callback(x, y, batch_x, batch_y)
