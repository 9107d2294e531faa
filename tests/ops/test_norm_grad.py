"""Gradients of BatchNormalization (running statistics), LayerNormalization,
InstanceNormalization and GroupNormalization against torch.autograd (issue #3 item 2, F49).
BatchNormalization's training form is tested with its pass in
tests/transforms/test_training_semantics.py."""

import pytest
import torch.nn.functional as F

from tests.helpers import check_grad, rand

TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 5), (2, 3, 2, 3, 2)])
def test_batchnorm_inference_grad(shape):
    c = shape[1]
    x, scale, b = rand(*shape), rand(c), rand(c)
    mean, var = rand(c), rand(c, low=0.5, high=1.5)
    ref = lambda x, s, b, m, v: F.batch_norm(x, m, v, s, b, False, 0.0, 1e-3)  # noqa: E731
    check_grad("BatchNormalization", [x, scale, b, mean, var], {"epsilon": 1e-3}, wrt=[0, 1, 2],
               const_inputs=[3, 4], ref=ref, **TOL)


def test_batchnorm_inference_grad_nonspatial():
    """Opset 7, spatial=0: statistics per activation."""
    x, scale, b = rand(4, 2, 3), rand(2, 3), rand(2, 3)
    mean, var = rand(2, 3), rand(2, 3, low=0.5, high=1.5)

    def ref(x, s, b, m, v):
        flat = F.batch_norm(x.reshape(4, 6), m.reshape(-1), v.reshape(-1), s.reshape(-1),
                            b.reshape(-1), False, 0.0, 1e-5)
        return flat.reshape(4, 2, 3)

    check_grad("BatchNormalization", [x, scale, b, mean, var], {"spatial": 0}, opset=7,
               wrt=[0, 1, 2], const_inputs=[3, 4], ref=ref, **TOL)


@pytest.mark.parametrize("shape,axis", [((4, 6), -1), ((2, 3, 8), -1), ((2, 3, 4, 5), 2),
                                        ((2, 3, 4), 1), ((3, 5), 0)])
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_grad(shape, axis, bias):
    norm_shape = shape[axis:]
    x, scale, b = rand(*shape), rand(*norm_shape), rand(*norm_shape)
    ref = lambda x, s, b=None: F.layer_norm(x, norm_shape, s, b, 1e-5)  # noqa: E731
    check_grad("LayerNormalization", [x, scale, b] if bias else [x, scale], {"axis": axis},
               opset=17, ref=ref, **TOL)


def test_layernorm_grad_with_saved_stats():
    """Mean and InvStdDev outputs present: the backward reuses them."""
    x, scale, b = rand(3, 4, 6), rand(6), rand(6)
    check_grad("LayerNormalization", [x, scale, b], {}, opset=17, num_outputs=3,
               ref=lambda x, s, b: [F.layer_norm(x, (6,), s, b, 1e-5)], **TOL)


def test_layernorm_grad_broadcast_scale():
    """Scale [1, 6] and bias [6] broadcast over the normalized shape [4, 6]."""
    x, scale, b = rand(2, 4, 6), rand(1, 6), rand(6)
    ref = lambda x, s, b: F.layer_norm(x, (4, 6), None, None, 1e-5) * s + b  # noqa: E731
    check_grad("LayerNormalization", [x, scale, b], {"axis": 1}, opset=17, ref=ref, **TOL)


def test_layernorm_grad_stash_float64():
    """float32 data normalized in float64 (stash_type=11)."""
    x, scale, b = rand(3, 5), rand(5), rand(5)
    check_grad("LayerNormalization", [x, scale, b], {"stash_type": 11}, opset=17,
               ref=lambda x, s, b: F.layer_norm(x, (5,), s, b, 1e-5), **TOL)


@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 4, 3, 5), (1, 2, 3, 2, 4)])
def test_instancenorm_grad(shape):
    c = shape[1]
    check_grad("InstanceNormalization", [rand(*shape), rand(c), rand(c)], {"epsilon": 1e-4},
               ref=lambda x, s, b: F.instance_norm(x, weight=s, bias=b, eps=1e-4), **TOL)


@pytest.mark.parametrize("groups", [1, 2, 6])
def test_groupnorm21_grad(groups):
    x, scale, b = rand(2, 6, 4, 3), rand(6), rand(6)
    check_grad("GroupNormalization", [x, scale, b], {"num_groups": groups}, opset=21,
               ref=lambda x, s, b: F.group_norm(x, groups, s, b, 1e-5), **TOL)


def test_groupnorm18_per_group_scale_grad():
    x, scale, b = rand(2, 6, 5), rand(3), rand(3)
    ref = lambda x, s, b: F.group_norm(x, 3, s.repeat_interleave(2), b.repeat_interleave(2))  # noqa
    check_grad("GroupNormalization", [x, scale, b], {"num_groups": 3}, opset=18, ref=ref, **TOL)


def test_groupnorm21_stash_grad():
    x, scale, b = rand(2, 4, 5), rand(4), rand(4)
    check_grad("GroupNormalization", [x, scale, b], {"num_groups": 2, "stash_type": 11},
               opset=21, ref=lambda x, s, b: F.group_norm(x, 2, s, b, 1e-5), **TOL)
