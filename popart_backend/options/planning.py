"""The planning dicts of SessionOptions: ``convolutionOptions``, ``matmulOptions`` and
``lstmOptions``. PopART hands them to the Poplar libraries' planners; here each key
is checked and either has the effect of the matching per-op setting or is logged once as having
no effect in the simulator's model:

- ``"partialsType"`` ("float" / "half", any case): in ``matmulOptions``, "half" makes the
  float16 matmuls accumulate in float16, exactly as ``partialsTypeMatMuls = "half"`` does
  (transforms/numerics_options.py); in ``convolutionOptions`` it does the same for the float16
  1-D and 2-D convolutions (their gradients keep float32 partials, logged); in
  ``lstmOptions`` it makes the float16 LSTMs (ai.onnx LSTM and ai.graphcore lstm, not GRU or
  RNN) compute their cell products X·Wᵀ and H·Rᵀ with float16 sums, and their gradients the
  same (HalfPartialLstms; ops/rnn.py). On a float32 LSTM it is logged once as having no effect.
  The LSTMs' cycles and memory do not depend on it (they have no planner in the device model).
- ``"availableMemoryProportion"`` (a number in (0, 1]): the budget of a planner's temporary
  memory for the matmuls (``matmulOptions``) or convolutions (``convolutionOptions``) without
  a per-op setting (device/planner.py: lower means less temporary memory and more cycles); in
  ``lstmOptions`` it is logged once as having no effect.
- any other key: logged once as having no effect.
"""

from __future__ import annotations

import logging

from ..errors import popart_exception

__all__ = ["check_planning_options", "conv_half_partials", "lstm_half_partials",
           "matmul_half_partials"]

_log = logging.getLogger("popart:session")
_PLANNING_DICTS = ("convolutionOptions", "matmulOptions", "lstmOptions")
_PARTIALS = ("float", "half")
_logged: set[tuple[str, str]] = set()


def _log_once(where: str, key: str, why: str) -> None:
    if (where, key) in _logged:
        return
    _logged.add((where, key))
    _log.warning("SessionOptions.%s[%r] has no effect in the simulator: %s.", where, key, why)


def _partials(where: str, value: str) -> str:
    kind = value.lower()
    if kind not in _PARTIALS:
        raise popart_exception(
            f"SessionOptions.{where}['partialsType'] = {value!r}: use \"float\" or \"half\"."
        )
    return kind


def check_planning_options(options) -> None:
    """Check every key of the three planning dicts of ``options`` (SessionOptions); raise
    popart_exception for an invalid value, and log the keys without effect once."""
    for where in _PLANNING_DICTS:
        for key, value in getattr(options, where).items():
            if key == "partialsType":
                _partials(where, value)
            elif key == "availableMemoryProportion":
                try:
                    proportion = float(value)
                except ValueError:
                    proportion = float("nan")
                if not 0.0 < proportion <= 1.0:
                    raise popart_exception(
                        f"SessionOptions.{where}['availableMemoryProportion'] = {value!r}: use "
                        f"a number in (0, 1], as a string (e.g. \"0.6\")."
                    )
                if where == "lstmOptions":
                    _log_once(where, key, "the simulated LSTMs have no planner")
            else:
                _log_once(where, key, "the simulator has no Poplar planner to pass it to")
    matmul_half_partials(options)


def conv_half_partials(options) -> bool:
    """Whether ``convolutionOptions["partialsType"]`` asks the float16 convolutions (forward,
    1-D and 2-D) to accumulate in float16."""
    value = options.convolutionOptions.get("partialsType")
    return value is not None and _partials("convolutionOptions", value) == "half"


def lstm_half_partials(options) -> bool:
    """Whether ``lstmOptions["partialsType"]`` asks the float16 LSTMs to accumulate their cell
    products in float16."""
    value = options.lstmOptions.get("partialsType")
    return value is not None and _partials("lstmOptions", value) == "half"


def matmul_half_partials(options) -> bool:
    """Whether the float16 matmuls accumulate in float16: ``partialsTypeMatMuls`` if set,
    else ``matmulOptions["partialsType"]``. Raises popart_exception when both are set and
    disagree."""
    global_value = options.partialsTypeMatMuls.lower()
    key_value = options.matmulOptions.get("partialsType")
    if key_value is None:
        return global_value == "half"
    kind = _partials("matmulOptions", key_value)
    if global_value and global_value != kind:
        raise popart_exception(
            f"SessionOptions.partialsTypeMatMuls = {options.partialsTypeMatMuls!r} and "
            f"matmulOptions['partialsType'] = {key_value!r} disagree; set one of them, or give "
            f"both the same value."
        )
    return kind == "half"
