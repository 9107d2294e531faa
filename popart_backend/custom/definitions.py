"""Checks of a custom op against its declarations: ``OpDefinition``
normalisation, attribute regexes, input/output dtypes, and a grad op's wiring tables."""

from __future__ import annotations

import re

from ..dtypes import DataType
from ..errors import popart_exception
from ..supported_ops import OpDefinition
from .api import GradInOutMapper, GradOpInType

# --- OpDefinition -----------------------------------------------------------------------------------


def _data_types(names, where: str) -> tuple[DataType, ...]:
    out = []
    for name in names:
        if isinstance(name, DataType):
            out.append(name)
            continue
        try:
            out.append(DataType[str(name).upper()])
        except KeyError:
            raise popart_exception(
                f"{where}: unknown data type {name!r}; use names like 'FLOAT', 'FLOAT16', "
                f"'INT32'.") from None
    return tuple(out)


def _normalize_definition(opid, definition) -> OpDefinition | None:
    """Accept ``("name", ["FLOAT", ...])`` pairs as well as Input/Output objects."""
    if definition is None:
        return None
    if not isinstance(definition, OpDefinition):
        raise popart_exception(f"register_op({opid}): definition must be a popart.OpDefinition, "
                               f"not {type(definition).__name__}.")
    where = f"OpDefinition of {opid}"

    def slot(entry, kind):
        if isinstance(entry, (OpDefinition.Input, OpDefinition.Output)):
            return entry
        if isinstance(entry, str):
            entry = (entry, ())
        name, dtypes, *rest = entry
        types_ = _data_types(dtypes, where)
        if kind is OpDefinition.Input:
            return OpDefinition.Input(name, types_, bool(rest[0]) if rest else False)
        return OpDefinition.Output(name, types_)

    for regex in definition.attributes.values():
        _compile_regex(regex, where)
    return OpDefinition([slot(e, OpDefinition.Input) for e in definition.inputs],
                        [slot(e, OpDefinition.Output) for e in definition.outputs],
                        dict(definition.attributes))


def _compile_regex(regex: str, where: str) -> re.Pattern:
    # PopART writes "*" for "any value"; it is not a valid regular expression.
    if regex in ("*", ""):
        return re.compile(r"(?s).*")
    try:
        return re.compile(regex)
    except re.error as exc:
        raise popart_exception(f"{where}: attribute regex {regex!r} is invalid: {exc}") from None


def _check_attributes(definition: OpDefinition, values: dict, where: str) -> None:
    unknown = sorted(set(values) - set(definition.attributes))
    if unknown:
        raise popart_exception(
            f"{where}: attribute(s) {unknown} are not in the op's OpDefinition, which allows "
            f"{sorted(definition.attributes) or 'none'}.")
    for name, value in values.items():
        pattern = _compile_regex(definition.attributes[name], where)
        items = value if isinstance(value, (tuple, list)) else (value,)
        for item in items:
            if pattern.fullmatch(str(item)) is None:
                raise popart_exception(
                    f"{where}: attribute '{name}' = {value!r} does not match the OpDefinition's "
                    f"regex {definition.attributes[name]!r}.")


def _check_types(slots, infos, kind: str, where: str) -> None:
    for index, (slot, info) in enumerate(zip(slots, infos)):
        if info is None or not slot.supportedTensors:
            continue
        if info.dtype not in slot.supportedTensors:
            allowed = [t.name for t in slot.supportedTensors]
            raise popart_exception(
                f"{where}: {kind} {index} '{slot.name}' is {info.dtype.name}, but the op's "
                f"OpDefinition allows {allowed}. Cast it, or widen the definition.")


def _check_grad_tables(opid, cls) -> None:
    where = f"register_grad_op({opid}): {cls.__qualname__}"
    try:
        infos = [GradInOutMapper(int(a), int(b), GradOpInType(c))
                 for a, b, c in cls.grad_input_info]
    except (TypeError, ValueError) as exc:
        raise popart_exception(
            f"{where}.grad_input_info must be [(iGrad, iNonGrad, GradOpInType)], got "
            f"{cls.grad_input_info!r} ({exc}).") from None
    if sorted(i.iGrad for i in infos) != list(range(len(infos))):
        raise popart_exception(f"{where}.grad_input_info must cover grad inputs 0..n-1 once "
                               f"each, got {cls.grad_input_info!r}.")
    if not cls.grad_out_to_non_grad_in:
        raise popart_exception(f"{where}.grad_out_to_non_grad_in is empty; map each grad output "
                               f"to the forward input it is the gradient of, e.g. {{0: 0}}.")
