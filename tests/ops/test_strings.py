"""STRING tensors on the simulated IPU and the string ops (spec §6.1, F78), against onnxruntime.

Covers graph inputs, initializers, Constant and anchors of STRING type, the element-moving ops
run on element codes (ops/string_tensors.py), StringNormalizer, StringSplit, StringConcat,
RegexFullMatch and TfIdfVectorizer.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import popart_backend as popart
from popart_backend.dtypes import DataType
from popart_backend.errors import ShapeError, UnsupportedOpError
from popart_backend.ir.tensor import TensorInfo
from tests.helpers import check_op, one_op_model, run_onnxruntime, run_popart


def strings(values, shape=None) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array.reshape(shape if shape is not None else (len(values),))


WORDS = strings(["apple", "Banana", "", "cherry", "apple", "Éclair"], (2, 3))


# --- data movement on strings ---------------------------------------------------------------


@pytest.mark.parametrize("op_type, inputs, attrs, const_inputs", [
    ("Identity", [WORDS], {}, ()),
    ("Reshape", [WORDS, np.array([3, 2], np.int64)], {}, (1,)),
    ("Transpose", [WORDS], {"perm": [1, 0]}, ()),
    ("Gather", [WORDS, np.array([2, 0, 0], np.int64)], {"axis": 1}, ()),
    ("Concat", [WORDS, strings(["x", "y", "z"], (1, 3))], {"axis": 0}, ()),
    ("Slice", [WORDS, np.array([1], np.int64), np.array([3], np.int64),
               np.array([1], np.int64)], {}, (1, 2, 3)),
    ("Unsqueeze", [WORDS, np.array([0], np.int64)], {}, (1,)),
    ("Squeeze", [strings(["a", "b"], (1, 2)), np.array([0], np.int64)], {}, (1,)),
    ("Expand", [strings(["a", "b"], (1, 2)), np.array([3, 2], np.int64)], {}, (1,)),
    ("Tile", [WORDS, np.array([2, 1], np.int64)], {}, (1,)),
    ("Where", [np.array([[True, False, True]]), WORDS, strings(["-"], (1,))], {}, ()),
    ("Equal", [WORDS, strings(["apple", "Banana", "x"], (3,))], {}, ()),
    ("Flatten", [WORDS], {"axis": 0}, ()),
])
def test_element_moving_ops_on_strings(op_type, inputs, attrs, const_inputs):
    """F78: data-movement ops keep their torch kernel, run on element codes."""
    check_op(op_type, inputs, attrs, opset=19, const_inputs=const_inputs)


def test_split_and_pad_fill_with_empty_strings():
    """F78: multi-output ops decode each output; Pad's zero fill decodes to ""."""
    check_op("Split", [WORDS, np.array([1, 2], np.int64)], {"axis": 1}, opset=18,
             num_outputs=2, const_inputs=(1,))
    check_op("Pad", [strings(["a", "b"], (1, 2)), np.array([0, 1, 0, 2], np.int64)], {},
             opset=18, const_inputs=(1,), ref=lambda x, p: strings(["", "a", "b", "", ""], (1, 5)))


def test_string_initializer_and_constant_fold():
    """F78: string initializers and Constant(value_strings) are constants; Concat of both
    folds at import."""
    const = helper.make_node("Constant", [], ["c"], value_strings=["p", "q"])
    concat = helper.make_node("Concat", ["c", "init", "x"], ["y"], axis=0)
    graph = helper.make_graph(
        [const, concat], "g", [helper.make_tensor_value_info("x", TensorProto.STRING, [1])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [4])],
        initializer=[helper.make_tensor("init", TensorProto.STRING, [1], [b"r"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    out = run_popart(model, {"x": strings(["s"])})["y"]
    np.testing.assert_array_equal(out, strings(["p", "q", "r", "s"]))


def test_string_session_batches_and_memory():
    """F78: an InferenceSession streams STRING inputs per micro-batch and writes STRING
    anchors; a string tensor counts 8 bytes (a pointer) per element."""
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("STRING", [3]), "x")
    y = builder.aiOnnx.transpose([builder.aiOnnx.reshape(
        [x, builder.aiOnnx.constant(np.array([3, 1], np.int64))])])
    session = popart.InferenceSession(
        fnModel=builder.getModelProto(),
        dataFlow=popart.DataFlow(2, {y: popart.AnchorReturnType("All")}),
        deviceInfo=popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    data = strings(["a", "bb", "ccc", "d", "ee", "fff"], (2, 3))
    session.run(popart.PyStepIO({x: data}, anchors))
    np.testing.assert_array_equal(anchors[y], data.reshape(2, 1, 3))
    assert TensorInfo(DataType.STRING, (2, 3)).num_bytes == 6 * 8


def test_string_reaching_numeric_only_op_raises():
    """F78: an op without a string path names the tensor and the ops that take strings."""
    model, feeds = one_op_model("OneHot", [np.array([0, 1], np.int64), np.array(3, np.int64),
                                           strings(["off", "on"])], {}, opset=11,
                                const_inputs=(1,))
    with pytest.raises(UnsupportedOpError, match="OneHot.*STRING"):
        run_popart(model, feeds)
    # The message lists the op types that run on codes, read from their class attributes.
    with pytest.raises(UnsupportedOpError, match="Gather, GatherElements, GatherND, Identity"):
        run_popart(model, feeds)


# The ai.onnx op types whose kernels run on string codes: they copy, select, reorder or compare
# elements for equality and fill only with zeros.
ELEMENT_MOVING = {
    "CenterCropPad", "Compress", "Concat", "DepthToSpace", "Equal", "Expand", "Flatten",
    "Gather", "GatherElements", "GatherND", "Identity", "Pad", "Reshape", "ReverseSequence",
    "Scatter", "ScatterElements", "ScatterND", "Slice", "SpaceToDepth", "Split", "Squeeze",
    "Tile", "Transpose", "Trilu", "Unsqueeze", "Where",
}


def test_string_paths_are_declared_on_the_op_classes():
    """F78: each op class declares its string path (``strings_as_codes`` / ``takes_strings``,
    ir/op.py); the ai.onnx types on codes are the element-moving ones, and ONNX's schema of
    their latest version accepts tensor(string)."""
    from popart_backend.ops.registry import all_registered
    from popart_backend.ops.string_tensors import string_code_op_types

    on_codes = {(d, t) for d, t, _, cls in all_registered() if cls.strings_as_codes}
    assert {t for d, t in on_codes if d == "ai.onnx"} == ELEMENT_MOVING
    assert set(string_code_op_types()) == ELEMENT_MOVING
    assert not [(d, t) for d, t, _, cls in all_registered()
                if cls.strings_as_codes and cls.takes_strings]
    latest: dict[str, int] = {}
    for d, t, v, _ in all_registered():
        if d == "ai.onnx" and t in ELEMENT_MOVING:
            latest[t] = max(v, latest.get(t, 0))
    for op_type, version in latest.items():
        schema = onnx.defs.get_schema(op_type, version, "")
        allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
        assert any("tensor(string)" in allowed.get(i.type_str, ()) for i in schema.inputs), (
            op_type, version)


# --- string ops --------------------------------------------------------------------------------


@pytest.mark.parametrize("attrs", [
    {"case_change_action": "LOWER"},
    {"case_change_action": "UPPER"},
    {"case_change_action": "NONE", "locale": "en_US"},
])
def test_string_normalizer_case(attrs):
    """F78: StringNormalizer without stopwords keeps the shape. Reference: Python's str case
    mapping (onnxruntime needs the en_US locale installed to change case)."""
    change = {"LOWER": str.lower, "UPPER": str.upper, "NONE": str}[attrs["case_change_action"]]
    for data in (strings(["Monday", "tuesday", "ÉTÉ"]), strings(["Monday", "x"], (1, 2))):
        check_op("StringNormalizer", [data], attrs, opset=10,
                 ref=lambda x: strings([change(v) for v in x.reshape(-1)], x.shape))


@pytest.mark.parametrize("attrs", [
    {"stopwords": ["monday"], "is_case_sensitive": 0},
    {"stopwords": ["monday"], "is_case_sensitive": 1},
    {"stopwords": ["monday", "tuesday"]},
])
def test_string_normalizer_stopwords_fold_on_constants(attrs):
    """F78: stopwords on a constant input fold at compile time (all removed leaves "").
    Reference: a Python filter (onnxruntime's case folding needs the en_US locale)."""
    fold = str if attrs.get("is_case_sensitive") else str.lower
    stop = {fold(w) for w in attrs["stopwords"]}

    def ref(x):
        kept = [v for v in x.reshape(-1) if fold(v) not in stop] or [""]
        return strings(kept, (len(kept),) if x.ndim == 1 else (1, len(kept)))

    for data in (strings(["Monday", "tuesday", "wed"]), strings(["monday", "Tuesday"], (1, 2))):
        check_op("StringNormalizer", [data], attrs, opset=10, const_inputs=(0,), ref=ref)


def test_string_normalizer_stopwords_on_stream_raise():
    """F78: stopwords make the output shape data-dependent: a streamed input is rejected."""
    model, feeds = one_op_model("StringNormalizer", [strings(["a", "b"])],
                                {"stopwords": ["a"]}, opset=10)
    with pytest.raises(UnsupportedOpError, match="StringNormalizer.*output shape depends"):
        run_popart(model, feeds)


@pytest.mark.parametrize("attrs", [{}, {"delimiter": ","}, {"delimiter": "-", "maxsplit": 1},
                                   {"delimiter": ",,"}])
def test_string_split_folds_constants(attrs):
    """F78: StringSplit on a constant input (its output width depends on the data). No ""
    element: onnxruntime gives it 0 pieces, the ONNX reference (and we) one."""
    data = strings(["a,b,,c", " x  y ", "k", "p-q-r,,s"], (2, 2))
    check_op("StringSplit", [data], attrs, opset=20, num_outputs=2, const_inputs=(0,))


def test_string_split_on_stream_raises():
    """F78: StringSplit of a computed input has no static output shape."""
    model, feeds = one_op_model("StringSplit", [strings(["a b"])], {}, opset=20, num_outputs=2)
    with pytest.raises(UnsupportedOpError, match="StringSplit.*longest split"):
        run_popart(model, feeds)


@pytest.mark.parametrize("a, b", [
    (WORDS, strings(["!", "?", ""])),
    (strings(["x"], ()), strings(["y"], ())),
    (strings(["日本"], (1, 1)), WORDS),
])
def test_string_concat(a, b):
    """F78: StringConcat broadcasts, including 0-d and UTF-8 strings."""
    check_op("StringConcat", [a, b], opset=20)


@pytest.mark.parametrize("pattern", [r"[a-z]+", r"a.*e", r"", r"(\w+)@(\w+)\.com", r"(?i)BANANA"])
def test_regex_full_match(pattern):
    """F78: RegexFullMatch with Python re (RE2-compatible patterns)."""
    data = strings(["apple", "banana", "", "me@site.com", "BaNaNa", "a e"], (3, 2))
    check_op("RegexFullMatch", [data], {"pattern": pattern}, opset=20)


def test_regex_full_match_bad_pattern():
    model, feeds = one_op_model("RegexFullMatch", [strings(["a"])], {"pattern": "(a"}, opset=20)
    with pytest.raises(popart.popart_exception, match="RegexFullMatch.*not a valid"):
        run_popart(model, feeds)


_TFIDF_POOL = {"ngram_counts": [0, 4], "ngram_indexes": [0, 1, 2, 3, 4, 5, 6],
               "pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 6, 7]}


@pytest.mark.parametrize("mode, weights", [("TF", None), ("IDF", None), ("TFIDF", None),
                                           ("IDF", [0.5, 1, 2, 3, 4, 5, 6]),
                                           ("TFIDF", [0.5, 1, 2, 3, 4, 5, 6])])
@pytest.mark.parametrize("grams, skip", [((1, 1), 0), ((2, 2), 0), ((1, 2), 3), ((2, 2), 5)])
def test_tfidf_int(mode, weights, grams, skip):
    """F78: TfIdfVectorizer on int32/int64, 1-D and 2-D, all modes and skips."""
    attrs = dict(_TFIDF_POOL, mode=mode, min_gram_length=grams[0], max_gram_length=grams[1],
                 max_skip_count=skip)
    if weights:
        attrs["weights"] = weights
    data = np.array([[1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8], [2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 5, 6]])
    check_op("TfIdfVectorizer", [data.astype(np.int32)], attrs, opset=9)
    check_op("TfIdfVectorizer", [data[1].astype(np.int64)], attrs, opset=9)


def test_tfidf_strings():
    """F78: TfIdfVectorizer with a string pool; unknown words match nothing."""
    attrs = {"ngram_counts": [0, 3], "ngram_indexes": [2, 0, 1, 3, 4],
             "pool_strings": ["a", "b", "c", "a", "b", "b", "zz"], "mode": "TFIDF",
             "weights": [1.0, 2.0, 3.0, 4.0, 5.0], "min_gram_length": 1, "max_gram_length": 2,
             "max_skip_count": 1}
    data = strings(["a", "b", "x", "b", "zz", "a", "b", "c"], (2, 4))
    check_op("TfIdfVectorizer", [data], attrs, opset=9)


def test_tfidf_rejects_mismatched_pool():
    model, feeds = one_op_model("TfIdfVectorizer", [strings(["a"])], dict(
        _TFIDF_POOL, mode="TF", min_gram_length=1, max_gram_length=1, max_skip_count=0), opset=9)
    with pytest.raises(ShapeError, match="TfIdfVectorizer.*pool_int64s"):
        run_popart(model, feeds)


def test_string_model_round_trip_through_onnx():
    """F78: a string pipeline (normalize -> match -> where) agrees with onnxruntime."""
    nodes = [
        helper.make_node("StringNormalizer", ["x"], ["n"], case_change_action="NONE"),
        helper.make_node("RegexFullMatch", ["n"], ["m"], pattern=r"[A-Za-z]+"),
        helper.make_node("Where", ["m", "n", "fallback"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.STRING, [4])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [4])],
        initializer=[helper.make_tensor("fallback", TensorProto.STRING, [1], [b"?"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.checker.check_model(model)
    feeds = {"x": strings(["Hello", "w0rld", "", "OK"])}
    np.testing.assert_array_equal(run_popart(model, feeds)["y"], run_onnxruntime(model, feeds)["y"])
