"""Elementwise ops: unary math and activations, broadcasting arithmetic, comparisons, logic."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Comparison, ElementwiseBinary, ElementwiseUnary
from .registry import register_op


@register_op("Relu", versions=(6, 13, 14))
class Relu(ElementwiseUnary):
    def kernel(self, x):
        return torch.relu(x)


@register_op("Sigmoid", versions=(6, 13))
class Sigmoid(ElementwiseUnary):
    def kernel(self, x):
        return torch.sigmoid(x)


@register_op("LeakyRelu", versions=(6, 16))
class LeakyRelu(ElementwiseUnary):
    @dataclass(frozen=True)
    class Attrs:
        alpha: float = 0.01

    def kernel(self, x):
        return torch.nn.functional.leaky_relu(x, self.attrs.alpha)


@register_op("Add", versions=(6, 7, 13, 14))
class Add(ElementwiseBinary):
    def kernel(self, a, b):
        return torch.add(a, self.legacy_align(a, b))


@register_op("Equal", versions=(7, 11, 13, 19))
class Equal(Comparison):
    def kernel(self, a, b):
        return torch.eq(a, b)
