"""``Patterns`` and ``PatternsLevel``: which IR patterns are enabled.

Every name PopART's ``Patterns`` accepts is accepted here, at the level PopART enables it:
``Minimal`` holds the mandatory patterns (InPlace off), ``Default`` the patterns on by default
plus InPlace, ``All`` every pattern plus InPlace; ``UpdateInplacePrioritiesForIpu`` is on only
when named. A session refuses a set that disables a mandatory pattern unless
``enableRuntimeAsserts(False)`` was called, as PopART does.

The session hands the set to the Ir (``Ir.patterns``); passes read it there. In our design a
pattern either has an effect (``PATTERN_EFFECTS``: an IR rewrite of
``transforms/apply_patterns.py``, or the in-place pass) or is neutral (``NEUTRAL_PATTERNS``, with
the reason: mostly gradient decompositions, which our autodiff does not need). docs/patterns.md
has the table.
"""

from __future__ import annotations

import difflib
import enum
import logging

from ..errors import popart_exception
from .typed import _checked

__all__ = ["Patterns", "PatternsLevel"]  # excluded_pattern_names: the importer's

_log = logging.getLogger("popart:pattern")


class PatternsLevel(enum.Enum):
    NoPatterns = 0
    Minimal = 1
    Default = 2
    All = 3


_MIN, _DEF, _ALL = PatternsLevel.Minimal, PatternsLevel.Default, PatternsLevel.All

# Pattern name -> lowest level that enables it. Minimal = mandatory, All = off by default.
PATTERN_LEVELS: dict[str, PatternsLevel] = {
    "AbsGradOp": _MIN,
    "AllReduceToIdentity": _MIN,
    "Atan2Arg0GradOp": _MIN,
    "Atan2Arg1GradOp": _MIN,
    "ConvDataGrad": _MIN,
    "ConvFlipWeightsDoubleFlip": _DEF,
    "ConvFlipWeightsGradOp": _MIN,
    "ConvTranspose": _MIN,
    "CosGradOp": _MIN,
    "CoshOp": _MIN,
    "DecomposeBinaryConstScalar": _DEF,
    "DivArg0GradOp": _MIN,
    "DivArg1GradOp": _MIN,
    "ExpandCast": _DEF,
    "ExpGradOp": _MIN,
    "Expm1GradOp": _MIN,
    "FmodArg0GradOp": _MIN,
    "InitAccumulate": _DEF,
    "LambSerialisedWeight": _DEF,
    "Log1pGradOp": _MIN,
    "LogGradOp": _MIN,
    "LoopScanOut": _MIN,
    "LSTMOp": _ALL,
    "MatMulLhsGradOp": _MIN,
    "MatMulOp": _MIN,
    "MatMulRhsGradOp": _MIN,
    "MulArgGradOp": _MIN,
    "NegativeOneScale": _DEF,
    "NlllWithSoftmaxGradDirect": _DEF,
    "OpToIdentity": _DEF,
    "PackedDataBlock": _DEF,
    "PadSum": _DEF,
    "PostNRepl": _DEF,
    "PowArg0GradOp": _MIN,
    "PowArg1GradOp": _MIN,
    "PreUniRepl": _DEF,
    "RandomNormalLikeOpPattern": _MIN,
    "RandomUniformLikeOpPattern": _MIN,
    "ReciprocalGradOp": _MIN,
    "RemoveUnnecessaryLossGradCast": _DEF,
    "ScanToLoop": _MIN,
    "SinGradOp": _MIN,
    "Slice2SliceSubsample": _ALL,
    "SoftmaxGradDirect": _DEF,
    "SplitGather": _ALL,
    "SplitGradOpToConcat": _DEF,
    "SplitOp": _DEF,
    "SqrtGradOp": _MIN,
    "SubtractArg1GradOp": _MIN,
    "SumToAdd": _DEF,
    "TiedGather": _ALL,
    "TiedGatherAccumulate": _ALL,
    "TransposeToIdentityOrReshapePattern": _DEF,
    "UpsampleToResize": _DEF,
    "ZerosLikeOpPattern": _MIN,
    # Not pre-alias patterns: in-placing (off in Minimal) and the IPU priorities of in-place
    # Add variants (on only when named).
    "InPlace": _DEF,
    "UpdateInplacePrioritiesForIpu": _ALL,
}

# Names that no level enables: only Patterns([...]) or enablePattern turn them on.
NAMED_ONLY = frozenset({"UpdateInplacePrioritiesForIpu"})

# Other spellings accepted for a name (the 2.3 property names use "SoftMax").
ALIASES = {
    "SoftMaxGradDirect": "SoftmaxGradDirect",
    "NlllWithSoftMaxGradDirect": "NlllWithSoftmaxGradDirect",
}

# What toggling a pattern changes in our model (read by transforms/apply_patterns.py and
# transforms/inplace.py through Ir.patterns).
PATTERN_EFFECTS: dict[str, str] = {
    "InPlace": "ops offering in-place variants (custom ops) overwrite their input instead of "
               "allocating an output (memory)",
    "SumToAdd": "a Sum of two inputs becomes an Add (IR)",
    "NegativeOneScale": "Scale(x, -1) becomes Neg(x) (IR)",
    "ExpandCast": "Cast(Expand(x)) becomes Expand(Cast(x)): the cast runs on the small tensor "
                  "(IR, memory, cycles)",
    "TransposeToIdentityOrReshapePattern": "a Transpose that keeps the element order becomes "
                                           "an Identity or a Reshape (IR)",
    "SplitOp": "a Split becomes one Slice per output (IR)",
    "UpsampleToResize": "Upsample becomes the equivalent Resize (IR)",
    "DecomposeBinaryConstScalar": "Mul by a constant float scalar becomes Scale with the "
                                  "scalar as attribute (IR)",
    "Slice2SliceSubsample": "a Slice with steps becomes a unit-step Slice then a Subsample "
                            "(IR)",
}

_GRAD = ("our autodiff builds this gradient directly from the forward op's grad rule, in one "
         "grad kernel with the same formula; there is no grad op to decompose")
_KERNEL = "the op runs as one kernel with the same formula; a decomposition would only rename ops"
_TILES = ("it changes the tile layout of gathers on the IPU; our memory model counts bytes per "
          "IPU, not per tile")
_IDENTITY = ("identity-like ops keep their op, whose kernel returns its input without a copy: "
             "same numbers, memory and cycles")

# Why toggling a pattern changes nothing in our model.
NEUTRAL_PATTERNS: dict[str, str] = {
    **dict.fromkeys(
        ["AbsGradOp", "Atan2Arg0GradOp", "Atan2Arg1GradOp", "CosGradOp", "DivArg0GradOp",
         "DivArg1GradOp", "ExpGradOp", "Expm1GradOp", "FmodArg0GradOp", "Log1pGradOp",
         "LogGradOp", "MatMulLhsGradOp", "MatMulRhsGradOp", "MulArgGradOp", "PowArg0GradOp",
         "PowArg1GradOp", "ReciprocalGradOp", "SinGradOp", "SqrtGradOp", "SubtractArg1GradOp",
         "ConvDataGrad", "ConvFlipWeightsGradOp", "SplitGradOpToConcat", "SoftmaxGradDirect",
         "NlllWithSoftmaxGradDirect"], _GRAD),
    **dict.fromkeys(["CoshOp", "ConvTranspose", "LSTMOp", "MatMulOp", "PackedDataBlock",
                     "PadSum", "RandomNormalLikeOpPattern", "RandomUniformLikeOpPattern",
                     "ZerosLikeOpPattern"], _KERNEL),
    **dict.fromkeys(["OpToIdentity", "PreUniRepl", "PostNRepl", "AllReduceToIdentity"],
                    _IDENTITY),
    **dict.fromkeys(["SplitGather", "TiedGather", "TiedGatherAccumulate"], _TILES),
    "ScanToLoop": "Scan and Loop bodies run with the same compile-once plan; no conversion "
                  "is needed",
    "LoopScanOut": "Loop scan outputs are written by the Loop kernel itself",
    "ConvFlipWeightsDoubleFlip": "no ConvFlipWeights ops are created (ConvTranspose and the "
                                 "Conv gradients run as their own kernels)",
    "InitAccumulate": "accumulators start at zero and the first Add of zero is exact",
    "LambSerialisedWeight": "LAMB reduces each weight in one piece (no serialised weights)",
    "RemoveUnnecessaryLossGradCast": "autodiff seeds the loss gradient in the loss's dtype: "
                                     "there is no cast to remove",
    "UpdateInplacePrioritiesForIpu": "it re-ranks in-place variants of Add ops; built-in ops "
                                     "offer no in-place variants here",
}


def register_pattern(name: str, level: PatternsLevel = PatternsLevel.Default) -> None:
    """Make a pattern name known; Patterns built afterwards include it. A pattern
    registered this way has no transform, so it is neutral."""
    if name in PATTERN_LEVELS or name in ALIASES:
        raise popart_exception(f"Pattern '{name}' is already registered.")
    PATTERN_LEVELS[name] = level
    NEUTRAL_PATTERNS[name] = "registered from Python; no pass of ours implements it"


def mandatory_patterns() -> list[str]:
    """The patterns a session needs enabled unless runtime asserts are off (Minimal's set)."""
    return [name for name, level in PATTERN_LEVELS.items()
            if level is PatternsLevel.Minimal and name not in NAMED_ONLY]


class Patterns:
    """The enabled IR patterns: ``Patterns()``, ``Patterns(level)``, ``Patterns([names])``.

    A list enables exactly the names given (NoPatterns plus those). Each name is also a bool
    attribute (``patterns.SumToAdd = False``); ``SoftMaxGradDirect`` and
    ``NlllWithSoftMaxGradDirect`` are accepted spellings of the Softmax names.
    """

    def __init__(self, arg: PatternsLevel | list[str] | tuple[str, ...] = PatternsLevel.Default):
        if isinstance(arg, PatternsLevel):
            self._enabled = {
                name: (arg != PatternsLevel.NoPatterns and name not in NAMED_ONLY
                       and level.value <= arg.value)
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
        if not isinstance(name, str):
            raise popart_exception(f"A pattern name must be a str, got {name!r}.")
        name = ALIASES.get(name, name)
        if name not in self._enabled:
            close = difflib.get_close_matches(name, list(self._enabled) + list(ALIASES), n=1)
            if not close:
                close = [k for k in self._enabled if k.lower() == name.lower()]
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise popart_exception(
                f"Unknown pattern '{name}'.{hint} Known patterns: "
                f"{', '.join(sorted(self._enabled))}."
            )
        return name

    def isPatternEnabled(self, name: str) -> bool:  # noqa: N802
        return self._enabled[self._known(name)]

    def enablePattern(self, name: str, enabled: bool) -> Patterns:  # noqa: N802
        self._enabled[self._known(name)] = _checked(enabled, bool, f"Patterns '{name}'")
        return self

    def enableRuntimeAsserts(self, enabled: bool) -> Patterns:  # noqa: N802
        """Off: a session accepts this set even if it disables a mandatory pattern."""
        self.runtimeAssertsOn = _checked(enabled, bool, "Patterns.enableRuntimeAsserts")
        return self

    def enabledPatterns(self) -> list[str]:  # noqa: N802
        return [name for name, on in self._enabled.items() if on]

    def check_mandatory(self, where: str) -> None:
        """Raise if runtime asserts are on and a mandatory pattern is disabled (as PopART
        does when it prepares the IR)."""
        if not self.runtimeAssertsOn:
            return
        off = [name for name in mandatory_patterns() if not self._enabled.get(name, False)]
        if off:
            raise popart_exception(
                f"{where}: mandatory pattern(s) disabled: {', '.join(off)}. Pattern '{off[0]}' "
                f"must be enabled: start from Patterns(PatternsLevel.Minimal) (or Default) and "
                f"enable the others you want, or call patterns.enableRuntimeAsserts(False) to "
                f"accept the set as it is."
            )

    def differences(self, other: Patterns) -> dict[str, bool]:
        """name -> own state, for every name whose state differs from ``other``'s."""
        return {name: on for name, on in self._enabled.items()
                if other._enabled.get(name) is not on}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Patterns) and self._enabled == other._enabled

    def __repr__(self) -> str:
        return f"Patterns({self.enabledPatterns()})"


def excluded_pattern_names(names, where: str) -> frozenset[str]:
    """The pattern names of a node's ``__exclude_patterns`` annotation (the builder's
    ``excludePatterns``), spelled as ``Patterns`` spells them; raises popart_exception naming
    ``where`` for an unknown name."""
    known = Patterns(PatternsLevel.All)
    out = set()
    for name in names:
        text = name.decode() if isinstance(name, bytes) else name
        try:
            out.add(known._known(text))
        except popart_exception as exc:
            raise popart_exception(f"{where}: excludePatterns: {exc}") from None
    return frozenset(out)


def log_pattern_effects(patterns: Patterns, logged: set[str]) -> None:
    """Say once per process, for the patterns whose state differs from the default set, what
    that changes here: each effect (info), and the neutral ones grouped by why (warning)."""
    neutral: dict[str, list[str]] = {}
    for name, on in patterns.differences(Patterns()).items():
        key = f"pattern:{name}:{on}"
        if key in logged:
            continue
        logged.add(key)
        state = "enabled" if on else "disabled"
        if name in PATTERN_EFFECTS:
            _log.info("Pattern '%s' %s; when enabled, %s.", name, state, PATTERN_EFFECTS[name])
        else:
            reason = NEUTRAL_PATTERNS.get(name, "no pass implements it")
            neutral.setdefault(reason, []).append(f"{name} ({state})")
    for reason, names in neutral.items():
        _log.warning("Patterns %s: no effect in the simulator (same IR, numbers, memory and "
                     "cycles), because %s.", ", ".join(names), reason)


def _pattern_property(name: str) -> property:
    return property(
        lambda self: self.isPatternEnabled(name),
        lambda self, on: self.enablePattern(name, on),
        doc=f"Whether the {name} pattern is enabled.",
    )


for _name in [*PATTERN_LEVELS, *ALIASES]:
    setattr(Patterns, _name, _pattern_property(_name))
del _name
