"""``enableSupportedDataTypeCasting`` (default True): INT64 / UINT64 host inputs travel to the
IPU as INT32 / UINT32, so values outside that range are refused at the stream; set to False,
a model with such inputs is refused, the IPU having no 64-bit integers. In-range results
are checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.errors import StepIOError


def _session(dtype: str, casting: bool = True):
    b = popart.Builder(opsets={"ai.onnx": 11})
    idx = b.addInputTensor(popart.TensorInfo(dtype, [3]), "idx")
    out = b.aiOnnx.cast([b.aiOnnx.mul([idx, idx])], "FLOAT")
    opts = popart.SessionOptions()
    opts.enableSupportedDataTypeCasting = casting
    return popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, [out]),
                                   popart.DeviceManager().createCpuDevice(), userOptions=opts), \
        idx, out


@pytest.mark.parametrize("dtype, np_dtype, limit", [
    ("INT64", np.int64, np.iinfo(np.int32).max), ("UINT64", np.uint64, np.iinfo(np.uint32).max),
])
def test_64bit_inputs_are_range_checked_at_the_stream(dtype, np_dtype, limit):
    session, idx, out = _session(dtype)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    good = np.array([5, 0, 2], np_dtype)
    session.run(popart.PyStepIO({idx: good}, anchors))
    np.testing.assert_array_equal(anchors[out], (good * good).astype(np.float32))
    bad = np.array([0, int(limit) + 1, 1], np_dtype)
    with pytest.raises(StepIOError, match=rf"Input '{idx}' \({dtype}\) holds {int(limit) + 1}, "
                       rf"outside the U?INT32 range"):
        session.run(popart.PyStepIO({idx: bad}, anchors))


def test_negative_int64_below_the_int32_range_is_refused():
    session, idx, _ = _session("INT64")
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    bad = np.array([0, -2 ** 40, 1], np.int64)
    with pytest.raises(StepIOError, match=str(-2 ** 40)):
        session.run(popart.PyStepIO({idx: bad}, anchors))


def test_without_casting_64bit_inputs_are_refused():
    with pytest.raises(popart.popart_exception, match=r"Inputs 'idx\w*' \(INT64\) are 64-bit "
                       r"integers(.|\n)*enableSupportedDataTypeCasting is False"):
        _session("INT64", casting=False)
    session, idx, out = _session("INT32", casting=False)  # 32-bit inputs are fine
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({idx: np.array([1, 1, 3], np.int32)}, anchors))
    np.testing.assert_array_equal(anchors[out], np.array([1, 1, 9], np.float32))
