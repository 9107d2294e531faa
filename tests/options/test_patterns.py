"""Every PopART pattern name (F8): accepted by each API at PopART's level, with its effect in our
model (IR rewrite, in-place memory) or proven neutral (same results on and off)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import popart_backend as popart
import popart_backend.session as popart_session
from popart_backend.custom.api import _CUSTOM
from popart_backend.custom.api import Op as CustomOp
from popart_backend.custom.registration import register_op
from popart_backend.ops import registry
from popart_backend.options.patterns import NEUTRAL_PATTERNS, PATTERN_EFFECTS

# PopART's list (api/popart_names.md section (d)): name -> default state. "mandatory" patterns
# form Minimal and are on; "off" ones only All (or naming them) enables.
MANDATORY = {
    "AbsGradOp", "AllReduceToIdentity", "Atan2Arg0GradOp", "Atan2Arg1GradOp", "ConvDataGrad",
    "ConvFlipWeightsGradOp", "ConvTranspose", "CosGradOp", "CoshOp", "DivArg0GradOp",
    "DivArg1GradOp", "ExpGradOp", "Expm1GradOp", "FmodArg0GradOp", "Log1pGradOp", "LogGradOp",
    "LoopScanOut", "MatMulLhsGradOp", "MatMulOp", "MatMulRhsGradOp", "MulArgGradOp",
    "PowArg0GradOp", "PowArg1GradOp", "RandomNormalLikeOpPattern", "RandomUniformLikeOpPattern",
    "ReciprocalGradOp", "ScanToLoop", "SinGradOp", "SqrtGradOp", "SubtractArg1GradOp",
    "ZerosLikeOpPattern",
}
ON_NOT_MANDATORY = {
    "ConvFlipWeightsDoubleFlip", "DecomposeBinaryConstScalar", "ExpandCast", "InitAccumulate",
    "LambSerialisedWeight", "NegativeOneScale", "NlllWithSoftmaxGradDirect", "OpToIdentity",
    "PackedDataBlock", "PadSum", "PostNRepl", "PreUniRepl", "RemoveUnnecessaryLossGradCast",
    "SoftmaxGradDirect", "SplitGradOpToConcat", "SplitOp", "SumToAdd",
    "TransposeToIdentityOrReshapePattern", "UpsampleToResize",
}
OFF = {"LSTMOp", "Slice2SliceSubsample", "SplitGather", "TiedGather", "TiedGatherAccumulate"}
SPECIAL = {"InPlace", "UpdateInplacePrioritiesForIpu"}
ALL_NAMES = sorted(MANDATORY | ON_NOT_MANDATORY | OFF | SPECIAL)


def test_F8_the_list_has_57_names_each_effect_or_neutral():
    assert len(MANDATORY) == 31 and len(MANDATORY | ON_NOT_MANDATORY | OFF) == 55
    assert len(ALL_NAMES) == 57
    assert set(PATTERN_EFFECTS) | set(NEUTRAL_PATTERNS) == set(ALL_NAMES)
    assert not set(PATTERN_EFFECTS) & set(NEUTRAL_PATTERNS)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_F8_every_name_accepted_by_every_api(name):
    listed = popart.Patterns([name])
    assert listed.isPatternEnabled(name) and listed.enabledPatterns() == [name]
    patterns = popart.Patterns(popart.PatternsLevel.NoPatterns)
    assert patterns.enablePattern(name, True) is patterns
    assert patterns.isPatternEnabled(name) and getattr(patterns, name)
    setattr(patterns, name, False)
    assert not patterns.isPatternEnabled(name)
    assert popart.Patterns(popart.PatternsLevel.All).enablePattern(name, False).enabledPatterns()


def _enabled(level):
    return set(popart.Patterns(level).enabledPatterns())


def test_F8_levels_follow_popart():
    assert _enabled(popart.PatternsLevel.NoPatterns) == set()
    assert _enabled(popart.PatternsLevel.Minimal) == MANDATORY
    assert _enabled(popart.PatternsLevel.Default) == MANDATORY | ON_NOT_MANDATORY | {"InPlace"}
    assert _enabled(popart.PatternsLevel.All) == MANDATORY | ON_NOT_MANDATORY | OFF | {"InPlace"}
    assert popart.Patterns() == popart.Patterns(popart.PatternsLevel.Default)
    # UpdateInplacePrioritiesForIpu: on only when named
    assert popart.Patterns(["UpdateInplacePrioritiesForIpu"]).UpdateInplacePrioritiesForIpu


def test_F8_softmax_spellings_are_one_pattern():
    patterns = popart.Patterns()
    patterns.SoftMaxGradDirect = False
    assert not patterns.isPatternEnabled("SoftmaxGradDirect")
    patterns.enablePattern("NlllWithSoftMaxGradDirect", False)
    assert not patterns.NlllWithSoftmaxGradDirect


def test_F8_unknown_names_raise():
    with pytest.raises(popart.popart_exception, match="Unknown pattern 'Inplace'. Did you mean "
                                                      "'InPlace'"):
        popart.Patterns(["Inplace"])
    with pytest.raises(popart.popart_exception, match="Unknown pattern 'NoSuchThing'"):
        popart.Patterns().enablePattern("NoSuchThing", True)
    with pytest.raises(popart.popart_exception, match="Unknown pattern"):
        popart.Patterns().isPatternEnabled("SumToAddd")
    with pytest.raises(popart.popart_exception, match="bool"):
        popart.Patterns().enablePattern("SumToAdd", 1)


# --- sessions ----------------------------------------------------------------------------------


def _infer(builder, outputs, feeds, patterns):
    session = popart.InferenceSession(
        builder.getModelProto(),
        popart.DataFlow(1, {o: popart.AnchorReturnType("All") for o in outputs}),
        popart.DeviceManager().createIpuModelDevice({}), patterns=patterns)
    session.prepareDevice()
    arrays = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, arrays))
    return session, arrays


def _op_types(session) -> list[str]:
    return sorted(op.op_type for op in session._ir.main.ops.values())


def _tiny_sum():
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    y = builder.aiOnnx.sum([x, x])
    builder.addOutputTensor(y)
    return builder, x, y


def test_F8_disabling_a_mandatory_pattern_needs_runtime_asserts_off():
    builder, x, y = _tiny_sum()
    patterns = popart.Patterns(["SumToAdd"])
    with pytest.raises(popart.popart_exception, match="Pattern 'AbsGradOp' must be enabled"):
        _infer(builder, [y], {x: np.ones((2, 3), np.float32)}, patterns)
    patterns.enableRuntimeAsserts(False)
    session, out = _infer(builder, [y], {x: np.ones((2, 3), np.float32)}, patterns)
    np.testing.assert_array_equal(out[y], 2 * np.ones((2, 3), np.float32))
    assert _op_types(session) == ["Add"]


def test_F8_session_logs_what_a_changed_pattern_does(caplog, monkeypatch):
    monkeypatch.setattr(popart_session, "_LOGGED", set())  # logged once per process
    builder, x, y = _tiny_sum()
    patterns = popart.Patterns().enablePattern("SumToAdd", False).enablePattern("SinGradOp",
                                                                                False)
    patterns.enableRuntimeAsserts(False)
    with caplog.at_level(logging.INFO, logger="popart:pattern"):
        _infer(builder, [y], {x: np.ones((2, 3), np.float32)}, patterns)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "Pattern 'SumToAdd' disabled; when enabled, a Sum of two inputs becomes an Add" in text
    assert "SinGradOp (disabled): no effect in the simulator" in text


# --- patterns with an effect: op types change, numbers match the reference -----------------------

_RNG = np.random.default_rng(0)


def _model_sum(b):
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    return x, b.aiOnnx.sum([x, b.aiOnnx.abs([x])]), lambda v: v + np.abs(v), (2, 3)


def _model_neg_scale(b):
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    return x, b.aiGraphcore.scale([x], -1.0), lambda v: -v, (2, 3)


def _model_expand_cast(b):
    x = b.addInputTensor(popart.TensorInfo("FLOAT16", [1, 3]), "x")
    shape = b.aiOnnx.constant(np.array([64, 3], np.int64))
    y = b.aiOnnx.cast([b.aiOnnx.expand([x, shape])], "FLOAT")
    return x, y, lambda v: np.broadcast_to(v.astype(np.float32), (64, 3)), (1, 3)


def _model_transpose(b):
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 1, 3]), "x")
    return x, b.aiOnnx.transpose([x], perm=[1, 0, 2]), lambda v: v.transpose(1, 0, 2), (4, 1, 3)


def _model_split(b):
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [5, 2]), "x")
    p, q = b.aiOnnx.split([x], 2, axis=0, split=[2, 3])
    return x, b.aiOnnx.concat([q, p], axis=0), lambda v: np.concatenate([v[2:], v[:2]]), (5, 2)


def _model_upsample(b):
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [1, 1, 2, 3]), "x")
    scales = b.aiOnnx.constant(np.array([1, 1, 2, 2], np.float32))
    y = b.aiOnnx.upsample([x, scales], mode="nearest")
    return x, y, lambda v: v.repeat(2, axis=2).repeat(2, axis=3), (1, 1, 2, 3)


def _model_mul_scalar(b):
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    y = b.aiOnnx.mul([x, b.aiOnnx.constant(np.array(0.75, np.float32))])
    return x, y, lambda v: v * np.float32(0.75), (2, 3)


def _model_strided_slice(b):
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [7, 4]), "x")
    consts = [b.aiOnnx.constant(np.array(v, np.int64)) for v in ([1], [7], [0], [3])]
    return x, b.aiOnnx.slice([x, *consts]), lambda v: v[1:7:3], (7, 4)


# name -> (model, op types with the pattern on, op types with it off)
EFFECT_MODELS = {
    "SumToAdd": (_model_sum, ["Abs", "Add"], ["Abs", "Sum"]),
    "NegativeOneScale": (_model_neg_scale, ["Neg"], ["Scale"]),
    "ExpandCast": (_model_expand_cast, ["Cast", "Expand"], ["Cast", "Expand"]),
    "TransposeToIdentityOrReshapePattern": (_model_transpose, ["Reshape"], ["Transpose"]),
    "SplitOp": (_model_split, ["Concat", "Slice", "Slice"], ["Concat", "Split"]),
    "UpsampleToResize": (_model_upsample, ["Resize"], ["Upsample"]),
    "DecomposeBinaryConstScalar": (_model_mul_scalar, ["Scale"], ["Mul"]),
    "Slice2SliceSubsample": (_model_strided_slice, ["Slice", "Subsample"], ["Slice"]),
}


def test_F8_every_ir_rewrite_pattern_has_a_model():
    assert set(EFFECT_MODELS) == set(PATTERN_EFFECTS) - {"InPlace"}


@pytest.mark.parametrize("name", sorted(EFFECT_MODELS))
def test_F8_pattern_rewrites_ir_with_same_numbers(name):
    build, on_types, off_types = EFFECT_MODELS[name]
    opset = 9 if name == "UpsampleToResize" else 10  # Upsample is deprecated in opset 10
    builder = popart.Builder(opsets={"ai.onnx": opset, "ai.graphcore": 1})
    x, y, reference, shape = build(builder)
    builder.addOutputTensor(y)
    dtype = np.float16 if name == "ExpandCast" else np.float32
    data = _RNG.standard_normal(shape).astype(dtype)
    results = {}
    for on in (True, False):
        patterns = popart.Patterns(popart.PatternsLevel.All).enablePattern(name, on)
        session, out = _infer(builder, [y], {x: data}, patterns)
        assert _op_types(session) == (on_types if on else off_types), on
        np.testing.assert_allclose(out[y], reference(data), rtol=1e-6, atol=1e-6)
        results[on] = session
    if name == "ExpandCast":  # the cast reads the small tensor, not the expanded one
        cast_inputs = {on: [op.inputs[0].info.shape for op in s._ir.main.ops.values()
                            if op.op_type == "Cast"] for on, s in results.items()}
        assert cast_inputs == {True: [(1, 3)], False: [(64, 3)]}


def test_F8_rewrites_in_training_match_torch():
    """SumToAdd, DecomposeBinaryConstScalar and TransposeToIdentityOrReshapePattern ahead of
    autodiff: the weight update equals torch's, with the patterns on and off."""
    w0 = _RNG.standard_normal((2, 3)).astype(np.float32)
    xv = _RNG.standard_normal((2, 3)).astype(np.float32)
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    w = builder.addInitializedInputTensor(w0, "w")
    m = builder.aiOnnx.mul([builder.aiOnnx.sum([x, w]),
                            builder.aiOnnx.constant(np.array(0.5, np.float32))])
    t = builder.aiOnnx.transpose([builder.aiOnnx.unsqueeze([m], axes=[0])], perm=[1, 0, 2])
    loss = builder.aiOnnx.reducesum([builder.aiOnnx.mul([t, t])], keepdims=0)
    builder.addOutputTensor(loss)
    wt = torch.tensor(w0, requires_grad=True)
    (((torch.tensor(xv) + wt) * 0.5) ** 2).sum().backward()
    expected = w0 - 0.1 * wt.grad.numpy()
    types = {}
    for on in (True, False):
        patterns = popart.Patterns()
        for name in ("SumToAdd", "DecomposeBinaryConstScalar",
                     "TransposeToIdentityOrReshapePattern"):
            patterns.enablePattern(name, on)
        updated, types[on] = _train(builder, x, xv, loss, "w", patterns)
        np.testing.assert_allclose(updated, expected, rtol=1e-5, atol=1e-6)
    assert {"Add", "Scale"} <= set(types[True]) and "Transpose" not in types[True]
    assert {"Sum", "Transpose"} <= set(types[False])
    assert not {"Add", "Scale"} & set(types[False])


def _train(builder, x, xv, loss, weight, patterns, optimizer=None):
    session = popart.TrainingSession(
        builder.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}),
        loss, optimizer or popart.ConstSGD(0.1), popart.DeviceManager().createIpuModelDevice({}),
        patterns=patterns)
    session.prepareDevice()
    session.weightsFromHost()
    arrays = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: xv}, arrays))
    session.weightsToHost()
    out = np.empty_like(session._host_weights[weight])
    session.readWeights(popart.PyWeightsIO({weight: out}))
    return out, _op_types(session)


# --- InPlace: in-place variants of (custom) ops, memory ------------------------------------------


@pytest.fixture
def scale_pair():
    """A custom op with an in-place variant; the registries are restored afterwards."""
    saved = {key: dict(table) for key, table in registry._REGISTRY.items()}
    saved_custom = dict(_CUSTOM)

    @register_op(popart.OperatorIdentifier("test.patterns", "TimesInplace", 1))
    class TimesInplace(_Times):
        modifies_inputs = (0,)

        def compute(self, ctx, x):
            x *= np.float32(self.attrs["factor"])
            return x

    @register_op(popart.OperatorIdentifier("test.patterns", "Times", 1))
    class Times(_Times):
        def compute(self, ctx, x):
            return x * np.float32(self.attrs["factor"])

        def inplace_variants(self):
            return [(popart.OperatorIdentifier("test.patterns", "TimesInplace", 1), 10.0)]

    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    _CUSTOM.clear()
    _CUSTOM.update(saved_custom)


class _Times(CustomOp):
    def __init__(self, opid, attributes, settings):
        super().__init__(opid, settings)
        self.attrs = dict(attributes)

    def setup(self, in_infos):
        return [in_infos[0]]


def test_F8_inplace_pattern_saves_activation_memory(scale_pair):
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [256]), "x")
    e = builder.aiOnnx.exp([x])
    t = e
    for factor in (2.0, 3.0):
        (t,) = builder.customOp("Times", 1, "test.patterns", [t], {"factor": factor})
    data = _RNG.standard_normal(256).astype(np.float32)
    activations = {}
    for on in (True, False):
        # e is anchored, so it lives on: three f32[256] buffers at once unless in place
        session, out = _infer(builder, [t, e], {x: data},
                              popart.Patterns().enablePattern("InPlace", on))
        np.testing.assert_allclose(out[t], np.exp(data) * 6, rtol=1e-6)
        kinds = [op.op_type for op in session._ir.main.topo_order()]
        # The second Times overwrites the first's (fresh, unobserved) output.
        assert kinds == (["Exp", "Times", "TimesInplace"] if on else ["Exp", "Times", "Times"])
        activations[on] = session._device_model.memory.ipu(0).categories["activations"]
    assert activations[False] - activations[True] == 256 * 4  # one f32[256] buffer fewer


# --- neutral patterns: identical results on and off ----------------------------------------------


def _unary(op):
    return lambda b, x, w: getattr(b.aiOnnx, op)([b.aiOnnx.add([x, w])])


def _binary(op, aig=False):
    return lambda b, x, w: getattr(b.aiGraphcore if aig else b.aiOnnx, op)([x, w])


def _conv(b, x, w):
    return b.aiOnnx.conv([b.aiOnnx.reshape([b.aiOnnx.add([x, w]), _shape(b, [1, 1, 2, 3])]),
                          b.aiOnnx.constant(np.full((2, 1, 2, 2), 0.5, np.float32))])


def _conv_transpose(b, x, w):
    image = b.aiOnnx.reshape([b.aiOnnx.add([x, w]), _shape(b, [1, 1, 2, 3])])
    return b.aiOnnx.convtranspose([image, b.aiOnnx.constant(np.full((1, 2, 2, 2), 0.5,
                                                                    np.float32))])


def _shape(b, dims):
    return b.aiOnnx.constant(np.array(dims, np.int64))


def _split_concat(b, x, w):
    p, q = b.aiOnnx.split([b.aiOnnx.mul([x, w])], 2, axis=1, split=[1, 2])
    return b.aiOnnx.concat([b.aiOnnx.exp([p]), q], axis=1)


def _softmax_nll(b, x, w):
    probs = b.aiOnnx.softmax([b.aiOnnx.mul([x, w])], axis=1)
    return b.aiGraphcore.nllloss([probs, b.aiOnnx.constant(np.array([0, 2], np.int32))])


def _pad_sum(b, x, w):
    left = b.aiOnnx.pad([x], pads=[0, 0, 0, 1])
    right = b.aiOnnx.pad([w], pads=[0, 1, 0, 0])
    return b.aiOnnx.sum([left, right])


def _gather(b, x, w):
    return b.aiOnnx.gather([b.aiOnnx.mul([x, w]), b.aiOnnx.constant(np.array([1, 0], np.int32))])


def _random_like(op):
    return lambda b, x, w: b.aiOnnx.add([b.aiOnnx.mul([x, w]), getattr(b.aiOnnx, op)([x])])


# neutral name -> f(builder, x, w) using the op the pattern is about (x, w: f32[2,3] in [0.5, 1.5])
NEUTRAL_MODELS = {
    "AbsGradOp": _unary("abs"), "CosGradOp": _unary("cos"), "CoshOp": _unary("cosh"),
    "ExpGradOp": _unary("exp"), "LogGradOp": _unary("log"), "SinGradOp": _unary("sin"),
    "SqrtGradOp": _unary("sqrt"), "ReciprocalGradOp": _unary("reciprocal"),
    "Expm1GradOp": lambda b, x, w: b.aiGraphcore.expm1([b.aiOnnx.mul([x, w])]),
    "Log1pGradOp": lambda b, x, w: b.aiGraphcore.log1p([b.aiOnnx.mul([x, w])]),
    "Atan2Arg0GradOp": _binary("atan2", aig=True), "Atan2Arg1GradOp": _binary("atan2", True),
    "FmodArg0GradOp": _binary("fmod", aig=True),
    "DivArg0GradOp": _binary("div"), "DivArg1GradOp": _binary("div"),
    "PowArg0GradOp": _binary("pow"), "PowArg1GradOp": _binary("pow"),
    "MulArgGradOp": _binary("mul"), "SubtractArg1GradOp": _binary("sub"),
    "MatMulOp": lambda b, x, w: b.aiOnnx.matmul([x, b.aiOnnx.transpose([w], perm=[1, 0])]),
    "ConvDataGrad": _conv, "ConvFlipWeightsGradOp": _conv, "ConvFlipWeightsDoubleFlip": _conv,
    "ConvTranspose": _conv_transpose, "SplitGradOpToConcat": _split_concat,
    "SoftmaxGradDirect": _softmax_nll, "NlllWithSoftmaxGradDirect": _softmax_nll,
    "PadSum": _pad_sum, "SplitGather": _gather, "TiedGather": _gather,
    "TiedGatherAccumulate": _gather,
    "OpToIdentity": lambda b, x, w: b.aiOnnx.identity([b.aiOnnx.mul([x, w])]),
    "RandomNormalLikeOpPattern": _random_like("randomnormallike"),
    "RandomUniformLikeOpPattern": _random_like("randomuniformlike"),
}
NEUTRAL_MODELS["MatMulLhsGradOp"] = NEUTRAL_MODELS["MatMulRhsGradOp"] = NEUTRAL_MODELS["MatMulOp"]
NEUTRAL_MODELS["PreUniRepl"] = NEUTRAL_MODELS["PostNRepl"] = NEUTRAL_MODELS["OpToIdentity"]


def _default_model(b, x, w):
    return b.aiOnnx.add([b.aiOnnx.mul([x, w]), x])


def _neutral_run(name, on):
    model = NEUTRAL_MODELS.get(name, _default_model)
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    w = builder.addInitializedInputTensor(np.linspace(0.6, 1.4, 6, dtype=np.float32)
                                          .reshape(2, 3), "w")
    out = model(builder, x, w)
    loss = out if name in ("SoftmaxGradDirect", "NlllWithSoftmaxGradDirect") else \
        builder.aiOnnx.reducesum([builder.aiOnnx.mul([out, out])], keepdims=0)
    builder.addOutputTensor(loss)
    patterns = popart.Patterns(popart.PatternsLevel.All).enablePattern(name, on)
    patterns.enableRuntimeAsserts(False)  # off for a mandatory pattern
    xv = np.linspace(1.4, 0.5, 6, dtype=np.float32).reshape(2, 3)
    return _train(builder, x, xv, loss, "w", patterns)


@pytest.mark.parametrize("name", sorted(NEUTRAL_PATTERNS))
def test_F8_neutral_pattern_gives_identical_results(name):
    on_weight, on_types = _neutral_run(name, True)
    off_weight, off_types = _neutral_run(name, False)
    np.testing.assert_array_equal(on_weight, off_weight)
    assert on_types == off_types
    assert not np.allclose(on_weight, np.linspace(0.6, 1.4, 6).reshape(2, 3))  # it trained
