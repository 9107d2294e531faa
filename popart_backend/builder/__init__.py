"""PopART's Builder: an ONNX ModelProto written by hand (``builder.py``), its opset objects
(``opsets.py``), the ai.graphcore methods with nested arguments (``nested.py``) and the
placement/annotation API (``annotations.py``), over what they share (``base.py``: domain names,
``make_attribute``, the ``Opset`` base and the ``NodeWriter`` protocol)."""
