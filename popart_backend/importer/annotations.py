"""The PopART ``__`` node annotations that become typed ``OpSettings`` fields of the planning
kind: ``__partials_type``, ``__available_memory`` and ``__serialize_matmul_mode|factor|
precision`` (the builder's setPartialsType, setAvailableMemoryProportion, setSerializeMatMul;
poptorch's serializedMatMul and MultiConv write the same names).

Every other ``__`` annotation the importer does not read is logged once per name as having no
effect in our model, except the ones read elsewhere or internal to the frontends
(``KNOWN_ELSEWHERE``).
"""

from __future__ import annotations

import logging

from ..errors import ModelError
from ..ir.op import SerializeMatMul

__all__ = ["KNOWN_ELSEWHERE", "READ_HERE", "check_supported", "log_unread", "planning_settings"]

_log = logging.getLogger("popart:ir")

# Read by node_settings (onnx_model.py) or by planning_settings below.
READ_HERE = frozenset({
    "__ipu_number", "__pipeline_stage", "__execution_phase",
    "__recompute_output_in_backward_pass", "__schedule_priority", "__source",
    "__collectiveCommGroup", "__partials_type", "__available_memory",
    "__serialize_matmul_mode", "__serialize_matmul_factor", "__serialize_matmul_precision",
    "__exclude_patterns",
})
# Read from the proto by another pass, or bookkeeping of the builder / frontend.
KNOWN_ELSEWHERE = frozenset({
    "__output_tensor_location",  # transforms/tensor_locations.py
    "__block_id",  # poptorch_lite's block bookkeeping
    "__debug_info_id",  # the builder's debug context
})
_SERIALIZE_MODES = ("none", "input_channels", "reducing_dim", "output_channels")
_logged: set[str] = set()


def _log_once(key: str, message: str, *args) -> None:
    if key not in _logged:
        _logged.add(key)
        _log.warning(message, *args)


def log_unread(annotations: dict) -> None:
    """Log once per name each annotation nothing in the backend reads."""
    for name in annotations:
        if name not in READ_HERE and name not in KNOWN_ELSEWHERE:
            _log_once(name, "Node annotation %s has no effect in the simulated IPU's model "
                      "(numbers, memory and cycles are as without it); it is kept on the ONNX "
                      "node only.", name)


def planning_settings(annotations: dict, where: str) -> dict:
    """The OpSettings fields (``half_partials``, ``available_memory_proportion``,
    ``serialize_matmul``) the planning annotations of one node ask for. Raises ModelError for
    a value out of range."""
    out: dict = {}
    partials = annotations.get("__partials_type")
    if partials is not None:
        kind = str(partials).lower()
        if kind not in ("float", "half"):
            raise ModelError(f"{where}: annotation __partials_type = {partials!r} must be "
                             f"\"float\" or \"half\".")
        out["half_partials"] = kind == "half"
    proportion = annotations.get("__available_memory")
    if proportion is not None:
        value = float(proportion)
        if not 0.0 < value <= 1.0:
            raise ModelError(f"{where}: annotation __available_memory = {proportion!r} must "
                             f"be in (0, 1].")
        out["available_memory_proportion"] = value
    mode = annotations.get("__serialize_matmul_mode")
    if mode is not None:
        if mode not in _SERIALIZE_MODES:
            raise ModelError(f"{where}: annotation __serialize_matmul_mode = {mode!r} must be "
                             f"one of {list(_SERIALIZE_MODES)}.")
        factor = int(annotations.get("__serialize_matmul_factor", 0))
        if mode != "none":
            if factor < 1:
                raise ModelError(f"{where}: annotation __serialize_matmul_factor = {factor} "
                                 f"must be >= 1 with mode '{mode}'.")
            keep = bool(annotations.get("__serialize_matmul_precision", 0))
            out["serialize_matmul"] = SerializeMatMul(mode, factor, keep)
    return out


def check_supported(op, where: str) -> dict:
    """The planning settings of ``op`` that its type cannot honour, reset (logged once per op
    type): half partials on an op without ``supports_half_partials``, serialisation of an op
    other than MatMul, a memory proportion on an op without a planner (``uses_amp``)."""
    reset: dict = {}
    s = op.settings
    if s.half_partials and not (op.supports_half_partials or op.supports_conv_half_partials):
        _log_once(f"partials:{op.op_type}", "%s: __partials_type \"half\" has no effect on a "
                  "%s in the simulated IPU (it accumulates in float32).", where, op.op_type)
        reset["half_partials"] = False
    if s.serialize_matmul is not None and op.op_type != "MatMul":
        _log_once(f"serialize:{op.op_type}", "%s: __serialize_matmul_* has no effect on a %s "
                  "(only MatMul is serialised).", where, op.op_type)
        reset["serialize_matmul"] = None
    if s.available_memory_proportion is not None and not op.uses_amp:
        _log_once(f"memory:{op.op_type}", "%s: __available_memory has no effect on a %s (it "
                  "has no planner temporaries in the model).", where, op.op_type)
        reset["available_memory_proportion"] = None
    return reset
