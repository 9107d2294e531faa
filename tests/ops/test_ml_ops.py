"""The ai.onnx.ml ops (spec §6.1, F78; version resolution F82) against onnxruntime.

LabelEncoder 1/2/4, TreeEnsemble 5, Binarizer, ArrayFeatureExtractor, Scaler, Imputer,
OneHotEncoder and LinearRegressor; gradients of the differentiable ones.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from popart_backend.errors import ShapeError, UnsupportedOpError
from popart_backend.ops.registry import resolve
from tests.helpers import (
    _value_info,
    assert_close,
    check_grad,
    rand,
    run_onnxruntime,
    run_popart,
)

ML = "ai.onnx.ml"


def strings(values, shape=None) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array.reshape(shape if shape is not None else (len(values),))


def check_ml(op_type: str, inputs, attrs: dict, ml_opset: int = 1, num_outputs: int = 1,
             rtol=None, atol=None, reference: str = "onnxruntime") -> list[np.ndarray]:
    """One ai.onnx.ml node importing the domain at ``ml_opset``: ours vs onnxruntime, or vs
    onnx's ReferenceEvaluator (``reference="onnx"``) for type combinations ORT lacks."""
    names = [f"in{i}" for i in range(len(inputs))]
    outs = [f"out{i}" for i in range(num_outputs)]
    node = helper.make_node(op_type, names, outs, domain=ML, **attrs)
    graph = helper.make_graph(
        [node], "ml", [_value_info(n, np.asarray(v)) for n, v in zip(names, inputs)],
        [helper.make_empty_tensor_value_info(o) for o in outs])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid(ML, ml_opset)])
    feeds = dict(zip(names, inputs))
    ours = run_popart(model, feeds)
    if reference == "onnx":
        values = ReferenceEvaluator(model).run(None, feeds)
        expected = {o: np.asarray(v, dtype=object if np.asarray(v).dtype.kind == "U" else None)
                    for o, v in zip(outs, values)}
    else:
        expected = run_onnxruntime(model, feeds)
    for name in outs:
        assert_close(ours[name], expected[name], f"{op_type}-{ml_opset} {name}", rtol, atol)
    return [ours[o] for o in outs]


# --- LabelEncoder --------------------------------------------------------------------------------


def test_label_encoder_v1_both_directions():
    """F78: LabelEncoder-1 maps strings to their class position and back."""
    classes = ["cat", "dog", "emu"]
    check_ml("LabelEncoder", [strings(["dog", "cat", "yak", "emu"], (2, 2))],
             {"classes_strings": classes, "default_int64": 7})
    check_ml("LabelEncoder", [np.array([2, 0, 5, 1], np.int64)],
             {"classes_strings": classes, "default_string": "?"})


@pytest.mark.parametrize("x, attrs", [
    (strings(["a", "b", "zz", "c"]),
     {"keys_strings": ["a", "b", "c"], "values_floats": [0.5, 1.5, 2.5]}),
    (np.array([[3, 1], [9, 2]], np.int64),
     {"keys_int64s": [1, 2, 3], "values_strings": ["one", "two", "three"]}),
    (np.array([0.5, -1.0, 7.25, 2.0], np.float32),
     {"keys_floats": [7.25, 0.5, 2.0], "values_int64s": [70, 5, 20], "default_int64": -9}),
    (np.array([4, 5], np.int64), {"keys_int64s": [4], "values_int64s": [40]}),
])
def test_label_encoder_v2(x, attrs):
    """F78: LabelEncoder-2 with every key / value list type and the defaults."""
    check_ml("LabelEncoder", [x], attrs, ml_opset=2)


@pytest.mark.parametrize("x, keys, values, default", [
    (np.array([1, 2, 3, 4], np.int32), np.array([4, 1], np.int32),
     np.array([0.25, 1.0], np.float64), np.array([-3.0], np.float64)),
    (np.array([1.5, -1.0, 0.0, 2.0], np.float64), np.array([2.0, 0.0, 1.5, 2.0]),
     strings(["two", "zero", "x", "last two"]), strings(["none"])),
    (strings(["p", "q", "r"]), strings(["q", "p"]), np.array([2, 1], np.int16),
     np.array([0], np.int16)),
])
def test_label_encoder_v4_tensors(x, keys, values, default):
    """F78: LabelEncoder-4 keys_tensor / values_tensor / default_tensor; NaN keys match NaN.
    Reference: onnx's evaluator (onnxruntime lacks int32 -> double and string -> int16)."""
    attrs = {"keys_tensor": numpy_helper.from_array(keys, "keys"),
             "values_tensor": numpy_helper.from_array(values, "values")}
    if default is not None:
        attrs["default_tensor"] = numpy_helper.from_array(default, "default")
    check_ml("LabelEncoder", [x], attrs, ml_opset=4, reference="onnx")


def test_label_encoder_v4_nan_and_repeated_keys():
    """F78: as the spec says, a NaN key matches NaN inputs (onnxruntime agrees, onnx's
    evaluator does not) and a repeated key maps to its last value (onnx's evaluator agrees,
    onnxruntime keeps the first)."""
    attrs = {"keys_tensor": numpy_helper.from_array(np.array([np.nan, 1.5], np.float32)),
             "values_tensor": numpy_helper.from_array(np.array([7, 8], np.int64))}
    check_ml("LabelEncoder", [np.array([1.5, np.nan, 0.0], np.float32)], attrs, ml_opset=4)
    check_ml("LabelEncoder", [strings(["a", "b"])],
             {"keys_strings": ["a", "a"], "values_int64s": [1, 2]}, ml_opset=2, reference="onnx")
    check_ml("LabelEncoder", [np.array([3, 4], np.int64)],
             {"keys_int64s": [3, 4, 3], "values_floats": [1.0, 2.0, 3.0]}, ml_opset=2,
             reference="onnx")


def test_label_encoder_version_resolution():
    """F82: ai.onnx.ml opset 3 resolves LabelEncoder to version 2; opset 5 to 4."""
    assert resolve("LabelEncoder", ML, 3)[1] == 2
    assert resolve("LabelEncoder", ML, 5)[1] == 4
    assert resolve("TreeEnsemble", ML, 5)[1] == 5
    with pytest.raises(UnsupportedOpError, match="TreeEnsemble.*earliest version"):
        resolve("TreeEnsemble", ML, 4)


def test_label_encoder_needs_one_key_list():
    with pytest.raises(Exception, match="LabelEncoder.*exactly one keys_"):
        check_ml("LabelEncoder", [np.array([1], np.int64)],
                 {"keys_int64s": [1], "keys_floats": [1.0], "values_int64s": [2]}, ml_opset=2)


# --- TreeEnsemble ---------------------------------------------------------------------------------


def random_forest(rng, trees: int, depth: int, features: int, targets: int, modes):
    """TreeEnsemble-5 attributes of ``trees`` full random trees of ``depth`` levels."""
    feature_ids, splits, node_modes, true_ids, true_leaf, false_ids, false_leaf = ([] for _ in
                                                                                  range(7))
    missing, members, leaf_targets, leaf_weights, roots = [], [], [], [], []

    def leaf():
        leaf_targets.append(int(rng.integers(targets)))
        leaf_weights.append(float(rng.normal()))
        return len(leaf_weights) - 1

    def node(level):
        index = len(feature_ids)
        mode = int(rng.choice(modes))
        feature_ids.append(int(rng.integers(features)))
        # Integer-valued splits, features and sets: ties exercise <= vs <, and onnxruntime
        # implements integer membership sets only.
        splits.append(float(rng.integers(-2, 3)) if mode != 6 else 0.0)
        node_modes.append(mode)
        missing.append(int(rng.integers(2)))
        if mode == 6:
            members.extend(list(rng.choice(np.arange(-3, 4), 3, replace=False)) + [np.nan])
        for ids, leafs in ((true_ids, true_leaf), (false_ids, false_leaf)):
            ids.append(0)
            leafs.append(0)
        for ids, leafs in ((true_ids, true_leaf), (false_ids, false_leaf)):
            if level + 1 == depth:
                ids[index], leafs[index] = leaf(), 1
            else:
                ids[index] = node(level + 1)
        return index

    for _ in range(trees):
        roots.append(node(0))
    attrs = {
        "nodes_featureids": feature_ids, "nodes_modes": numpy_helper.from_array(
            np.array(node_modes, np.uint8), "modes"),
        "nodes_splits": numpy_helper.from_array(np.array(splits, np.float32), "splits"),
        "nodes_truenodeids": true_ids, "nodes_trueleafs": true_leaf,
        "nodes_falsenodeids": false_ids,
        "nodes_falseleafs": false_leaf, "nodes_missing_value_tracks_true": missing,
        "leaf_targetids": leaf_targets,
        "leaf_weights": numpy_helper.from_array(np.array(leaf_weights, np.float32), "weights"),
        "tree_roots": roots, "n_targets": targets}
    if members:
        attrs["membership_values"] = numpy_helper.from_array(np.array(members, np.float32), "m")
    return attrs


def forest_case(seed: int, aggregate: int, post: int):
    rng = np.random.default_rng(seed)
    attrs = random_forest(rng, trees=4, depth=4, features=3, targets=2, modes=range(7))
    attrs.update(aggregate_function=aggregate, post_transform=post)
    x = rng.integers(-3, 4, size=(20, 3)).astype(np.float32)
    x[::5, 1] = np.nan
    return attrs, x


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_random_forests(aggregate):
    """F78: TreeEnsemble-5 over every node mode, NaN features (missing-value tracking) and
    each aggregate function."""
    attrs, x = forest_case(aggregate, aggregate, 0)
    check_ml("TreeEnsemble", [x], attrs, ml_opset=5, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("post", [1, 2, 3, 4])
def test_tree_ensemble_post_transforms(post):
    """F78: post_transform codes as the ONNX spec numbers them: SOFTMAX 1, LOGISTIC 2,
    SOFTMAX_ZERO 3, PROBIT 4. onnxruntime swaps codes 1 and 2, so the reference is its
    untransformed output with the transform applied here."""
    attrs, x = forest_case(5, 1, 0)
    weights = numpy_helper.to_array(attrs["leaf_weights"])
    # PROBIT needs scores in (0, 1); SOFTMAX_ZERO needs some zero scores (all-zero leaves).
    weights = {3: np.where(weights > 0, weights, 0.0), 4: (weights > 0) * 0.2 + 0.01}.get(
        post, weights)
    attrs["leaf_weights"] = numpy_helper.from_array(weights.astype(np.float32), "w")
    raw = check_ml("TreeEnsemble", [x], attrs, ml_opset=5)[0].astype(np.float64)
    exp = np.exp(raw - raw.max(-1, keepdims=True))
    kept = np.where(raw != 0, exp, 0)
    expected = {1: exp / exp.sum(-1, keepdims=True), 2: 1 / (1 + np.exp(-raw)),
                3: kept / np.maximum(kept.sum(-1, keepdims=True), 1e-30),
                4: np.sqrt(2) * torch.erfinv(torch.from_numpy(2 * raw - 1)).numpy()}[post]
    attrs["post_transform"] = post
    with np.errstate(invalid="ignore"):  # PROBIT of a never-reached target's 0 is -inf
        assert_close(run_tree(attrs, x), expected.astype(np.float32), f"post_transform {post}",
                     rtol=1e-5, atol=1e-6)


def run_tree(attrs: dict, x: np.ndarray) -> np.ndarray:
    node = helper.make_node("TreeEnsemble", ["x"], ["y"], domain=ML, **attrs)
    graph = helper.make_graph([node], "tree", [_value_info("x", x)],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid(ML, 5)])
    return run_popart(model, {"x": x})["y"]


def test_tree_ensemble_double_and_single_leaf_tree():
    """F78: double input; a tree whose root is a leaf (true and false the same leaf)."""
    attrs = {"nodes_featureids": [0, 1], "nodes_modes": numpy_helper.from_array(
        np.array([0, 0], np.uint8)), "nodes_splits": numpy_helper.from_array(np.array([0.5, 0.0])),
        "nodes_truenodeids": [0, 1], "nodes_trueleafs": [1, 1], "nodes_falsenodeids": [1, 0],
        "nodes_falseleafs": [1, 1], "leaf_targetids": [0, 0],
        "leaf_weights": numpy_helper.from_array(np.array([1.0, 2.0])), "tree_roots": [0, 1],
        "n_targets": 1}
    attrs["nodes_falsenodeids"] = [1, 1]
    attrs["nodes_truenodeids"] = [0, 1]
    check_ml("TreeEnsemble", [np.array([[0.0, 3.0], [1.0, -1.0]])], attrs, ml_opset=5)


def test_tree_ensemble_rejects_bad_feature():
    attrs = random_forest(np.random.default_rng(0), 1, 2, features=5, targets=1, modes=[0])
    with pytest.raises(ShapeError, match=r"TreeEnsemble.*read feature \d"):
        check_ml("TreeEnsemble", [np.zeros((2, 1), np.float32)], attrs, ml_opset=5)


# --- small transforms --------------------------------------------------------------------------


@pytest.mark.parametrize("x, reference", [
    (rand(3, 4), "onnxruntime"), (np.array([[-2, 0, 3]], np.int64), "onnx"),
    (np.array([1.0, 0.0, 0.5], np.float64), "onnx")])
def test_binarizer(x, reference):
    """F78: Binarizer keeps the dtype (onnxruntime implements float32 only)."""
    check_ml("Binarizer", [x], {"threshold": 0.25}, reference=reference)


@pytest.mark.parametrize("x", [rand(2, 5), rand(5), np.arange(24, dtype=np.int64).reshape(2, 3, 4),
                               strings(list("abcdef"), (2, 3))])
def test_array_feature_extractor(x):
    """F78: ArrayFeatureExtractor selects along the last axis (1-D input gives [1, k])."""
    index = np.array([2, 0, 2], np.int64)
    check_ml("ArrayFeatureExtractor", [x, index], {})


def test_scaler_and_grad():
    """F78: Scaler per feature and scalar; its gradient is dy * scale."""
    x = rand(4, 3, seed=1)
    check_ml("Scaler", [x], {"offset": [0.5, -1.0, 2.0], "scale": [2.0, 0.5, -1.0]})
    check_ml("Scaler", [np.array([[1, 2, 3]], np.int64)], {"offset": [1.0], "scale": [3.0]})
    scale = [2.0, 0.5, -1.0]
    check_grad("Scaler", [x], {"offset": [0.5, -1.0, 2.0], "scale": scale}, domain=ML,
               ref=lambda t: (t - torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64))
               * torch.tensor(scale, dtype=torch.float64))


def test_imputer_and_grad():
    """F78: Imputer replaces NaN (float) or a value (int); no gradient reaches imputed slots."""
    x = rand(3, 2, seed=2)
    x[0, 1] = x[2, 0] = np.nan
    check_ml("Imputer", [x], {"imputed_value_floats": [7.0, 8.0], "replaced_value_float": np.nan})
    check_ml("Imputer", [np.array([[0, 5], [3, 0]], np.int64)],
             {"imputed_value_int64s": [9], "replaced_value_int64": 0})
    y = rand(3, 2, seed=3)
    y[1, 1] = 0.0
    grads = check_grad("Imputer", [y], {"imputed_value_floats": [1.0]}, domain=ML,
                       ref=lambda t: torch.where(t == 0, torch.ones_like(t), t))
    assert grads[0][1, 1] == 0.0


@pytest.mark.parametrize("x, attrs", [
    (np.array([[1, 3], [4, 1]], np.int64), {"cats_int64s": [1, 2, 3]}),
    (np.array([2.0, 1.0], np.float32), {"cats_int64s": [1, 2]}),
    (strings(["b", "a", "q"]), {"cats_strings": ["a", "b"]}),
])
def test_one_hot_encoder(x, attrs):
    """F78: OneHotEncoder appends a category axis; unknown values give zero rows."""
    check_ml("OneHotEncoder", [x], attrs)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_linear_regressor(post):
    """F78: LinearRegressor with 2 targets and the post transforms."""
    attrs = {"coefficients": [0.5, -1.0, 2.0, 1.0, 0.0, -0.5], "intercepts": [0.1, -0.2],
             "targets": 2, "post_transform": post}
    check_ml("LinearRegressor", [rand(4, 3, seed=4)], attrs)


def test_linear_regressor_grad():
    """F78: LinearRegressor's gradient is dy @ coefficients."""
    coefficients = [0.5, -1.0, 2.0, 1.0, 0.0, -0.5]
    w = torch.tensor(coefficients, dtype=torch.float64).reshape(2, 3)
    check_grad("LinearRegressor", [rand(4, 3, seed=5)],
               {"coefficients": coefficients, "intercepts": [0.1, -0.2], "targets": 2},
               domain=ML, ref=lambda t: t @ w.T + torch.tensor([0.1, -0.2], dtype=torch.float64))
    check_grad("LinearRegressor", [rand(3, seed=6)],
               {"coefficients": coefficients, "targets": 2},
               domain=ML, ref=lambda t: (t @ w.T).reshape(1, 2))


def test_ml_model_from_sklearn_style_pipeline():
    """F78: a Scaler -> TreeEnsemble -> Binarizer pipeline, as an exporter writes it."""
    rng = np.random.default_rng(7)
    forest = random_forest(rng, trees=3, depth=3, features=2, targets=1, modes=[0, 3])
    nodes = [helper.make_node("Scaler", ["x"], ["s"], domain=ML, offset=[1.0], scale=[0.5]),
             helper.make_node("TreeEnsemble", ["s"], ["t"], domain=ML, **forest),
             helper.make_node("Binarizer", ["t"], ["y"], domain=ML, threshold=0.0)]
    graph = helper.make_graph(nodes, "pipeline",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 1])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid(ML, 5)])
    feeds = {"x": rand(6, 2, seed=8, low=-3, high=3)}
    np.testing.assert_array_equal(run_popart(model, feeds)["y"], run_onnxruntime(model, feeds)["y"])


_MODE_NAMES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def regressor_attrs(forest: dict, extra_targets: bool) -> dict:
    """TreeEnsembleRegressor attributes of a ``random_forest`` (no membership nodes): tree t's
    nodes keep their indices as node ids, leaves become LEAF nodes after them."""
    modes = numpy_helper.to_array(forest["nodes_modes"])
    splits = numpy_helper.to_array(forest["nodes_splits"])
    weights = numpy_helper.to_array(forest["leaf_weights"])
    nodes, leaves = len(modes), len(weights)
    tree_of = {}
    for tree, root in enumerate(forest["tree_roots"]):
        stack = [(root, False)]
        while stack:
            index, is_leaf = stack.pop()
            tree_of[(index, is_leaf)] = tree
            if not is_leaf:
                stack += [(forest["nodes_truenodeids"][index], forest["nodes_trueleafs"][index]),
                          (forest["nodes_falsenodeids"][index], forest["nodes_falseleafs"][index])]

    def node_id(index, is_leaf):
        return nodes + index if is_leaf else index

    attrs = {
        "nodes_treeids": [tree_of[(i, False)] for i in range(nodes)]
        + [tree_of[(i, True)] for i in range(leaves)],
        "nodes_nodeids": list(range(nodes + leaves)),
        "nodes_featureids": list(forest["nodes_featureids"]) + [0] * leaves,
        "nodes_modes": [_MODE_NAMES[m] for m in modes] + ["LEAF"] * leaves,
        "nodes_values": list(splits) + [0.0] * leaves,
        "nodes_truenodeids": [node_id(i, f) for i, f in zip(forest["nodes_truenodeids"],
                                                            forest["nodes_trueleafs"])]
        + [0] * leaves,
        "nodes_falsenodeids": [node_id(i, f) for i, f in zip(forest["nodes_falsenodeids"],
                                                             forest["nodes_falseleafs"])]
        + [0] * leaves,
        "nodes_missing_value_tracks_true": list(forest["nodes_missing_value_tracks_true"])
        + [0] * leaves,
        "target_treeids": [tree_of[(i, True)] for i in range(leaves)],
        "target_nodeids": [nodes + i for i in range(leaves)],
        "target_ids": list(forest["leaf_targetids"]), "target_weights": list(weights),
        "n_targets": forest["n_targets"]}
    # onnxruntime wants each tree's nodes together, its root first.
    order = sorted(range(nodes + leaves), key=lambda i: attrs["nodes_treeids"][i])
    for key in [k for k in attrs if k.startswith("nodes_")]:
        attrs[key] = [attrs[key][i] for i in order]
    if extra_targets:  # every leaf also feeds the other target
        for i in range(leaves):
            attrs["target_treeids"].append(tree_of[(i, True)])
            attrs["target_nodeids"].append(nodes + i)
            attrs["target_ids"].append(1 - forest["leaf_targetids"][i])
            attrs["target_weights"].append(0.5)
    return attrs


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("version", [1, 3])
def test_tree_ensemble_regressor(aggregate, version):
    """F78: TreeEnsembleRegressor-1/3 (leaves with several targets, base values, NaN
    tracking) against onnxruntime. Every target is reached: for a target no leaf feeds,
    onnxruntime returns 0 and onnx's evaluator 0 + base (SUM) or ±FLT_MAX (MIN/MAX)."""
    rng = np.random.default_rng(3)
    forest = random_forest(rng, trees=3, depth=3, features=3, targets=2, modes=range(6))
    attrs = regressor_attrs(forest, extra_targets=True)
    attrs.update(aggregate_function=aggregate, base_values=[0.25, -1.0])
    x = rng.integers(-3, 4, size=(12, 3)).astype(np.float32)
    if version == 3:  # double thresholds; onnxruntime then wants double features
        attrs["nodes_values_as_tensor"] = numpy_helper.from_array(
            np.array(attrs.pop("nodes_values"), np.float64))
        x = x.astype(np.float64)
    x[::4, 0] = np.nan
    check_ml("TreeEnsembleRegressor", [x], attrs, ml_opset=version, rtol=1e-5, atol=1e-5)


def test_tree_ensemble_regressor_int_input():
    """F78: int64 features (onnxruntime has no int64 kernel) give what the same values as
    float32 give."""
    rng = np.random.default_rng(4)
    forest = random_forest(rng, trees=2, depth=2, features=2, targets=1, modes=[0, 1])
    attrs = regressor_attrs(forest, extra_targets=False)
    x = rng.integers(-3, 4, size=(8, 2))
    as_float = check_ml("TreeEnsembleRegressor", [x.astype(np.float32)], attrs)[0]
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain=ML, **attrs)
    graph = helper.make_graph([node], "t", [_value_info("x", x)],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid(ML, 1)])
    np.testing.assert_array_equal(run_popart(model, {"x": x})["y"], as_float)
