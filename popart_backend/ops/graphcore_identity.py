"""ai.graphcore ops that pass a tensor through or make one without computing: Detach,
Nop, PrintTensor, Abort, CopyVarUpdate and Init. ReplicatedAllReduce is a cross-replica
collective and lives in collectives.py."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ShapeError, popart_runtime_error
from ..ir.op import Op
from ..ir.signature import INT, INTS, REQUIRED, STRING, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from .graphcore_common import GC, onnx_dtype
from .registry import register_op


class _Passthrough(Op):
    aliases_inputs = True  # returns its input

    def infer(self, x):
        return x

    def kernel(self, x):
        return x


@register_op("Detach", versions=1, domain=GC)
class Detach(_Passthrough):
    """Identity whose output carries no gradient back to its input."""

    builder_method = BuilderMethod("detach", 1)
    stops_gradient = True

    def grad(self, g):
        """Stops the gradient: nothing flows back."""


@register_op("Nop", versions=1, domain=GC)
class Nop(_Passthrough):
    """Identity that graph optimisations must keep (PopART uses it to pin the schedule)."""

    builder_method = BuilderMethod("nop", 1)

    foldable = False

    def grad(self, g):
        g.set_input_grad(0, g.op("Nop", g.output_grad(0), domain=GC))


@register_op("PrintTensor", versions=1, domain=GC)
class PrintTensor(_Passthrough):
    """Identity that prints ``<title>: <values>`` to stdout each time it runs (the title defaults
    to the input's id); with print_gradient=1 its gradient is printed too, titled
    ``Gradient___<title>``."""

    builder_method = BuilderMethod(
        "printtensor", 1, 1, (AttrSpec("print_gradient", INT, 1), AttrSpec("title", STRING, ""))
    )

    foldable = False

    @dataclass(frozen=True)
    class Attrs:
        print_gradient: int = 1
        title: str = ""

    def kernel(self, x):
        title = self.attrs.title or self.inputs[0].id
        sys.stdout.write(f"{title}: {x.tolist()}\n")
        sys.stdout.flush()
        return x

    def grad(self, g):
        if not self.attrs.print_gradient:
            g.set_input_grad(0, g.output_grad(0))
            return
        title = "Gradient___" + (self.attrs.title or g.input(0))
        g.set_input_grad(0, g.op("PrintTensor", g.output_grad(0), domain=GC, print_gradient=0,
                                 title=title))


@register_op("Abort", versions=1, domain=GC)
class Abort(Op):
    """Stops the run with popart_runtime_error when executed: always without an input, only when
    the input (a scalar condition) is non-zero with one."""

    builder_method = BuilderMethod("abort", (0, 1), 0)

    foldable = False

    def infer(self, condition=None):
        if condition is not None and condition.nelms != 1:
            raise ShapeError(f"{self.debug_name}: the condition {condition} must be one value.")
        return []

    def kernel(self, condition=None):
        if condition is None or bool(condition.reshape(()).item()):
            raise popart_runtime_error(
                f"{self.debug_name}: abort executed"
                + ("" if condition is None else f" (condition '{self.inputs[0].id}' is true)")
                + ". The model asked to stop the run here."
            )
        return ()


@register_op("CopyVarUpdate", versions=1, domain=GC)
class CopyVarUpdate(Op):
    """var := updater, in place; the output aliases ``var`` (PopART's variable copy)."""

    builder_method = BuilderMethod("copyvarupdate", 2)

    foldable = False
    modifies_inputs = (0,)

    def infer(self, var, updater):
        if var != updater:
            raise ShapeError(f"{self.debug_name}: var {var} and updater {updater} must match.")
        return var

    def kernel(self, var, updater):
        return var.copy_(updater)


@register_op("Init", versions=1, domain=GC)
class Init(Op):
    """A new tensor of ``shape`` and ``data_type``: zeros for InitType Zero (1). NoInit (0) means
    "contents undefined" on hardware; the simulator gives zeros so runs stay reproducible."""

    builder_method = BuilderMethod(
        "init",
        0,
        1,
        (
            AttrSpec("shape", INTS, REQUIRED),
            AttrSpec("data_type", INT, REQUIRED, convert=onnx_dtype),
            AttrSpec("init_type", INT, REQUIRED),
            AttrSpec("batch_axis", INT, -1),
        ),
        takes_args=False,
    )

    foldable = False  # a fresh buffer per run: in-place updates must not touch a constant
    allocates_only = True  # no compute: a phase holding only Inits hides no prefetch

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...]
        data_type: int
        init_type: int
        batch_axis: int = -1

    def infer(self):
        if self.attrs.init_type not in (0, 1):
            raise ShapeError(
                f"{self.debug_name}: init_type {self.attrs.init_type} is not an InitType "
                f"(0 NoInit, 1 Zero)."
            )
        if any(d < 0 for d in self.attrs.shape):
            raise ShapeError(f"{self.debug_name}: shape {list(self.attrs.shape)} is negative.")
        self._info = TensorInfo(DataType.from_onnx(self.attrs.data_type), tuple(self.attrs.shape))
        return self._info

    def kernel(self):
        return torch.zeros(self._info.shape, dtype=self._info.dtype.torch)
