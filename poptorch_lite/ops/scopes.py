"""Context managers that annotate the ops traced inside them (P62): ``NameScope``,
``Attribute`` and ``MultiConv``.

While the frontend traces, each active context is pushed on a stack kept in the FX node
metadata (``custom[SCOPES_KEY]``), so every FX node records the contexts it was traced in;
``tracing.py`` hands that record to ``annotate_node`` for the ONNX node made from it. Run
eagerly on CPU the contexts only check their arguments.

- ``NameScope("enc")``: node names become ``enc/...`` (nested scopes join with ``/``); the
  backend takes a node's scope from its name, so debug names and reports show it.
- ``Attribute(__outline={"k": "v"}, ...)``: each keyword becomes a node attribute of every op
  inside (a dict as PopART's flat ``[key, value, ...]`` strings, a plain value as itself).
- ``MultiConv()``: each convolution inside is annotated with its planning options under
  PopART's per-node names (``__available_memory``, ``__partials_type``,
  ``__enable_conv_dithering``, ``__multiconv_*``). The backend plans each convolution with its
  own available memory proportion and partials type (its planner temporaries and supersteps);
  the annotations it does not read (dithering, the ``__multiconv_*`` plan options) it logs once
  as having no effect.

Attribute names starting with ``__`` are read by the backend's importer or logged there once as
having no effect; other names are refused there as unknown attributes of the op.
"""

from __future__ import annotations

import contextlib
from itertools import count

import onnx
import torch
import torch.fx.traceback as fx_traceback
from onnx import helper

from ..blocks import isRunningOnIpu
from ..enums import MultiConvPlanType
from ..errors import Error

__all__ = ["Attribute", "MultiConv", "NameScope"]

SCOPES_KEY = "poptorch_lite_scopes"
_serials = count()
_PARTIALS = {torch.float: "float", torch.half: "half"}


@contextlib.contextmanager
def _pushed(entry: tuple):
    """``entry`` on the FX metadata's scope stack while tracing, else nothing."""
    if not isRunningOnIpu():
        yield
        return
    custom = dict(fx_traceback.current_meta.get("custom") or {})
    previous = custom.get(SCOPES_KEY, ())
    custom[SCOPES_KEY] = (*previous, entry)
    fx_traceback.current_meta["custom"] = custom
    try:
        yield
    finally:
        custom = dict(fx_traceback.current_meta.get("custom") or {})
        if previous:
            custom[SCOPES_KEY] = previous
        else:
            custom.pop(SCOPES_KEY, None)
        fx_traceback.current_meta["custom"] = custom


class _Scope:
    def __enter__(self):
        self._context = _pushed(self._entry())
        self._context.__enter__()
        return self

    def __exit__(self, exc_type, value, traceback):
        return self._context.__exit__(exc_type, value, traceback)


class NameScope(_Scope):
    """``with NameScope("enc"):`` names the ops traced inside ``enc/...`` (nests)."""

    def __init__(self, name: str):
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"NameScope: name must be a non-empty string without '/', got "
                             f"{name!r}.")
        self.name = name

    def _entry(self):
        return ("name", self.name)


class Attribute(_Scope):
    """``with Attribute(__outline={"layer": "embedding"}):`` adds each keyword as an attribute
    of every op traced inside (a dict as flat ``[key, value, ...]`` strings). The backend
    reads the ``__`` annotations it models and logs the others once as having no effect."""

    def __init__(self, **kwargs):
        if not kwargs:
            raise ValueError("Attribute: give at least one attribute, e.g. "
                             "Attribute(__outline={'layer': 'embedding'}).")
        for key, value in kwargs.items():
            if not isinstance(value, (dict, str, int, float)) or isinstance(value, bool):
                raise ValueError(f"Attribute: {key}={value!r} must be a dict of strings, a "
                                 f"string, an int or a float.")
        self.attributes = {k: (tuple(str(s) for kv in v.items() for s in kv)
                               if isinstance(v, dict) else v) for k, v in kwargs.items()}

    def _entry(self):
        return ("attrs", tuple(self.attributes.items()))


def _per_conv(name: str, value, check):
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if not check(v):
            raise ValueError(f"MultiConv.{name}: invalid value {v!r}.")
    return values


class MultiConv(_Scope):
    """``with MultiConv().availableMemoryProportions(0.3).planType(...):`` plans the
    convolutions traced inside together. Per-convolution options take one value for all or a
    list with one value per convolution."""

    def __init__(self):
        self._options: dict = {}

    def availableMemoryProportions(self, value):
        self._options["available_memory"] = _per_conv(
            "availableMemoryProportions", value,
            lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1)
        return self

    def partialsTypes(self, value):
        values = _per_conv("partialsTypes", value, lambda v: v in _PARTIALS
                           or v in ("float", "half"))
        self._options["partials_type"] = [_PARTIALS.get(v, v) for v in values]
        return self

    def enableConvDithering(self, value):
        self._options["enable_conv_dithering"] = [int(v) for v in _per_conv(
            "enableConvDithering", value, lambda v: isinstance(v, bool))]
        return self

    def planType(self, value):
        if not isinstance(value, MultiConvPlanType):
            raise ValueError(f"MultiConv.planType: expected a poptorch_lite.MultiConvPlanType, "
                             f"got {value!r}.")
        self._options["multiconv_plan_type"] = value.name.lower()
        return self

    def perConvReservedTiles(self, value: int):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"MultiConv.perConvReservedTiles: expected an int >= 0, got "
                             f"{value!r}.")
        self._options["multiconv_per_conv_reserved_tiles"] = value
        return self

    def cycleBackOff(self, value: float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"MultiConv.cycleBackOff: expected a float in [0, 1], got "
                             f"{value!r}.")
        self._options["multiconv_cycle_back_off"] = float(value)
        return self

    def _entry(self):
        return ("multiconv", next(_serials), tuple(
            (k, tuple(v) if isinstance(v, list) else v) for k, v in self._options.items()))


def _attribute(name: str, value) -> onnx.AttributeProto:
    if isinstance(value, tuple):
        return helper.make_attribute(name, list(value), attr_type=(
            onnx.AttributeProto.STRINGS if all(isinstance(v, str) for v in value)
            else onnx.AttributeProto.FLOATS if any(isinstance(v, float) for v in value)
            else onnx.AttributeProto.INTS))
    return helper.make_attribute(name, value)


def annotate_node(node: onnx.NodeProto, entries: tuple, conv_counts: dict) -> str:
    """Apply the recorded contexts to ``node``; returns its name scope prefix (``a/b/`` or
    ``""``). ``conv_counts`` numbers the convolutions of each MultiConv across calls."""
    prefix = ""
    attributes: dict = {}
    for entry in entries:
        if entry[0] == "name":
            prefix += entry[1] + "/"
        elif entry[0] == "attrs":
            attributes.update(entry[1])
        elif entry[0] == "multiconv" and node.op_type == "Conv":
            index = conv_counts.get(entry[1], 0)
            conv_counts[entry[1]] = index + 1
            for key, value in entry[2]:
                if isinstance(value, tuple):
                    if len(value) > 1 and index >= len(value):
                        raise Error(f"MultiConv: {len(value)} values were given for "
                                    f"{key.removeprefix('multiconv_')} (one per convolution), "
                                    f"but the block has more convolutions (Conv "
                                    f"'{node.name}' is number {index + 1}). Give one value per "
                                    f"convolution, or a single value for all.")
                    value = value[index] if len(value) > 1 else value[0]
                attributes[f"__{key}"] = value
    existing = {a.name for a in node.attribute}
    for key, value in attributes.items():
        if key not in existing:
            node.attribute.append(_attribute(key, value))
    return prefix
