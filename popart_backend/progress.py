"""Progress bars for long calls: the IR passes of a session's construction,
``prepareDevice()`` and the micro-batches of ``run()``.

Bars are drawn by tqdm on stderr. ``POPART_PROGRESS`` chooses when:

- unset or ``auto``: only when stderr is a terminal, and only for calls that last over a second
  (tqdm's ``delay``), so short calls and logs, pipes and CI output stay clean;
- ``0`` / ``off`` / ``false``: never;
- ``1`` / ``on`` / ``true``: always, from the start of the call, even when stderr is not a
  terminal.

``SessionOptions.compilationProgressLogger`` (PopART's hook, a callable ``(progress, total)``)
is called during ``prepareDevice()`` whatever the variable says, with ``total`` =
``compilationProgressTotal``, ending at ``(total, total)``.

When nothing is asked for, ``bar()`` returns None and callers skip all bookkeeping, so progress
costs nothing when off.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from .errors import popart_exception

__all__ = ["ENV_VAR", "Progress", "bar", "bars_enabled", "counting", "step", "track"]

ENV_VAR = "POPART_PROGRESS"
# In auto mode a bar appears only once a call has run this long.
_AUTO_DELAY_S = 1.0
_ON = ("1", "on", "true")
_OFF = ("0", "off", "false")
_AUTO = ("", "auto")


def bars_enabled() -> tuple[bool, float]:
    """(draw bars?, delay in seconds before a bar appears) from ``POPART_PROGRESS``."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in _OFF:
        return False, 0.0
    if value in _ON:
        return True, 0.0
    if value in _AUTO:
        isatty = getattr(sys.stderr, "isatty", None)
        return bool(isatty and isatty()), _AUTO_DELAY_S
    raise popart_exception(
        f"{ENV_VAR}='{os.environ[ENV_VAR]}' is not a progress setting; use 0 (no bars), 1 (always "
        f"draw bars) or auto / unset (bars on a terminal for calls over {_AUTO_DELAY_S:g} s)."
    )


class Progress:
    """A tqdm bar and/or a ``(progress, total)`` callback over ``total`` units of work."""

    def __init__(self, desc: str, total: int, unit: str, draw: bool, delay: float,
                 callback: Callable[[int, int], None] | None = None, callback_total: int = 100):
        self.desc = desc
        self.total = max(1, total)
        self.done = 0
        self.callback = callback
        self.callback_total = callback_total
        self._tqdm = None
        if draw:
            from tqdm import tqdm

            self._tqdm = tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=False,
                              dynamic_ncols=True, file=sys.stderr)
        if callback is not None:
            callback(0, callback_total)

    def update(self, n: int = 1, stage: str | None = None) -> None:
        """``n`` more units done; ``stage`` (optional) names what runs next."""
        self.done += n
        if self._tqdm is not None:
            if stage is not None:
                self._tqdm.set_postfix_str(stage, refresh=False)
            self._tqdm.update(n)
        if self.callback is not None:
            self.callback(min(self.done, self.total) * self.callback_total // self.total,
                          self.callback_total)

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
            self._tqdm = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bar(desc: str, total: int, unit: str, callback: Callable[[int, int], None] | None = None,
        callback_total: int = 100, min_total: int = 1) -> Progress | None:
    """A Progress over ``total`` units, or None when there is neither a bar to draw (see the
    module docstring; none either for fewer than ``min_total`` units) nor a callback."""
    draw, delay = bars_enabled()
    draw = draw and total >= min_total
    if not draw and callback is None:
        return None
    return Progress(desc, total, unit, draw, delay, callback, callback_total)


@contextmanager
def track(desc: str, total: int, unit: str, callback: Callable[[int, int], None] | None = None,
          callback_total: int = 100, min_total: int = 1) -> Iterator[Progress | None]:
    """``bar(...)`` as a context manager that closes the bar, also when the call fails."""
    progress = bar(desc, total, unit, callback, callback_total, min_total)
    try:
        yield progress
    finally:
        if progress is not None:
            progress.close()


def step(progress: Progress | None, stage: str | None = None) -> None:
    """One unit done on ``progress`` (nothing when None); ``stage`` names the next one."""
    if progress is not None:
        progress.update(1, stage)


def counting(fn: Callable, progress: Progress | None) -> Callable:
    """``fn``, counting one unit per call on ``progress``; ``fn`` itself when None."""
    if progress is None:
        return fn

    def counted(*args, **kwargs):
        result = fn(*args, **kwargs)
        progress.update(1)
        return result

    return counted
