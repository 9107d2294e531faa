"""``builder.schedulePriority(p)``: among ops that are ready, higher priority is scheduled first
(PopART's ``__schedule_priority``), the numbers are unchanged."""

import numpy as np

import popart_backend as popart


def _model(priority: float | None):
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [4]), "x")
    a = builder.aiOnnx.relu([x], "first_created")
    if priority is None:
        b = builder.aiOnnx.neg([x], "second_created")
    else:
        with builder.schedulePriority(priority):
            b = builder.aiOnnx.neg([x], "second_created")
    y = builder.aiOnnx.add([a, b])
    builder.addOutputTensor(y)
    return builder.getModelProto(), y


def _schedule_and_result(priority):
    proto, y = _model(priority)
    session = popart.InferenceSession(proto, popart.DataFlow(1, {y: popart.AnchorReturnType("All")}),
                                      popart.DeviceManager().createCpuDevice())
    order = [op.settings.name for op in session.getIr().main.topo_order()]
    session.prepareDevice()
    x = np.array([-1.0, 0.5, 2.0, -3.0], dtype=np.float32)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    np.testing.assert_array_equal(anchors[y], np.maximum(x, 0) - x)
    return [n for n in order if n in ("first_created", "second_created")]


def test_higher_priority_is_scheduled_first_and_numbers_agree():
    assert _schedule_and_result(None) == ["first_created", "second_created"]
    assert _schedule_and_result(5.0) == ["second_created", "first_created"]
    assert _schedule_and_result(-5.0) == ["first_created", "second_created"]
