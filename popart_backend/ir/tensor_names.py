"""PopART's reserved tensor-id prefixes beyond the basic ones (``popart.reserved*Prefix()``).

The passes name the tensors they create with these prefixes (optimizer state ``Accl1___``,
scaled hyper-parameters ``scaledLearningRate0___default___`` ...); users read them to anchor
or look up such tensors. The values are PopART's strings.
"""

from __future__ import annotations

# PopART's function name (without "reserved" and "Prefix") -> its string
_PREFIXES = {
    "Accl1": "Accl1___",
    "Accl2": "Accl2___",
    "Accl3": "Accl3___",
    "AcclToReduce": "AcclIntoReduce___",
    "AcclToUpdate": "AcclIntoUpdate___",
    "AcclFinalOut": "AcclOutOfAcclUpdate___",
    "FinalReducedGrad": "FinalReducedGradient___",
    "AdamUpdater": "AdamUpdater___",
    "LambR1Sq": "LambR1Sq___",
    "LambR2Sq": "LambR2Sq___",
    "SeedModifier": "randomSeedModifier___",
    "RemoteArg": "RemoteArg___",
    "AutomaticLossScale": "AutomaticLossScaleProxy___",
}
# Optimizer hyper-parameter tensors come in a default and a per-weight (specific) form.
_HYPER = {
    "WeightDecayScaleFactor0": "weightDecayScaleFactor0",
    "ScaledLearningRate0": "scaledLearningRate0",
    "ScaledWeightDecay1": "scaledWeightDecay1",
    "ScaledLearningRate1": "scaledLearningRate1",
    "DampeningScaleFactor1": "dampeningScaleFactor1",
    "ScaledMomentum1": "scaledMomentum1",
    "LearningRate": "learningRate",
    "WeightDecay": "weightDecay",
    "LossScaling": "lossScaling",
    "MaxWeightNorm": "maxWeightNorm",
    "AdamBeta1": "adamBeta1",
    "AdamBeta2": "adamBeta2",
    "AdamEps": "adamEps",
    "Step": "step",
}
for _name, _stem in _HYPER.items():
    _PREFIXES[f"Default{_name}"] = f"{_stem}___default___"
    _PREFIXES[f"Specific{_name}"] = f"{_stem}___specific___"


def _prefix_function(name: str, value: str):
    def prefix() -> str:
        return value

    prefix.__name__ = prefix.__qualname__ = f"reserved{name}Prefix"
    prefix.__doc__ = f"PopART's reserved tensor-id prefix {value!r}."
    return prefix


RESERVED_PREFIX_FUNCTIONS = {
    f"reserved{name}Prefix": _prefix_function(name, value) for name, value in _PREFIXES.items()
}
__all__ = sorted(RESERVED_PREFIX_FUNCTIONS)
globals().update(RESERVED_PREFIX_FUNCTIONS)
