"""Stochastic rounding of float32 values to float16 (SessionOptions.enableStochasticRounding).

The IPU can round a float32 value x to one of its two float16 neighbours lo <= x <= hi at
random, hi with probability (x - lo) / (hi - lo): the rounding error is zero on average, so many
small updates of a float16 weight add up instead of vanishing. Ops whose class sets
``supports_stochastic_rounding`` and whose ``OpSettings.stochastic_rounding`` the
StochasticRounding pass set (transforms/stochastic_rounding.py) compute in float32 and round
their float16 results with ``stochastic_round``; their last input is then the session's
``randomSeed___`` tensor ([seed, micro-batch counter], distinct per replica), so the draws are
reproducible for a seed, new every micro-batch and different per op; kernel results differ per
replica, weight updates draw the same on every replica (as PopART's identical seeds for the
weight updates), so the replicas' weights stay equal.

Every other op with a float16 result that the pass marks (``generic_rounding``) goes through
``stochastically_rounded``, which the execution plan wraps around its kernel: float16 inputs
are widened to float32, the kernel runs, and each float16 result is rounded stochastically
from the float32 value (a Cast from a wider float rounds its input directly). A kernel that
cannot run on float32 inputs is logged once and computes in float16, rounding to nearest.
"""

from __future__ import annotations

import logging
import zlib

import torch

from ..dtypes import DataType
from .cast import CastBase

__all__ = ["generic_rounding", "rounding_generator", "split_seed", "stochastic_round",
           "stochastically_rounded"]

_log = logging.getLogger("popart:devicex")
_NARROW_KERNELS: set[str] = set()


def split_seed(op, xs: tuple) -> tuple[tuple, torch.Tensor | None]:
    """The kernel inputs without the trailing random seed, and the seed (None when the op does
    not round stochastically)."""
    if op.settings.stochastic_rounding:
        return xs[:-1], xs[-1]
    return xs, None


def rounding_generator(op, seed: torch.Tensor, replicas: int = 1) -> torch.Generator:
    """A generator for ``op``'s draws in this micro-batch: the user seed, the micro-batch
    counter and the op's name mixed into one 63-bit seed. The device counts the micro-batches
    of the ``replicas`` local replicas running in lockstep one after another, so the counter
    differs per replica; ``replicas`` > 1 divides that out, for draws the replicas share (the
    weight updates, which must leave every replica with the same weights)."""
    user_seed, counter = (int(v) for v in seed.reshape(-1)[:2])
    counter //= max(1, replicas)
    name = zlib.crc32(op.debug_name.encode("utf-8"))
    mixed = (user_seed * 0x9E3779B97F4A7C15 + counter * 0xBF58476D1CE4E5B9 + name) % (2**63)
    return torch.Generator().manual_seed(mixed)


def stochastic_round(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """float16 of ``x`` (float32) rounded stochastically: each element goes to its upper float16
    neighbour with probability (x - lo) / (hi - lo), else to the lower one. Exact values stay,
    non-finite values and values beyond the float16 range round to nearest (inf)."""
    x = x.float()
    nearest = x.to(torch.float16)
    back = nearest.float()
    toward = torch.where(back > x, torch.full_like(nearest, float("-inf")),
                         torch.full_like(nearest, float("inf")))
    other = torch.nextafter(nearest, toward)
    lo = torch.minimum(nearest.float(), other.float())
    hi = torch.maximum(nearest.float(), other.float())
    span = hi - lo
    p_up = torch.where(span > 0, (x - lo) / span, torch.zeros_like(x))
    draw = torch.rand(x.shape, generator=generator)
    rounded = torch.where(draw < p_up, hi, lo).to(torch.float16)
    keep = (back == x) | ~torch.isfinite(back) | ~torch.isfinite(hi) | ~torch.isfinite(lo)
    return torch.where(keep, nearest, rounded)


def generic_rounding(op) -> bool:
    """Whether ``op`` rounds stochastically through ``stochastically_rounded`` (marked by the
    StochasticRounding pass, its class having no rounding of its own)."""
    return op.settings.stochastic_rounding and not op.supports_stochastic_rounding


def stochastically_rounded(op, kernel):
    """``kernel`` computing in float32 with its float16 results rounded stochastically, for an
    op the pass marked (``generic_rounding``); other kernels unchanged. The wrapped kernel takes
    the random seed as its last argument."""
    if not generic_rounding(op):
        return kernel
    narrow = [i for i, t in enumerate(op.outputs)
              if t is not None and t.info.dtype is DataType.FLOAT16]
    single = len(op.outputs) == 1
    is_cast = isinstance(op, CastBase)

    def run(*xs):
        args, seed = xs[:-1], xs[-1]
        if is_cast:
            x = args[0]
            if isinstance(x, torch.Tensor) and x.is_floating_point() \
                    and x.dtype != torch.float16 and narrow:
                return stochastic_round(x, rounding_generator(op, seed))
            return kernel(*args)
        wide = tuple(x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.float16
                     else x for x in args)
        try:
            result = kernel(*wide)
        except (RuntimeError, TypeError) as exc:
            if op.op_type not in _NARROW_KERNELS:
                _NARROW_KERNELS.add(op.op_type)
                _log.warning("enableStochasticRounding: the %s kernel of %s cannot compute in "
                             "float32 (%s); it computes in float16 and rounds to nearest.",
                             op.op_type, op.debug_name, exc)
            return kernel(*args)
        outs = [result] if single else list(result)
        generator = rounding_generator(op, seed)
        for i in narrow:
            value = outs[i]
            if isinstance(value, torch.Tensor) and value.dtype != torch.float16:
                outs[i] = stochastic_round(value, generator)
        return outs[0] if single else tuple(outs)

    return run
