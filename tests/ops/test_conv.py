"""Conv and ConvTranspose (spec §6.1, F78) against onnxruntime, at every registered version."""

import numpy as np
import onnx.defs
import pytest
import torch

from popart_backend.errors import ShapeError
from popart_backend.ops.registry import registered_versions
from tests.helpers import check_op, one_op_model, rand, run_popart

# (x shape, w shape, attrs, bias)
CONV_CASES = [
    ((1, 3, 7, 7), (4, 3, 3, 3), {}, True),
    ((2, 4, 8, 6), (6, 2, 3, 3), {"group": 2, "strides": [2, 1]}, True),
    ((1, 4, 9, 9), (4, 1, 3, 3), {"group": 4, "dilations": [2, 2], "pads": [2, 2, 2, 2]}, False),
    ((1, 2, 7, 8), (3, 2, 3, 2), {"pads": [1, 0, 2, 1]}, True),  # asymmetric
    ((1, 2, 7, 8), (3, 2, 3, 3), {"pads": [0, 2, 1, 0], "strides": [2, 3]}, False),
    ((1, 2, 7, 8), (3, 2, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, True),
    ((1, 2, 6, 8), (3, 2, 4, 2), {"auto_pad": "SAME_LOWER", "strides": [1, 3]}, True),
    ((1, 2, 6, 8), (3, 2, 4, 4), {"auto_pad": "SAME_UPPER"}, False),
    ((1, 2, 7, 8), (3, 2, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}, True),
    ((1, 2, 7, 8), (3, 2, 3, 3), {"kernel_shape": [3, 3], "dilations": [2, 1]}, True),
    ((2, 3, 10), (4, 3, 3), {"strides": [2], "pads": [1, 2]}, True),  # 1-D
    ((2, 4, 10), (4, 2, 5), {"group": 2, "dilations": [2], "pads": [4, 3]}, False),
    ((1, 2, 5, 6, 4), (3, 2, 3, 3, 2), {"pads": [1, 1, 0, 1, 0, 1]}, True),  # 3-D
    ((1, 4, 5, 6, 4), (4, 2, 2, 3, 3), {"group": 2, "strides": [2, 1, 2]}, False),
]


def _ids(cases):
    return [f"{len(c[0]) - 2}d-{c[2]}-{'b' if c[3] else 'nob'}" for c in cases]


@pytest.mark.parametrize("version", registered_versions("Conv"))
@pytest.mark.parametrize("x_shape,w_shape,attrs,bias", CONV_CASES, ids=_ids(CONV_CASES))
def test_conv_f78(version, x_shape, w_shape, attrs, bias):
    inputs = [rand(*x_shape), rand(*w_shape)] + ([rand(w_shape[0])] if bias else [])
    check_op("Conv", inputs, attrs=attrs, opset=version, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("auto_pad,pads", [("SAME_UPPER", (2, 3)), ("SAME_LOWER", (3, 2))])
def test_conv_auto_pad_with_dilation(auto_pad, pads):
    """onnxruntime refuses dilation with SAME_*; ONNX pads the dilated extent (torch reference)."""
    x, w = rand(2, 4, 10), rand(4, 2, 4)

    def ref(x, w):
        xp = torch.nn.functional.pad(torch.from_numpy(x), pads)
        return torch.nn.functional.conv1d(xp, torch.from_numpy(w), stride=2, dilation=2, groups=2).numpy()

    check_op("Conv", [x, w], attrs={"auto_pad": auto_pad, "strides": [2], "dilations": [2], "group": 2},
             opset=11, ref=ref, rtol=1e-5, atol=1e-6)


def test_conv_f16():
    x, w, b = rand(1, 4, 6, 6, dtype=np.float16), rand(4, 2, 3, 3, dtype=np.float16), rand(4, dtype=np.float16)

    def ref(x, w, b):
        y = torch.nn.functional.conv2d(*(torch.from_numpy(v).float() for v in (x, w, b)),
                                       padding=(1, 1), groups=2)
        return y.half().numpy()

    check_op("Conv", [x, w, b], attrs={"pads": [1, 1, 1, 1], "group": 2}, opset=11, ref=ref,
             rtol=2e-3, atol=2e-3)


def test_conv_channel_mismatch_error():
    model, feeds = one_op_model("Conv", [rand(1, 3, 5, 5), rand(4, 2, 3, 3)], opset=11)
    with pytest.raises(ShapeError, match=r"Conv .*channel mismatch.*f32\[1,3,5,5\].*f32\[4,2,3,3\]"):
        run_popart(model, feeds)


def test_conv_kernel_shape_mismatch_error():
    model, feeds = one_op_model("Conv", [rand(1, 2, 5, 5), rand(4, 2, 3, 3)],
                                {"kernel_shape": [2, 2]}, opset=11)
    with pytest.raises(ShapeError, match="kernel_shape"):
        run_popart(model, feeds)


# (x shape, w shape, attrs, bias)
CONV_T_CASES = [
    ((1, 3, 4, 4), (3, 2, 3, 3), {}, True),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2]}, True),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 3], "output_padding": [1, 2]}, False),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "pads": [1, 0, 0, 1]}, True),  # asymmetric
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "pads": [2, 1, 0, 0]}, True),
    ((1, 4, 4, 4), (4, 1, 3, 3), {"group": 2, "dilations": [2, 2]}, True),
    ((1, 4, 3, 5), (4, 3, 2, 3), {"group": 4, "strides": [1, 2], "pads": [1, 1, 1, 1]}, False),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [8, 10]}, True),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [9, 11]}, False),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [3, 2], "output_shape": [10, 9]}, True),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "VALID"}, True),
    ((2, 3, 6), (3, 2, 4), {"strides": [2], "pads": [1, 2]}, True),  # 1-D
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 1, 0, 1]}, True),
]


@pytest.mark.parametrize("version", registered_versions("ConvTranspose"))
@pytest.mark.parametrize("x_shape,w_shape,attrs,bias", CONV_T_CASES, ids=_ids(CONV_T_CASES))
def test_conv_transpose_f78(version, x_shape, w_shape, attrs, bias):
    inputs = [rand(*x_shape), rand(*w_shape)]
    if bias:
        inputs.append(rand(w_shape[1] * attrs.get("group", 1)))
    check_op("ConvTranspose", inputs, attrs=attrs, opset=version, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_auto_pad_spec(auto_pad):
    """auto_pad SAME_*: output = input * stride; the odd pad unit goes to the end for
    SAME_UPPER and to the start for SAME_LOWER (ONNX spec text; compared with torch)."""
    x, w, b = rand(1, 2, 4, 5), rand(2, 3, 3, 3), rand(3)
    model, feeds = one_op_model("ConvTranspose", [x, w, b], {"strides": [2, 2], "auto_pad": auto_pad},
                                opset=11)
    out = run_popart(model, feeds)["out0"]
    full = torch.nn.functional.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w),
                                                torch.from_numpy(b), stride=2).numpy()
    # full is 9 x 11, the target 8 x 10: one unit of padding per spatial dim.
    start = 0 if auto_pad == "SAME_UPPER" else 1
    np.testing.assert_allclose(out, full[:, :, start:start + 8, start:start + 10], rtol=1e-6)


def test_conv_transpose_channel_mismatch_error():
    model, feeds = one_op_model("ConvTranspose", [rand(1, 3, 4, 4), rand(2, 3, 3, 3)], opset=11)
    with pytest.raises(ShapeError, match=r"ConvTranspose .*channel mismatch"):
        run_popart(model, feeds)


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_every_onnx_version_up_to_28_is_registered_f82(op):
    expected = sorted({
        s.since_version
        for s in onnx.defs.get_all_schemas_with_history()
        if s.name == op and s.domain == "" and s.since_version <= 28
    })
    assert registered_versions(op) == expected
