"""ai.graphcore shape ops: Reshape, Reverse, Subsample (and its gradient) and the
builder's ai.graphcore spelling of DepthToSpace."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import ShapeError
from ..ir.op import Op
from ..ir.signature import INT, INTS, REQUIRED, STRING, AttrSpec, BuilderMethod
from .base import normalize_axis
from .graphcore_common import GC
from .registry import register_op
from .shape import DepthToSpace as OnnxDepthToSpace


@register_op("Reshape", versions=1, domain=GC)
class Reshape(Op):
    """Reshape to the ``shape`` attribute (one dimension may be -1)."""

    builder_method = BuilderMethod("reshape", 1, 1, (AttrSpec("shape", INTS, REQUIRED),))

    aliases_inputs = True  # a view of the input

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...]

    def infer(self, x):
        shape = list(self.attrs.shape)
        if shape.count(-1) > 1 or any(d < -1 for d in shape):
            raise ShapeError(f"{self.debug_name}: shape {shape} may hold one -1 and no other <0.")
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            if known == 0 or x.nelms % known:
                raise ShapeError(f"{self.debug_name}: cannot reshape {x} to {shape}.")
            shape[shape.index(-1)] = x.nelms // known
        if math.prod(shape) != x.nelms:
            raise ShapeError(f"{self.debug_name}: cannot reshape {x} ({x.nelms} elements) to "
                             f"{shape}.")
        self._shape = tuple(shape)
        return x.with_shape(self._shape)

    def kernel(self, x):
        return x.reshape(self._shape)

    def grad(self, g):
        g.set_input_grad(0, g.op("Reshape", g.output_grad(0), domain=GC,
                                 shape=g.input_info(0).shape))


@register_op("Reverse", versions=1, domain=GC)
class Reverse(Op):
    """Reverse the order of elements along each of ``dimensions``."""

    builder_method = BuilderMethod("reverse", 1, 1, (AttrSpec("dimensions", INTS, REQUIRED),))
    moves_elements = True

    @dataclass(frozen=True)
    class Attrs:
        dimensions: tuple[int, ...]

    def infer(self, x):
        given = list(self.attrs.dimensions)
        if any(not -x.rank <= d < x.rank for d in given):
            raise ShapeError(f"{self.debug_name}: dimensions {given} must be axes of the input "
                             f"{x}: 0..{x.rank - 1} (or -{x.rank}..-1 from the end).")
        dims = [normalize_axis(self, d, x.rank) for d in given]
        if len(set(dims)) != len(dims):
            raise ShapeError(f"{self.debug_name}: dimensions {given} name an axis of {x} twice; "
                             f"list each axis once.")
        self._dims = tuple(dims)
        return x

    def kernel(self, x):
        return torch.flip(x, self._dims) if self._dims else x

    def grad(self, g):
        g.set_input_grad(0, g.op("Reverse", g.output_grad(0), domain=GC,
                                 dimensions=self.attrs.dimensions))


@register_op("Subsample", versions=1, domain=GC)
class Subsample(Op):
    """Every strides[i]-th element along each axis i, starting at 0."""

    builder_method = BuilderMethod("subsample", 1, 1, (AttrSpec("strides", INTS, REQUIRED),))

    @dataclass(frozen=True)
    class Attrs:
        strides: tuple[int, ...]

    def infer(self, x):
        strides = self.attrs.strides
        if len(strides) != x.rank or any(s < 1 for s in strides):
            raise ShapeError(f"{self.debug_name}: strides {list(strides)} must be one positive "
                             f"stride per axis of {x}.")
        self._index = tuple(slice(None, None, s) for s in strides)
        return x.with_shape(tuple(-(-d // s) for d, s in zip(x.shape, strides)))

    def kernel(self, x):
        return x[self._index].contiguous()

    def grad(self, g):
        g.set_input_grad(0, g.op("SubsampleGrad", g.output_grad(0), g.input(0), domain=GC,
                                 strides=self.attrs.strides))


@register_op("SubsampleGrad", versions=1, domain=GC)
class SubsampleGrad(Op):
    """dx: zeros with dy at the sampled positions. Inputs (dy, x) (x for its shape)."""

    Attrs = Subsample.Attrs

    def infer(self, dy, x):
        self._index = tuple(slice(None, None, s) for s in self.attrs.strides)
        return x

    def kernel(self, dy, x):
        out = torch.zeros_like(x)
        out[self._index] = dy
        return out


@register_op("DepthToSpace", versions=1, domain=GC)
class DepthToSpace(OnnxDepthToSpace):
    """The builder's ai.graphcore spelling of ai.onnx DepthToSpace (blocksize, mode)."""

    builder_method = BuilderMethod(
        "depthtospace",
        1,
        1,
        (AttrSpec("blocksize", INT, REQUIRED), AttrSpec("mode", STRING, "DCR")),
    )

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs
