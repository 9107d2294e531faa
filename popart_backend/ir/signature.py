"""The Builder method of an op that ONNX has no schema for (the ai.graphcore ops):
its name, argument counts and attributes, declared on the op class as ``Op.builder_method`` so
that adding such an op touches its class only. ``builder/opsets.py`` turns each declaration into
a ``builder.aiGraphcore.<name>`` method, as it turns the ONNX schemas into ``aiOnnx`` methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from onnx import AttributeProto

# AttributeProto types, short because every declaration names one per attribute.
INT, FLOAT, STRING = AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.STRING
INTS, FLOATS = AttributeProto.INTS, AttributeProto.FLOATS


class _Required:
    def __repr__(self) -> str:
        return "<required>"


REQUIRED = _Required()


@dataclass(frozen=True)
class AttrSpec:
    """One attribute of an op: ONNX name, AttributeProto type and default (or REQUIRED/None)."""

    name: str
    type: int
    default: Any = None  # None: optional without default (left out of the node when unset)
    param: str = ""  # Python parameter name when it differs from the ONNX attribute name
    convert: Callable[[Any], Any] | None = None  # PopART enums etc. -> attribute value

    @property
    def param_name(self) -> str:
        return self.param or self.name

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class BuilderMethod:
    """``builder.aiGraphcore.<name>(args, <attrs with defaults>, debugContext="")``.

    ``inputs`` is the number of ``args`` (or a (min, max) range); ``outputs`` a count, or a
    (min, max) range for ops whose method takes ``num_outputs`` after ``args`` (ai.graphcore
    ``batchnormalization``); the method returns the first ``returned`` of the node's ``outputs``
    ids when set (PopART's ``ctcloss`` returns only the loss); ``takes_args=False`` for ops
    without inputs (``init``).
    """

    name: str
    inputs: int | tuple[int, int]
    outputs: int | tuple[int, int] = 1
    attrs: tuple[AttrSpec, ...] = ()
    returned: int | None = None
    takes_args: bool = True
