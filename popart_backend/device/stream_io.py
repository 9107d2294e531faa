"""Host stream IO of the simulated device: binding a ``PyStepIO``'s arrays to micro-batch chunks
(zero-copy torch views where the storage type matches the host type) and checking the arrays and
callback results a run reads or writes.

``bind_inputs`` / ``bind_outputs`` give, per input / anchor, the chunk of each micro-batch of a
run; the run loop of ``device/simulator.py`` binds input chunks to slots and ``copy_``s anchor
values into output chunks (``StringView`` / ``ConvertedView`` give that ``copy_`` to STRING
arrays and to types stored as another torch dtype).
"""

from __future__ import annotations

import difflib
import logging
import sys

import numpy as np
import torch

from ..dataflow import AnchorReturnTypeId, PyStepIO, PyStepIOCallback
from ..dtypes import DataType, to_host, to_storage
from ..errors import StepIOError
from .lower import AnchorStream, InputStream, Program

_log = logging.getLogger("popart:devicex")

def _hint_lines(p: Program, nelms: int, anchor: AnchorStream | None = None) -> str:
    lines = [
        "To disable this check at your own risk, use IStepIO::enableRuntimeAsserts.",
        f"  replication factor: {p.replication_factor}",
        f"  accumulation factor: {p.accumulation_factor}",
        f"  batches per step: {p.batches_per_step}",
        f"  tensor nelms: {nelms}",
    ]
    if anchor is not None:
        lines.append(f"  anchor return type: {anchor.art.id().name}")
        if anchor.art.id() is AnchorReturnTypeId.EveryN:
            lines.append(f"  anchor return period: {anchor.art.rp()}")
    return "\n".join(lines)


def _check_array(kind: str, tensor_id: str, array, info) -> None:
    if not isinstance(array, np.ndarray):
        raise StepIOError(
            f"PyStepIO's {kind} for tensor '{tensor_id}' is a {type(array).__name__}; give a "
            f"numpy array of dtype {info.dtype.numpy}."
        )
    if array.dtype != info.dtype.numpy:
        raise StepIOError(
            f"Type discrepancy for tensor '{tensor_id}': PyStepIO's {kind} hold a numpy array of "
            f"dtype {array.dtype}, but the model expects {info.dtype.numpy} ({info.dtype.name}). "
            f"Convert it with .astype(np.{info.dtype.numpy})."
        )


def bind_inputs(p: Program, stepio: PyStepIO):
    """Per input, the tensor of each micro-batch of this run (zero-copy views of the user data)."""
    total = p.micro_batches_per_run
    required = {s.id for s in p.inputs}
    for tensor_id in stepio.inputs:
        if tensor_id in required:
            continue
        if tensor_id in p.unused_inputs:
            _log.warning("Input '%s' is not used by the model (its uses were folded into "
                         "constants); its PyStepIO buffer is ignored.", tensor_id)
            continue
        raise StepIOError(
            f"PyStepIO's inputs has tensor '{tensor_id}', which is not an input of the model. "
            f"Model inputs: {sorted(required | p.unused_inputs)}." + _suggest(tensor_id, required)
        )
    feeds, offsets = [], {}
    for stream in p.inputs:
        if stream.id not in stepio.inputs:
            raise StepIOError(f"No tensor {stream.id} provided in PyStepIO's inputs")
        array = stepio.inputs[stream.id]
        nelms = stream.info.nelms
        # A broadcast input holds one value per micro-batch for all replicas together.
        rf = p.replication_factor if stream.broadcast else 1
        expected = nelms * total // rf
        if isinstance(array, torch.Tensor):
            tensor = _tensor_input(stream, array, expected, total // rf,
                                   stepio.input_offsets.get(stream.id, 0))
            if tensor is not None:  # one whole micro-batch, read in place
                feeds.append([tensor] * p.replication_factor if rf > 1 else [tensor])
                offsets[stream.id] = 0
                continue
            array = array.detach().numpy()
        _check_array("inputs", stream.id, array, stream.info)
        if stepio.runtime_asserts and array.size != expected:
            raise StepIOError(
                f"Unexpected number of input elements for Tensor {stream.id}. Expected "
                f"{expected}, but received {array.size}.\n" + _hint_lines(p, nelms)
                + ("\n  broadcast to every replica: yes" if stream.broadcast else "")
            )
        chunks, offsets[stream.id] = _chunks(
            "inputs", stream.id, array, stream.info, total // rf,
            stepio.input_offsets.get(stream.id, 0), writable=False)
        if rf > 1:  # micro-batch k of the run is replica k % rf of host chunk k // rf
            chunks = [chunk for chunk in chunks for _ in range(rf)]
        feeds.append(chunks)
    return feeds, offsets


def tensor_input_table(p: Program) -> tuple | None:
    """For ``bind_tensor_inputs``: per input (id, torch dtype, shape) when a run reads one
    micro-batch of every input in place from a torch tensor of its storage type; else None."""
    if p.micro_batches_per_run != 1 or not all(
            s.info.dtype.storage_views_host and s.info.dtype is not DataType.STRING
            and s.info.nelms for s in p.inputs):
        return None
    return tuple((s.id, s.info.dtype.torch, torch.Size(s.info.shape)) for s in p.inputs)


def bind_tensor_inputs(table: tuple, stepio: PyStepIO) -> list | None:
    """``bind_inputs`` of a run of one micro-batch (``tensor_input_table``) for a step IO
    holding exactly the model's inputs as contiguous CPU tensors of their dtype and shape:
    the tensors themselves, checked at a fraction of the cost; None: take ``bind_inputs``."""
    inputs, offsets = stepio.inputs, stepio.input_offsets
    if len(inputs) != len(table):
        return None
    feeds = []
    for tensor_id, dtype, shape in table:
        tensor = inputs.get(tensor_id)
        if (type(tensor) is not torch.Tensor or tensor.dtype is not dtype
                or tensor.shape != shape or tensor.requires_grad or not tensor.is_cpu
                or not tensor.is_contiguous() or offsets.get(tensor_id, 0)):
            return None
        feeds.append(tensor)
    return feeds


def _tensor_input(stream: InputStream, tensor: torch.Tensor, expected: int, chunks: int,
                  offset: int) -> torch.Tensor | None:
    """A torch input as the run's only chunk of ``stream``, viewed in place; None when it
    takes the numpy path (more chunks, another dtype or layout: converted or refused there)."""
    if not tensor.is_cpu:
        raise StepIOError(
            f"PyStepIO's input for tensor '{stream.id}' is a torch tensor on "
            f"{tensor.device}; give a CPU tensor or a numpy array."
        )
    info = stream.info
    if (chunks == 1 and offset == 0 and tensor.dtype is info.dtype.torch
            and tensor.numel() == expected == info.nelms and info.dtype.storage_views_host
            and tensor.is_contiguous()):
        if tensor.requires_grad:
            tensor = tensor.detach()
        return tensor if tensor.shape == info.shape else tensor.view(info.shape)
    return None


def bind_outputs(p: Program, stepio: PyStepIO):
    """Per anchor, the host chunks (torch views into the user's arrays) this run writes; with
    ``allocate_outputs``, the ``HandOver`` of each anchor fetched once, or chunks of an array
    the run allocates and puts in ``stepio.outputs``."""
    if stepio.allocate_outputs:
        return _allocated_outputs(p, stepio.outputs), {}
    anchored = {a.id for a in p.anchors}
    for tensor_id in stepio.outputs:
        if tensor_id not in anchored:
            raise StepIOError(
                f"PyStepIO's outputs has tensor '{tensor_id}', which is not an anchor. Anchors: "
                f"{sorted(anchored)}." + _suggest(tensor_id, anchored)
            )
    destinations, offsets = [], {}
    for anchor in p.anchors:
        if anchor.id not in stepio.outputs:
            raise StepIOError(f"No tensor {anchor.id} provided in PyStepIO's outputs")
        array = stepio.outputs[anchor.id]
        _check_array("outputs", anchor.id, array, anchor.info)
        if not (array.flags.c_contiguous and array.flags.writeable):
            raise StepIOError(
                f"PyStepIO's output array for anchor '{anchor.id}' must be C-contiguous and "
                f"writeable, so results can be written into it; allocate it with "
                f"session.initAnchorArrays() or np.empty."
            )
        nelms = anchor.info.nelms
        expected = nelms * anchor.fetches_per_run
        if stepio.runtime_asserts and array.size != expected:
            raise StepIOError(
                f"Unexpected number of output elements for Tensor {anchor.id}. Expected "
                f"{expected}, but received {array.size}.\n" + _hint_lines(p, nelms, anchor)
            )
        chunks, offsets[anchor.id] = _chunks(
            "outputs", anchor.id, array, anchor.info, anchor.fetches_per_run,
            stepio.output_offsets.get(anchor.id, 0), writable=True)
        destinations.append(chunks)
    return destinations, offsets


def _allocated_outputs(p: Program, results: dict) -> list:
    results.clear()
    destinations = []
    for anchor in p.anchors:
        info = anchor.info
        if (anchor.fetches_per_run == 1 and info.dtype.storage_views_host
                and info.dtype is not DataType.STRING):
            destinations.append((HandOver(results, anchor.id, anchor.host_shape,
                                          info.dtype.torch),))
            continue
        if info.dtype is DataType.STRING:
            array = np.full(anchor.host_shape, "", dtype=object)
        else:
            array = np.empty(anchor.host_shape, dtype=info.dtype.numpy)
        chunks, _ = _chunks("outputs", anchor.id, array, info, anchor.fetches_per_run, 0,
                            writable=True)
        viewable = info.dtype.storage_views_host and info.dtype is not DataType.STRING
        results[anchor.id] = to_storage(array, info.dtype) if viewable else array
        destinations.append(chunks)
    return destinations


class HandOver:
    """The output of an anchor fetched once per run, for a step IO that allocates its outputs:
    ``take`` hands the device's result tensor itself over when nothing else holds it (the device
    then forgets it, so a later run cannot write into it); ``copy_`` writes the value once into
    a new uninitialised tensor."""

    __slots__ = ("anchor_id", "dtype", "results", "shape")

    def __init__(self, results: dict, anchor_id: str, shape: tuple, dtype: torch.dtype):
        self.results, self.anchor_id, self.shape, self.dtype = results, anchor_id, shape, dtype

    def take(self, values: list, source: int) -> None:
        """Hand over ``values[source]`` (and clear the slot) if this list is its only holder
        and no other tensor shares its storage; else copy it."""
        value = values[source]
        # References: the slot list, ``value`` and getrefcount's argument. Storage users:
        # this tensor and the ``storage`` object.
        if (type(value) is torch.Tensor and value.dtype is self.dtype and value._base is None
                and sys.getrefcount(value) == 3 and value.is_contiguous()
                and value.storage_offset() == 0):
            storage = value.untyped_storage()
            # Not resizable: memory torch did not allocate (numpy's, a buffer someone keeps).
            if (torch._C._storage_Use_Count(storage._cdata) != 2 or not storage.resizable()
                    or storage.nbytes() != value.numel() * value.element_size()):
                self.copy_(value)
                return
            values[source] = None
            self.results[self.anchor_id] = (value if value.shape == self.shape
                                            else value.view(self.shape))
            return
        self.copy_(value)

    def copy_(self, value: torch.Tensor) -> None:
        out = torch.empty(self.shape, dtype=self.dtype)
        out.view(value.shape).copy_(value)
        self.results[self.anchor_id] = out


def _chunks(kind: str, tensor_id: str, array: np.ndarray, info, count: int, offset: int,
            writable: bool):
    """``count`` consecutive ``nelms(T)`` chunks of ``array`` from element ``offset``, wrapping.

    Returns the chunk views (shape T) and the element offset after them.
    """
    shape, nelms = info.shape, info.nelms
    if nelms == 0:
        zero = zeros_of(info)
        if writable and info.dtype is DataType.STRING:
            zero = StringView(zero)  # the anchor loop writes outputs with copy_
        return [zero] * count, 0
    num_chunks, remainder = divmod(array.size, nelms)
    if num_chunks == 0 or remainder:
        raise StepIOError(
            f"PyStepIO's {kind} array for tensor '{tensor_id}' holds {array.size} elements, not a "
            f"whole number of {nelms}-element micro-batch chunks; it cannot be read in chunks "
            f"even with runtime asserts disabled."
        )
    if not writable and not (array.flags.c_contiguous and array.flags.writeable):
        # Non-contiguous or read-only data gets one host copy; the user's array is untouched.
        array = np.array(array, order="C", copy=True)
    if array.dtype == object:
        return _string_chunks(array, shape, count, offset, num_chunks, writable)
    if not info.dtype.storage_views_host:
        return _converted_chunks(array, info, count, offset, num_chunks, writable)
    if num_chunks == count == 1:
        # One micro-batch per run (the usual training/inference step): no split needed.
        whole = to_storage(array, info.dtype)
        return (whole if array.shape == shape else whole.view(shape),), 0
    whole = to_storage(array.reshape(-1), info.dtype).view(num_chunks, *shape).unbind(0)
    start = offset // nelms
    if start == 0 and num_chunks == count:
        return whole, 0
    chunks = [whole[(start + i) % num_chunks] for i in range(count)]
    return chunks, ((start + count) % num_chunks) * nelms


def _string_chunks(array: np.ndarray, shape, count: int, offset: int, num_chunks: int,
                   writable: bool):
    """``_chunks`` for a STRING array: numpy views (torch has no strings); output chunks wrapped
    so the anchor loop writes them with ``copy_`` as it does torch views."""
    nelms = array.size // num_chunks
    blocks = array.reshape(num_chunks, *shape)
    whole = [blocks[i, ...] for i in range(num_chunks)]  # views, also of 0-d chunks
    if writable:
        whole = [StringView(view) for view in whole]
    start = offset // nelms
    chunks = [whole[(start + i) % num_chunks] for i in range(count)]
    return chunks, ((start + count) % num_chunks) * nelms


def _converted_chunks(array: np.ndarray, info, count: int, offset: int, num_chunks: int,
                      writable: bool):
    """``_chunks`` for a type the simulator stores in another torch dtype (int4, float8,
    uint32 ...: ``dtypes.to_storage``): input chunks are converted copies, output chunks are
    wrapped so the anchor loop's ``copy_`` converts back into the user's array."""
    nelms = array.size // num_chunks
    blocks = array.reshape(num_chunks, *info.shape)
    if writable:
        whole = [ConvertedView(blocks[i, ...], info.dtype) for i in range(num_chunks)]
    else:
        whole = list(to_storage(blocks, info.dtype).unbind(0))
    start = offset // nelms
    chunks = [whole[(start + i) % num_chunks] for i in range(count)]
    return chunks, ((start + count) % num_chunks) * nelms


class ConvertedView:
    """A numpy view into a host array whose ``copy_`` converts from the simulator's storage."""

    __slots__ = ("array", "dtype")

    def __init__(self, array: np.ndarray, dtype: DataType):
        self.array, self.dtype = array, dtype

    def copy_(self, value: torch.Tensor) -> None:
        self.array[...] = to_host(value, self.dtype)


class StringView:
    """A numpy view into a host STRING array with the ``copy_`` of a torch view."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array

    def copy_(self, value: np.ndarray) -> None:
        self.array[...] = value


def zeros_of(info):
    """A zero value of ``info``: "" for STRING."""
    if info.dtype is DataType.STRING:
        return np.full(info.shape, "", dtype=object)
    return torch.zeros(info.shape, dtype=info.dtype.torch)


def callback_feed(stepio: PyStepIOCallback, stream: InputStream) -> torch.Tensor:
    """One micro-batch of ``stream`` from the user's input callback."""
    value = callback_input(stream, stepio.input_callback(stream.id, False))
    stepio.input_complete_callback(stream.id)
    return value


def callback_input(stream: InputStream, array) -> torch.Tensor:
    _check_array("input_callback result", stream.id, array, stream.info)
    if array.size != stream.info.nelms:
        raise StepIOError(
            f"input_callback('{stream.id}') returned {array.size} elements, the tensor has "
            f"{stream.info.nelms} ({stream.info}); return one micro-batch of shape "
            f"{list(stream.info.shape)}."
        )
    if not (array.flags.c_contiguous and array.flags.writeable):
        array = np.array(array, order="C", copy=True)
    if array.dtype == object:
        return array.reshape(stream.info.shape)
    return to_storage(array, stream.info.dtype).view(stream.info.shape)


def callback_output(anchor: AnchorStream, array) -> torch.Tensor:
    _check_array("output_callback result", anchor.id, array, anchor.info)
    if array.size != anchor.info.nelms:
        raise StepIOError(
            f"output_callback('{anchor.id}') returned an array of {array.size} elements, the "
            f"anchor has {anchor.info.nelms} ({anchor.info}) per micro-batch."
        )
    if not (array.flags.c_contiguous and array.flags.writeable):
        raise StepIOError(
            f"output_callback('{anchor.id}') must return a C-contiguous writeable array."
        )
    if array.dtype == object:
        return StringView(array.reshape(anchor.info.shape))
    if not anchor.info.dtype.storage_views_host:
        return ConvertedView(array.reshape(anchor.info.shape), anchor.info.dtype)
    return to_storage(array, anchor.info.dtype).view(anchor.info.shape)


def _suggest(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=3)
    return f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""

