"""The Builder's opset objects (``builder.aiOnnx``, ``aiOnnxOpsetN``, ``aiGraphcore`` ...), F17.

Each op method is generated, not written by hand: for ai.onnx and ai.onnx.ml the op list and
every signature come from the ``onnx.defs`` schema of that opset version; the ai.graphcore ops
have no ONNX schema, so each op class declares its method (``Op.builder_method``,
ir/signature.py) and ``graphcore_specs`` reads the declarations from the op registry. One
``OpSpec`` describes an op, ``make_method`` turns it into a method with PopART's calling
convention::

    opset.<lower-case op name>(args, [num_outputs,] <attributes with defaults>, debugContext="")

``num_outputs`` is taken by ops whose output count varies (Split, MaxPool, Dropout ...). A method
returns one id, or a list of ids for ops with a variable or fixed multiple output count.

Two ai.graphcore methods take nested arguments no OpSpec describes and are written by hand in
``nested.py``: ``multiconv`` and ``packedDataBlock``.
"""

from __future__ import annotations

import enum
import functools
import inspect
import keyword
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.defs
from onnx import AttributeProto, helper, numpy_helper

from ..dtypes import DataType
from ..errors import popart_exception
from ..ir.signature import REQUIRED, AttrSpec, BuilderMethod
from ..ops.registry import all_registered
from .base import (
    AI_GRAPHCORE,
    AI_ONNX,
    NodeWriter,
    Opset,
    _is_int,
    make_attribute,
)
from .nested import GRAPHCORE_METHODS

# ai.onnx versions the Builder offers: PopART's 6..11, extended to what the backend imports.
MIN_ONNX_OPSET = 6
MAX_ONNX_OPSET = 28

# Python keywords (and PopART's choice for If) get PopART's method names.
_METHOD_NAMES = {
    "If": "logical_if",
    "Not": "logical_not",
    "And": "logical_and",
    "Or": "logical_or",
    "Xor": "logical_xor",
}

# PopART keeps these first after ``args`` so that ``constant(value, False)`` works.
_FIRST_ATTRIBUTES = {"Constant": ("value",)}

# Extra PopART parameters that are not ONNX attributes: (name, default, why it is accepted).
_EXTRA_PARAMS = {
    # Every Constant of the simulated IPU is constant already; PopART's flag only controls
    # whether its value may be overwritten by the host, which nothing here can do.
    "Constant": (("is_value_const", False),),
}


def _data_type_code(value):
    """PopART's ``cast`` takes the target type by name ("FLOAT16", "INT32", "BOOL" ...), which
    the node stores as its ONNX code; codes and DataType values pass too."""
    if isinstance(value, str):
        return int(DataType.from_string(value).onnx)
    if isinstance(value, DataType):
        return int(value.onnx)
    return value


# Attributes a PopART method takes in another form than the node stores: (op, name) -> conversion.
_CONVERSIONS = {("Cast", "to"): _data_type_code}


@dataclass(frozen=True)
class OpSpec:
    """What a method needs to know to validate a call and write the node."""

    op_type: str
    domain: str
    version: int  # the opset version the method belongs to
    min_inputs: int
    max_inputs: int
    min_outputs: int
    max_outputs: int
    attrs: tuple[AttrSpec, ...] = ()
    takes_args: bool = True
    variable_outputs: bool = False  # takes ``num_outputs``
    returned_outputs: int | None = None  # return only the first N outputs (PopART's ctcloss)
    write_defaults: bool = False  # ai.graphcore nodes carry every attribute explicitly
    extra_params: tuple[tuple[str, Any], ...] = ()
    unsupported: str = ""  # non-empty: calling the method raises this reason

    @property
    def fixed_outputs(self) -> int:
        return self.max_outputs


def _schema_default(attr: onnx.defs.OpSchema.Attribute):
    if attr.required:
        return REQUIRED
    default = attr.default_value
    if default.type == AttributeProto.UNDEFINED:
        return None
    value = helper.get_attribute_value(default)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if default.type == AttributeProto.TENSOR:
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
    return value


def spec_from_schema(schema: onnx.defs.OpSchema, version: int, domain: str) -> OpSpec:
    """OpSpec of an ONNX schema as seen by a model importing ``domain`` at ``version``."""
    first = _FIRST_ATTRIBUTES.get(schema.name, ())
    attrs = [
        AttrSpec(a.name, int(a.type), _schema_default(a),
                 convert=_CONVERSIONS.get((schema.name, a.name))
                 if a.type == AttributeProto.INT else None)
        for a in schema.attributes.values()
    ]
    # Required attributes first (they have no default), then alphabetical, as PopART generates.
    attrs.sort(key=lambda a: (a.name not in first, not a.required, a.name))
    unsupported = ""
    if schema.deprecated:
        unsupported = f"{schema.name} is deprecated in {domain} opset {version}."
    return OpSpec(
        op_type=schema.name,
        domain=domain,
        version=version,
        min_inputs=schema.min_input,
        max_inputs=schema.max_input,
        min_outputs=schema.min_output,
        max_outputs=schema.max_output,
        attrs=tuple(attrs),
        takes_args=schema.max_input > 0,
        variable_outputs=schema.min_output != schema.max_output,
        extra_params=_EXTRA_PARAMS.get(schema.name, ()),
        unsupported=unsupported,
    )


@functools.lru_cache(maxsize=None)
def _schema_names(domain: str) -> tuple[str, ...]:
    onnx_domain = "" if domain == AI_ONNX else domain
    schemas = onnx.defs.get_all_schemas_with_history()
    return tuple(sorted({s.name for s in schemas if s.domain == onnx_domain}))


def onnx_specs(domain: str, version: int) -> dict[str, OpSpec]:
    """Method name -> OpSpec for every op of ``domain`` in opset ``version`` (from onnx.defs)."""
    onnx_domain = "" if domain == AI_ONNX else domain
    specs = {}
    for name in _schema_names(domain):
        try:
            schema = onnx.defs.get_schema(name, version, onnx_domain)
        except onnx.defs.SchemaError:
            continue  # not yet introduced at this opset
        specs[_METHOD_NAMES.get(name, name.lower())] = spec_from_schema(schema, version, domain)
    return specs


# --- ai.graphcore ----------------------------------------------------------------


def _graphcore_spec(op_type: str, method: BuilderMethod) -> OpSpec:
    lo, hi = method.inputs if isinstance(method.inputs, tuple) else (method.inputs,) * 2
    out_lo, out_hi = method.outputs if isinstance(method.outputs, tuple) else (method.outputs,) * 2
    return OpSpec(
        op_type=op_type,
        domain=AI_GRAPHCORE,
        version=1,
        min_inputs=lo,
        max_inputs=hi,
        min_outputs=out_lo,
        max_outputs=out_hi,
        attrs=method.attrs,
        takes_args=method.takes_args,
        variable_outputs=out_lo != out_hi,
        returned_outputs=method.returned,
        write_defaults=True,
    )


@functools.lru_cache(maxsize=None)
def graphcore_specs() -> dict[str, OpSpec]:
    """Method name -> OpSpec of every ai.graphcore op class that declares its Builder method
    (``Op.builder_method``; a subclass does not inherit its base's method), plus ``call``."""
    specs = {}
    for domain, op_type, version, cls in all_registered():
        method = cls.__dict__.get("builder_method")
        if domain == AI_GRAPHCORE and version == 1 and method is not None:
            specs[method.name] = _graphcore_spec(op_type, method)
    specs["call"] = _CALL
    return dict(sorted(specs.items()))


# call(args, num_outputs, callee): the callee's inputs take ``args`` in order.
_CALL = OpSpec(
    "Call", AI_GRAPHCORE, 1, 0, 1 << 30, 1, 1 << 30,
    attrs=(AttrSpec("callee", AttributeProto.GRAPH, REQUIRED),),
    variable_outputs=True, write_defaults=True,
)


# --- call binding ----------------------------------------------------------------------------


@dataclass
class BoundCall:
    """A validated op-method call."""

    inputs: list[str]
    num_outputs: int
    attributes: list[AttributeProto] = field(default_factory=list)
    debug_context: str = ""


# Split-18 has a ``num_outputs`` attribute: the method's own ``num_outputs`` parameter fills it
# when no optional input (the ``split`` sizes) fixes the output sizes already.
NUM_OUTPUTS = "num_outputs"


def _params(spec: OpSpec) -> list[tuple[str, Any]]:
    """(parameter name, default) in positional order, excluding debugContext."""
    params: list[tuple[str, Any]] = []
    if spec.takes_args:
        params.append(("args", REQUIRED))
    if spec.variable_outputs:
        params.append((NUM_OUTPUTS, REQUIRED))
    first = _FIRST_ATTRIBUTES.get(spec.op_type, ())
    attrs = [a for a in spec.attrs if not (spec.variable_outputs and a.name == NUM_OUTPUTS)]
    for attr in attrs[: len(first)]:
        params.append((attr.param_name, attr.default))
    params.extend(spec.extra_params)
    for attr in attrs[len(first):]:
        params.append((attr.param_name, attr.default))
    return params


def bind_call(spec: OpSpec, where: str, args: tuple, kwargs: dict) -> BoundCall:
    """Check a call against the op's spec and build its attributes."""
    if spec.unsupported:
        raise popart_exception(f"{where}: {spec.unsupported}")
    params = _params(spec)
    names = [n for n, _ in params]
    accepted = names + ["debugContext"]
    if len(args) > len(accepted):
        raise popart_exception(
            f"{where}: takes at most {len(accepted)} positional arguments ({', '.join(accepted)}), "
            f"got {len(args)}."
        )
    values = dict(zip(accepted, args))
    for key, value in kwargs.items():
        if key in ("debugPrefix", "debugName"):  # PopART's older spellings
            key = "debugContext"
        elif key.endswith("_") and keyword.iskeyword(key[:-1]):
            key = key[:-1]  # ``lambda_=`` for an attribute named after a Python keyword
        if key not in accepted:
            attr_names = [a.param_name for a in spec.attrs]
            raise popart_exception(
                f"{where}: unknown argument '{key}'. {spec.op_type} (domain {spec.domain}, "
                f"opset {spec.version}) accepts attributes {attr_names or 'none'}"
                f"{' and num_outputs' if spec.variable_outputs else ''}."
            )
        if key in values:
            raise popart_exception(f"{where}: argument '{key}' given twice.")
        values[key] = value

    for name, default in params:
        if default is REQUIRED and name not in values:
            what = {"args": "the input ids", "num_outputs": (
                f"num_outputs ({spec.min_outputs}..{spec.max_outputs})")}.get(
                name, f"attribute '{name}'")
            raise popart_exception(f"{where}: {what} must be given ({spec.op_type} requires it).")

    inputs = _check_inputs(spec, where, values.get("args", []))
    num_outputs = spec.max_outputs
    if spec.variable_outputs:
        num_outputs = values["num_outputs"]
        if not _is_int(num_outputs) or not spec.min_outputs <= num_outputs <= spec.max_outputs:
            raise popart_exception(
                f"{where}: num_outputs={num_outputs!r}, but {spec.op_type}-{spec.version} has "
                f"{spec.min_outputs}..{spec.max_outputs} outputs."
            )
    debug_context = values.get("debugContext", "")
    if not isinstance(debug_context, str):
        raise popart_exception(
            f"{where}: debugContext must be a string, not {type(debug_context).__name__}."
        )
    attributes = []
    for attr in spec.attrs:
        if attr.name == NUM_OUTPUTS and spec.variable_outputs:
            if len(inputs) < spec.max_inputs:
                attributes.append(make_attribute(NUM_OUTPUTS, num_outputs, attr.type, where))
            continue
        if attr.param_name not in values:
            if not spec.write_defaults or attr.default is None:
                continue
            value = attr.default
        else:
            value = values[attr.param_name]
        if attr.convert is not None and value is not None:
            value = attr.convert(value)
        if value is None:
            continue
        if not spec.write_defaults and _equals_default(value, attr.default):
            continue
        if attr.default is None and isinstance(value, (list, tuple)) and len(value) == 0:
            continue  # PopART's "[]" means "not set" for list attributes without a default
        attributes.append(make_attribute(attr.name, value, attr.type, where))
    return BoundCall(inputs, int(num_outputs), attributes, debug_context)


def _equals_default(value, default) -> bool:
    if default is None or default is REQUIRED:
        return False
    if isinstance(default, np.ndarray) or isinstance(value, np.ndarray):
        return False
    if isinstance(value, enum.Enum):
        return False
    if isinstance(default, list):
        return isinstance(value, (list, tuple)) and list(value) == default
    return type(value) in (int, float, str, bool) and value == default


def _check_inputs(spec: OpSpec, where: str, args) -> list[str]:
    if isinstance(args, str) or not isinstance(args, (list, tuple)):
        raise popart_exception(
            f"{where}: args must be a list of tensor ids, got {type(args).__name__} {args!r}."
        )
    if not all(isinstance(a, str) for a in args):
        raise popart_exception(f"{where}: every input id must be a string, got {list(args)!r}.")
    if not spec.min_inputs <= len(args) <= spec.max_inputs:
        expected = (
            str(spec.min_inputs)
            if spec.min_inputs == spec.max_inputs
            else f"{spec.min_inputs}..{'any' if spec.max_inputs > 1 << 20 else spec.max_inputs}"
        )
        raise popart_exception(
            f"{where}: {spec.op_type}-{spec.version} takes {expected} inputs, got {len(args)} "
            f"({list(args)})."
        )
    return list(args)


def write_call(builder: NodeWriter, spec: OpSpec, call: BoundCall) -> list[str]:
    """Write the node of a validated op-method call; returns its output ids."""
    builder._check_known(call.inputs, f"{spec.domain} {spec.op_type}")
    builder._fix_opset(spec.domain, spec.version)
    return builder._add_node(
        spec.op_type, spec.domain, call.inputs, call.num_outputs, call.attributes,
        call.debug_context,
    )


def make_method(method_name: str, spec: OpSpec):
    """The opset-object method for ``spec``, with a real signature for help() and IDEs."""

    def method(self: Opset, *args, **kwargs):
        where = f"{self.name}.{method_name}"
        call = bind_call(spec, where, args, kwargs)
        outputs = write_call(self.builder, spec, call)
        if spec.variable_outputs:
            return outputs
        if spec.returned_outputs is not None:
            outputs = outputs[: spec.returned_outputs]
        if spec.fixed_outputs == 0:
            return None
        return outputs[0] if len(outputs) == 1 else outputs

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if not spec.unsupported:
        for name, default in _params(spec):
            parameters.append(inspect.Parameter(
                name + "_" if keyword.iskeyword(name) else name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=inspect.Parameter.empty if default is REQUIRED else default,
            ))
        parameters.append(inspect.Parameter(
            "debugContext", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=""))
    method.__signature__ = inspect.Signature(parameters)
    method.__name__ = method_name
    method.__qualname__ = method_name
    method.__doc__ = (
        spec.unsupported
        or f"Add an {spec.domain} {spec.op_type} node (opset {spec.version}); returns "
        f"{'a list of ids' if spec.variable_outputs or spec.fixed_outputs > 1 else 'its id'}."
    )
    return method


# --- opset objects ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def opset_class(domain: str, version: int, name: str) -> type[Opset]:
    """The generated class holding one method per op of ``domain`` at ``version``."""
    specs = graphcore_specs() if domain == AI_GRAPHCORE else onnx_specs(domain, version)
    namespace = {
        method_name: make_method(method_name, spec) for method_name, spec in specs.items()
    }
    if domain == AI_GRAPHCORE:
        namespace.update(GRAPHCORE_METHODS)
    namespace.update(domain=domain, version=version, name=name, op_specs=specs)
    class_name = name[0].upper() + name[1:]
    return type(class_name, (Opset,), namespace)
