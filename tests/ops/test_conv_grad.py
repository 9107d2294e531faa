"""Gradients of Conv and ConvTranspose against torch.autograd (issue #3 item 2, F49)."""

import pytest
import torch.nn.functional as F

from tests.helpers import check_grad, rand

TOL = dict(rtol=1e-4, atol=1e-4)


def _conv_ref(n, strides, pads, dilations, group):
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[n]
    begin, end = pads[:n], pads[n:]

    def ref(x, w, b=None):
        if begin != end:
            pad = []
            for bg, e in zip(reversed(begin), reversed(end)):
                pad += [bg, e]
            return fn(F.pad(x, pad), w, b, strides, 0, dilations, group)
        return fn(x, w, b, strides, tuple(begin), dilations, group)

    return ref


@pytest.mark.parametrize("n,strides,pads,dilations,group,bias", [
    (2, (1, 1), (0, 0, 0, 0), (1, 1), 1, True),
    (2, (2, 1), (1, 1, 1, 1), (1, 1), 1, True),
    (2, (1, 2), (1, 0, 2, 1), (1, 1), 1, False),   # asymmetric pads
    (2, (1, 1), (2, 2, 2, 2), (2, 2), 1, True),    # dilation
    (2, (2, 2), (1, 1, 1, 1), (1, 1), 2, True),    # groups
    (2, (1, 1), (1, 1, 1, 1), (1, 1), 4, False),   # depthwise
    (1, (2,), (1, 2), (1,), 1, True),
    (3, (1, 2, 1), (1, 0, 1, 1, 0, 1), (1, 1, 2), 2, True),
])
def test_conv_grad(n, strides, pads, dilations, group, bias):
    spatial = {1: (9,), 2: (7, 8), 3: (5, 6, 7)}[n]
    kernel = {1: (3,), 2: (3, 2), 3: (2, 3, 2)}[n]
    x = rand(2, 4, *spatial)
    w = rand(6 if group != 4 else 4, 4 // group, *kernel)
    inputs = [x, w, rand(w.shape[0])] if bias else [x, w]
    attrs = {"strides": list(strides), "pads": list(pads), "dilations": list(dilations),
             "group": group}
    check_grad("Conv", inputs, attrs, ref=_conv_ref(n, strides, pads, dilations, group), **TOL)


def test_conv_grad_auto_pad_same_upper():
    x, w = rand(1, 2, 6, 6), rand(3, 2, 3, 3)
    # SAME_UPPER with stride 2 on 6: total pad 1, all at the end.
    ref = lambda x, w: F.conv2d(F.pad(x, (0, 1, 0, 1)), w, None, 2)  # noqa: E731
    check_grad("Conv", [x, w], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, ref=ref, **TOL)


@pytest.mark.parametrize("wrt", [[0], [1], [2], [1, 2]])
def test_conv_grad_subsets(wrt):
    inputs = [rand(2, 3, 5, 5), rand(4, 3, 3, 3), rand(4)]
    check_grad("Conv", inputs, {"pads": [1, 1, 1, 1]}, wrt=wrt,
               ref=lambda x, w, b: F.conv2d(x, w, b, 1, 1), **TOL)


@pytest.mark.parametrize("n,strides,pads,out_pad,dilations,group,bias", [
    (2, (2, 2), (0, 0, 0, 0), (0, 0), (1, 1), 1, True),
    (2, (2, 2), (1, 1, 1, 1), (1, 1), (1, 1), 1, True),
    (2, (1, 2), (0, 1, 0, 1), (0, 0), (2, 1), 2, False),
    (1, (3,), (1, 1), (2,), (1,), 1, True),
    (3, (2, 1, 1), (0, 0, 0, 0, 0, 0), (0, 0, 0), (1, 1, 1), 1, True),
])
def test_conv_transpose_grad(n, strides, pads, out_pad, dilations, group, bias):
    spatial = {1: (5,), 2: (4, 5), 3: (3, 4, 3)}[n]
    kernel = {1: (3,), 2: (3, 3), 3: (2, 2, 3)}[n]
    x = rand(2, 4, *spatial)
    w = rand(4, 6 // group, *kernel)
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[n]
    ref = lambda x, w, b=None: fn(x, w, b, strides, pads[:n], out_pad, group, dilations)  # noqa
    inputs = [x, w, rand(6)] if bias else [x, w]
    attrs = {"strides": list(strides), "pads": list(pads), "output_padding": list(out_pad),
             "dilations": list(dilations), "group": group}
    check_grad("ConvTranspose", inputs, attrs, ref=ref, **TOL)


def test_conv_transpose_grad_asymmetric_pads():
    """Uneven pads take the forward's crop path; compare with a full transpose then a crop."""
    x, w, b = rand(1, 2, 4, 4), rand(2, 3, 3, 3), rand(3)

    def ref(x, w, b):
        full = F.conv_transpose2d(x, w, b, 2)
        return full[:, :, 2:full.shape[2] - 0, 1:full.shape[3] - 3]

    check_grad("ConvTranspose", [x, w, b], {"strides": [2, 2], "pads": [2, 1, 0, 3]}, ref=ref,
               **TOL)
