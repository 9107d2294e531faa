"""RMSNormalization-23, RotaryEmbedding-23, Swish-24 and SwiGLU-28 (F78: ai.onnx ops and
versions): forward against onnxruntime (which has the first three) or torch formulas from the
ONNX text, and gradients against torch.autograd."""

import numpy as np
import pytest
import torch

from popart_backend.errors import ShapeError
from tests.helpers import check_grad, check_op, rand

TOL = {"rtol": 1e-4, "atol": 1e-5}


def ref_rms(x, scale, axis=-1, epsilon=1e-5):
    x = torch.as_tensor(x)
    axes = tuple(range(axis % x.dim(), x.dim()))
    return x / torch.sqrt(x.square().mean(axes, keepdim=True) + epsilon) * torch.as_tensor(scale)


@pytest.mark.parametrize("shape,axis,scale_shape", [
    ((2, 3, 4), -1, (4,)), ((2, 3, 4), 1, (3, 4)), ((2, 3, 4, 5), 0, (1, 4, 5)), ((5, 6), -2, (6,)),
])
def test_rms_normalization(shape, axis, scale_shape):
    """F78: RMSNormalization-23 with axis and a broadcast scale, against onnxruntime."""
    check_op("RMSNormalization", [rand(*shape), rand(*scale_shape)],
             {"axis": axis, "epsilon": 1e-3}, opset=23, **TOL)


def test_rms_normalization_float16_stash():
    """F78: float16 X normalized in float32 (stash_type 1), cast back, then scaled."""
    x, s = rand(3, 8, dtype=np.float16), rand(8, dtype=np.float16)
    check_op("RMSNormalization", [x, s], {}, opset=23,
             ref=lambda x, s: (ref_rms(x.astype(np.float32), np.float32(1)).numpy()
                               .astype(np.float16) * s))


@pytest.mark.parametrize("axis,scale_shape", [(-1, (4,)), (1, (3, 1)), (0, (2, 3, 4))])
def test_rms_normalization_grad(axis, scale_shape):
    """F78 gradients: dX and dScale (summed over broadcast axes)."""
    check_grad("RMSNormalization", [rand(2, 3, 4), rand(*scale_shape)], {"axis": axis},
               opset=23, ref=lambda x, s: ref_rms(x, s, axis), **TOL)


def ref_rope(x, cos, sin, ids=None, interleaved=0, dim=0, heads=None):
    """The ONNX text: rotate pairs (i, i + dim/2), or (2i, 2i+1) when interleaved."""
    x, cos, sin = (torch.as_tensor(t) for t in (x, cos, sin))
    if ids is not None:
        ids = torch.as_tensor(ids)
        cos, sin = cos[ids], sin[ids]
    shape = x.shape
    if x.dim() == 3:  # [B, S, H*D] -> [B, H, S, D]
        x = x.reshape(shape[0], shape[1], heads, -1).transpose(1, 2)
    dim = dim or x.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([a * cos - b * sin, a * sin + b * cos], -1).reshape(rot.shape)
    else:
        a, b = rot.chunk(2, -1)
        out = torch.cat([a * cos - b * sin, a * sin + b * cos], -1)
    out = torch.cat([out, rest], -1)
    if len(shape) == 3:
        out = out.transpose(1, 2).reshape(shape)
    return out


ROPE_CASES = {
    "4d_ids": (lambda: [rand(2, 3, 4, 8), rand(10, 4), rand(10, 4),
                        np.array([[0, 1, 2, 3], [5, 2, 2, 9]], np.int64)], {}),
    "4d_ids_interleaved_partial": (
        lambda: [rand(2, 2, 3, 8), rand(6, 2), rand(6, 2), np.array([[0, 1, 2], [3, 4, 5]])],
        {"interleaved": 1, "rotary_embedding_dim": 4}),
    "3d_no_ids": (lambda: [rand(2, 3, 12), rand(2, 3, 3), rand(2, 3, 3)], {"num_heads": 2}),
    "3d_no_ids_partial": (lambda: [rand(2, 3, 16), rand(2, 3, 2), rand(2, 3, 2)],
                          {"num_heads": 2, "rotary_embedding_dim": 4, "interleaved": 1}),
}


def _rope_ref(attrs):
    return lambda x, c, s, ids=None: ref_rope(
        x, c, s, ids, attrs.get("interleaved", 0), attrs.get("rotary_embedding_dim", 0),
        attrs.get("num_heads"))


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rotary_embedding(case):
    """F78: RotaryEmbedding-23 (position_ids or per-token caches, interleaved, partial
    rotation, 3-D with num_heads) against onnxruntime."""
    make, attrs = ROPE_CASES[case]
    inputs = make()
    if len(inputs) == 4:
        inputs[3] = inputs[3].astype(np.int64)
    check_op("RotaryEmbedding", inputs, attrs, opset=23, **TOL)


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rotary_embedding_grad(case):
    """F78 gradients: dX and the cos / sin caches (scattered back to the positions)."""
    make, attrs = ROPE_CASES[case]
    inputs = make()
    if len(inputs) == 4:
        inputs[3] = inputs[3].astype(np.int64)
    check_grad("RotaryEmbedding", inputs, attrs, opset=23, ref=_rope_ref(attrs), **TOL)


def test_rotary_embedding_bad_cache():
    with pytest.raises(ShapeError, match="RotaryEmbedding.*cos"):
        check_op("RotaryEmbedding", [rand(1, 2, 3, 8), rand(1, 3, 3), rand(1, 3, 3)], {},
                 opset=23)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_swish(alpha):
    """F78: Swish-24 against onnxruntime, and its gradient."""
    x = rand(3, 4, low=-4, high=4)
    check_op("Swish", [x], {"alpha": alpha}, opset=24, **TOL)
    check_grad("Swish", [x], {"alpha": alpha}, opset=24,
               ref=lambda x: x * torch.sigmoid(alpha * x), **TOL)


@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_swiglu(alpha):
    """F78: SwiGLU-28 = Swish_alpha(A) * B (onnxruntime lacks opset 28: torch formula), and
    the gradients of both inputs."""
    a, b = rand(2, 5, low=-3, high=3), rand(2, 5)

    def ref(a, b):
        a, b = torch.as_tensor(a), torch.as_tensor(b)
        return a * torch.sigmoid(alpha * a) * b

    check_op("SwiGLU", [a, b], {"alpha": alpha}, opset=28, ref=lambda a, b: ref(a, b).numpy(),
             **TOL)
    check_grad("SwiGLU", [a, b], {"alpha": alpha}, opset=28, ref=ref, **TOL)


def test_swiglu_shapes_must_match():
    with pytest.raises(ShapeError, match="SwiGLU.*one shape"):
        check_op("SwiGLU", [rand(2, 4), rand(4)], {}, opset=28)
