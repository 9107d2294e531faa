"""Range and finiteness checks of the numeric SessionOptions fields: a count of 0 or -1, a NaN
or an infinite threshold is refused with the option's name and value before anything uses it
(``replicatedGraphCount = 0`` would otherwise divide by zero deep in the passes)."""

from __future__ import annotations

import math
from typing import Any

from ..errors import popart_exception
from .session_options import SessionOptions

__all__ = ["check_numeric_options"]

_INT32_MAX = 2**31 - 1

# option path -> (lowest allowed, highest allowed); every value must also be finite.
# (globalReplicationFactor and globalReplicaOffset have their own checks in
# device/distributed.py, with PopART's messages.)
_RANGES: dict[str, tuple[float, float]] = {
    "firstDotOp": (0, _INT32_MAX),
    "finalDotOp": (0, _INT32_MAX),
    "outlineThreshold": (-math.inf, math.inf),
    "outlineSequenceBreakCost": (0, math.inf),
    "timeLimitScheduler": (0, math.inf),
    "swapLimitScheduler": (0, 2**63 - 1),
    "transitiveClosureOptimizationThreshold": (0, 2**63 - 1),
    "mergeVarUpdateMemThreshold": (0, 2**63 - 1),
    "looseThresholdAtPeak": (0, 2**63 - 1),
    "defaultBufferingDepth": (1, _INT32_MAX),
    "defaultPrefetchBufferingDepth": (1, _INT32_MAX),
    "numIOTiles": (0, _INT32_MAX),
    "replicatedGraphCount": (1, _INT32_MAX),
    "accumulationFactor": (1, _INT32_MAX),
    "executionPhaseSettings.phases": (0, _INT32_MAX),
    "executionPhaseSettings.stages": (1, _INT32_MAX),
    "batchSerializationSettings.factor": (0, _INT32_MAX),
    "automaticLossScalingSettings.binEdgeLocation": (0, 1),
    "automaticLossScalingSettings.thresholdUpperCountProportion": (0, 1),
    "compilationProgressTotal": (1, _INT32_MAX),
}
_LOCATION_SETTINGS = ("activationTensorLocationSettings", "weightTensorLocationSettings",
                      "optimizerStateTensorLocationSettings", "accumulatorTensorLocationSettings")
for _settings in _LOCATION_SETTINGS:
    _RANGES[f"{_settings}.minElementsForOffChip"] = (0, 2**63 - 1)
    _RANGES[f"{_settings}.minElementsForReplicatedTensorSharding"] = (0, 2**63 - 1)


def _read(options: SessionOptions, path: str) -> Any:
    value = options
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _check(name: str, value: Any, low: float, high: float) -> None:
    if value is None:
        return
    number = float(value)
    if math.isnan(number) or math.isinf(number) or not low <= value <= high:
        bounds = ("" if (low, high) == (-math.inf, math.inf) else f">= {low}"
                  if high == math.inf else f"in [{low}, {high}]")
        raise popart_exception(
            f"SessionOptions.{name} = {value!r} is out of range: it must be a finite number "
            f"{bounds}".rstrip() + ". Set a value in that range."
        )


def check_numeric_options(options: SessionOptions) -> None:
    """Raise popart_exception naming the first numeric option out of its range."""
    for path, (low, high) in _RANGES.items():
        _check(path, _read(options, path), low, high)
    for tensor_id, depth in options.prefetchBufferingDepthMap.items():
        _check(f"prefetchBufferingDepthMap[{tensor_id!r}]", depth, 1, _INT32_MAX)
