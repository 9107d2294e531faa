"""getSupportedOperations / getSupportedOperationsDefinition / getUnsupportedOperations,
OperatorIdentifier, OpDefinition and docs/supported_ops.md (spec §6, F81, F82, F87, F88)."""

from __future__ import annotations

import re

import onnx
import onnx.defs
import pytest

import popart_backend as popart
from popart_backend import supported_ops
from popart_backend.ops.registry import all_registered
from tests.conformance.popart_ops import POPART_ONNX_OPS

# Spec §6.3: the builder-callable ai.graphcore types (§6.1's ai.onnx list: POPART_ONNX_OPS).
SPEC_6_3_BUILDER = """Abort Atan2 BitwiseAnd BitwiseNot BitwiseOr BitwiseXor BitwiseXnor Call
CopyVarUpdate CtcBeamSearchDecoder Ctc DepthToSpace Detach DynamicSlice DynamicUpdate DynamicZero
DynamicAdd Expm1 Log1p Gelu Swish Round Fmod Remainder GroupNormalization IdentityLoss Init L1 LSTM
MultiConv Nll Nop PackedDataBlock PrintTensor ReduceMedian ReplicatedAllReduce Reshape Reverse
Scale ScaledAdd ScatterReduce SequenceSlice ShapedDropout Subsample""".split()
SPEC_6_3_OTHER = """AddLhsInplace AutoLossScaleProxy BinaryConstScalar ConvFlipWeights Histogram
HostLoad HostStore LossScaleUpdate RemoteLoad RemoteStore ReplicatedAllGather
ReplicatedAllReduceInplace ReplicatedReduceScatter Resize Square UnaryZeroGrad Zeros
ZerosLike""".split()


def test_operator_identifier_value_semantics():
    """F87: domain/type/version, equality, hashing, ordering and PopART's text form."""
    a = popart.OperatorIdentifier("ai.onnx", "Add", 7)
    assert (a.domain, a.type, a.version) == ("ai.onnx", "Add", 7)
    assert a == popart.OperatorIdentifier("", "Add", 7)  # "" is ai.onnx, as in ONNX
    assert a != popart.OperatorIdentifier("ai.onnx", "Add", 13)
    assert len({a, popart.OperatorIdentifier("ai.onnx", "Add", 7)}) == 1
    assert a < popart.OperatorIdentifier("ai.onnx", "Add", 13)
    assert str(a) == "ai.onnx.Add:7"
    with pytest.raises(popart.popart_exception, match="version"):
        popart.OperatorIdentifier("ai.onnx", "Add", 0)


def test_supported_operations_match_the_registry():
    """F81: every registered (domain, type, version) appears with includeInternal=True."""
    everything = popart.getSupportedOperations(True)
    registered = {(d, t, v) for d, t, v, _ in all_registered()}
    listed = {(o.domain, o.type, o.version) for o in everything}
    assert registered <= listed
    # The rest are the ops the importer resolves itself (sequences, optionals, Gradient).
    assert {(d, t) for d, t, _ in listed - registered} <= set(supported_ops._IMPORT_TIME_OPS)
    assert everything == sorted(everything)
    public = popart.getSupportedOperations(False)
    assert set(public) < set(everything)


def test_spec_6_1_ops_are_public_at_their_popart_versions():
    """F78: each §6.1 type is listed."""
    public = {(o.type, o.version) for o in popart.getSupportedOperations(False)
              if o.domain == "ai.onnx"}
    types = {t for t, _ in public}
    missing = sorted(set(POPART_ONNX_OPS) - types)
    assert not missing, f"§6.1 op types not supported: {missing}"
    # Spot-check versions spec §6.1 lists.
    for op_type, version in [("Add", 7), ("Gather", 11), ("Resize", 10), ("Resize", 11),
                             ("TopK", 10), ("Slice", 10), ("Upsample", 9), ("Clip", 11)]:
        assert (op_type, version) in public, (op_type, version)


def test_internal_ops_are_hidden_unless_asked():
    """Grad ops, fused kernels, optimizer updates and the training forms are internal."""
    public = {(o.domain, o.type) for o in popart.getSupportedOperations(False)}
    internal = {(o.domain, o.type) for o in popart.getSupportedOperations(True)} - public
    for op in [("ai.graphcore", "ReluGrad"), ("ai.graphcore", "MatMulLhsGrad"),
               ("ai.graphcore", "SGDUpdate"), ("ai.graphcore", "Accumulate"),
               ("ai.graphcore", "BatchNormalizationTraining"), ("ai.graphcore", "DropoutTraining"),
               ("popart.fused", "LinearBias")]:
        assert op in internal, op
    assert not any(d == "popart.fused" or t.endswith("Grad") and d == "ai.graphcore"
                   for d, t in public)
    for op in [("ai.graphcore", "Nll"), ("ai.graphcore", "L1"), ("ai.graphcore", "IdentityLoss")]:
        assert op in public, op


def _builder_op_types() -> set[str]:
    """The ai.graphcore op types ``builder.aiGraphcore`` writes: the declared methods plus the
    two hand-written ones with nested arguments."""
    opset = popart.Builder().aiGraphcore
    return {spec.op_type for spec in opset.op_specs.values()} | {"MultiConv", "PackedDataBlock"}


def test_spec_graphcore_builder_ops_are_builder_methods():
    missing = sorted(set(SPEC_6_3_BUILDER) - _builder_op_types())
    assert not missing, f"spec §6.3 builder ops without a builder.aiGraphcore method: {missing}"


def test_public_graphcore_ops_are_the_specs():
    """§6.3: a public ai.graphcore type is builder-callable or listed by the spec; a new internal
    op must be marked (``public = False`` or a rule of supported_ops.is_public)."""
    public = {o.type for o in popart.getSupportedOperations(False) if o.domain == "ai.graphcore"}
    unexpected = sorted(public - _builder_op_types() - set(SPEC_6_3_OTHER))
    assert not unexpected, (
        f"ai.graphcore types {unexpected} are public but not in spec §6.3; set `public = False` "
        f"on internal ops")


def test_explicit_public_flag_wins():
    class Marked:
        public = True
        __module__ = "popart_backend.ops.optimizer_updates"

    assert supported_ops.is_public("ai.graphcore", "SomethingGrad", Marked)
    Marked.public = False
    assert not supported_ops.is_public("ai.onnx", "Relu", Marked)


def test_definition_inputs_outputs_attributes():
    """F88: OpDefinition from the ONNX schema and the op class (constant inputs, attributes)."""
    defs = popart.getSupportedOperationsDefinition(False)
    assert set(defs) == set(popart.getSupportedOperations(False))
    reduce_sum = defs[popart.OperatorIdentifier("ai.onnx", "ReduceSum", 13)]
    assert [(i.name, i.constant) for i in reduce_sum.inputs] == [("data", False), ("axes", True)]
    assert popart.DataType.FLOAT in reduce_sum.inputs[0].supportedTensors
    assert reduce_sum.inputs[1].supportedTensors == (popart.DataType.INT64,)
    assert [o.name for o in reduce_sum.outputs] == ["reduced"]
    assert set(reduce_sum.attributes) == {"keepdims", "noop_with_empty_axes"}

    conv = defs[popart.OperatorIdentifier("ai.onnx", "Conv", 11)]
    assert [i.name for i in conv.inputs] == ["X", "W", "B"]
    assert not any(i.constant for i in conv.inputs)
    assert {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"} <= set(
        conv.attributes)
    # Every ONNX element type is modelled (popart_backend/dtypes.py), bfloat16 included.
    add14 = defs[popart.OperatorIdentifier("ai.onnx", "Add", 14)]
    assert popart.DataType.BFLOAT16 in add14.inputs[0].supportedTensors
    assert popart.DataType.UINT8 in add14.inputs[0].supportedTensors

    # ai.graphcore ops have no ONNX schema: attributes still come from the op's Attrs.
    nll = defs[popart.OperatorIdentifier("ai.graphcore", "Nll", 1)]
    assert "reduction" in nll.attributes


def test_import_time_ops_of_every_domain_are_listed():
    """F81, F88: ops the importer builds itself are listed at the versions ONNX defines, with
    OpDefinitions from their schemas: the sequence ops (ai.onnx) and Gradient-1
    (ai.onnx.preview.training, importer/gradient_op.py)."""
    gradient = popart.OperatorIdentifier("ai.onnx.preview.training", "Gradient", 1)
    public = popart.getSupportedOperations(False)
    assert gradient in public
    assert [o for o in public if o.type == "Gradient"] == [gradient]
    assert popart.OperatorIdentifier("ai.onnx", "SequenceAt", 11) in public

    schema = onnx.defs.get_schema("Gradient", 1, "ai.onnx.preview.training")
    definition = popart.getSupportedOperationsDefinition(False)[gradient]
    assert [(i.name, i.constant) for i in definition.inputs] == [
        (slot.name, False) for slot in schema.inputs]
    assert [o.name for o in definition.outputs] == [slot.name for slot in schema.outputs]
    assert set(definition.attributes) == {"xs", "zs", "y"} == set(schema.attributes)
    # Gradients are floating point (the schema's T2); the inputs may be any tensor (T1).
    assert set(definition.outputs[0].supportedTensors) == {
        popart.DataType.FLOAT, popart.DataType.FLOAT16, popart.DataType.DOUBLE}
    assert popart.DataType.INT64 in definition.inputs[0].supportedTensors
    assert re.fullmatch(definition.attributes["xs"].supportedValuesRegex, str(("a", "b")))
    assert re.fullmatch(definition.attributes["y"].supportedValuesRegex, "c")

    sequence_at = popart.getSupportedOperationsDefinition(False)[
        popart.OperatorIdentifier("ai.onnx", "SequenceAt", 11)]
    assert [(i.name, i.constant) for i in sequence_at.inputs] == [
        ("input_sequence", False), ("position", True)]


def test_gradient_is_on_the_docs_page():
    """docs/supported_ops.md lists Gradient under its domain (rendered from the same list)."""
    text = supported_ops.render_markdown()
    section = text.split("## Domain `ai.onnx.preview.training`", 1)[1].split("## ", 1)[0]
    assert re.search(r"^\| Gradient \| 1 \|", section, re.MULTILINE)


@pytest.mark.parametrize("value, attr_type, matches", [
    (3, onnx.AttributeProto.INT, True),
    (-2, onnx.AttributeProto.INT, True),
    (1.5, onnx.AttributeProto.INT, False),
    (1e-05, onnx.AttributeProto.FLOAT, True),
    (0.5, onnx.AttributeProto.FLOAT, True),
    ((1, 2, 3), onnx.AttributeProto.INTS, True),
    ((), onnx.AttributeProto.INTS, True),
    ((1.0, 2.5), onnx.AttributeProto.FLOATS, True),
    ("NOTSET", onnx.AttributeProto.STRING, True),
])
def test_attribute_regexes_match_importer_values(value, attr_type, matches):
    """supportedValuesRegex matches str() of the values the importer hands an op."""
    regex = supported_ops._ATTRIBUTE_REGEX[attr_type]
    assert bool(re.fullmatch(regex, str(value))) is matches


def test_attribute_is_a_regex_string():
    defs = popart.getSupportedOperationsDefinition(False)
    attr = defs[popart.OperatorIdentifier("ai.onnx", "LeakyRelu", 6)].attributes["alpha"]
    assert attr == attr.supportedValuesRegex
    assert re.fullmatch(attr.supportedValuesRegex, str(0.01))


def test_unsupported_operations(monkeypatch):
    """F81: ONNX ops of an opset without an implementation at that opset's version."""
    latest = onnx.defs.onnx_opset_version()
    for opset in (11, 17, latest):
        # Issue #7: every ai.onnx op type is implemented at every version up to the latest.
        assert popart.getUnsupportedOperations(opset) == [], opset
    # Take Relu out entirely and Conv-22 (Conv-11 stays): Relu is unsupported everywhere, Conv
    # only from opset 22, where the version it resolves to is not implemented.
    entries = supported_ops._entries
    monkeypatch.setattr(supported_ops, "_entries", lambda internal: [
        e for e in entries(internal) if e[1] != "Relu" and e[1:3] != ("Conv", 22)])
    assert "Relu" in popart.getUnsupportedOperations(11)
    assert "Conv" not in popart.getUnsupportedOperations(21)
    unsupported = popart.getUnsupportedOperations(22)
    assert "Conv" in unsupported and unsupported == sorted(unsupported)
    with pytest.raises(popart.popart_exception, match="opsetVersion"):
        popart.getUnsupportedOperations(0)


def test_docs_page_is_current():
    """docs/supported_ops.md is generated; regenerate with scripts/update_supported_ops_doc.py."""
    import os
    import subprocess
    import sys

    path = supported_ops.DOC_PATH
    assert path.exists(), f"{path} is missing; run python scripts/update_supported_ops_doc.py"
    # Rendered in a fresh interpreter: other tests in this process register test-only ops.
    rendered = subprocess.run(
        [sys.executable, "-c",
         "import sys, popart_backend.supported_ops as s; sys.stdout.write(s.render_markdown())"],
        capture_output=True, text=True, check=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=str(path.parents[1])),
    ).stdout
    assert path.read_text() == rendered, (
        f"{path} is stale: run python scripts/update_supported_ops_doc.py and commit the result")
