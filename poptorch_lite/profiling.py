"""``poptorch.profiling``: host-side trace channels (PopTorch's ``Channel``).

PopTorch's channels write PopVision trace points through libpvti. The simulated machine has no
PopVision trace file, so a ``Channel`` here keeps what a trace point would have recorded: each
trace point's name, start time and duration in seconds, appended to ``channel.records`` (a list
the user reads) and logged at debug level on the ``poptorch_lite`` logger.

    channel = poptorch_lite.profiling.Channel("data")
    with channel.tracepoint("load"):
        batch = next(it)
    channel.instrument(model, "forward")  # every model.forward call is a trace point
    channel.records  # [TracePoint(channel="data", name="load", start_s=..., duration_s=...), ...]
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time

__all__ = ["Channel", "TracePoint"]

_log = logging.getLogger("poptorch_lite")


@dataclasses.dataclass(frozen=True)
class TracePoint:
    """One recorded trace point: ``start_s`` from ``time.perf_counter()``, both in seconds."""

    channel: str
    name: str
    start_s: float
    duration_s: float


class Channel:
    """A named channel of host trace points (PopTorch's ``profiling.Channel(name)``)."""

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise TypeError(f"profiling.Channel: the name must be a non-empty str, got {name!r}.")
        self.name = name
        self.records: list[TracePoint] = []

    @contextlib.contextmanager
    def tracepoint(self, name: str):
        """Record the time spent in the ``with`` block under ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            duration = time.perf_counter() - start
            self.records.append(TracePoint(self.name, name, start, duration))
            _log.debug("profiling channel '%s': %s took %.6f s", self.name, name, duration)

    def instrument(self, obj, *methods: str):
        """Wrap each named method of ``obj`` (an instance) in a trace point named
        ``<class>.<method>``; returns ``obj``. An unknown or non-callable name raises."""
        if not methods:
            raise ValueError("Channel.instrument(obj, *methods): name at least one method.")
        for method in methods:
            target = getattr(obj, method, None)
            if not callable(target):
                raise AttributeError(
                    f"Channel.instrument: {type(obj).__name__} has no method {method!r} to "
                    f"instrument.")
            point = f"{type(obj).__name__}.{method}"
            setattr(obj, method, self._traced(target, point))
        return obj

    def _traced(self, function, point: str):
        @functools.wraps(function)
        def traced(*args, **kwargs):
            with self.tracepoint(point):
                return function(*args, **kwargs)

        return traced

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, {len(self.records)} record(s))"
