"""PopTorch's ``OptionsDict`` face of ``Options`` and its groups: option values read by their
PopTorch key (``opts.replication_factor``, ``opts("log_dir")``) and the generic methods
``set``, ``createOrSet``, ``exists``, ``deleteIfExists``, ``checkIsFrozen``, ``update`` and
``__call__``.

Each class lists its keys in ``_KEYS``: how to read the value, the setter that writes it (so
``set(replication_factor=4)`` is ``replicationFactor(4)``, with its checks and its effect),
and, for keys that exist only after their setter (``random_seed``, ``ipu_version`` ...), when
they exist and how ``deleteIfExists`` resets them. A key ``createOrSet`` creates that no code
reads is stored (and read back) but has no effect; that is logged once per key.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, ClassVar

__all__: list[str] = []

_log = logging.getLogger("poptorch_lite")
_LOGGED: set[str] = set()


@dataclasses.dataclass(frozen=True)
class _Key:
    """One PopTorch value key: ``get(obj)``, ``put(obj, value)`` (None: read-only), ``present``
    (None: always exists) and ``clear`` (how ``deleteIfExists`` removes an optional key)."""

    get: Callable[[Any], Any]
    put: Callable[[Any, Any], Any] | None = None
    present: Callable[[Any], bool] | None = None
    clear: Callable[[Any], Any] | None = None

    def exists(self, obj) -> bool:
        return self.present is None or self.present(obj)


class OptionsDictMixin:
    """The OptionsDict methods over ``_KEYS`` and the store's ``createdOptions`` dict."""

    _KEYS: ClassVar[dict[str, _Key]] = {}

    def _dict_root(self):  # the Options holding the values (itself, or a group's root)
        return self

    def _dict_prefix(self) -> str:  # "" for Options, "Training." for its Training group
        return ""

    def _dict_name(self) -> str:
        return "Options" + ("." + self._dict_prefix().rstrip(".") if self._dict_prefix() else "")

    def _created(self) -> dict:
        prefix = self._dict_prefix()
        return {k[len(prefix):]: v
                for k, v in self._dict_root()._values["createdOptions"].items()
                if k.startswith(prefix) and "." not in k[len(prefix):]}

    def _present(self) -> dict:
        values = {name: key.get(self) for name, key in self._KEYS.items() if key.exists(self)}
        values.update(self._created())
        return values

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        key = type(self)._KEYS.get(name)
        if key is not None and key.exists(self):
            return key.get(self)
        created = self._created()
        if name in created:
            return created[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or option {name!r}"
                             + (" (it exists once its setter was called)" if key else "") + ".")

    def exists(self, option: str) -> bool:
        """Is ``option`` defined (keys such as ``random_seed`` exist only once set)?"""
        key = self._KEYS.get(option)
        return (key is not None and key.exists(self)) or option in self._created()

    def __call__(self, option: str):
        """The value of ``option``."""
        if not self.exists(option):
            raise ValueError(f"{self._dict_name()}: no option {option!r}; defined options are "
                             f"{sorted(self._present())}.")
        return getattr(self, option)

    def checkIsFrozen(self, option: str | None = None) -> None:  # noqa: N802
        """Raise ``AttributeError`` if these options were given to a wrapper or DataLoader."""
        self._dict_root()._check_not_frozen(self._dict_prefix() + (option or "options"))

    def set(self, **kwargs):
        """Set existing keys through their setters (same checks, same effect)."""
        for option, value in kwargs.items():
            key = self._KEYS.get(option)
            if key is None and option in self._created():
                self._store_created(option, value)
                continue
            if key is None:
                raise ValueError(f"{self._dict_name()}.set: invalid option {option!r}; valid "
                                 f"options are {sorted(self._KEYS)}.")
            if key.put is None:
                raise ValueError(f"{self._dict_name()}.set: {option!r} is read-only here; use "
                                 f"its setter method.")
            self.checkIsFrozen(option)
            key.put(self, value)
        return self

    def createOrSet(self, **kwargs):  # noqa: N802
        """Set keys that exist; create the others (stored, read back, but of no effect)."""
        for option, value in kwargs.items():
            if option in self._KEYS:
                self.set(**{option: value})
            else:
                self._store_created(option, value)
        return self

    def _store_created(self, option: str, value) -> None:
        full = self._dict_prefix() + option
        self.checkIsFrozen(option)
        if full not in _LOGGED:
            _LOGGED.add(full)
            _log.warning("%s.createOrSet(%s=...): no part of poptorch_lite reads this option; "
                         "it is stored and read back but has no effect.", self._dict_name(),
                         option)
        root = self._dict_root()
        root._set("createdOptions", {**root._values["createdOptions"], full: value})

    def deleteIfExists(self, option: str):  # noqa: N802
        """Remove a created key, or reset an optional one (``random_seed`` ...) to unset."""
        if not self.exists(option):
            return self
        self.checkIsFrozen(option)
        if option in self._created():
            root = self._dict_root()
            created = dict(root._values["createdOptions"])
            del created[self._dict_prefix() + option]
            root._set("createdOptions", created)
            return self
        key = self._KEYS[option]
        if key.clear is None:
            raise ValueError(f"{self._dict_name()}.deleteIfExists: {option!r} is always "
                             f"defined; set another value instead.")
        key.clear(self)
        return self

    def update(self, other: dict) -> dict:
        """Merge these values (by PopTorch key) into ``other`` and return it; keys in common
        are an error."""
        mine = self._present()
        common = sorted(set(mine) & set(other))
        if common:
            raise ValueError(f"{self._dict_name()}.update: cannot merge, keys in common: "
                             f"{common}.")
        other.update(mine)
        return other
