"""What the backend can run: ``getSupportedOperations``, ``getSupportedOperationsDefinition``,
``getUnsupportedOperations``, ``OperatorIdentifier`` and ``OpDefinition``.

Everything here is read from the op registry (plus ai.onnx.preview.training Gradient, which
the importer builds itself, ``_IMPORT_TIME_OPS``) and from ``onnx.defs``: nothing else is listed by hand, so the answers
cannot drift from what the importer accepts.

Public and internal ops. ``getSupportedOperations(False)`` lists only the ops a model or a
Builder may name. Internal ops are the ones passes create: gradient ops, the fused kernels of
the fusion passes, optimizer updates and the training forms of BatchNormalization / Dropout.
The rule (``is_public``), in order:

1. an op class that sets ``public = True`` or ``False`` says so itself;
2. domain ``popart.fused`` is internal (only the fusion passes may create it);
3. an ai.graphcore type whose name ends in ``Grad`` is internal (STYLE.md: grad ops are named
   ``<Forward>Grad``; autodiff creates them);
4. an ai.graphcore op defined in ``ops.optimizer_updates`` or ``ops.accumulate`` is internal
   (the optimizer and gradient-accumulation passes create them);
5. everything else is public.

Run ``python scripts/update_supported_ops_doc.py`` to regenerate ``docs/supported_ops.md``.
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
import types
import typing
from functools import lru_cache
from pathlib import Path

import onnx
import onnx.defs

from .dtypes import DataType
from .errors import popart_exception
from .files import write_text_atomic
from .importer.gradient_op import PREVIEW_TRAINING
from .ops import registry
from .ops.registry import AI_GRAPHCORE, AI_ONNX

__all__ = [
    "OperatorIdentifier",
    "OpDefinition",
    "getSupportedOperations",
    "getSupportedOperationsDefinition",
    "getUnsupportedOperations",
]

FUSED_DOMAIN = "popart.fused"
# Modules whose ai.graphcore ops only the optimizer / accumulation passes create (rule 4).
_INTERNAL_MODULES = ("popart_backend.ops.optimizer_updates", "popart_backend.ops.accumulate")

# Ops the importer builds itself instead of creating a registered op class:
# ai.onnx.preview.training Gradient becomes a Call of the backward autodiff grows
# (importer/gradient_op.py; an op class cannot, ops never import transforms). The sequence and
# optional ops are registered op classes (ops/sequences.py). Key: (domain, type); value: the input
# positions that must be compile-time constants. Versions, inputs, outputs and attributes are
# those of the ONNX schemas.
_IMPORT_TIME_OPS: dict[tuple[str, str], tuple[int, ...]] = {
    (PREVIEW_TRAINING, "Gradient"): (),
}


class OperatorIdentifier:
    """An op's identity: ``OperatorIdentifier("ai.onnx", "Add", 7)``.

    Equal, hashable and ordered by (domain, type, version); ``str()`` is PopART's
    ``domain.type:version``.
    """

    __slots__ = ("domain", "type", "version")

    def __init__(self, domain: str, type: str, version: int):  # noqa: A002 - PopART's name
        if not isinstance(domain, str) or not isinstance(type, str) or not type:
            raise popart_exception(
                f"OperatorIdentifier(domain, type, version): domain and type must be strings "
                f"and type non-empty, not {domain!r}, {type!r}."
            )
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise popart_exception(
                f"OperatorIdentifier {domain}.{type}: version must be an int >= 1, not {version!r}."
            )
        self.domain = registry.normalize_domain(domain)
        self.type = type
        self.version = version

    def _key(self) -> tuple[str, str, int]:
        return self.domain, self.type, self.version

    def __eq__(self, other) -> bool:
        return isinstance(other, OperatorIdentifier) and self._key() == other._key()

    def __lt__(self, other: "OperatorIdentifier") -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return f"{self.domain}.{self.type}:{self.version}"

    def __repr__(self) -> str:
        return f"OperatorIdentifier({self.domain!r}, {self.type!r}, {self.version})"


class OpDefinition:
    """What an op accepts: its inputs, outputs and attributes.

    ``inputs``: ``[Input(name, supportedTensors, constant)]``; ``constant`` inputs must be
    known at compile time (shapes, axes, sizes on a static-shape device).
    ``outputs``: ``[Output(name, supportedTensors)]``.
    ``attributes``: ``{name: Attribute}``, an Attribute being the regular expression its
    values (written as ``str(value)`` of the Python value) must match, also available as
    ``.supportedValuesRegex``.
    ``supportedTensors`` lists the DataTypes ONNX allows for the slot that the backend models.
    """

    @dataclasses.dataclass(frozen=True)
    class Input:
        name: str
        supportedTensors: tuple[DataType, ...]  # noqa: N815 - PopART's name
        constant: bool = False

    @dataclasses.dataclass(frozen=True)
    class Output:
        name: str
        supportedTensors: tuple[DataType, ...]  # noqa: N815

    class Attribute(str):
        """A regular expression over ``str(value)``; a ``str`` so ``attributes[n] == regex``."""

        @property
        def supportedValuesRegex(self) -> str:  # noqa: N802 - PopART's name
            return str(self)

    def __init__(self, inputs=(), outputs=(), attributes=None):
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attributes = {
            name: OpDefinition.Attribute(regex) for name, regex in (attributes or {}).items()
        }

    def __eq__(self, other) -> bool:
        return isinstance(other, OpDefinition) and (
            (self.inputs, self.outputs, self.attributes)
            == (other.inputs, other.outputs, other.attributes)
        )

    def __repr__(self) -> str:
        return (f"OpDefinition(inputs={[i.name for i in self.inputs]}, "
                f"outputs={[o.name for o in self.outputs]}, "
                f"attributes={sorted(self.attributes)})")


# --- public / internal -------------------------------------------------------------------------


def is_public(domain: str, op_type: str, cls) -> bool:
    """Whether ``getSupportedOperations(False)`` lists an op (rules in the module docstring)."""
    explicit = getattr(cls, "public", None)
    if explicit is not None:
        return bool(explicit)
    if domain == FUSED_DOMAIN:
        return False
    if domain == AI_GRAPHCORE and op_type.endswith("Grad"):
        return False
    if domain == AI_GRAPHCORE and cls is not None and cls.__module__ in _INTERNAL_MODULES:
        return False
    return True


def _entries(include_internal: bool):
    """(domain, type, version, op class or None for an import-time op), sorted."""
    rows = [
        (domain, op_type, version, cls)
        for domain, op_type, version, cls in registry.all_registered()
        if include_internal or is_public(domain, op_type, cls)
    ]
    for domain, op_type in _IMPORT_TIME_OPS:
        rows.extend((domain, op_type, v, None) for v in _onnx_versions(domain, op_type))
    return sorted(rows, key=lambda row: row[:3])


def getSupportedOperations(includeInternal: bool) -> list[OperatorIdentifier]:  # noqa: N802,N803
    """Every (domain, type, version) the importer resolves; internal ops only if asked."""
    return [OperatorIdentifier(d, t, v) for d, t, v, _ in _entries(bool(includeInternal))]


def getSupportedOperationsDefinition(  # noqa: N802
    includeInternal: bool,  # noqa: N803
) -> dict[OperatorIdentifier, OpDefinition]:
    """``getSupportedOperations`` mapped to each op's ``OpDefinition``."""
    return {
        OperatorIdentifier(d, t, v): _definition(d, t, v, cls)
        for d, t, v, cls in _entries(bool(includeInternal))
    }


def getUnsupportedOperations(opsetVersion: int) -> list[str]:  # noqa: N802,N803
    """ai.onnx op types of opset ``opsetVersion`` that a model of that opset cannot use.

    An op counts as unsupported when no version is registered, or when the version ONNX opset
    ``opsetVersion`` defines is not one we implement (strict resolution would reject it).
    """
    if isinstance(opsetVersion, bool) or not isinstance(opsetVersion, int) or opsetVersion < 1:
        raise popart_exception(
            f"getUnsupportedOperations: opsetVersion must be an int >= 1, not {opsetVersion!r}."
        )
    supported = {(t, v) for d, t, v, _ in _entries(True) if d == AI_ONNX}
    missing = []
    for (domain, op_type), versions in _onnx_schemas().items():
        if domain != AI_ONNX:
            continue
        usable = [v for v in versions if v <= opsetVersion]
        if not usable:
            continue
        schema = versions[max(usable)]
        if schema.deprecated:
            continue
        if (op_type, max(usable)) not in supported:
            missing.append(op_type)
    return sorted(missing)


# --- definitions ------------------------------------------------------------------------------

# ONNX type strings are the lower-case TensorProto names: tensor(float), tensor(bfloat16) ...
_ONNX_TYPE_TO_DATATYPE = {
    f"tensor({onnx.TensorProto.DataType.Name(dt.value).lower()})": dt
    for dt in DataType
    if dt is not DataType.UNDEFINED
}

# Regular expressions over str(value) of the importer's Python value of an attribute.
_NUMBER = r"[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?|inf|nan)"
_INT = r"[-+]?\d+"
_ATTRIBUTE_REGEX = {
    onnx.AttributeProto.INT: _INT,
    onnx.AttributeProto.FLOAT: _NUMBER,
    onnx.AttributeProto.STRING: r".*",
    onnx.AttributeProto.INTS: rf"\(({_INT}(, {_INT})*,?)?\)",
    onnx.AttributeProto.FLOATS: rf"\(({_NUMBER}(, {_NUMBER})*,?)?\)",
    onnx.AttributeProto.STRINGS: r"\(.*\)",
}
_ANY = r"(?s).*"  # tensors, graphs and values whose ONNX type is unknown


@lru_cache(maxsize=None)
def _onnx_schemas() -> dict[tuple[str, str], dict[int, onnx.defs.OpSchema]]:
    """ONNX schemas of every domain ONNX defines, by (domain, type) and since-version."""
    table: dict[tuple[str, str], dict[int, onnx.defs.OpSchema]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        key = (registry.normalize_domain(schema.domain), schema.name)
        table.setdefault(key, {})[schema.since_version] = schema
    return table


def _onnx_versions(domain: str, op_type: str) -> list[int]:
    return sorted(_onnx_schemas().get((domain, op_type), {}))


def _schema(domain: str, op_type: str, version: int) -> onnx.defs.OpSchema | None:
    """The ONNX schema of exactly this version; None for ops ONNX does not define."""
    return _onnx_schemas().get((domain, op_type), {}).get(version)


def _tensor_types(schema: onnx.defs.OpSchema, slot) -> tuple[DataType, ...]:
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    names = allowed.get(slot.type_str, [slot.type_str])
    types = {_ONNX_TYPE_TO_DATATYPE[n] for n in names if n in _ONNX_TYPE_TO_DATATYPE}
    return tuple(sorted(types, key=lambda dt: dt.value))


def _definition(domain: str, op_type: str, version: int, cls) -> OpDefinition:
    if getattr(cls, "definition", None) is not None:
        return cls.definition  # a custom op registered with its own OpDefinition
    schema = _schema(domain, op_type, version)
    const = _IMPORT_TIME_OPS[(domain, op_type)] if cls is None else tuple(cls.const_inputs)
    if schema is not None:
        inputs = [
            OpDefinition.Input(slot.name, _tensor_types(schema, slot), index in const)
            for index, slot in enumerate(schema.inputs)
        ]
        outputs = [OpDefinition.Output(s.name, _tensor_types(schema, s)) for s in schema.outputs]
    else:
        # Ops ONNX does not define (ai.graphcore ...): the constant positions are still known.
        inputs = [OpDefinition.Input(f"input{i}", (), True) for i in sorted(const)]
        outputs = []
    return OpDefinition(inputs, outputs, _attribute_regexes(schema, cls, version))


def _attribute_regexes(schema, cls, version: int) -> dict[str, str]:
    schema_types = {a.name: a.type for a in schema.attributes.values()} if schema else {}
    if cls is None:
        return {name: _ATTRIBUTE_REGEX.get(t, _ANY) for name, t in schema_types.items()}
    attrs_type = cls.attrs_type(version)
    if not dataclasses.is_dataclass(attrs_type):
        return {}
    onnx_names = {field: name for name, field in cls.attr_aliases().items()}
    hints = typing.get_type_hints(attrs_type)
    result = {}
    for field in dataclasses.fields(attrs_type):
        name = onnx_names.get(field.name, field.name)
        onnx_type = schema_types.get(name, _type_from_hint(hints.get(field.name)))
        result[name] = _ATTRIBUTE_REGEX.get(onnx_type, _ANY)
    return result


def _type_from_hint(hint):
    """The ONNX attribute type an Attrs annotation implies (ops without an ONNX schema)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next((h for h in typing.get_args(hint) if h is not type(None)), hint)
    plain = {int: onnx.AttributeProto.INT, float: onnx.AttributeProto.FLOAT,
             str: onnx.AttributeProto.STRING, bool: onnx.AttributeProto.INT}
    if hint in plain:
        return plain[hint]
    if typing.get_origin(hint) is tuple:
        element = (typing.get_args(hint) or (None,))[0]
        return {int: onnx.AttributeProto.INTS, float: onnx.AttributeProto.FLOATS,
                str: onnx.AttributeProto.STRINGS}.get(element)
    return None


# --- docs/supported_ops.md ----------------------------------------------------------------------

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "supported_ops.md"


def _versions_text(versions: list[int]) -> str:
    return ", ".join(str(v) for v in versions)


def _types_text(domain: str, op_type: str, version: int) -> str:
    """The element types of the op's first input (its first output when it has no input) at
    ``version``, from its ONNX schema; blank for ops without one."""
    schema = _schema(domain, op_type, version)
    if schema is None:
        return ""
    slots = list(schema.inputs) or list(schema.outputs)
    if not slots:
        return ""
    return " ".join(dt.short for dt in _tensor_types(schema, slots[0]))


def render_markdown() -> str:
    """The text of docs/supported_ops.md, generated from the registry."""
    by_type: dict[tuple[str, str], list[int]] = {}
    for op in getSupportedOperations(True):
        by_type.setdefault((op.domain, op.type), []).append(op.version)
    public = {(op.domain, op.type) for op in getSupportedOperations(False)}
    domains = sorted({d for d, _ in by_type}, key=lambda d: (d != AI_ONNX, d != AI_GRAPHCORE, d))
    lines = [
        "# Supported operations",
        "",
        "Generated from the op registry by `python scripts/update_supported_ops_doc.py`; do not",
        "edit by hand (tests/test_supported_ops.py fails when this page is stale).",
        "",
        "A model with ai.onnx opset V resolves each node to the highest listed version <= V;",
        "with `strictOpVersions` (the default) that version must be the one ONNX opset V defines",
        "(as in PopART). `popart.getSupportedOperations(includeInternal)` returns the same list;",
        "internal ops (gradients, fused kernels, optimizer updates, IPU copies, stashes,",
        "collectives the replication passes insert) are created by passes and cannot appear",
        "in a model, so they are listed by name only.",
        "",
        "Data types are those of the op's first input in the ONNX schema of its latest",
        "version, as short names; the simulated IPU computes every one of them except as",
        "listed under \"Data types not modelled\" below.",
        "",
        *textwrap.wrap(", ".join(f"{dt.short} = {dt.name.lower()}" for dt in DataType
                                 if dt is not DataType.UNDEFINED) + ".", 92),
        "",
    ]
    for domain in domains:
        rows = sorted((t, v) for (d, t), v in by_type.items() if d == domain)
        public_rows = [(t, v) for t, v in rows if (domain, t) in public]
        internal_rows = [(t, v) for t, v in rows if (domain, t) not in public]
        lines += [f"## Domain `{domain}`", ""]
        if public_rows:
            lines += [f"{len(public_rows)} public op types.", "",
                      "| op type | versions | data types (latest version) |",
                      "| --- | --- | --- |"]
            lines += [f"| {t} | {_versions_text(v)} | {_types_text(domain, t, max(v))} |"
                      for t, v in public_rows]
            lines.append("")
        if internal_rows:
            lines += [f"Internal ({len(internal_rows)} op types): "
                      + ", ".join(t for t, _ in internal_rows) + ".", ""]
    lines += _dtype_gaps()
    latest = onnx.defs.onnx_opset_version()
    missing = getUnsupportedOperations(latest)
    lines += [f"## Not supported (ai.onnx opset {latest})", ""]
    if missing:
        lines += [
            f"{len(missing)} op types of ONNX opset {latest} (`popart.getUnsupportedOperations"
            f"({latest})`), either not implemented or implemented only at an older version:",
            "",
            ", ".join(missing) + ".",
            "",
        ]
    else:
        lines += [
            f"None: `popart.getUnsupportedOperations({latest})` is empty, every ai.onnx op type "
            f"is implemented at every version up to opset {latest}.",
            "",
        ]
    return "\n".join(lines)


def _dtype_gaps() -> list[str]:
    """The "Data types not modelled" section: the limits the op classes declare."""
    public = {(d, t) for d, t, _, _ in _entries(False)}
    uint64 = sorted({t for d, t, _, cls in registry.all_registered()
                     if (d, t) in public and getattr(cls, "uint64", None) is not None})
    strings = sorted({t for d, t, _, cls in registry.all_registered()
                      if (d, t) in public and (cls.takes_strings or cls.strings_as_codes)})
    return [
        "## Data types not modelled",
        "",
        "Every ONNX element type has a representation (docs in `popart_backend/dtypes.py`); "
        "two are limited to the ops that declare them:",
        "",
        "- uint64 (held as int64 bit patterns): ops whose result for values >= 2**63 would "
        "differ from int64's declare how they compute it; any other op refuses uint64 with "
        f"UnsupportedOpError rather than give a wrong result. Declared: {', '.join(uint64)}.",
        "- string: element-moving ops (their kernels see the strings as codes), the string ops "
        f"and Cast. Declared: {', '.join(strings)}.",
        "- complex64 / complex128: ONNX allows them only in data-movement ops (and BitCast, "
        "GridSample, Resize, random *Like ops), which move them with torch's complex tensors; "
        "ops that compute on them (BitCast, GridSample, Resize, the random ops) refuse them.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    """Write docs/supported_ops.md (``--check``: exit 1 if the committed page is stale)."""
    argv = sys.argv[1:] if argv is None else argv
    text = render_markdown()
    if "--check" in argv:
        current = DOC_PATH.read_text() if DOC_PATH.exists() else ""
        if current != text:
            print(f"{DOC_PATH} is stale; run python scripts/update_supported_ops_doc.py")
            return 1
        return 0
    write_text_atomic(DOC_PATH, text)
    print(f"wrote {DOC_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
