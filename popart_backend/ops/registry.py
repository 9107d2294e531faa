"""The op registry: (domain, op type, version) -> Op class, and version resolution.

Ops register with ``@register_op("Relu", versions=(6, 13, 14))``: the versions are the ONNX
``since_version`` values whose semantics the class implements. The importer resolves a node of
a model with opset V to the highest registered version <= V.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import typing
from typing import Iterable

import numpy as np
import onnx.defs

from ..errors import UnsupportedOpError, popart_exception
from ..ir.op import Op

AI_ONNX = "ai.onnx"
AI_GRAPHCORE = "ai.graphcore"
AI_ONNX_ML = "ai.onnx.ml"

_REGISTRY: dict[tuple[str, str], dict[int, type[Op]]] = {}
_log = logging.getLogger("popart:op")


def normalize_domain(domain: str) -> str:
    return AI_ONNX if domain in ("", AI_ONNX) else domain


def register_op(op_type: str, versions: Iterable[int] | int, domain: str = AI_ONNX):
    """Class decorator registering an Op subclass for each ONNX since-version in ``versions``.

    Registering an existing (domain, type, version) raises: an op lives in one place.
    """
    versions = (versions,) if isinstance(versions, int) else tuple(sorted(versions))
    domain = normalize_domain(domain)

    def decorate(cls: type[Op]) -> type[Op]:
        cls.op_type = op_type
        cls.domain = domain
        cls.versions = versions
        table = _REGISTRY.setdefault((domain, op_type), {})
        for v in versions:
            if v in table:
                raise popart_exception(
                    f"Op {domain}::{op_type}-{v} is registered twice: by "
                    f"{table[v].__module__}.{table[v].__name__} and {cls.__module__}.{cls.__name__}."
                )
            table[v] = cls
        return cls

    return decorate


def unregister_op(op_type: str, version: int, domain: str = AI_ONNX) -> type[Op] | None:
    """Remove and return the class registered for (domain, type, version), None if absent.

    Only custom ops (``popart_backend.custom``) replace registrations; built-in ops never do.
    """
    table = _REGISTRY.get((normalize_domain(domain), op_type), {})
    cls = table.pop(version, None)
    if not table:
        _REGISTRY.pop((normalize_domain(domain), op_type), None)
    return cls


def registered_versions(op_type: str, domain: str = AI_ONNX) -> list[int]:
    return sorted(_REGISTRY.get((normalize_domain(domain), op_type), {}))


def all_registered() -> list[tuple[str, str, int, type[Op]]]:
    return [
        (domain, op_type, v, cls)
        for (domain, op_type), table in sorted(_REGISTRY.items())
        for v, cls in sorted(table.items())
    ]


def onnx_since_version(op_type: str, opset: int, domain: str = AI_ONNX) -> int | None:
    """The since-version of ``op_type`` in ONNX opset ``opset``; None if ONNX has no such op."""
    try:
        return onnx.defs.get_schema(op_type, opset, "" if domain == AI_ONNX else domain).since_version
    except onnx.defs.SchemaError:
        return None


def resolve(op_type: str, domain: str, opset: int, strict: bool = True) -> tuple[type[Op], int]:
    """Op class and version for a node of ``op_type`` in a model importing ``domain`` at ``opset``."""
    domain = normalize_domain(domain)
    table = _REGISTRY.get((domain, op_type))
    if not table:
        raise UnsupportedOpError(
            f"Op {op_type} (domain {domain}, opset {opset}) is not supported by popart_backend."
            + _similar(op_type, domain)
            + " popart.getSupportedOperations(False) lists what is; a custom op can add it."
        )
    usable = [v for v in table if v <= opset]
    if not usable:
        raise UnsupportedOpError(
            f"Op {op_type} (domain {domain}) at opset {opset}: the earliest version we support is "
            f"{min(table)} (supported versions {sorted(table)})."
        )
    version = max(usable)
    if domain in (AI_ONNX, AI_ONNX_ML):
        expected = onnx_since_version(op_type, opset, domain)
        if expected is not None and expected != version:
            message = (
                f"Op {op_type} in {domain} opset {opset} is version {expected}, but popart_backend "
                f"implements versions {sorted(table)} of it."
            )
            if strict:
                raise UnsupportedOpError(
                    message + f" Set SessionOptions.strictOpVersions = False to run it as "
                    f"{op_type}-{version} (results may differ)."
                )
            _log.warning("%s Running it as %s-%d, which may differ.", message, op_type, version)
    return table[version], version


def find(op_type: str, domain: str, opset: int) -> tuple[type[Op], int] | None:
    """Op class and version a node would resolve to, without the strict version check; None
    when nothing is registered at or below ``opset``. Never raises (``resolve`` reports)."""
    table = _REGISTRY.get((normalize_domain(domain), op_type), {})
    usable = [v for v in table if v <= opset]
    return (table[max(usable)], max(usable)) if usable else None


def modified_input_positions(op_type: str, domain: str, opset: int) -> tuple[int, ...]:
    """Input positions the op a node would resolve to writes in place (``modifies_inputs``);
    () if unknown. Never raises, like ``const_input_positions``."""
    found = find(op_type, domain, opset)
    return tuple(found[0].modifies_inputs) if found else ()


def const_input_positions(op_type: str, domain: str, opset: int) -> tuple[int, ...]:
    """Input positions read at compile time by the op a node would resolve to; () if unknown.

    Never raises: the importer uses it to classify initializers before resolving nodes (an
    unsupported node is reported when it is added).
    """
    found = find(op_type, domain, opset)
    return tuple(found[0].const_inputs) if found else ()


def _similar(op_type: str, domain: str) -> str:
    import difflib

    names = sorted({t for (d, t) in _REGISTRY if d == domain})
    close = difflib.get_close_matches(op_type, names, n=3)
    hint = f" Similar registered ops: {', '.join(close)}." if close else ""
    return hint + f" ({len(names)} {domain} op types are registered.)"


# --- attributes ------------------------------------------------------------------------------


def make_attrs(cls: type[Op], version: int, values: dict, where: str):
    """Fill the op's Attrs dataclass from ONNX attribute values; unknown names are rejected.

    An op class whose attributes are not a fixed dataclass (custom ops take any attributes
    their OpDefinition allows) provides ``build_attrs(version, values, where)`` instead.
    """
    build_attrs = getattr(cls, "build_attrs", None)
    if build_attrs is not None:
        return build_attrs(version, dict(values), where)
    attrs_type = cls.attrs_type(version)
    aliases = cls.attr_aliases()
    values = {aliases.get(k, k): v for k, v in values.items()}
    fields = {f.name: f for f in dataclasses.fields(attrs_type)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise popart_exception(
            f"{where}: unknown attribute(s) {unknown} for {cls.op_type}-{version}; "
            f"it accepts {sorted(fields) or 'none'}."
        )
    hints = _type_hints(attrs_type)
    converted = {k: _convert(v, hints.get(k)) for k, v in values.items()}
    try:
        return attrs_type(**converted)
    except TypeError as exc:
        missing = [
            n
            for n, f in fields.items()
            if n not in values
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        raise popart_exception(
            f"{where}: {cls.op_type}-{version} requires attribute(s) {missing}: {exc}"
        ) from None


@functools.cache
def _type_hints(attrs_type: type) -> dict:
    """``typing.get_type_hints`` of an Attrs dataclass, once per class (resolving the string
    annotations is costly and an Attrs class never changes)."""
    return typing.get_type_hints(attrs_type)


def _convert(value, hint):
    """Lists become tuples (Attrs are frozen); numbers follow the field's declared type."""
    if isinstance(value, list):
        value = tuple(value)
    if hint is float and isinstance(value, (int, np.integer)):
        return float(value)
    if hint is int and isinstance(value, (bool, np.bool_)):
        return int(value)
    return value


def create_op(op_type: str, attrs: dict | None = None, settings=None, version: int | None = None,
              domain: str = AI_ONNX, where: str = "") -> Op:
    """An op instance of a registered type (latest registered version unless given).

    For passes and import rewrites that build ops directly rather than from a NodeProto.
    """
    domain = normalize_domain(domain)
    table = _REGISTRY.get((domain, op_type))
    if not table:
        raise UnsupportedOpError(f"{where or 'create_op'}: op {domain}::{op_type} is not registered.")
    version = version if version is not None else max(table)
    if version not in table:
        raise UnsupportedOpError(
            f"{where or 'create_op'}: {op_type}-{version} is not registered ({sorted(table)})."
        )
    cls = table[version]
    return cls(make_attrs(cls, version, dict(attrs or {}), where or op_type), settings, version)
