"""Softmax, LogSoftmax and Hardmax (spec §6.1, F78): versions 1/11 coerce to 2-D at ``axis``,
version 13 normalizes along one axis. Compared with onnxruntime."""

import numpy as np
import onnx.defs
import pytest

from popart_backend.errors import ShapeError
from popart_backend.ops.registry import registered_versions
from tests.helpers import check_op, one_op_model, rand, run_popart

OPS = ["Softmax", "LogSoftmax", "Hardmax"]
AXES = [None, 0, 1, 2, -1, -3]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("version", registered_versions("Softmax"))
@pytest.mark.parametrize("axis", AXES)
def test_softmax_family_f78(op, version, axis):
    assert registered_versions(op) == registered_versions("Softmax")
    attrs = {} if axis is None else {"axis": axis}
    check_op(op, [rand(2, 3, 4, low=-3, high=3)], attrs, opset=version, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("version", [11, 13])
def test_softmax_family_f16(op, version):
    check_op(op, [rand(3, 5, dtype=np.float16, low=-3, high=3)], {"axis": 1}, opset=version)


@pytest.mark.parametrize("version", [1, 11, 13])
def test_hardmax_first_maximum_wins(version):
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]], dtype=np.float32)
    (y,) = check_op("Hardmax", [x], {"axis": 1}, opset=version)
    np.testing.assert_array_equal(y, [[0, 1, 0, 0], [1, 0, 0, 0]])


def test_softmax_coerced_differs_from_single_axis():
    """Same model, two opsets: the 2-D coercion of version 11 really is kept."""
    x = rand(2, 3, 4)
    (old,) = check_op("Softmax", [x], {"axis": 1}, opset=11)
    (new,) = check_op("Softmax", [x], {"axis": 1}, opset=13)
    np.testing.assert_allclose(old.reshape(2, 12).sum(1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(new.sum(1), 1.0, rtol=1e-5)
    assert not np.allclose(old, new)


def test_softmax_axis_error():
    model, feeds = one_op_model("Softmax", [rand(2, 3)], {"axis": 2}, opset=13)
    with pytest.raises(ShapeError, match="Softmax .*axis 2"):
        run_popart(model, feeds)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_every_onnx_version_up_to_21_is_registered_f82(op):
    expected = sorted({
        s.since_version
        for s in onnx.defs.get_all_schemas_with_history()
        if s.name == op and s.domain == "" and s.since_version <= 21
    })
    assert registered_versions(op) == expected
