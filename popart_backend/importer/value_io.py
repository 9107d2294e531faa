"""Sequence and optional graph inputs and outputs of a session.

The importer (``sequences.StaticSequences``) binds a sequence input of n elements to n host
streams ``name[0]`` ... ``name[n-1]`` and a sequence output to n anchored tensors, and records
both here, with None for an absent optional. The session uses ``ValueIO`` to expand its
DataFlow to element anchors, to return lists (or None) from ``initAnchorArrays`` and to turn the
user's step IO into one over element ids, which the simulator runs like any other:

- ``PyStepIO``: each list is split into its element streams. Each element array is read in
  ``[bps, af, rf, *S]`` chunks like a plain tensor's, and its read / write position is kept on
  the user's PyStepIO, so an array holding several steps advances from run to run.
- ``PyStepIOCallback``: the user's callbacks see the sequence, not its elements.
  ``input_callback(name, prefetch)`` returns a list of n arrays (element i of shape
  ``InputShapeInfo`` gave it, n as compiled) for one micro-batch of one replica, and is called
  once per micro-batch; ``input_complete_callback(name)`` follows once every element of that
  list has been consumed. ``output_callback(name)`` returns a list of n writeable arrays, one
  per element, filled for one micro-batch; ``output_complete_callback(name)`` follows once all
  n are written. The device still streams ``name[i]`` element by element (possibly on
  different pipeline stages); ``_SequenceCallbacks`` gathers them per micro-batch, in order.
- A present optional is an ordinary tensor: its callback returns or fills an array. An absent
  optional (compiled with ``InputShapeInfo().add(name, None)``) has no stream: its callbacks
  are never called, and a PyStepIO must give None for it (or leave it out).
- An empty sequence input has no streams either, so its input callback is never called.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from ..dataflow import DataFlow, PyStepIO, PyStepIOCallback
from ..errors import StepIOError, popart_exception


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

    def flatten_step_io(self, stepio, streams: dict):
        """A step IO over element ids for one run. ``streams`` maps the device's input and
        anchor ids to their TensorInfo (element shapes for the callback checks)."""
        if isinstance(stepio, PyStepIOCallback):
            return _SequenceCallbacks(self, stepio, streams).step_io()
        if not isinstance(stepio, PyStepIO):
            raise popart_exception(
                f"This model has sequence or optional inputs/outputs "
                f"({sorted(self.inputs) + sorted(self.outputs)}); run it with a PyStepIO of "
                f"lists or a PyStepIOCallback (a {type(stepio).__name__} cannot feed them)."
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
        # The read / write positions live on the user's PyStepIO, keyed by element id, so they
        # carry over to the next run as a plain tensor's do (the simulator commits them).
        flat.input_offsets = stepio.input_offsets
        flat.output_offsets = stepio.output_offsets
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


class _Gathered:
    """One sequence's lists from the user's callback, handed out element by element.

    The k-th request for element i gets element i of the k-th list; the list is fetched on the
    first request that needs it and completed once each streamed element has completed it.
    """

    def __init__(self, what: str, name: str, elements: list[str], streams: dict, fetch,
                 complete):
        self.what, self.name = what, name
        self.elements = elements
        # Elements the device never streams (unused inputs) must not hold up completion.
        self.streamed = [i for i, e in enumerate(elements) if e in streams]
        self.infos = [streams.get(e) for e in elements]
        self._fetch, self._complete = fetch, complete
        self.lists: dict[int, list] = {}
        self.fetched = self.completed = 0
        self.taken = [0] * len(elements)
        self.done = [0] * len(elements)

    def get(self, index: int):
        k = self.taken[index]
        self.taken[index] += 1
        while self.fetched <= k:
            self.lists[self.fetched] = self._checked(self._fetch())
            self.fetched += 1
        return self.lists[k][index]

    def finish(self, index: int) -> None:
        self.done[index] += 1
        while self.completed < self.fetched and all(
                self.done[i] > self.completed for i in self.streamed):
            del self.lists[self.completed]
            self.completed += 1
            self._complete()

    def _checked(self, value) -> list:
        what = self.what
        n = len(self.elements)
        if not isinstance(value, (list, tuple)) or len(value) != n:
            got = (f"a list of {len(value)}" if isinstance(value, (list, tuple))
                   else type(value).__name__)
            raise StepIOError(
                f"{what}('{self.name}') returned {got}; the sequence was compiled with {n} "
                f"elements, so return a list of {n} numpy arrays (one per element, for one "
                f"micro-batch)."
            )
        for i, (array, info) in enumerate(zip(value, self.infos)):
            if info is None:
                continue
            if not isinstance(array, np.ndarray):
                raise StepIOError(
                    f"{what}('{self.name}') element {i} is a {type(array).__name__}; give a "
                    f"numpy array of shape {list(info.shape)} and dtype {info.dtype.numpy}."
                )
            if array.size != info.nelms:
                raise StepIOError(
                    f"{what}('{self.name}') element {i} has shape {list(array.shape)}; the "
                    f"session compiled it as {list(info.shape)} ({info}). Sequence element "
                    f"shapes are static per session (InputShapeInfo)."
                )
        return list(value)


class _SequenceCallbacks:
    """The user's PyStepIOCallback seen through element ids for one run: element requests of a
    sequence are gathered into one list per micro-batch (see the module docstring)."""

    def __init__(self, value_io: ValueIO, user, streams: dict):
        self.user = user
        self.by_id: dict[str, tuple[_Gathered, int]] = {}
        for name, elements in value_io.inputs.items():
            self._add("input_callback", name, elements, streams,
                      lambda name=name: user.input_callback(name, False),
                      lambda name=name: user.input_complete_callback(name))
        for name, elements in value_io.outputs.items():
            self._add("output_callback", name, elements, streams,
                      lambda name=name: user.output_callback(name),
                      lambda name=name: user.output_complete_callback(name))

    def _add(self, what, name, elements, streams, fetch, complete) -> None:
        if elements:  # an absent optional or an empty sequence streams nothing
            gathered = _Gathered(what, name, elements, streams, fetch, complete)
            for i, e in enumerate(elements):
                self.by_id[e] = (gathered, i)

    def step_io(self):
        flat = PyStepIOCallback(self._input, self._input_complete, self._output,
                                self._output_complete)
        flat.runtime_asserts = self.user.runtime_asserts
        return flat

    def _input(self, tensor_id: str, prefetch: bool):
        if tensor_id in self.by_id:
            gathered, index = self.by_id[tensor_id]
            return gathered.get(index)
        return self.user.input_callback(tensor_id, prefetch)

    def _input_complete(self, tensor_id: str) -> None:
        if tensor_id in self.by_id:
            gathered, index = self.by_id[tensor_id]
            return gathered.finish(index)
        return self.user.input_complete_callback(tensor_id)

    def _output(self, tensor_id: str):
        if tensor_id in self.by_id:
            gathered, index = self.by_id[tensor_id]
            return gathered.get(index)
        return self.user.output_callback(tensor_id)

    def _output_complete(self, tensor_id: str) -> None:
        if tensor_id in self.by_id:
            gathered, index = self.by_id[tensor_id]
            return gathered.finish(index)
        return self.user.output_complete_callback(tensor_id)


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
