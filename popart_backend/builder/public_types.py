"""PopART's Builder-side public types that have no home of their own: the enums its op methods
take (``InitType``, ``ScatterReduction``, ``TensorRemapType``), the session's IR dump format
(``IrSerializationFormat``) and the class names of the objects the Builder hands out (opsets and
annotation context managers), so ``isinstance`` checks written against PopART work."""

from __future__ import annotations

import enum

from .annotations import Annotate, NameContextManager
from .base import AI_GRAPHCORE, AI_ONNX
from .opsets import opset_class

__all__ = [
    "AiGraphcoreOpset1",
    "AiOnnxOpset6",
    "AiOnnxOpset7",
    "AiOnnxOpset8",
    "AiOnnxOpset9",
    "AiOnnxOpset10",
    "AiOnnxOpset11",
    "AttributeContextManager",
    "InitType",
    "IrSerializationFormat",
    "KeyValueContextManager",
    "NameContextManager",
    "ScatterReduction",
    "TensorRemapType",
]


class InitType(enum.Enum):
    """``aiGraphcore.init``'s contents: NoInit (undefined on hardware; zeros in the simulator,
    so runs stay reproducible) or Zero."""

    NoInit = 0
    Zero = 1


class ScatterReduction(enum.Enum):
    """``aiGraphcore.scatterreduce``'s reduction; the value is the name the node stores.
    ``NoReduction`` is C++'s ``None`` (plain assignment)."""

    Sum = "sum"
    Max = "max"
    Min = "min"
    Mul = "mul"
    NoReduction = "none"


class TensorRemapType(enum.Enum):
    """``aiGraphcore.tensorremap``'s type: remap in the forward pass only, in forward and
    backward, or forward and the reverse mapping in backward."""

    FwdBwdReverse = 0
    FwdBwd = 1
    Fwd = 2


class IrSerializationFormat(enum.Enum):
    """Format of ``session._serializeIr``: PopART's JSON IR dump."""

    JSON = 0


# PopART's names of the context managers: virtualGraph(n), pipelineStage(n) ... return an
# AttributeContextManager; outlineAttributes({...}) a KeyValueContextManager.
AttributeContextManager = Annotate
KeyValueContextManager = Annotate

# The Builder's opset objects are instances of these (one generated class per opset).
AiOnnxOpset6 = opset_class(AI_ONNX, 6, "aiOnnxOpset6")
AiOnnxOpset7 = opset_class(AI_ONNX, 7, "aiOnnxOpset7")
AiOnnxOpset8 = opset_class(AI_ONNX, 8, "aiOnnxOpset8")
AiOnnxOpset9 = opset_class(AI_ONNX, 9, "aiOnnxOpset9")
AiOnnxOpset10 = opset_class(AI_ONNX, 10, "aiOnnxOpset10")
AiOnnxOpset11 = opset_class(AI_ONNX, 11, "aiOnnxOpset11")
AiGraphcoreOpset1 = opset_class(AI_GRAPHCORE, 1, "aiGraphcoreOpset1")
