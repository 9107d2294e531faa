"""``Patterns`` and ``PatternsLevel`` (spec §2.1, §2.2, F8): which IR patterns are enabled.
Patterns never change results, only IR dumps and estimates."""

from __future__ import annotations

import enum

from ..errors import popart_exception
from .typed import _checked

__all__ = ["Patterns", "PatternsLevel"]

# ----------------------------------------------------------------------------------------------
# Patterns (F8)
# ----------------------------------------------------------------------------------------------


class PatternsLevel(enum.Enum):
    NoPatterns = 0
    Minimal = 1
    Default = 2
    All = 3


# Pattern name -> lowest level that enables it. Patterns never change results (spec §2.2), only
# IR dumps and estimates. Which 2.3 patterns were "mandatory" (Minimal) is not recorded in the
# spec; the MatMul rewrites are the ones 2.3 lowering needed, so they are Minimal here.
PATTERN_LEVELS: dict[str, PatternsLevel] = {
    "PreUniRepl": PatternsLevel.Default,
    "PostNRepl": PatternsLevel.Default,
    "SoftMaxGradDirect": PatternsLevel.Default,
    "NlllWithSoftMaxGradDirect": PatternsLevel.Default,
    "OpToIdentity": PatternsLevel.Default,
    "SubtractArg1GradOp": PatternsLevel.Default,
    "MulArgGradOp": PatternsLevel.Default,
    "MatMulOp": PatternsLevel.Minimal,
    "MatMulLhsGradOp": PatternsLevel.Minimal,
    "MatMulRhsGradOp": PatternsLevel.Minimal,
    "InPlace": PatternsLevel.Default,
}


def register_pattern(name: str, level: PatternsLevel = PatternsLevel.Default) -> None:
    """Make a pattern name known; Patterns built afterwards include it (spec §2.1)."""
    if name in PATTERN_LEVELS:
        raise popart_exception(f"Pattern '{name}' is already registered.")
    PATTERN_LEVELS[name] = level


class Patterns:
    """The enabled IR patterns: ``Patterns()``, ``Patterns(level)``, ``Patterns([names])``."""

    def __init__(self, arg: PatternsLevel | list[str] | tuple[str, ...] = PatternsLevel.Default):
        if isinstance(arg, PatternsLevel):
            self._enabled = {
                name: arg != PatternsLevel.NoPatterns and level.value <= arg.value
                for name, level in PATTERN_LEVELS.items()
            }
        elif isinstance(arg, (list, tuple)):
            self._enabled = dict.fromkeys(PATTERN_LEVELS, False)
            for name in arg:
                self.enablePattern(name, True)
        else:
            raise popart_exception(
                f"Patterns expects a PatternsLevel or a list of pattern names, got {arg!r}."
            )
        self.runtimeAssertsOn = True

    def _known(self, name: str) -> str:
        if name not in self._enabled:
            raise popart_exception(
                f"Unknown pattern '{name}'. Known patterns: {', '.join(sorted(self._enabled))}."
            )
        return name

    def isPatternEnabled(self, name: str) -> bool:  # noqa: N802
        return self._enabled[self._known(name)]

    def enablePattern(self, name: str, enabled: bool) -> Patterns:  # noqa: N802
        self._enabled[self._known(name)] = _checked(enabled, bool, f"Patterns '{name}'")
        return self

    def enableRuntimeAsserts(self, enabled: bool) -> Patterns:  # noqa: N802
        self.runtimeAssertsOn = _checked(enabled, bool, "Patterns.enableRuntimeAsserts")
        return self

    def enabledPatterns(self) -> list[str]:  # noqa: N802
        return [name for name, on in self._enabled.items() if on]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Patterns) and self._enabled == other._enabled

    def __repr__(self) -> str:
        return f"Patterns({self.enabledPatterns()})"


def _pattern_property(name: str) -> property:
    return property(
        lambda self: self.isPatternEnabled(name),
        lambda self, on: self.enablePattern(name, on),
        doc=f"Whether the {name} pattern is enabled.",
    )


for _name in (
    "PreUniRepl",
    "PostNRepl",
    "SoftMaxGradDirect",
    "NlllWithSoftMaxGradDirect",
    "OpToIdentity",
    "SubtractArg1GradOp",
    "MulArgGradOp",
    "MatMulOp",
    "MatMulLhsGradOp",
    "MatMulRhsGradOp",
    "InPlace",
):
    setattr(Patterns, _name, _pattern_property(_name))
del _name
