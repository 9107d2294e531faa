"""The public ``TensorInfo``, ``InputShapeInfo`` and ``InputSettings``, F7, F13, F102.

The IR works with the frozen ``popart_backend.ir.TensorInfo``; the public class here is PopART's
method-style view of the same thing (``shape()``, ``data_type()`` ...) and converts both ways
with ``to_ir()`` / ``from_ir()``. ``TileSet`` and ``ExchangeStrategy`` live here
because ``InputSettings`` is their first user; the data-flow module imports them from here.
"""

from __future__ import annotations

import enum
from typing import Iterable, Iterator

import numpy as np

from .dtypes import DataType, GraphcoreFloat8
from .errors import popart_exception
from .ir.tensor import TensorInfo as IrTensorInfo

__all__ = [
    "ExchangeStrategy",
    "InputSettings",
    "InputShapeInfo",
    "ReplicatedStreamMode",
    "TensorInfo",
    "TileSet",
    "getTensorInfo",
]


class TileSet(enum.Enum):
    """Which tiles of an IPU a tensor is streamed to."""

    Compute = 0
    IO = 1


class ExchangeStrategy(enum.Enum):
    """When host data is exchanged relative to compute."""

    JustInTime = 0
    OverlapInnerLoop = 1
    OverlapLoops = 2
    OverlapStep = 3


class ReplicatedStreamMode(enum.Enum):
    """How a host input reaches the replicas: its own slice for each (Replicate) or the same
    data for all (Broadcast)."""

    Replicate = 0
    Broadcast = 1


def _data_type(dtype) -> DataType:
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, GraphcoreFloat8):
        raise dtype.refusal("TensorInfo")
    if isinstance(dtype, str):
        return DataType.from_string(dtype)
    if isinstance(dtype, (np.dtype, type)):
        return DataType.from_numpy(dtype)
    raise popart_exception(
        f"TensorInfo: data type must be a string like 'FLOAT' or 'float32', a DataType or a numpy "
        f"dtype, not {type(dtype).__name__} {dtype!r}."
    )


def _shape(shape) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise popart_exception(
            f"TensorInfo: shape must be a list of integers, not {shape!r}."
        ) from None
    negative = [d for d in dims if d < 0]
    if negative:
        raise popart_exception(
            f"TensorInfo: shape {list(dims)} has negative dimensions; shapes on the simulated IPU "
            f"are static, give every dimension."
        )
    return dims


class TensorInfo:
    """Element type and shape of a tensor.

    ``TensorInfo("FLOAT", [2, 3])``, ``TensorInfo("float32", (2, 3))``,
    ``TensorInfo(DataType.FLOAT, [2, 3])`` or ``TensorInfo(array)``.
    """

    __slots__ = ("_info", "_meta_shape")

    def __init__(self, dtype_or_array, shape: Iterable[int] | None = None,
                 metaShape: Iterable[int] = ()):  # noqa: N803 - PopART's name
        # The full shape of a tensor whose shape is one replica's shard (PopART's RTS).
        self._meta_shape = list(_shape(metaShape))
        if shape is None:
            if isinstance(dtype_or_array, IrTensorInfo):
                self._info = dtype_or_array
                return
            if isinstance(dtype_or_array, TensorInfo):
                self._info = dtype_or_array._info
                self._meta_shape = dtype_or_array.metaShape()
                return
            if not isinstance(dtype_or_array, (np.ndarray, np.generic)):
                raise popart_exception(
                    f"TensorInfo({dtype_or_array!r}): give a data type and a shape, e.g. "
                    f"TensorInfo('FLOAT', [2, 3]), or a numpy array."
                )
            array = np.asarray(dtype_or_array)
            self._info = IrTensorInfo(DataType.from_numpy(array.dtype), array.shape)
            return
        self._info = IrTensorInfo(_data_type(dtype_or_array), _shape(shape))

    @classmethod
    def from_ir(cls, info: IrTensorInfo) -> "TensorInfo":
        return cls(info)

    def to_ir(self) -> IrTensorInfo:
        return self._info

    @property
    def dtype(self) -> DataType:
        return self._info.dtype

    def shape(self) -> list[int]:
        return list(self._info.shape)

    def set(self, dataType, shape: Iterable[int] | None = None,  # noqa: N803 - PopART's names
            metaShape: Iterable[int] | None = None) -> None:  # noqa: N803
        """Reset the type (and the shape, and the meta shape when given)."""
        dims = self._info.shape if shape is None else _shape(shape)
        self._info = IrTensorInfo(_data_type(dataType), dims)
        if metaShape is not None:
            self._meta_shape = list(_shape(metaShape))

    def metaShape(self) -> list[int]:  # noqa: N802
        """The full shape of a sharded tensor; [] when the tensor is not sharded."""
        return list(self._meta_shape)

    def dim(self, i: int) -> int:
        if not -self.rank() <= i < self.rank():
            raise popart_exception(f"TensorInfo.dim({i}): {self!r} has rank {self.rank()}.")
        return self._info.shape[i]

    def strides(self, shape: Iterable[int]) -> list[int]:
        """Row-major strides, in elements, of ``shape``."""
        dims = _shape(shape)
        out, step = [], 1
        for d in reversed(dims):
            out.append(step)
            step *= d
        return out[::-1]

    def dataType(self) -> DataType:  # noqa: N802
        return self._info.dtype

    def data_type(self) -> str:
        """Upper-case PopART name, e.g. ``"FLOAT"``."""
        return self._info.dtype.name

    def data_type_lcase(self) -> str:
        """numpy-style lower-case name, e.g. ``"float32"``."""
        return self._info.dtype.lcase

    def nelms(self) -> int:
        return self._info.nelms

    def nbytes(self) -> int:
        return self._info.num_bytes

    def rank(self) -> int:
        return self._info.rank

    def __eq__(self, other) -> bool:
        if isinstance(other, TensorInfo):
            return self._info == other._info
        if isinstance(other, IrTensorInfo):
            return self._info == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._info)

    def __repr__(self) -> str:
        return f"TensorInfo('{self.data_type()}', {self.shape()})"

    __str__ = __repr__


def getTensorInfo(array) -> TensorInfo:  # noqa: N802 - PopART's name
    """TensorInfo (type and shape) of a numpy array."""
    return TensorInfo(np.asarray(array))


class InputShapeInfo:
    """Shapes for model inputs whose ONNX shape is missing or symbolic."""

    def __init__(self):
        self._infos: dict[str, TensorInfo | list[TensorInfo] | None] = {}

    def add(self, tensor_id: str, info) -> None:
        """``info``: a TensorInfo; for an ONNX sequence input a list of TensorInfo, one per
        element (the length and element shapes are static per compiled session); None for an
        optional input the session is compiled without (fed None)."""
        if info is None:
            self._infos[tensor_id] = None
            return
        if isinstance(info, (list, tuple)):
            self._infos[tensor_id] = [self._checked(tensor_id, i) for i in info]
            return
        self._infos[tensor_id] = self._checked(tensor_id, info)

    @staticmethod
    def _checked(tensor_id: str, info) -> TensorInfo:
        if isinstance(info, IrTensorInfo):
            info = TensorInfo.from_ir(info)
        if not isinstance(info, TensorInfo):
            raise popart_exception(
                f"InputShapeInfo.add('{tensor_id}', ...): expected a TensorInfo (a list of them "
                f"for a sequence input, None for an absent optional input), got "
                f"{type(info).__name__}."
            )
        return info

    def get(self, tensor_id: str) -> TensorInfo:
        try:
            return self._infos[tensor_id]
        except KeyError:
            raise popart_exception(
                f"InputShapeInfo has no entry for '{tensor_id}'; it has {sorted(self._infos)}."
            ) from None

    def has(self, tensor_id: str) -> bool:
        return tensor_id in self._infos

    def getAllTensorInfo(self) -> dict[str, TensorInfo]:  # noqa: N802 - PopART's name
        return dict(self._infos)

    def to_ir(self) -> dict[str, IrTensorInfo]:
        """The mapping ``importer.onnx_model.import_model`` takes as ``input_shape_info``."""
        def convert(info):
            if info is None:
                return None
            if isinstance(info, list):
                return [i.to_ir() for i in info]
            return info.to_ir()

        return {name: convert(info) for name, info in self._infos.items()}

    def __len__(self) -> int:
        return len(self._infos)

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def __repr__(self) -> str:
        return f"InputShapeInfo({self._infos!r})"


class InputSettings:
    """How one host input is streamed to the device."""

    __slots__ = ("_tile_set", "_exchange_strategy", "_replicated_stream_mode")

    def __init__(
        self,
        tileSet: TileSet | ReplicatedStreamMode = TileSet.Compute,  # noqa: N803 - PopART's
        exchangeStrategy: ExchangeStrategy = ExchangeStrategy.JustInTime,  # noqa: N803
    ):
        mode = ReplicatedStreamMode.Replicate
        if isinstance(tileSet, ReplicatedStreamMode):  # the InputSettings(mode) overload
            mode, tileSet = tileSet, TileSet.Compute
        if not isinstance(tileSet, TileSet):
            raise popart_exception(
                f"InputSettings: tileSet must be a TileSet (Compute or IO), not {tileSet!r}."
            )
        if not isinstance(exchangeStrategy, ExchangeStrategy):
            raise popart_exception(
                f"InputSettings: exchangeStrategy must be an ExchangeStrategy, not "
                f"{exchangeStrategy!r}."
            )
        # Broadcast: the host array has no replica dimension and every replica reads the same
        # value (device/stream_io.py bind_inputs).
        self._tile_set = tileSet
        self._exchange_strategy = exchangeStrategy
        self._replicated_stream_mode = mode

    def tileSet(self) -> TileSet:  # noqa: N802
        return self._tile_set

    def exchangeStrategy(self) -> ExchangeStrategy:  # noqa: N802
        return self._exchange_strategy

    def replicatedStreamMode(self) -> ReplicatedStreamMode:  # noqa: N802
        return self._replicated_stream_mode

    def is_default(self) -> bool:
        return (self._tile_set is TileSet.Compute
                and self._exchange_strategy is ExchangeStrategy.JustInTime
                and self._replicated_stream_mode is ReplicatedStreamMode.Replicate)

    def _key(self) -> tuple:
        return self._tile_set, self._exchange_strategy, self._replicated_stream_mode

    def __eq__(self, other) -> bool:
        if not isinstance(other, InputSettings):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        mode = self._replicated_stream_mode
        if mode is ReplicatedStreamMode.Broadcast:
            return "InputSettings(ReplicatedStreamMode.Broadcast)"
        return (f"InputSettings(TileSet.{self._tile_set.name}, "
                f"ExchangeStrategy.{self._exchange_strategy.name})")


# InputSettings travel inside the ModelProto (the session only sees the model), as model
# metadata entries "__input_settings:<tensor id>" -> "<TileSet>,<ExchangeStrategy>", with
# ",Broadcast" appended for ReplicatedStreamMode.Broadcast.
INPUT_SETTINGS_KEY_PREFIX = "__input_settings:"


def encode_input_settings(settings: InputSettings) -> str:
    text = f"{settings.tileSet().name},{settings.exchangeStrategy().name}"
    if settings.replicatedStreamMode() is ReplicatedStreamMode.Broadcast:
        text += ",Broadcast"
    return text


def input_settings_from_model(model) -> dict[str, InputSettings]:
    """The non-default InputSettings the Builder recorded in an ``onnx.ModelProto``."""
    result = {}
    for prop in model.metadata_props:
        if not prop.key.startswith(INPUT_SETTINGS_KEY_PREFIX):
            continue
        tensor_id = prop.key[len(INPUT_SETTINGS_KEY_PREFIX):]
        tile_set, _, rest = prop.value.partition(",")
        strategy, _, mode = rest.partition(",")
        if (tile_set not in TileSet.__members__ or strategy not in ExchangeStrategy.__members__
                or mode not in ("", "Broadcast")):
            raise popart_exception(
                f"Model metadata '{prop.key}' = '{prop.value}' is not "
                f"'<TileSet>,<ExchangeStrategy>[,Broadcast]' "
                f"(TileSet: {list(TileSet.__members__)}, ExchangeStrategy: "
                f"{list(ExchangeStrategy.__members__)})."
            )
        settings = InputSettings(TileSet[tile_set], ExchangeStrategy[strategy])
        if mode:
            settings._replicated_stream_mode = ReplicatedStreamMode.Broadcast
        result[tensor_id] = settings
    return result
