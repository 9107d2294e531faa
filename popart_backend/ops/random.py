"""Random ops. For now Dropout, in its inference form.

Whether dropout is active is decided by the session, as in PopART (DESIGN decision 5): in an
inference graph Dropout is the identity and its mask is all ones, even when the model sets
is_test=0 (versions 1, 6) or feeds training_mode=True (versions 12, 13). The training issue
adds the seeded, replayable random form used by a TrainingSession.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .registry import register_op


@register_op("Dropout", versions=(1, 6, 7, 10, 12, 13))
class Dropout(Op):
    """output = data; mask = all ones (BOOL from version 10, the data type before)."""

    # Dropout must not be folded: in a TrainingSession its output is random.
    foldable = False

    @dataclass(frozen=True)
    class Attrs:
        """Versions 12 and 13 (ratio and training_mode are inputs)."""

        seed: int | None = None

    @dataclass(frozen=True)
    class V7Attrs:
        ratio: float = 0.5

    @dataclass(frozen=True)
    class V6Attrs(V7Attrs):
        is_test: int = 0

    @dataclass(frozen=True)
    class V1Attrs(V6Attrs):
        consumed_inputs: tuple[int, ...] = ()

    @classmethod
    def attrs_type(cls, version: int):
        if version >= 12:
            return cls.Attrs
        return cls.V7Attrs if version >= 7 else cls.V6Attrs if version >= 6 else cls.V1Attrs

    def infer(self, data, ratio=None, training_mode=None):
        if ratio is not None and ratio.rank != 0:
            raise ShapeError(f"{self.debug_name}: ratio {ratio} must be a scalar.")
        if training_mode is not None and (training_mode.rank != 0 or training_mode.dtype != DataType.BOOL):
            raise ShapeError(
                f"{self.debug_name}: training_mode {training_mode} must be a BOOL scalar."
            )
        mask_dtype = DataType.BOOL if self.version >= 10 else data.dtype
        self._mask_dtype = mask_dtype.torch
        return [data, TensorInfo(mask_dtype, data.shape)]

    def kernel(self, data, ratio=None, training_mode=None):
        if len(self.outputs) < 2 or self.outputs[1] is None:
            return data if len(self.outputs) < 2 else (data, None)
        return data, torch.ones(data.shape, dtype=self._mask_dtype)
