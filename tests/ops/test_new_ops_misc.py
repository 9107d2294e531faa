"""CumProd, CenterCropPad, TensorScatter and Col2Im (issue #7, spec F78): forward against
onnxruntime, gradients against torch.autograd (or central differences) with check_grad."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from popart_backend.errors import ShapeError
from tests.helpers import check_grad, check_op, rand

TOL = {"rtol": 1e-4, "atol": 1e-5}


# --- CumProd -------------------------------------------------------------------------------------


def torch_cumprod(x, axis, exclusive, reverse):
    if reverse:
        x = x.flip(axis)
    if exclusive:
        x = torch.cat([torch.ones_like(x.narrow(axis, 0, 1)), x.narrow(axis, 0, x.shape[axis] - 1)],
                      axis)
    y = torch.cumprod(x, axis)
    return y.flip(axis) if reverse else y


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumprod(exclusive, reverse, axis):
    x = rand(3, 4, 5, low=0.5, high=1.5, seed=1)
    attrs = {"exclusive": exclusive, "reverse": reverse}
    check_op("CumProd", [x, np.array(axis, np.int64)], attrs, opset=26, const_inputs=(1,))
    check_grad("CumProd", [x, np.array(axis, np.int64)], attrs, opset=26, const_inputs=(1,),
               ref=lambda x, a: torch_cumprod(x, axis, exclusive, reverse), **TOL)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_cumprod_dtypes(dtype):
    x = rand(2, 6, low=-3, high=4, dtype=dtype, seed=2)
    check_op("CumProd", [x, np.array(1, np.int32)], {"exclusive": 1}, opset=26,
             const_inputs=(1,))


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod_grad_with_zeros(exclusive, reverse):
    """Zeros in the input: the gradient must not divide by them."""
    x = np.array([[2.0, 0.0, 3.0, 0.0, 4.0], [0.0, 1.5, -2.0, 0.5, 3.0]], np.float32)
    check_grad("CumProd", [x, np.array(1, np.int64)], {"exclusive": exclusive, "reverse": reverse},
               opset=26, const_inputs=(1,),
               ref=lambda x, a: torch_cumprod(x, 1, exclusive, reverse), **TOL)


# --- CenterCropPad -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,axes", [([5, 3, 4], None), ([2, 7, 4], None), ([2, 2], [0, -1]),
                                        ([6, 6], [1, 2]), ([4], [1])])
def test_center_crop_pad(shape, axes):
    x = rand(3, 4, 5, seed=3)
    attrs = {} if axes is None else {"axes": axes}
    target = np.array(shape, np.int64)
    check_op("CenterCropPad", [x, target], attrs, const_inputs=(1,))
    check_grad("CenterCropPad", [x, target], attrs, const_inputs=(1,))


def test_center_crop_pad_int_and_bool():
    x = rand(4, 3, low=-9, high=9, dtype=np.int32, seed=4)
    check_op("CenterCropPad", [x, np.array([2, 6], np.int64)], const_inputs=(1,))
    # An int32 shape (onnxruntime's function body rejects it): crop rows 1-2, pad columns 1 + 2.
    expected = np.zeros((2, 6), np.int32)
    expected[:, 1:4] = x[1:3]
    check_op("CenterCropPad", [x, np.array([2, 6], np.int32)], const_inputs=(1,),
             ref=lambda *_: expected)
    check_op("CenterCropPad", [rand(4, 3, dtype=np.bool_, seed=5), np.array([7, 2], np.int64)],
             const_inputs=(1,))


def test_center_crop_pad_shape_must_be_constant():
    with pytest.raises(ShapeError, match="CenterCropPad.*must be a constant"):
        check_op("CenterCropPad", [rand(3, 4, seed=6), np.array([2, 2], np.int64)])


def test_center_crop_pad_wrong_shape_length():
    with pytest.raises(ShapeError, match="CenterCropPad.*one size per axis"):
        check_op("CenterCropPad", [rand(3, 4, seed=6), np.array([2], np.int64)],
                 const_inputs=(1,))


# --- TensorScatter -------------------------------------------------------------------------------


def torch_tensor_scatter(past, update, indices, axis, circular):
    """Reference: the schema's loop over batch rows and update positions."""
    out = past.clone()
    axis = axis % past.dim()
    max_len, length = past.shape[axis], update.shape[axis]
    for b in range(past.shape[0]):
        start = 0 if indices is None else int(indices[b])
        for s in range(length):
            pos = (start + s) % max_len if circular else start + s
            out[b].select(axis - 1, pos).copy_(update[b].select(axis - 1, s))
    return out


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("past_shape,update_len,axis", [((2, 3, 6, 4), 2, -2), ((3, 5, 2), 3, 1),
                                                        ((2, 2, 4, 3), 4, 2)])
def test_tensor_scatter(mode, past_shape, update_len, axis):
    past = rand(*past_shape, seed=7)
    ax = axis % len(past_shape)
    update_shape = list(past_shape)
    update_shape[ax] = update_len
    update = rand(*update_shape, seed=8)
    max_len = past_shape[ax]
    high = max_len if mode == "circular" else max_len - update_len + 1
    indices = np.random.default_rng(9).integers(0, high, past_shape[0]).astype(np.int64)
    attrs = {"mode": mode, "axis": axis}
    circular = mode == "circular"
    check_op("TensorScatter", [past, update, indices], attrs, opset=24)
    check_op("TensorScatter", [past, update], attrs, opset=24)
    check_grad("TensorScatter", [past, update, indices], attrs, opset=24,
               ref=lambda p, u, i: torch_tensor_scatter(p, u, i, axis, circular), **TOL)


def test_tensor_scatter_errors():
    with pytest.raises(ShapeError, match="TensorScatter.*batch dimension"):
        check_op("TensorScatter", [rand(2, 3, seed=1), rand(1, 3, seed=2)], {"axis": 0},
                 opset=24)
    with pytest.raises(ShapeError, match="TensorScatter.*exceed"):
        check_op("TensorScatter", [rand(2, 3, 2, seed=1), rand(2, 4, 2, seed=2)], {"axis": 1},
                 opset=24)


# --- Col2Im --------------------------------------------------------------------------------------


COL2IM_CASES = [
    ([4, 5], [2, 2], {}),
    ([5, 5], [2, 3], {"strides": [2, 1]}),
    ([4, 4], [3, 3], {"pads": [1, 0, 1, 2]}),
    ([6, 5], [2, 2], {"dilations": [2, 1], "strides": [1, 2], "pads": [0, 1, 0, 0]}),
    ([3, 4, 3], [2, 2, 1], {}),
    ([7], [3], {"strides": [2], "pads": [1, 1]}),
]


def _col2im_inputs(image, block, attrs, channels=2, batch=2, seed=10):
    n = len(image)
    strides = attrs.get("strides", [1] * n)
    dilations = attrs.get("dilations", [1] * n)
    pads = attrs.get("pads", [0] * (2 * n))
    blocks = 1
    for i in range(n):
        size = image[i] + pads[i] + pads[i + n]
        blocks *= (size - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
    cols = rand(batch, channels * int(np.prod(block)), blocks, seed=seed)
    return [cols, np.array(image, np.int64), np.array(block, np.int64)]


@pytest.mark.parametrize("image,block,attrs", COL2IM_CASES)
def test_col2im(image, block, attrs):
    inputs = _col2im_inputs(image, block, attrs)
    if len(image) == 2:
        check_op("Col2Im", inputs, attrs, const_inputs=(1, 2))
    else:  # onnxruntime's Col2Im is 2-D only: the 2-D result of folding with a unit dim
        padded = _unit_dim_ref(inputs, image, block, attrs)
        check_op("Col2Im", inputs, attrs, const_inputs=(1, 2), ref=lambda *_: padded)
    check_grad("Col2Im", inputs, attrs, const_inputs=(1, 2), **TOL)


def _unit_dim_ref(inputs, image, block, attrs):
    """N-D Col2Im by torch: 1-D as 2-D with a unit first dim; 3-D with a unit third block dim
    as a 2-D fold per depth slice."""
    cols = torch.from_numpy(inputs[0])
    if len(image) == 1:
        pads = attrs.get("pads", [0, 0])
        out = F.fold(cols, (1, image[0]), (1, block[0]), stride=(1, attrs["strides"][0]),
                     padding=0 if pads == [0, 0] else (0, pads[0]))
        return out[:, :, 0].numpy()
    assert block[2] == 1 and not attrs
    n, ck, _ = cols.shape
    c = ck // (block[0] * block[1])
    depth = image[2]
    per = cols.reshape(n, ck, -1, depth)
    slices = [F.fold(per[..., d], image[:2], block[:2]) for d in range(depth)]
    return torch.stack(slices, -1).reshape(n, c, *image).numpy()


def test_col2im_matches_torch_fold():
    inputs = _col2im_inputs([6, 5], [2, 3], {"strides": [2, 1], "pads": [1, 1, 1, 1]},
                            channels=3, batch=1, seed=11)
    ref = F.fold(torch.from_numpy(inputs[0]), (6, 5), (2, 3), stride=(2, 1), padding=(1, 1))
    check_op("Col2Im", inputs, {"strides": [2, 1], "pads": [1, 1, 1, 1]}, const_inputs=(1, 2),
             ref=lambda *_: ref.numpy())


def test_col2im_wrong_block_count():
    cols = rand(1, 4, 7, seed=12)
    with pytest.raises(ShapeError, match="Col2Im.*must be \\[N, C \\* 4, 9\\]"):
        check_op("Col2Im", [cols, np.array([4, 4], np.int64), np.array([2, 2], np.int64)],
                 const_inputs=(1, 2))
