"""Anchors per the spec §4.2 table, element by element (F26, F29, F31–F35, F72).

The model computes ``y = x * 2 + 1``, so the value of every micro-batch is known from the input.
The reference below applies the spec's definitions to a numpy array laid out
``[bps, af, rf, *T]``: All keeps everything, EveryN(N) keeps batches N-1, 2N-1, ..., Final keeps
the last micro-batch of the last batch, Sum adds over batches and accumulation steps; then only
size-1 entries of the leading part are dropped.
"""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart

from .session_models import SAMPLE_SHAPE, affine_ref, ipu_model_device, make_session, step_input

ART_CASES = [("All",), ("EveryN", 1), ("EveryN", 2), ("EveryN", 3), ("Final",), ("Sum",)]


def reference_anchor(per_micro_batch: np.ndarray, art: tuple) -> np.ndarray:
    """Spec §4.2 applied to ``per_micro_batch`` of shape [bps, af, rf, *T]."""
    bps, af, rf = per_micro_batch.shape[:3]
    kind = art[0]
    if kind == "All":
        leading, value = (bps, af, rf), per_micro_batch
    elif kind == "EveryN":
        n = art[1]
        leading, value = (bps // n, af, rf), per_micro_batch[n - 1::n]
    elif kind == "Final":
        leading, value = (rf,), per_micro_batch[-1, -1]
    else:
        leading, value = (rf,), per_micro_batch.sum(axis=(0, 1), dtype=np.float32)
    sample = per_micro_batch.shape[3:]
    return value.reshape(tuple(d for d in leading if d != 1) + sample)


# EveryN periods that do not divide bps are rejected by DataFlow (see test_dataflow).
TABLE = [(bps, art) for bps in (1, 4, 6) for art in ART_CASES
         if art[0] != "EveryN" or bps % art[1] == 0]
TABLE_IDS = [f"bps{bps}-{''.join(map(str, art))}" for bps, art in TABLE]


@pytest.mark.parametrize("bps, art", TABLE, ids=TABLE_IDS)
def test_anchor_table_single_replica(bps, art):
    session = make_session({"y": popart.AnchorReturnType(*art)}, bps=bps)
    x = step_input(bps, seed=bps)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    expected = reference_anchor(affine_ref(x).reshape(bps, 1, 1, *SAMPLE_SHAPE), art)
    assert anchors["y"].shape == expected.shape
    np.testing.assert_allclose(anchors["y"], expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bps, art", TABLE, ids=TABLE_IDS)
def test_anchor_table_two_replicas_F72(bps, art):
    options = popart.SessionOptions()
    options.enableReplicatedGraphs = True
    options.replicatedGraphCount = 2
    session = make_session({"y": popart.AnchorReturnType(*art)}, bps=bps, options=options,
                           device=ipu_model_device(2))
    assert session.replicationFactor == 2
    # [bps, af, rf, mb, *S]: chunk k = b*rf + r feeds batch b on replica r.
    x = step_input(bps * 2, seed=10 + bps).reshape(bps, 2, *SAMPLE_SHAPE)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    expected = reference_anchor(affine_ref(x).reshape(bps, 1, 2, *SAMPLE_SHAPE), art)
    assert anchors["y"].shape == expected.shape
    np.testing.assert_allclose(anchors["y"], expected, rtol=1e-6, atol=1e-6)


def test_several_anchors_with_different_types_in_one_run():
    bps = 6
    flow = {
        "y": popart.AnchorReturnType("All"),
        "xw": popart.AnchorReturnType("EveryN", 3),
        "x": popart.AnchorReturnType("Final"),
    }
    session = make_session(flow, bps=bps)
    x = step_input(bps, seed=3)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    np.testing.assert_allclose(anchors["y"], affine_ref(x), rtol=1e-6)
    np.testing.assert_allclose(anchors["xw"], (x * np.float32(2))[[2, 5]], rtol=1e-6)
    np.testing.assert_array_equal(anchors["x"], x[-1])


def test_any_tensor_anchorable_inputs_weights_constants_F35():
    """Inputs, constant weights (constantWeights=True) and variables come back like outputs."""
    bps = 2
    session = make_session(["x", "w", "b", "y"], bps=bps)
    x = step_input(bps, seed=5)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    np.testing.assert_array_equal(anchors["x"], x)
    np.testing.assert_array_equal(anchors["w"], np.full((bps, *SAMPLE_SHAPE), 2, np.float32))
    np.testing.assert_array_equal(anchors["b"], np.full((bps, *SAMPLE_SHAPE), 1, np.float32))

    options = popart.SessionOptions()
    options.constantWeights = False
    session = make_session({"w": popart.AnchorReturnType("Sum")}, bps=3, options=options)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": step_input(3)}, anchors))
    np.testing.assert_array_equal(anchors["w"], np.full(SAMPLE_SHAPE, 6, np.float32))


def test_scalar_anchor_and_inference_loss_F49():
    """A loss in an inference graph is computed and returned when anchored."""
    from .session_models import affine_model

    bps = 4
    session = make_session({"loss": popart.AnchorReturnType("All"),
                            "y": popart.AnchorReturnType("Sum")},
                           bps=bps, model=affine_model(with_loss=True))
    assert session.initAnchorArrays()["loss"].shape == (bps,)
    x = step_input(bps, seed=7)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    y = affine_ref(x)
    expected = 0.5 * np.abs(y).reshape(bps, -1).sum(axis=1)
    np.testing.assert_allclose(anchors["loss"], expected, rtol=1e-5)
    np.testing.assert_allclose(anchors["y"], y.sum(axis=0), rtol=1e-5)


def test_anchors_are_rewritten_each_run():
    """Sum restarts every run; All follows the new input."""
    session = make_session({"y": popart.AnchorReturnType("Sum"),
                            "xw": popart.AnchorReturnType("All")}, bps=4)
    for seed in range(3):
        x = step_input(4, seed=seed)
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({"x": x}, anchors))
        np.testing.assert_allclose(anchors["y"], affine_ref(x).sum(axis=0), rtol=1e-5)
        np.testing.assert_allclose(anchors["xw"], x * 2, rtol=1e-6)


def test_input_of_any_shape_with_the_right_element_count_F26():
    """Only the element count is enforced; chunks are read front to back."""
    bps = 4
    session = make_session(["y"], bps=bps)
    x = step_input(bps, seed=9)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x.reshape(-1)}, anchors))
    np.testing.assert_allclose(anchors["y"], affine_ref(x), rtol=1e-6)
    flat_out = np.zeros(anchors["y"].size, np.float32)
    session.run(popart.PyStepIO({"x": x.reshape(6, 2, 2)}, {"y": flat_out}))
    np.testing.assert_allclose(flat_out.reshape(bps, *SAMPLE_SHAPE), affine_ref(x), rtol=1e-6)


def test_wrap_around_with_runtime_asserts_disabled_F26_F27():
    """With asserts off, an array holding two steps is consumed half per run, then wraps."""
    bps = 2
    session = make_session(["y"], bps=bps)
    x = step_input(2 * bps, seed=11)
    out = np.zeros((2 * bps, *SAMPLE_SHAPE), np.float32)
    stepio = popart.PyStepIO({"x": x}, {"y": out})
    stepio.enableRuntimeAsserts(False)
    session.run(stepio)
    np.testing.assert_allclose(out[:bps], affine_ref(x[:bps]), rtol=1e-6)
    assert not out[bps:].any()
    session.run(stepio)
    np.testing.assert_allclose(out, affine_ref(x), rtol=1e-6)
    out[:] = 0
    session.run(stepio)  # offsets wrapped to the start
    np.testing.assert_allclose(out[:bps], affine_ref(x[:bps]), rtol=1e-6)


def test_callback_order_and_contents_F28():
    """One call per micro-batch per replica, in (b, r) order; Final only at the last batch."""
    bps, rf = 3, 2
    options = popart.SessionOptions()
    options.enableReplicatedGraphs = True
    options.replicatedGraphCount = rf
    session = make_session({"y": popart.AnchorReturnType("All"),
                            "xw": popart.AnchorReturnType("Final")},
                           bps=bps, options=options, device=ipu_model_device(rf))
    x = step_input(bps * rf, seed=12).reshape(bps, rf, *SAMPLE_SHAPE)
    calls, outputs = [], {"y": [], "xw": []}
    counter = {"x": 0}

    def input_callback(tensor_id, prefetch):
        k = counter[tensor_id]
        calls.append(("in", tensor_id, k))
        return x[k // rf, k % rf]

    def input_complete(tensor_id):
        calls.append(("in_done", tensor_id, counter[tensor_id]))
        counter[tensor_id] += 1

    def output_callback(tensor_id):
        calls.append(("out", tensor_id))
        buffer = np.zeros(SAMPLE_SHAPE, np.float32)
        outputs[tensor_id].append(buffer)
        return buffer

    def output_complete(tensor_id):
        calls.append(("out_done", tensor_id))

    stepio = popart.PyStepIOCallback(input_callback, input_complete, output_callback,
                                     output_complete)
    session.run(stepio)
    expected_calls = []
    for b in range(bps):
        for r in range(rf):
            k = b * rf + r
            expected_calls += [("in", "x", k), ("in_done", "x", k), ("out", "y"), ("out_done", "y")]
            if b == bps - 1:
                expected_calls += [("out", "xw"), ("out_done", "xw")]
    assert calls == expected_calls
    y_ref = affine_ref(x)
    for k, value in enumerate(outputs["y"]):
        np.testing.assert_allclose(value, y_ref[k // rf, k % rf], rtol=1e-6)
    assert len(outputs["xw"]) == rf
    for r, value in enumerate(outputs["xw"]):
        np.testing.assert_allclose(value, x[-1, r] * 2, rtol=1e-6)


def test_callback_sum_anchor_is_returned_once_per_replica():
    bps = 4
    session = make_session({"y": popart.AnchorReturnType("Sum")}, bps=bps)
    x = step_input(bps, seed=13)
    position = iter(range(bps))
    got = []

    stepio = popart.PyStepIOCallback(
        lambda tid, prefetch: x[next(position)],
        lambda tid: None,
        lambda tid: got.append(np.zeros(SAMPLE_SHAPE, np.float32)) or got[-1],
        lambda tid: None,
    )
    session.run(stepio)
    assert len(got) == 1
    np.testing.assert_allclose(got[0], affine_ref(x).sum(axis=0), rtol=1e-5)


def test_anchor_on_intermediate_of_fused_pattern():
    """Compile-time fusions (MatMul+Add) keep anchored intermediates (F35)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(17)
    weight = rng.standard_normal((3, 4)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["mm"]),
         helper.make_node("Add", ["mm", "B"], ["y"])],
        "mm_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    session = make_session(["mm", "y"], bps=3, model=model)
    x = step_input(3, seed=18, shape=(2, 3))
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    np.testing.assert_allclose(anchors["mm"], x @ weight, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(anchors["y"], x @ weight + bias, rtol=1e-5, atol=1e-6)
