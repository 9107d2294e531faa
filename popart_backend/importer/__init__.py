"""ONNX into the IR: a ModelProto (path, bytes or proto) becomes an ``Ir`` (``onnx_model.py``),
with static sequences and optionals resolved into tensor ops (``sequences.py``), the
sequence/optional values of graph inputs and outputs (``value_io.py``) and the
ai.onnx.preview.training Gradient op (``gradient_op.py``); ``graph_walk.py`` holds the GraphProto
walks they share."""
