"""Gradients of MatMul, Gemm and Einsum against torch.autograd (issue #3 item 2, F49)."""

import pytest
import torch

from popart_backend.errors import UnsupportedOpError
from tests.helpers import check_grad, rand


@pytest.mark.parametrize("a_shape,b_shape", [
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),          # linear layer: batch folded into one mm
    ((4,), (4, 5)),               # 1-D lhs
    ((3, 4), (4,)),               # 1-D rhs
    ((4,), (4,)),                 # dot product
    ((2, 1, 3, 4), (5, 4, 2)),    # both batch dims broadcast
    ((3, 4), (2, 4, 5)),          # 2-D lhs broadcast over rhs batch
    ((6, 2, 3, 4), (1, 4, 5)),
])
def test_matmul_grad(a_shape, b_shape):
    check_grad("MatMul", [rand(*a_shape), rand(*b_shape)], ref=torch.matmul)


def test_matmul_grad_one_operand():
    check_grad("MatMul", [rand(2, 3, 4), rand(4, 5)], wrt=[1], ref=torch.matmul)
    check_grad("MatMul", [rand(2, 3, 4), rand(4, 5)], wrt=[0], ref=torch.matmul)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), (3, 1), (3, 5), ()])
def test_gemm_grad(trans_a, trans_b, c_shape):
    a = rand(4, 3) if trans_a else rand(3, 4)
    b = rand(5, 4) if trans_b else rand(4, 5)
    c = None if c_shape is None else rand(*c_shape)
    alpha, beta = 0.7, 1.3

    def ref(a, b, c=None):
        y = alpha * (a.t() if trans_a else a) @ (b.t() if trans_b else b)
        return y if c is None else y + beta * c

    attrs = {"alpha": alpha, "beta": beta, "transA": trans_a, "transB": trans_b}
    check_grad("Gemm", [a, b, c] if c is not None else [a, b], attrs, ref=ref)


def test_gemm_linear_grad():
    """transB=1, alpha=beta=1: the F.linear path of the forward."""
    check_grad("Gemm", [rand(8, 6), rand(4, 6), rand(4)], {"transB": 1},
               ref=lambda a, b, c: torch.nn.functional.linear(a, b, c))


@pytest.mark.parametrize("equation,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),                  # implicit output
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),  # ellipsis broadcast
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("ij->", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,k->ij", [(3, 4), (5,)]),                 # k summed out of one operand only
    ("...ij,...jk->...ik", [(1, 3, 4), (2, 4, 5)]),  # size-1 ellipsis dim broadcast
    ("abc->cba", [(2, 3, 4)]),
])
def test_einsum_grad(equation, shapes):
    inputs = [rand(*s) for s in shapes]
    check_grad("Einsum", inputs, {"equation": equation}, opset=12,
               ref=lambda *xs: torch.einsum(equation, *xs))


def test_einsum_diagonal_grad_unsupported():
    with pytest.raises(UnsupportedOpError, match="EinsumGrad.*repeated"):
        check_grad("Einsum", [rand(3, 3)], {"equation": "ii->i"}, opset=12,
                   ref=lambda x: torch.einsum("ii->i", x))
