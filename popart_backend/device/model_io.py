"""The device model as plain JSON and arrays (F53): what an engine cache entry stores instead
of the analysis (``analysis.analyse``), so a cache hit skips it.

``model_to_json(model)`` returns ``(document, arrays)``: a JSON-serialisable document and the
numpy arrays it refers to by key (the executable file keeps them in its array member).
``model_from_json(document, arrays)`` rebuilds an equal ``DeviceModel``: the same memory per
IPU and tile, cycles, tensor locations and host streams, hence the same fit verdict, reports and
cycle counts.

The encoding walks the objects generically, so the result classes (device/cost.py,
device/memory.py ...) can gain fields without changes here. Values are tagged:

- ``None``, bools, ints, floats and strings stay themselves, lists stay lists;
- ``{"$": "tuple" | "set" | "frozenset", "v": [...]}``, ``{"$": "dict", "v": [[key, value]]}``;
- ``{"$": "dc", "c": <class index>, "v": [values]}`` for a dataclass instance, the values in
  the order of the attribute names the document's class table lists for that index
  (``"classes": [["<module>:<class>", [attribute names]], ...]``);
  ``{"$": "enum", "c": <class index>, "v": "<member name>"}`` for an enum member;
- ``{"$": "nd", "k": "<array key>"}`` for an array, ``{"$": "np", "d": dtype, "v": value}`` for
  a numpy scalar.

Reading never imports anything nor runs a constructor: a class is looked up among the modules
of this package already loaded, and must be a dataclass or an enum; anything else is refused
with ``popart_exception`` (the caller treats the entry as unusable).
"""

from __future__ import annotations

import dataclasses
import enum
import sys

import numpy as np

from ..errors import popart_exception
from .analysis import DeviceModel

__all__ = ["model_from_json", "model_to_json"]

_PACKAGE = __name__.split(".")[0] + "."
FORMAT_VERSION = 2


def model_to_json(model: DeviceModel) -> tuple[dict, dict[str, np.ndarray]]:
    """``model`` as a JSON document and its arrays (see the module docstring)."""
    writer = _Writer()
    encoded = writer.encode(model)
    classes = [[_name(cls), list(keys)] for cls, keys in writer.classes]
    return ({"format_version": FORMAT_VERSION, "classes": classes, "model": encoded},
            writer.arrays)


def model_from_json(document, arrays: dict[str, np.ndarray]) -> DeviceModel:
    """The ``DeviceModel`` of ``model_to_json``; raises ``popart_exception`` on anything
    malformed."""
    if not isinstance(document, dict) or document.get("format_version") != FORMAT_VERSION:
        raise popart_exception(
            f"the stored device model has format {str(document)[:80]!r}, expected version "
            f"{FORMAT_VERSION}.")
    try:
        reader = _Reader(document["classes"], arrays)
        model = reader.decode(document["model"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError,
            RecursionError) as exc:
        raise popart_exception(
            f"the stored device model is malformed ({type(exc).__name__}: {exc}).") from exc
    if not isinstance(model, DeviceModel):
        raise popart_exception(
            f"the stored device model is a {type(model).__name__}, not a DeviceModel.")
    return model


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


_PLAIN = (bool, int, float, str)


class _Writer:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.classes: list[tuple[type, tuple[str, ...]]] = []
        self._index: dict[tuple[type, tuple[str, ...]], int] = {}

    def _class(self, cls: type, keys: tuple[str, ...]) -> int:
        key = (cls, keys)
        if key not in self._index:
            self._index[key] = len(self.classes)
            self.classes.append(key)
        return self._index[key]

    def encode(self, value):
        kind = type(value)
        if value is None or kind in _PLAIN:
            return value
        if kind is list:
            return [self.encode(v) for v in value]
        if isinstance(value, enum.Enum):
            return {"$": "enum", "c": self._class(kind, ()), "v": value.name}
        if kind is tuple or kind is set or kind is frozenset:
            return {"$": kind.__name__, "v": [self.encode(v) for v in value]}
        if kind is dict:
            return {"$": "dict", "v": [[self.encode(k), self.encode(v)]
                                       for k, v in value.items()]}
        if kind is np.ndarray:
            key = f"m{len(self.arrays)}"
            self.arrays[key] = value
            return {"$": "nd", "k": key}
        if isinstance(value, np.generic):
            return {"$": "np", "d": value.dtype.name, "v": value.item()}
        if dataclasses.is_dataclass(value) and kind.__module__.startswith(_PACKAGE):
            state = vars(value) if hasattr(value, "__dict__") else {
                f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            keys = tuple(sorted(state))  # canonical
            return {"$": "dc", "c": self._class(kind, keys),
                    "v": [self.encode(state[k]) for k in keys]}
        raise popart_exception(
            f"Cannot store the device model in the engine cache: it holds a "
            f"{kind.__module__}.{kind.__qualname__} ({str(value)[:80]}), which has no JSON "
            f"form. Report this; meanwhile turn engine caching off.")


def _class(name) -> type:
    """A dataclass or enum of an already loaded module of this package."""
    module_name, _, qualname = str(name).partition(":")
    module = sys.modules.get(module_name) if module_name.startswith(_PACKAGE) else None
    cls = module
    for part in qualname.split(".") if module is not None else ():
        cls = vars(cls).get(part) if hasattr(cls, "__dict__") else None
    if not isinstance(cls, type) or not (dataclasses.is_dataclass(cls)
                                         or issubclass(cls, enum.Enum)):
        raise ValueError(f"'{name}' is not a dataclass or enum of this package")
    return cls


class _Reader:
    def __init__(self, classes, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.classes: list[tuple[type, tuple[str, ...]]] = []
        for name, keys in classes:
            cls, keys = _class(name), tuple(str(k) for k in keys)
            if any(k.startswith("__") for k in keys):
                raise ValueError(f"{name} has a reserved attribute name")
            if dataclasses.is_dataclass(cls):
                missing = {f.name for f in dataclasses.fields(cls)} - set(keys)
                if missing:
                    raise KeyError(f"{name} misses the field(s) {sorted(missing)}")
            self.classes.append((cls, keys))

    def decode(self, value):
        kind = type(value)
        if value is None or kind in _PLAIN:
            return value
        if kind is list:
            return [self.decode(v) for v in value]
        if kind is not dict:
            raise TypeError(f"unexpected JSON value {str(value)[:80]}")
        tag = value["$"]
        if tag == "dc":
            cls, keys = self.classes[value["c"]]
            values = value["v"]
            if not dataclasses.is_dataclass(cls) or type(values) is not list \
                    or len(values) != len(keys):
                raise TypeError(f"{cls.__qualname__}: not a dataclass of {len(keys)} values")
            obj = object.__new__(cls)  # no constructor: the state is restored as it was
            for key, item in zip(keys, values):
                object.__setattr__(obj, key, self.decode(item))
            return obj
        if tag == "enum":
            cls, _ = self.classes[value["c"]]
            if not issubclass(cls, enum.Enum):
                raise TypeError(f"{cls.__qualname__} is not an enum")
            return cls[value["v"]]
        if tag == "tuple":
            return tuple(self.decode(v) for v in value["v"])
        if tag in ("set", "frozenset"):
            items = (self.decode(v) for v in value["v"])
            return set(items) if tag == "set" else frozenset(items)
        if tag == "dict":
            return {self.decode(k): self.decode(v) for k, v in value["v"]}
        if tag == "nd":
            return self.arrays[value["k"]]
        if tag == "np":
            dtype = np.dtype(value["d"])
            if dtype.kind not in "biufc":
                raise TypeError(f"numpy scalar of dtype {dtype} is not numeric")
            return dtype.type(value["v"])
        raise ValueError(f"unknown tag {tag!r}")
