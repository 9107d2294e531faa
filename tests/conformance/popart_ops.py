"""PopART's own ai.onnx operator list (spec §6.1, 105 types) and the ONNX-level rewrites it
accepts (§6.2): the op types of issue #7's first acceptance criterion ("100 % of the node tests
whose op types are in PopART's list pass")."""

from __future__ import annotations

import onnx

POPART_ONNX_OPS = frozenset([
    "Abs", "Add", "And", "ArgMax", "ArgMin", "Asin", "Atan", "AveragePool",
    "BatchNormalization", "Cast", "Ceil", "Clip", "Concat", "Constant", "ConstantOfShape",
    "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum", "Div", "Dropout", "Elu", "Equal", "Erf",
    "Exp", "Expand", "Flatten", "Floor", "Gather", "GlobalAveragePool", "GlobalMaxPool",
    "Greater", "GRU", "HardSigmoid", "Identity", "If", "InstanceNormalization", "IsInf",
    "IsNaN", "LeakyRelu", "Less", "Log", "LogSoftmax", "Loop", "LRN", "LSTM", "MatMul", "Max",
    "MaxPool", "Mean", "Min", "Mul", "Neg", "Not", "OneHot", "Or", "Pad", "Pow", "PRelu",
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Reciprocal",
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu", "Reshape", "Resize",
    "Round", "Scan", "Scatter", "Selu", "Shape", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh",
    "Slice", "Softmax", "Softplus", "Softsign", "Split", "Sqrt", "Squeeze", "Sub", "Sum",
    "Tanh", "ThresholdedRelu", "Tile", "TopK", "Transpose", "Unsqueeze", "Upsample", "Where",
])

POPART_REWRITES = frozenset(
    ["Gemm", "Tan", "Asinh", "Acosh", "Atanh", "Acos", "Mod", "DepthToSpace", "SpaceToDepth"])


def uses_only_popart_ops(model_bytes: bytes) -> bool:
    """True when every node of the model's main graph is of a PopART-list op type."""
    model = onnx.load_from_string(model_bytes)
    types = {node.op_type for node in model.graph.node}
    return bool(types) and types <= POPART_ONNX_OPS | POPART_REWRITES
