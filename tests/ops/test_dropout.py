"""Dropout in an inference graph (spec §6.1, F78; DESIGN decision 5): the identity with an
all-ones mask, at every registered version, whatever ratio/is_test/training_mode say."""

import numpy as np
import onnx.defs
import pytest

from popart_backend.ops.registry import registered_versions
from tests.helpers import check_op, one_op_model, rand, run_popart


def _identity(x, *rest):
    mask_dtype = np.bool_
    return [x, np.ones(x.shape, dtype=mask_dtype)]


@pytest.mark.parametrize("version", registered_versions("Dropout"))
@pytest.mark.parametrize("num_outputs", [1, 2])
def test_dropout_inference_identity_f78(version, num_outputs):
    x = rand(3, 4, 5)
    attrs = {}
    if version < 12:
        attrs["ratio"] = 0.3
    if version == 1:
        attrs["consumed_inputs"] = [0]
    # The mask has the data type before version 10, BOOL after. onnxruntime's Dropout-7/10
    # return an all-False mask; ONNX's reference (and we) return all ones, so those versions
    # compare with the ONNX semantics directly.
    mask_dtype = x.dtype if version < 10 else np.bool_
    ref = None
    if version < 12:
        ref = lambda x: [x, np.ones(x.shape, mask_dtype)][:num_outputs]  # noqa: E731
    outs = check_op("Dropout", [x], attrs, opset=version, num_outputs=num_outputs, ref=ref)
    np.testing.assert_array_equal(outs[0], x)
    if num_outputs == 2:
        assert outs[1].dtype == mask_dtype
        assert outs[1].all()


@pytest.mark.parametrize("version", [12, 13])
def test_dropout_training_mode_input_is_ignored_in_inference(version):
    """training_mode=True as a constant: the inference session still runs the identity."""
    x = rand(4, 6)
    outs = check_op("Dropout", [x, np.array(0.5, np.float32), np.array(True)], opset=version,
                    num_outputs=2, const_inputs=(1, 2), ref=_identity)
    np.testing.assert_array_equal(outs[0], x)


@pytest.mark.parametrize("version", [6])
def test_dropout_is_test_zero_is_identity(version):
    x = rand(2, 3)
    check_op("Dropout", [x], {"is_test": 0, "ratio": 0.9}, opset=version, ref=lambda x: x)


def test_dropout_f16_and_mask_only():
    x = rand(2, 3, dtype=np.float16)
    check_op("Dropout", [x], opset=13, num_outputs=2)
    model, feeds = one_op_model("Dropout", [x], opset=13, num_outputs=2, output_names=["", "mask"])
    del model.graph.output[0]
    assert run_popart(model, feeds, outputs=["mask"])["mask"].all()


@pytest.mark.parametrize("op", ["Dropout"])
def test_every_onnx_version_up_to_28_is_registered_f82(op):
    expected = sorted({
        s.since_version
        for s in onnx.defs.get_all_schemas_with_history()
        if s.name == op and s.domain == "" and s.since_version <= 28
    })
    assert registered_versions(op) == expected
