"""Type-checked assignment for the option dataclasses (F9, F10): ``_Typed`` rejects unknown names
and values of the wrong type with ``popart_exception``; ``OptionDict`` is the string dict the
backend options (``engineOptions`` ...) use, so item assignments persist."""

from __future__ import annotations

import collections.abc
import difflib
import numbers
import types
import typing
from typing import Any

import numpy as np

from ..errors import popart_exception

# ----------------------------------------------------------------------------------------------
# Type-checked assignment
# ----------------------------------------------------------------------------------------------


class _Mismatch(Exception):
    """Internal signal from _coerce: the value does not fit the hint (turned into a message)."""


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_describe(a) for a in args)
    if origin is collections.abc.Callable:
        return "callable"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_describe(a) for a in args)}]"
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint))


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Return ``value`` converted to the type ``hint`` describes, or raise _Mismatch."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return _coerce(value, arg, where)
            except _Mismatch:
                continue
        raise _Mismatch
    if hint is type(None):
        if value is None:
            return None
        raise _Mismatch
    if hint is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise _Mismatch
    if hint is int:
        # bool is an Integral too; True as a count is almost always a slip.
        if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
            return int(value)
        raise _Mismatch
    if hint is float:
        if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
            return float(value)
        raise _Mismatch
    if origin is collections.abc.Callable:
        if callable(value):
            return value
        raise _Mismatch
    if origin in (set, frozenset):
        if not isinstance(value, (set, frozenset, list, tuple)):
            raise _Mismatch
        return {_coerce(v, args[0], where) for v in value}
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        return [_coerce(v, args[0], where) for v in value]
    if origin is dict:
        if not isinstance(value, collections.abc.Mapping):
            raise _Mismatch
        return OptionDict(where, args[0], args[1], value)
    if isinstance(hint, type):
        if isinstance(value, hint):
            return value
        raise _Mismatch
    raise TypeError(f"SessionOptions cannot check type hint {hint!r} of {where}")


def _checked(value: Any, hint: Any, where: str) -> Any:
    try:
        return _coerce(value, hint, where)
    except _Mismatch:
        raise popart_exception(
            f"{where} expects {_describe(hint)}, got {type(value).__name__} {value!r}."
        ) from None


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = {
            name: hint
            for name, hint in typing.get_type_hints(cls).items()
            if typing.get_origin(hint) is not typing.ClassVar
        }
    return _HINTS[cls]


class _Typed:
    """Base of the option structs: assigning checks the field name and the value's type."""

    def __setattr__(self, name: str, value: Any) -> None:
        hints = _hints(type(self))
        cls_name = type(self).__name__
        if name not in hints:
            close = difflib.get_close_matches(name, hints, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise popart_exception(f"{cls_name} has no option '{name}'.{hint}")
        object.__setattr__(self, name, _checked(value, hints[name], f"{cls_name}.{name}"))


class OptionDict(dict):
    """A dict option that checks key and value types on every write.

    SessionOptions stores this object itself, so item assignment on the value read from the
    options writes through (F10).
    """

    def __init__(self, where: str, key_type: type, value_type: type, items=()):
        super().__init__()
        self._where = where
        self._key_type = key_type
        self._value_type = value_type
        self.update(items)

    def __setitem__(self, key, value) -> None:
        key = _checked(key, self._key_type, f"key of {self._where}")
        super().__setitem__(key, _checked(value, self._value_type, f"{self._where}[{key!r}]"))

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def __ior__(self, other):
        self.update(other)
        return self

    def copy(self) -> dict:
        return dict(self)
