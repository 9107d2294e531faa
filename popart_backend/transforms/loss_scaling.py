"""Passes: where the loss scale enters the backward pass.

``SeedLossScaling`` (non-const ``lossScaling``): the loss gradient is multiplied by the
optimizer's ``lossScaling_FLOAT`` variable. ``Fp32LossScale`` (``ensureFp32LossScaleTensor``):
with a float16 loss the scale stays a float32 tensor and is applied, in float32, to the first
float16 activation gradients (the outputs of the loss's gradient ops), so a scale above the
float16 maximum (65504) works as long as the scaled gradients fit in float16, as in PopART.
"""

from __future__ import annotations

import logging

import numpy as np

from ..dtypes import DataType
from ..errors import popart_exception
from ..ir.op import OpSettings
from ..ir.tensor import TensorInfo, TensorKind, TensorRole
from ..ops.registry import create_op
from .autodiff import GRADIENT_PREFIX

__all__ = ["Fp32LossScale", "SeedLossScaling"]

_log = logging.getLogger("popart:transform")
_logged: set[str] = set()


class SeedLossScaling:
    """Pass: multiply the loss gradient by the optimizer's non-const ``lossScaling_FLOAT``
    variable, so ``updateOptimizerFromHost`` can change loss scaling without recompiling.

    Before:  Gradient___loss = <const 1>
             dx = LossGrad(Gradient___loss, x)
    After:   Gradient___loss/seed = <const 1>
             Gradient___loss/scaled = Mul(Gradient___loss/seed, lossScaling_FLOAT)
             dx = LossGrad(Gradient___loss/scaled, x)
    """

    name = "seed_loss_scaling"
    TENSOR = "lossScaling_FLOAT"  # the id the optimizer reuses (docs/training.md)

    def __init__(self, loss_id: str, value: float):
        self.loss_id = loss_id
        self.value = value

    def run(self, ir) -> bool:
        graph = ir.main
        seed = graph.tensors.get(GRADIENT_PREFIX + self.loss_id)
        if seed is None or not seed.is_const:
            raise popart_exception(
                f"seed_loss_scaling: the loss gradient '{GRADIENT_PREFIX + self.loss_id}' was not "
                f"created by autodiff; a tensor of the model already uses that name."
            )
        scaling = graph.tensors.get(self.TENSOR)
        if scaling is None:
            scaling = graph.add_tensor(self.TENSOR, TensorInfo(DataType.FLOAT, ()),
                                       TensorKind.VARIABLE, np.array(self.value, np.float32))
            scaling.role = TensorRole.OPTIMIZER_PARAM
        factor = self.TENSOR
        if seed.info.dtype is not DataType.FLOAT:
            factor = self._add(graph, "Cast", [self.TENSOR], f"{self.TENSOR}/cast",
                               to=int(seed.info.dtype.onnx))
        unscaled = graph.add_const(graph.unique_id(f"{seed.id}/seed"), seed.data)
        scaled = self._add(graph, "Mul", [unscaled.id, factor], f"{seed.id}/scaled")
        graph.replace_all_uses(seed, graph.tensor(scaled))
        graph.remove_tensor(seed)
        if seed.id in ir.anchors:  # an anchored loss gradient keeps its name
            self._add(graph, "Identity", [scaled], seed.id)
        return True

    @staticmethod
    def _add(graph, op_type: str, inputs: list[str], output: str, **attrs) -> str:
        out = graph.unique_id(output)
        op = create_op(op_type, attrs, OpSettings(name=out), where=out)
        graph.add_op(op, inputs, [out])
        return out


class Fp32LossScale:
    """Pass (``ensureFp32LossScaleTensor``): autodiff seeded the loss gradient without the loss
    scale; with a float16 loss, each float16 output ``dx`` of the ops reading that seed (the
    loss's gradient ops) becomes ``Cast(Mul(Cast(dx, FLOAT), scale), FLOAT16)``, ``scale``
    being a float32 constant (const loss scaling) or the optimizer's ``lossScaling_FLOAT``
    variable. The scaled tensor keeps ``dx``'s id. A float32 (or other) loss is scaled as
    without the option: there is no float16 loss scale tensor to keep in float32.

    Before:  Gradient___loss = <const f16 1>       (autodiff's seed, unscaled)
             dx = L1Grad(Gradient___loss, x)       (f16)
    After:   dx/unscaled = L1Grad(Gradient___loss, x)
             dx = Cast(Mul(Cast(dx/unscaled, FLOAT), <f32 scale>), FLOAT16)
    """

    name = "fp32_loss_scale"

    def __init__(self, loss_id: str, value: float, const: bool):
        self.loss_id, self.value, self.const = loss_id, value, const

    def run(self, ir) -> bool:
        graph = ir.main
        seed = graph.tensors.get(GRADIENT_PREFIX + self.loss_id)
        if seed is None or not seed.is_const:
            raise popart_exception(
                f"fp32_loss_scale: the loss gradient '{GRADIENT_PREFIX + self.loss_id}' was not "
                f"created by autodiff; a tensor of the model already uses that name.")
        if seed.info.dtype is not DataType.FLOAT16:
            if "float32" not in _logged:
                _logged.add("float32")
                _log.warning("SessionOptions.ensureFp32LossScaleTensor has no effect: the loss "
                             "'%s' is %s, not float16, so its loss scale is already that type.",
                             self.loss_id, seed.info.dtype.name)
            if not self.const:
                return SeedLossScaling(self.loss_id, self.value).run(ir)
            seed.data = np.asarray(seed.data * self.value, seed.info.dtype.numpy)
            return True
        scale = self._scale_tensor(graph)
        # Every float output of the seed's readers carries the scale (the optimizer divides
        # every gradient by it): float16 ones through float32, the others in their own type.
        for op in list(seed.consumers):
            for out in op.outputs:
                if out is not None and out.info.dtype.is_float:
                    self._scale(graph, out, scale)
        return True

    def _scale_tensor(self, graph) -> str:
        if self.const:
            return graph.add_const(graph.unique_id("lossScaling/fp32"),
                                   np.array(self.value, np.float32)).id
        tensor = graph.tensors.get(SeedLossScaling.TENSOR)
        if tensor is None:
            tensor = graph.add_tensor(SeedLossScaling.TENSOR, TensorInfo(DataType.FLOAT, ()),
                                      TensorKind.VARIABLE, np.array(self.value, np.float32))
            tensor.role = TensorRole.OPTIMIZER_PARAM
        return tensor.id

    @staticmethod
    def _scale(graph, out, scale: str) -> None:
        readers = [(op, i) for op in list(out.consumers)
                   for i, t in enumerate(op.inputs) if t is out]
        add = SeedLossScaling._add
        wide = add(graph, "Cast", [out.id], f"{out.id}/fp32", to=int(DataType.FLOAT.onnx))
        scaled = add(graph, "Mul", [wide, scale], f"{out.id}/fp32_scaled")
        narrow = add(graph, "Cast", [scaled], f"{out.id}/scaled", to=int(out.info.dtype.onnx))
        for op, index in readers:
            graph.replace_input(op, index, narrow)
        # The scaled value takes dx's id (anchors, graph outputs, Ir.weight_grads name it).
        old_id, unscaled_id = out.id, graph.unique_id(f"{out.id}/unscaled")
        result = graph.tensors.pop(narrow)
        del graph.tensors[old_id]
        out.id, result.id = unscaled_id, old_id
        graph.tensors[unscaled_id], graph.tensors[old_id] = out, result
