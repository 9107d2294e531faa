"""User types as model inputs: ``ICustomArgParser`` and ``registerCustomArgParser``.

A wrapper flattens ``forward``'s arguments into tensors (``tracing.flatten_inputs``) with torch's
pytree. A registered parser makes a user type one more pytree node: ``yieldTensors(struct)``
gives its tensors in a fixed order (they become inputs of the compiled model, each with its
own dtype and shape in the input signature) and ``reconstruct(original, tensor_iterator)``
rebuilds a struct of the same type from them, which is what ``forward`` receives while tracing.

The compiled signature also holds the struct's non-tensor state (its ``__dict__`` or
``__slots__`` attributes that are not tensors): a call whose struct differs there compiles again,
as a change of a plain Python argument does, instead of reusing a graph traced with the old
values.
"""

from __future__ import annotations

import abc
import logging

import torch
from torch.utils import _pytree as pytree

__all__ = ["ICustomArgParser", "registerCustomArgParser", "registerGeometricCustomArgParsers"]

_log = logging.getLogger("poptorch_lite")

_PARSERS: dict[type, ICustomArgParser] = {}


class ICustomArgParser(abc.ABC):
    """How to pass a user type to ``forward``: its tensors in order, and how to rebuild it."""

    @abc.abstractmethod
    def yieldTensors(self, struct):  # noqa: N802 - PopTorch's name
        """Yield the tensors of ``struct``, always in the same order."""

    @abc.abstractmethod
    def reconstruct(self, original_structure, tensor_iterator):
        """A struct like ``original_structure`` whose tensors are taken, in the order of
        ``yieldTensors``, from ``tensor_iterator``."""


class _Context:
    """The pytree context of a parsed struct: the struct itself (for ``reconstruct``) and a
    key of its non-tensor state (equality and the signature's text use only the key)."""

    __slots__ = ("fields", "key", "struct")

    def __init__(self, struct):
        self.struct = struct
        state = getattr(struct, "__dict__", None)
        if state is None:  # a __slots__ class
            names = [n for cls in type(struct).__mro__
                     for n in _names(cls.__dict__.get("__slots__", ()))]
            state = {n: getattr(struct, n) for n in names if hasattr(struct, n)}
        plain = {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}
        self.fields = plain  # compared field by field in the changed-input message
        self.key = f"{type(struct).__qualname__}{sorted(plain.items(), key=str)!r}"

    def __eq__(self, other) -> bool:
        return isinstance(other, _Context) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return self.key

    def __deepcopy__(self, memo):
        # torch.export copies its input spec; the struct's tensors may be fake ones then.
        return self


def _names(slots) -> tuple:
    return (slots,) if isinstance(slots, str) else tuple(slots)


def _tensors_of(parser: ICustomArgParser, struct) -> list:
    tensors = list(parser.yieldTensors(struct))
    bad = [type(t).__name__ for t in tensors if not isinstance(t, torch.Tensor)]
    if bad:
        raise TypeError(f"{type(parser).__name__}.yieldTensors({type(struct).__name__}) yielded "
                        f"non-tensors ({', '.join(bad)}); yield only torch.Tensor values.")
    return tensors


def _register(data_type: type, parser: ICustomArgParser) -> None:
    def flatten(struct):
        return _tensors_of(parser, struct), _Context(struct)

    def flatten_with_keys(struct):
        tensors = _tensors_of(parser, struct)
        return ([(pytree.SequenceKey(i), t) for i, t in enumerate(tensors)],
                _Context(struct))

    def unflatten(values, context: _Context):
        values = list(values)
        iterator = iter(values)
        rebuilt = parser.reconstruct(context.struct, iterator)
        left = sum(1 for _ in iterator)
        if left:
            raise ValueError(f"{type(parser).__name__}.reconstruct used {len(values) - left} of "
                             f"the {len(values)} tensors yieldTensors gave; it must use them "
                             f"all, in the same order.")
        return rebuilt

    pytree.register_pytree_node(data_type, flatten, unflatten,
                                flatten_with_keys_fn=flatten_with_keys)


def registerCustomArgParser(arg_data_type: type, arg_parser) -> None:  # noqa: N802
    """Use ``arg_parser`` (an ``ICustomArgParser``) for inputs of type ``arg_data_type``;
    ``None`` removes the parser registered for that type."""
    if not isinstance(arg_data_type, type):
        raise TypeError(f"registerCustomArgParser: arg_data_type must be a class, got "
                        f"{arg_data_type!r}.")
    if arg_data_type in _PARSERS:
        pytree._deregister_pytree_node(arg_data_type)
        del _PARSERS[arg_data_type]
    if arg_parser is None:
        return
    if not isinstance(arg_parser, ICustomArgParser):
        raise TypeError(f"registerCustomArgParser: the parser for {arg_data_type.__name__} must "
                        f"be an ICustomArgParser instance, got {type(arg_parser).__name__}.")
    if arg_data_type in pytree.SUPPORTED_NODES:
        raise ValueError(f"registerCustomArgParser: {arg_data_type.__name__} is already a "
                         f"container torch flattens itself (tuple, list, dict, dataclass "
                         f"registered with torch ...); it needs no parser.")
    _register(arg_data_type, arg_parser)
    _PARSERS[arg_data_type] = arg_parser


def registerGeometricCustomArgParsers() -> None:  # noqa: N802
    """Register parsers for PyTorch Geometric's ``Data`` and ``Batch`` when it is installed."""
    try:
        import torch_geometric  # noqa: F401,PLC0415 - optional dependency
    except ImportError:
        _log.info("registerGeometricCustomArgParsers(): torch_geometric is not installed, so "
                  "no parser was registered.")
        return
    from torch_geometric.data import Batch, Data  # noqa: PLC0415

    registerCustomArgParser(Data, _GeometricParser())
    registerCustomArgParser(Batch, _GeometricParser())


class _GeometricParser(ICustomArgParser):
    """A PyG ``Data`` / ``Batch``: its tensor attributes in sorted key order."""

    def yieldTensors(self, struct):  # noqa: N802
        for key in sorted(struct.keys()):
            if isinstance(struct[key], torch.Tensor):
                yield struct[key]

    def reconstruct(self, original_structure, tensor_iterator):
        rebuilt = original_structure.clone()
        for key in sorted(original_structure.keys()):
            if isinstance(original_structure[key], torch.Tensor):
                rebuilt[key] = next(tensor_iterator)
        return rebuilt
