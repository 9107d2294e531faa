"""DataFlow, anchors and step IO.

``DataFlow`` says how many batches one ``run()`` processes and which tensors come back to the
host (anchors), each with an ``AnchorReturnType`` (All / EveryN / Final / Sum). ``PyStepIO``
and ``PyStepIOCallback`` hand the host buffers to ``run()``; ``PyWeightsIO`` carries weights
for ``readWeights`` / ``writeWeights``.

The arithmetic shared by sessions and the simulator (anchor shapes, per-run element counts,
which micro-batches an anchor returns) lives here too, so both read one definition.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from .errors import popart_exception
from .limits import check_step
from .tensorinfo import ExchangeStrategy, TileSet

__all__ = [
    "AnchorReturnType",
    "AnchorReturnTypeId",
    "DataFlow",
    "IStepIO",
    "IWeightsIO",
    "PyStepIO",
    "PyStepIOCallback",
    "PyWeightsIO",
]


class AnchorReturnTypeId(enum.Enum):
    """Which micro-batches of a run an anchor returns."""

    Final = 0
    EveryN = 1
    All = 2
    Sum = 3


_ART_BY_NAME = {member.name.upper(): member for member in AnchorReturnTypeId}


class AnchorReturnType:
    """How an anchor is returned: ``AnchorReturnType("All")``, ``AnchorReturnType("EveryN", 2)``.

    The type string is case-insensitive. Optional ``tileSet`` / ``exchangeStrategy`` follow the
    type (or the return period), positionally or by keyword.
    """

    __slots__ = ("_string", "_id", "_rp", "_tile_set", "_exchange_strategy")

    def __init__(self, anchorReturnTypeString: str, *args, **kwargs):  # noqa: N803 - PopART's name
        if not isinstance(anchorReturnTypeString, str):
            raise popart_exception(
                f"AnchorReturnType: the return type must be a string (ALL, EVERYN, FINAL, SUM), "
                f"not {type(anchorReturnTypeString).__name__} {anchorReturnTypeString!r}."
            )
        return_period, tile_set, strategy = _parse_art_args(args, kwargs)
        art_id = _ART_BY_NAME.get(anchorReturnTypeString.upper())
        if art_id is None:
            raise popart_exception(
                f"Invalid anchor return type ID supplied: {anchorReturnTypeString}. "
                f"Use one of ALL, EVERYN, FINAL, SUM (case-insensitive)."
            )
        if art_id is AnchorReturnTypeId.EveryN:
            if return_period is None:
                raise popart_exception("Must specify return period with option 'EVERYN'")
            if return_period <= 0:
                raise popart_exception("Anchor return period must be greater than zero")
        elif return_period is not None:
            raise popart_exception(
                f"A return period should not be supplied for this anchor return type "
                f"('{anchorReturnTypeString}'); only EVERYN takes one."
            )
        self._string = anchorReturnTypeString
        self._id = art_id
        self._rp = return_period if return_period is not None else 0
        self._tile_set = tile_set
        self._exchange_strategy = strategy

    def id(self) -> AnchorReturnTypeId:
        return self._id

    def rp(self) -> int:
        """Return period: N for EveryN, 0 for the other types."""
        return self._rp

    def str(self) -> str:
        return self._string

    def tileSet(self) -> TileSet:  # noqa: N802 - PopART's name
        return self._tile_set

    def exchangeStrategy(self) -> ExchangeStrategy:  # noqa: N802
        return self._exchange_strategy

    def __eq__(self, other) -> bool:
        if not isinstance(other, AnchorReturnType):
            return NotImplemented
        return (self._id, self._rp, self._tile_set, self._exchange_strategy) == (
            other._id, other._rp, other._tile_set, other._exchange_strategy)

    def __hash__(self) -> int:
        return hash((self._id, self._rp, self._tile_set, self._exchange_strategy))

    def __repr__(self) -> str:
        period = f", {self._rp}" if self._id is AnchorReturnTypeId.EveryN else ""
        extra = ""
        if self._tile_set is not TileSet.Compute or (
            self._exchange_strategy is not ExchangeStrategy.JustInTime
        ):
            extra = (f", TileSet.{self._tile_set.name}, "
                     f"ExchangeStrategy.{self._exchange_strategy.name}")
        return f"AnchorReturnType('{self._id.name}'{period}{extra})"


def _parse_art_args(args: tuple, kwargs: dict):
    """Sort the overloads ``(type, [returnPeriod], [tileSet], [exchangeStrategy])``."""
    unknown = set(kwargs) - {"returnPeriod", "tileSet", "exchangeStrategy"}
    if unknown:
        raise popart_exception(
            f"AnchorReturnType: unknown keyword(s) {sorted(unknown)}; accepted: returnPeriod, "
            f"tileSet, exchangeStrategy."
        )
    args = list(args)
    return_period = kwargs.get("returnPeriod")
    if args and isinstance(args[0], (int, float, np.number)) and not isinstance(args[0], bool):
        if "returnPeriod" in kwargs:
            raise popart_exception("AnchorReturnType: return period given twice.")
        return_period = args.pop(0)
    if len(args) > 2:
        raise popart_exception(
            f"AnchorReturnType: too many arguments {args!r}; expected "
            f"(type, [returnPeriod], [tileSet], [exchangeStrategy])."
        )
    tile_set = args[0] if len(args) > 0 else kwargs.get("tileSet", TileSet.Compute)
    strategy = (args[1] if len(args) > 1
                else kwargs.get("exchangeStrategy", ExchangeStrategy.JustInTime))
    if return_period is not None:
        if isinstance(return_period, bool) or not isinstance(return_period, (int, np.integer)):
            raise popart_exception(
                f"AnchorReturnType: the return period must be an integer, not {return_period!r}."
            )
        return_period = int(return_period)
    if not isinstance(tile_set, TileSet):
        raise popart_exception(
            f"AnchorReturnType: tileSet must be a TileSet (Compute or IO), not {tile_set!r}."
        )
    if not isinstance(strategy, ExchangeStrategy):
        raise popart_exception(
            f"AnchorReturnType: exchangeStrategy must be an ExchangeStrategy, not {strategy!r}."
        )
    return return_period, tile_set, strategy


class DataFlow:
    """Batches per step and the anchors of a session.

    ``DataFlow(bps, {"y": AnchorReturnType("All")})`` or
    ``DataFlow(bps, ["y", "z"], AnchorReturnType("Final"))`` (default return type All).
    """

    def __init__(self, batchesPerStep: int, anchors=None, anchorReturnType=None):  # noqa: N803
        self._anchors = _anchor_map(anchors, anchorReturnType)
        self.setBatchesPerStep(batchesPerStep)

    def setBatchesPerStep(self, batchesPerStep: int) -> None:  # noqa: N802,N803
        """Change the batches per step. A session copies its DataFlow when it is built, so
        this changes the sessions built afterwards."""
        if isinstance(batchesPerStep, bool) or not isinstance(batchesPerStep, (int, np.integer)):
            raise popart_exception(
                f"DataFlow: batchesPerStep must be an integer, not {batchesPerStep!r}."
            )
        batches_per_step = int(batchesPerStep)
        if batches_per_step <= 0:
            raise popart_exception("'Batches per step' must be greater than zero")
        check_step(batches_per_step, 0, f"DataFlow: batchesPerStep = {batches_per_step}")
        for tensor_id, art in self._anchors.items():
            _check_return_period(tensor_id, art, batches_per_step)
        self._bps = batches_per_step

    def isAnchored(self, tensorId: str) -> bool:  # noqa: N802,N803
        return tensorId in self._anchors

    def nAnchors(self) -> int:  # noqa: N802
        return len(self._anchors)

    def batchesPerStep(self) -> int:  # noqa: N802
        return self._bps

    def anchors(self) -> list[str]:
        return list(self._anchors)

    def art(self, anchorId: str) -> AnchorReturnType:  # noqa: N803
        try:
            return self._anchors[anchorId]
        except KeyError:
            raise popart_exception(f"Tensor {anchorId} is not an anchor") from None

    def anchor_return_types(self) -> dict[str, AnchorReturnType]:
        return dict(self._anchors)

    def __repr__(self) -> str:
        return f"DataFlow({self._bps}, {self._anchors!r})"


def _anchor_map(anchors, art) -> dict[str, AnchorReturnType]:
    if anchors is None:
        if art is not None:
            raise popart_exception("DataFlow: an anchor return type was given without anchors.")
        return {}
    if isinstance(anchors, Mapping):
        if art is not None:
            raise popart_exception(
                "DataFlow: give either a dict {id: AnchorReturnType} or a list of ids with one "
                "AnchorReturnType, not a dict and a return type."
            )
        result = {}
        for tensor_id, value in anchors.items():
            _check_anchor_id(tensor_id)
            if not isinstance(value, AnchorReturnType):
                raise popart_exception(
                    f"DataFlow: anchor '{tensor_id}' maps to {value!r}; expected an "
                    f"AnchorReturnType, e.g. AnchorReturnType('All')."
                )
            result[tensor_id] = value
        return result
    if isinstance(anchors, str) or not isinstance(anchors, Iterable):
        raise popart_exception(
            f"DataFlow: anchors must be a dict {{id: AnchorReturnType}} or a list of tensor ids, "
            f"not {type(anchors).__name__} {anchors!r}."
        )
    art = AnchorReturnType("All") if art is None else art
    if not isinstance(art, AnchorReturnType):
        raise popart_exception(
            f"DataFlow: anchorReturnType must be an AnchorReturnType, not {art!r}."
        )
    result = {}
    for tensor_id in anchors:
        _check_anchor_id(tensor_id)
        if tensor_id in result:
            raise popart_exception(
                f"DataFlow: anchor '{tensor_id}' is listed more than once; list each id once."
            )
        result[tensor_id] = art
    return result


def _check_anchor_id(tensor_id) -> None:
    if not isinstance(tensor_id, str) or not tensor_id:
        raise popart_exception(
            f"DataFlow: anchor ids must be non-empty strings, not {tensor_id!r}."
        )


def _check_return_period(tensor_id: str, art: AnchorReturnType, batches_per_step: int) -> None:
    if art.id() is not AnchorReturnTypeId.EveryN:
        return
    if art.rp() > batches_per_step:
        raise popart_exception("Return period must be <= to the number of batches per step")
    if batches_per_step % art.rp() != 0:
        raise popart_exception("Return period must be a factor of the number of batches per step")


# --- anchor arithmetic  -----------------------------------------------------------


def anchor_leading_dims(art: AnchorReturnType, bps: int, af: int, rf: int) -> tuple[int, ...]:
    """The ``[bps|bps/N, af, rf]`` or ``[rf]`` part of an anchor's shape, before squeezing."""
    kind = art.id()
    if kind is AnchorReturnTypeId.All:
        return (bps, af, rf)
    if kind is AnchorReturnTypeId.EveryN:
        return (bps // art.rp(), af, rf)
    return (rf,)


def anchor_shape(art: AnchorReturnType, sample_shape: tuple[int, ...], bps: int, af: int,
                 rf: int) -> tuple[int, ...]:
    """Shape of ``initAnchorArrays()``: size-1 leading entries dropped, never dims of T."""
    leading = tuple(d for d in anchor_leading_dims(art, bps, af, rf) if d != 1)
    return leading + tuple(sample_shape)


def anchor_fetches_per_run(art: AnchorReturnType, bps: int, af: int, rf: int) -> int:
    """How many ``nelms(T)`` chunks one run writes for the anchor (all replicas together)."""
    count = 1
    for d in anchor_leading_dims(art, bps, af, rf):
        count *= d
    return count


def anchor_fetch_index(art: AnchorReturnType, b: int, a: int, r: int, bps: int, af: int,
                       rf: int) -> int | None:
    """Index of the chunk micro-batch (b, a, r) writes, or None when it returns nothing.

    Sum returns the chunk index of replica r for every micro-batch (the caller accumulates).
    """
    kind = art.id()
    if kind is AnchorReturnTypeId.All:
        return (b * af + a) * rf + r
    if kind is AnchorReturnTypeId.EveryN:
        n = art.rp()
        if (b + 1) % n:
            return None
        return ((b // n) * af + a) * rf + r
    if kind is AnchorReturnTypeId.Final:
        return r if (b == bps - 1 and a == af - 1) else None
    return r


# --- step IO ---------------------------------------------------------------------------------


class IStepIO:
    """Base of the step-IO classes ``run()`` accepts (``PyStepIO``, ``PyStepIOCallback``)."""


class IWeightsIO:
    """Base of the weight carriers of ``readWeights`` / ``writeWeights`` (``PyWeightsIO``)."""


class PyStepIO(IStepIO):
    """Host buffers for one or more runs: ``PyStepIO({"x": array}, session.initAnchorArrays())``.

    Input arrays are read front to back in ``nelms(T)`` chunks in ``[bps, af, rf, mb, *S]``
    order; the read position wraps to the start after the last chunk and persists between runs
    (it only matters when runtime asserts are off and an array holds more than one step).
    Output arrays are filled the same way. A sequence input or output takes a list of such
    arrays, one per element, each with its own position; an absent optional takes None.

    Lite extensions (for frontends such as ``poptorch_lite``): an input may also be a CPU torch
    tensor (read in place when it is contiguous and of the input's storage type, else through
    its numpy view); with ``allocate_outputs=True`` ``outputs`` must be empty and each run sets
    ``outputs[id]`` to a new tensor of the anchor's host shape (``initAnchorArrays``' shape;
    a torch tensor, a numpy array for types torch cannot hold). When one run fetches the anchor
    once and the device's result tensor has no other owner, that tensor itself is handed over
    (no copy); otherwise the run allocates the tensor (uninitialised) and writes it once. A
    tensor a run returned never changes in later runs.
    """

    def __init__(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], *,
                 allocate_outputs: bool = False):
        if not isinstance(inputs, Mapping) or not isinstance(outputs, Mapping):
            raise popart_exception(
                "PyStepIO(inputs, outputs): both must be dicts {tensor id: numpy array}."
            )
        if allocate_outputs and outputs:
            raise popart_exception(
                f"PyStepIO(inputs, outputs, allocate_outputs=True): the run allocates the "
                f"outputs, so pass an empty outputs dict, not one holding {sorted(outputs)}."
            )
        self.inputs = dict(inputs)
        self.outputs = dict(outputs)
        self.allocate_outputs = bool(allocate_outputs)
        self.runtime_asserts = True
        # Element offsets of the next chunk, per tensor id (the wrap-around state).
        self.input_offsets: dict[str, int] = {}
        self.output_offsets: dict[str, int] = {}

    def enableRuntimeAsserts(self, enabled: bool) -> None:  # noqa: N802 - PopART's name
        self.runtime_asserts = bool(enabled)

    def __repr__(self) -> str:
        return f"PyStepIO(inputs={sorted(self.inputs)}, outputs={sorted(self.outputs)})"


class PyStepIOCallback(IStepIO):
    """Step IO through callbacks, called once per micro-batch per replica in (b, a, r) order.

    ``input_callback(id, prefetch) -> ndarray`` of the tensor's shape,
    ``input_complete_callback(id)``, ``output_callback(id) -> ndarray`` to fill,
    ``output_complete_callback(id)``.

    A sequence input or output is called back by its ONNX name with a list of
    arrays, one per element, per micro-batch; an absent optional is never called back
    (``importer/value_io.py`` module docstring).
    """

    def __init__(self, input_callback: Callable, input_complete_callback: Callable,
                 output_callback: Callable, output_complete_callback: Callable):
        for name, fn in (("input_callback", input_callback),
                         ("input_complete_callback", input_complete_callback),
                         ("output_callback", output_callback),
                         ("output_complete_callback", output_complete_callback)):
            if not callable(fn):
                raise popart_exception(f"PyStepIOCallback: {name} must be callable, not {fn!r}.")
        self.input_callback = input_callback
        self.input_complete_callback = input_complete_callback
        self.output_callback = output_callback
        self.output_complete_callback = output_complete_callback
        self.runtime_asserts = True

    def enableRuntimeAsserts(self, enabled: bool) -> None:  # noqa: N802
        self.runtime_asserts = bool(enabled)


class PyWeightsIO(IWeightsIO):
    """Weight buffers by tensor id, full weight shapes (``readWeights`` / ``writeWeights``)."""

    def __init__(self, weights: Mapping[str, np.ndarray]):
        if not isinstance(weights, Mapping):
            raise popart_exception(
                "PyWeightsIO(weights): expected a dict {weight id: numpy array}."
            )
        self.weights = dict(weights)

    def contains(self, tensor_id: str) -> bool:
        return tensor_id in self.weights

    def __repr__(self) -> str:
        return f"PyWeightsIO({sorted(self.weights)})"
