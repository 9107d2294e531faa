"""The resource guard (popart_backend/limits.py): declared sizes, folded constants, initializer
totals, a step's host buffers, Loop trip counts and subgraph depth are checked before anything
is allocated or run, with the bytes asked for in the message."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart
from popart_backend.limits import ENV_VAR, max_bytes

from .models import SHAPE, load_and_run, make_model, value
from .test_fuzz_models import nested_ifs


@pytest.fixture
def limit_100mb(monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(100 << 20))


def test_default_limit_is_half_the_host_memory(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert max_bytes() == host // 2


@pytest.mark.parametrize("text,expected", [("12345", 12345), ("4G", 4 << 30), ("64MiB", 64 << 20)])
def test_limit_from_the_environment(monkeypatch, text, expected):
    monkeypatch.setenv(ENV_VAR, text)
    assert max_bytes() == expected


@pytest.mark.parametrize("text", ["lots", "-5", "0", "1.5G"])
def test_a_bad_limit_is_refused(monkeypatch, text):
    monkeypatch.setenv(ENV_VAR, text)
    with pytest.raises(popart.popart_exception, match=ENV_VAR):
        max_bytes()


def test_constant_of_shape_folding_is_refused_before_allocating(limit_100mb):
    """A ~100-byte model asking constant folding for a 1 GiB constant."""
    shape = numpy_helper.from_array(np.array([16384, 16384], np.int64), "shape")
    model = make_model([helper.make_node("ConstantOfShape", ["shape"], ["y"], name="zeros")],
                       [shape], outputs=[value("y", None)])
    assert len(model.SerializeToString()) < 200
    with pytest.raises(popart.ResourceLimitError, match=str(16384 * 16384 * 4)):
        load_and_run(model)


def test_declared_initializer_size_is_refused_before_reading(limit_100mb):
    init = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2**40])
    model = make_model([helper.make_node("Identity", ["w"], ["y"])], [init],
                       outputs=[value("y", None)])
    with pytest.raises(popart.ResourceLimitError, match=str(4 * 2**40)):
        load_and_run(model)


def test_total_initializer_bytes_are_bounded(limit_100mb):
    """Each initializer is under the limit, together they are over it (nothing is read)."""
    inits = [TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[10 << 20])
             for i in range(3)]
    model = make_model([helper.make_node("Sum", ["w0", "w1", "w2"], ["y"])], inits,
                       outputs=[value("y", None)])
    with pytest.raises(popart.ResourceLimitError, match=str(3 * 4 * (10 << 20))):
        load_and_run(model)


def test_declared_input_size_is_refused(limit_100mb):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], inputs=[value("x", [2**40])],
                       outputs=[value("y", None)])
    with pytest.raises(popart.ResourceLimitError, match="Input 'x'"):
        load_and_run(model)


def test_batches_per_step_alone_is_bounded():
    with pytest.raises(popart.ResourceLimitError, match="batchesPerStep = 1099511627776"):
        popart.DataFlow(2**40)


def test_batches_per_step_times_stream_sizes_is_bounded(limit_100mb):
    """1000 batches of a 1 MiB input and a 1 MiB anchor: 2 GiB of host buffers a step."""
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], inputs=[value("x", [256, 1024])],
                       outputs=[value("y", [256, 1024])])
    session = popart.InferenceSession(
        model, popart.DataFlow(1000, {"y": popart.AnchorReturnType("All")}),
        popart.DeviceManager().createCpuDevice())
    with pytest.raises(popart.ResourceLimitError, match="host input and anchor buffers"):
        session.prepareDevice()


def test_loop_trip_count_is_bounded():
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c2"]), helper.make_node("Neg", ["v"], ["v2"])],
        "body", [value("i", (), TensorProto.INT64), value("c", (), TensorProto.BOOL),
                 value("v")], [value("c2", (), TensorProto.BOOL), value("v2")])
    inits = [numpy_helper.from_array(np.array(10**12, np.int64), "trips"),
             numpy_helper.from_array(np.array(True), "go")]
    model = make_model([helper.make_node("Loop", ["trips", "go", "x"], ["y"], name="loop",
                                         body=body)], inits, [value("x")], [value("y")])
    with pytest.raises(popart.ResourceLimitError, match="1000000000000 iterations"):
        load_and_run(model)


def test_subgraph_depth_is_bounded():
    with pytest.raises(popart.ResourceLimitError, match="more than 64 levels"):
        load_and_run(nested_ifs(70))


def test_models_under_the_limit_still_run(limit_100mb):
    shape = numpy_helper.from_array(np.array(SHAPE, np.int64), "shape")
    model = make_model([helper.make_node("ConstantOfShape", ["shape"], ["c"],
                                         value=numpy_helper.from_array(np.array([3.0], np.float32))),
                        helper.make_node("Mul", ["x", "c"], ["y"])],
                       [shape], [value("x")], [value("y")])
    out = load_and_run(model)
    np.testing.assert_array_equal(out["y"], np.zeros(SHAPE, np.float32) * 3)


def _runtime_loop(monkeypatch, trips_input: bool):
    """A Loop whose trip count (or whose condition) is a stream input: known only at run time."""
    from popart_backend.limits import LOOP_ENV_VAR

    monkeypatch.setenv(LOOP_ENV_VAR, "50")
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c2"]), helper.make_node("Neg", ["v"], ["v2"])],
        "body", [value("i", (), TensorProto.INT64), value("c", (), TensorProto.BOOL),
                 value("v")], [value("c2", (), TensorProto.BOOL), value("v2")])
    loop_inputs = ["trips", "go", "x"] if trips_input else ["", "go", "x"]
    graph_inputs = [value("go", (), TensorProto.BOOL), value("x")]
    if trips_input:
        graph_inputs.insert(0, value("trips", (), TensorProto.INT64))
    model = make_model([helper.make_node("Loop", loop_inputs, ["y"], name="loop", body=body)],
                       [], graph_inputs, [value("y")])
    session = popart.InferenceSession(model, popart.DataFlow(1, {"y": popart.AnchorReturnType("All")}),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    out = session.initAnchorArrays()
    x = np.ones(SHAPE, np.float32)
    feeds = {"go": np.array(True), "x": x}

    def run(trips=None):
        if trips is not None:
            feeds["trips"] = np.array(trips, np.int64)
        session.run(popart.PyStepIO(feeds, out))
        return out["y"]

    return run, x


def test_loop_with_a_run_time_trip_count_is_bounded(monkeypatch):
    run, x = _runtime_loop(monkeypatch, trips_input=True)
    np.testing.assert_array_equal(run(3), -x)  # odd number of negations
    # Raised by the kernel while the step runs: reported as a run-time error of the Loop op.
    # (INT64 inputs stream as INT32, enableSupportedDataTypeCasting: the largest value.)
    with pytest.raises(popart.popart_runtime_error, match="trip count M is 2147483647"):
        run(2**31 - 1)
    np.testing.assert_array_equal(run(4), x)  # the session is still usable


def test_loop_whose_condition_never_ends_stops_at_the_limit(monkeypatch):
    run, _ = _runtime_loop(monkeypatch, trips_input=False)
    with pytest.raises(popart.popart_runtime_error, match="ResourceLimitError.*after 50 iterations"):
        run()
