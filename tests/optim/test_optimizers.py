"""The optimizer classes (spec §4.3, F38, F39): values, defaults, validation, replacement.

The update maths is checked against torch.optim in tests/ops/test_optimizer_updates.py.
"""

from __future__ import annotations

import pytest

import popart_backend as popart
from popart_backend.dtypes import DataType


def test_optimizer_value():
    v = popart.OptimizerValue(0.5, False)
    assert v.val() == 0.5 and not v.isConst()
    assert popart.OptimizerValue(0.5).isConst()
    assert popart.OptimizerValue() == popart.OptimizerValue(0.0, True)


@pytest.mark.parametrize("cls, defaults", [
    (popart.SGD, {"learningRate": 0.1, "weightDecay": 0.0, "momentum": 0.0, "dampening": 0.0,
                  "velocityScaling": 1.0, "nesterov": 0.0}),
    (popart.Adam, {"learningRate": 0.1, "weightDecay": 0.0, "beta1": 0.9, "beta2": 0.999,
                   "eps": 1e-6, "maxWeightNorm": 10.0}),
    (popart.Adaptive, {"learningRate": 0.01, "weightDecay": 0.0, "alpha": 0.99, "momentum": 0.0,
                       "eps": 1e-6}),
])
def test_defaults(cls, defaults):
    """F39: unset keys take spec §4.3's defaults and are const; lossScaling defaults to 1."""
    opt = cls({})
    assert opt.hyper_parameter_values(None) == {**defaults, "lossScaling": 1.0}
    assert all(opt.values_for(None)[k].isConst() for k in defaults)
    assert opt.getLossScalingVal() == 1.0 and opt.loss_scaling_is_const()


def test_value_forms():
    """Tuples, OptimizerValue and plain numbers (const) are accepted; SGD(float) is shorthand."""
    opt = popart.SGD({"defaultLearningRate": (0.2, False),
                      "defaultMomentum": popart.OptimizerValue(0.9, True),
                      "defaultWeightDecay": 0.01, "lossScaling": (8.0, False)})
    assert opt.learningRates().getDefault() == popart.OptimizerValue(0.2, False)
    assert opt.momentums().getDefault() == popart.OptimizerValue(0.9, True)
    assert opt.weightDecays().getDefault() == popart.OptimizerValue(0.01, True)
    assert opt.getLossScalingVal() == 8.0 and not opt.loss_scaling_is_const()
    assert popart.SGD(0.03).learningRates().getDefault() == popart.OptimizerValue(0.03, True)
    with pytest.raises(popart.popart_exception, match="not an OptimizerValue"):
        popart.SGD({"defaultLearningRate": "fast"})


def test_const_sgd():
    opt = popart.ConstSGD(0.05, weight_decay=0.1, loss_scaling=4.0)
    values = opt.hyper_parameter_values(None)
    assert values["learningRate"] == 0.05 and values["weightDecay"] == 0.1
    assert opt.getLossScalingVal() == 4.0
    assert all(v.isConst() for v in opt.values_for(None).values()) and opt.loss_scaling_is_const()


@pytest.mark.parametrize("cls", [popart.SGD, popart.Adam, popart.Adaptive])
def test_unknown_key_lists_valid_keys(cls):
    with pytest.raises(popart.popart_exception,
                       match="unknown key 'defaultLR'.*defaultLearningRate"):
        cls({"defaultLR": (0.1, True)})
    with pytest.raises(popart.popart_exception, match="unknown key 'defaultLearningRate'"):
        cls({}).insertSpecific("w", {"defaultLearningRate": (0.1, True)})
    with pytest.raises(popart.popart_exception, match="lossScaling is global"):
        cls({}).insertSpecific("w", {"lossScaling": (2.0, True)})


@pytest.mark.parametrize("cls, values, match", [
    (popart.SGD, {"defaultLearningRate": (-0.1, True)}, "learningRate must be >= 0"),
    (popart.SGD, {"defaultMomentum": (-1.0, True)}, "momentum must be >= 0"),
    (popart.SGD, {"defaultDampening": (1.5, True)}, "dampening"),
    (popart.SGD, {"defaultVelocityScaling": (0.0, True)}, "velocityScaling"),
    (popart.SGD, {"defaultNesterov": (1, True), "defaultMomentum": (0.9, True),
                  "defaultDampening": (0.1, True)}, "dampening 0"),
    (popart.SGD, {"lossScaling": (0.0, True)}, "lossScaling must be positive"),
    (popart.Adam, {"defaultBeta1": (1.0, True)}, "beta1 must be in"),
    (popart.Adam, {"defaultEps": (-1e-8, True)}, "eps must be >= 0"),
    (popart.Adaptive, {"defaultAlpha": (1.5, True)}, "alpha must be in"),
    (popart.Adaptive, {"defaultWeightDecay": (-0.5, True)}, "weightDecay must be >= 0"),
])
def test_value_validation(cls, values, match):
    with pytest.raises(popart.popart_exception, match=match):
        cls(values)


def test_constructor_argument_types():
    with pytest.raises(popart.popart_exception, match="AdamMode"):
        popart.Adam({}, mode="Lamb")
    with pytest.raises(popart.popart_exception, match="WeightDecayMode"):
        popart.Adaptive({}, weight_decay_mode=1)
    with pytest.raises(popart.popart_exception, match="FLOAT or FLOAT16"):
        popart.Adam({}, accl1_type=DataType.INT32)
    with pytest.raises(popart.popart_exception, match="ClipNormSettings"):
        popart.SGD(0.1, clip_norm_settings=[1.0])
    with pytest.raises(popart.popart_exception, match="maxNorm must be positive"):
        popart.ClipNormSettings(["w"], 0.0)


def test_insert_specific():
    """Per-weight values; unspecified keys take the current defaults."""
    opt = popart.SGD({"defaultLearningRate": (0.1, False), "defaultMomentum": (0.9, True)})
    opt.insertSpecific("w1", {"learningRate": (0.5, True), "weightDecay": 0.01})
    assert opt.hasSpecific("w1") and not opt.hasSpecific("w2")
    w1 = opt.hyper_parameter_values("w1")
    assert w1["learningRate"] == 0.5 and w1["weightDecay"] == 0.01 and w1["momentum"] == 0.9
    assert opt.learningRates().get("w1").isConst()
    assert opt.hyper_parameter_values("w2") == opt.hyper_parameter_values(None)
    with pytest.raises(popart.popart_exception, match="weight 'w3'.*learningRate must be >= 0"):
        opt.insertSpecific("w3", {"learningRate": -1.0})


def test_accumulator_dtype():
    sgd = popart.SGD(0.1, accumType=DataType.FLOAT)
    assert sgd.accumulator_dtype(DataType.FLOAT16) is DataType.FLOAT
    assert popart.Adam({}).accumulator_dtype(DataType.FLOAT16) is DataType.FLOAT16


def test_clip_norm_settings():
    s = popart.ClipNormSettings(["a", "b"], 2.0)
    assert s.getWeightIds() == ["a", "b"] and s.getMaxNorm() == 2.0
    assert popart.ClipNormSettings.clipAllWeights(1.0).all_weights


# --- check_update (updateOptimizerFromHost, F38) ----------------------------------------------


def test_check_update_accepts_non_const_changes():
    old = popart.SGD({"defaultLearningRate": (0.1, False), "lossScaling": (4.0, False)})
    old.insertSpecific("w", {"momentum": (0.5, False)})
    new = popart.SGD({"defaultLearningRate": (0.01, False), "lossScaling": (8.0, False)})
    new.insertSpecific("w", {"momentum": (0.7, False)})
    old.check_update(new)
    popart.ConstSGD(0.1).check_update(popart.ConstSGD(0.1))
    # ConstSGD is an SGD with const values (PopART's subclass): equal values may replace it.
    popart.ConstSGD(0.1).check_update(popart.SGD(0.1))


@pytest.mark.parametrize("old, new, match", [
    (popart.SGD({"defaultLearningRate": (0.1, True)}),
     popart.SGD({"defaultLearningRate": (0.2, True)}), "change a const value"),
    (popart.ConstSGD(0.1), popart.ConstSGD(0.1, loss_scaling=2.0), "const value.*lossScaling"),
    (popart.SGD({"defaultLearningRate": (0.1, False)}),
     popart.SGD({"defaultLearningRate": (0.1, True)}), "const-ness differs"),
    (popart.SGD(0.1), popart.Adam({}), "built with SGD, got Adam"),
    (popart.SGD(0.1), popart.ConstSGD(0.2), "const value: SGD default learningRate"),
    (popart.Adam({}, popart.AdamMode.Adam), popart.Adam({}, popart.AdamMode.Lamb), "mode changed"),
    (popart.SGD(0.1), popart.SGD(0.1, [popart.ClipNormSettings(["w"], 1.0)]),
     "clip_norm_settings changed"),
    (popart.SGD(0.1, accumulatorAndMomentum=popart.SGDAccumulatorAndMomentum.Separate),
     popart.SGD(0.1), "accumulatorAndMomentum changed"),
    (popart.Adaptive({}), popart.Adaptive({}, rmsprop_tf_variant=True),
     "rmsprop_tf_variant changed"),
])
def test_check_update_errors(old, new, match):
    with pytest.raises(popart.popart_exception, match=match):
        old.check_update(new)


def test_check_update_specific_weights_must_match():
    old = popart.Adam({"defaultLearningRate": (0.1, False)})
    old.insertSpecific("w", {"learningRate": (0.2, False)})
    new = popart.Adam({"defaultLearningRate": (0.1, False)})
    with pytest.raises(popart.popart_exception, match="specific values for weights"):
        old.check_update(new)
    new.insertSpecific("w", {"learningRate": (0.3, False), "beta1": (0.5, True)})
    with pytest.raises(popart.popart_exception, match="const value: Adam beta1 of weight 'w'"):
        old.check_update(new)
