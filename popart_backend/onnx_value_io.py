"""Sequence and optional graph inputs and outputs of a session (issue #7).

The importer (``onnx_sequences.StaticSequences``) binds a sequence input of n elements to n host
streams ``name[0]`` ... ``name[n-1]`` and a sequence output to n anchored tensors, and records
both here, with None for an absent optional. The session uses ``ValueIO`` to expand its
DataFlow to element anchors, to return lists (or None) from ``initAnchorArrays`` and to split
the lists of a PyStepIO into element streams.
"""

from __future__ import annotations

import dataclasses

import onnx

from .errors import popart_exception


def element_id(name: str, index: int) -> str:
    """The tensor id of element ``index`` of the sequence graph input or output ``name``."""
    return f"{name}[{index}]"


@dataclasses.dataclass
class ValueIO:
    """The sequence and optional graph inputs and outputs of a model, by ONNX name: a list of
    element tensor ids for a sequence, None for an absent optional."""

    inputs: dict[str, list[str] | None] = dataclasses.field(default_factory=dict)
    outputs: dict[str, list[str] | None] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.inputs or self.outputs)

    def expand_data_flow(self, data_flow):
        """``data_flow`` with each sequence anchor replaced by its element anchors (same return
        type) and absent optional anchors dropped."""
        from .dataflow import DataFlow

        anchors = {}
        for anchor_id, art in data_flow.anchor_return_types().items():
            elements = self.outputs.get(anchor_id, [anchor_id])
            anchors.update({e: art for e in elements or ()})
        return DataFlow(data_flow.batchesPerStep(), anchors)

    def group_anchors(self, arrays: dict, anchored) -> dict:
        """Anchor arrays by element id -> by user anchor: lists for sequences, None if absent."""
        grouped = {}
        for anchor_id in anchored:
            if anchor_id in self.outputs:
                elements = self.outputs[anchor_id]
                grouped[anchor_id] = None if elements is None else [arrays[e] for e in elements]
            else:
                grouped[anchor_id] = arrays[anchor_id]
        return grouped

    def flatten_step_io(self, stepio):
        """A PyStepIO over element ids: input lists split into their element streams, output
        lists' arrays written in place (the same numpy arrays the caller holds)."""
        from .dataflow import PyStepIO

        if not isinstance(stepio, PyStepIO):
            raise popart_exception(
                f"This model has sequence or optional inputs/outputs "
                f"({sorted(self.inputs) + sorted(self.outputs)}); run it with a PyStepIO of "
                f"lists (a {type(stepio).__name__} cannot feed them)."
            )
        inputs = {}
        for name, value in stepio.inputs.items():
            if name not in self.inputs:
                inputs[name] = value
                continue
            inputs.update(self._split(name, value, self.inputs[name], "input"))
        outputs = {}
        for name, value in stepio.outputs.items():
            if name not in self.outputs:
                outputs[name] = value
                continue
            outputs.update(self._split(name, value, self.outputs[name], "anchor"))
        flat = PyStepIO(inputs, outputs)
        flat.runtime_asserts = stepio.runtime_asserts
        return flat

    @staticmethod
    def _split(name, value, elements, what) -> dict:
        if elements is None:
            if value is not None:
                raise popart_exception(
                    f"Optional {what} '{name}' was compiled absent (InputShapeInfo gave None), "
                    f"but the step IO gives a value; pass None or compile the session with it."
                )
            return {}
        if not isinstance(value, (list, tuple)) or len(value) != len(elements):
            got = f"a list of {len(value)}" if isinstance(value, (list, tuple)) else (
                type(value).__name__)
            raise popart_exception(
                f"Sequence {what} '{name}' was compiled with {len(elements)} elements; the step "
                f"IO gives {got}. Sequence lengths and element shapes are static per session."
            )
        return dict(zip(elements, value))


def value_kind(tp: onnx.TypeProto) -> str:
    """tensor | sequence | optional | unknown (no type given)."""
    which = tp.WhichOneof("value")
    return {"tensor_type": "tensor", "sequence_type": "sequence",
            "optional_type": "optional"}.get(which, "unknown")


def static_shape(tp: onnx.TypeProto) -> tuple[int, ...] | None:
    ttype = tp.tensor_type
    if not ttype.HasField("shape"):
        return None
    dims = []
    for d in ttype.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(d.dim_value)
    return tuple(dims)
