"""Custom operators in Python (spec §7, F83–F94): ``import popart_backend.custom``.

PopART users write an Op, a GradOp and two Opx classes in C++ and load a shared library. Here
they write one Python class per op (shape inference, attributes, grad ops, a numpy ``compute``)
and register it with a decorator; registration is the Python analogue of loading the library.

The public custom-op API *is* the internal op API (DESIGN decision 2): ``register_op`` wraps the
user's class in an adapter subclass of the IR ``Op`` and puts it in the same registry the
built-in ops use, so the importer, ``Builder.customOp``, ``getTensorShape``, autodiff, the
cost model and the simulator treat it like any other op:

- ``infer`` calls the user's ``setup(in_infos)`` (public ``TensorInfo`` objects) and checks
  the result against the op's ``OpDefinition``;
- ``kernel`` hands the torch inputs to ``compute(ctx, *arrays)`` as zero-copy numpy views
  (read-only unless the op declares ``modifies_inputs``), then checks each result's shape and
  dtype against ``setup`` before wrapping it back zero-copy;
- ``grad`` inserts the user's ``grad_ops()`` wired by their ``grad_input_info`` and
  ``grad_out_to_non_grad_in`` tables;
- every custom op reads the session's ``randomSeed___`` tensor ([user seed, micro-batch
  counter], docs/training.md): that is how ``ctx`` learns the micro-batch and replica it runs
  for, and, for ops with ``requires_random_seed``, a per-op seed.
"""

from __future__ import annotations

import copy
import enum
import hashlib
import importlib.util
import logging
import re
import sys
import types
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, NamedTuple, Sequence

import numpy as np
import torch

from .dtypes import DataType
from .errors import popart_exception, popart_runtime_error
from .ir.op import Op as IrOp
from .ir.op import OpSettings
from .ir.tensor import TensorInfo as IrTensorInfo
from .ir.tensor import TensorKind
from .ops import registry
from .ops.random import mix_seed
from .supported_ops import OperatorIdentifier, OpDefinition
from .tensorinfo import TensorInfo

__all__ = [
    "ComputeContext",
    "GradInOutMapper",
    "GradOp",
    "GradOpInType",
    "Op",
    "OpDefinition",
    "OperatorIdentifier",
    "loadCustomOpModule",
    "register_grad_op",
    "register_op",
    "registered_custom_ops",
    "run_backward",
    "run_forward",
    "unregister_op",
]

_log = logging.getLogger("popart:op")
RANDOM_SEED_ID = "randomSeed___"  # transforms/random_seed.py


# --- the user-facing classes ---------------------------------------------------------------------


class GradOpInType(enum.Enum):
    """What a grad op input is: a forward input, a forward output, or an output's gradient."""

    In = 0
    Out = 1
    GradOut = 2


class GradInOutMapper(NamedTuple):
    """Grad op input ``iGrad`` is forward tensor ``iNonGrad`` of kind ``type`` (F84)."""

    iGrad: int  # noqa: N815 - PopART's names
    iNonGrad: int  # noqa: N815
    type: GradOpInType


@dataclass(frozen=True)
class ComputeContext:
    """What ``compute(ctx, ...)`` knows about where it runs (one micro-batch, one replica).

    ``seed`` is an int that changes every micro-batch (and replica) and replays with the same
    ``setRandomSeed``; it is None unless the op class sets ``requires_random_seed``.
    """

    name: str
    replica: int
    num_replicas: int
    ipu: int
    micro_batch: int
    seed: int | None


class Op:
    """Base of a custom op (F83). Subclass, then ``@register_op(opid, definition=...)``.

    The registry builds it as ``cls(opid, attributes, settings)``; ``attributes`` is a dict of
    the node's attribute values (int, float, str or tuples of them).
    """

    HIGH: ClassVar[float] = 1000.0  # getHighSubgraphValue(): ops worth outlining, e.g. conv
    LOW: ClassVar[float] = 0.1  # getLowSubgraphValue(): cheap ops, e.g. relu
    subgraph_value: ClassVar[float] = LOW
    requires_random_seed: ClassVar[bool] = False
    # Inputs ``compute`` writes in place (in-place variants); other inputs are read-only.
    modifies_inputs: ClassVar[tuple[int, ...]] = ()

    def __init__(self, opid: OperatorIdentifier, settings: OpSettings | None = None):
        self.opid = opid
        self.settings = settings if settings is not None else OpSettings()

    def setup(self, in_infos: list[TensorInfo]) -> list[TensorInfo]:
        """Output infos from input infos (mandatory; idempotent; used by getTensorShape)."""
        raise NotImplementedError(f"custom op {self.opid}: define setup(in_infos)")

    def compute(self, ctx: ComputeContext, *inputs: np.ndarray):
        """Outputs (one array, or a tuple for several) from numpy inputs (mandatory)."""
        raise NotImplementedError(f"custom op {self.opid}: define compute(ctx, *inputs)")

    def attributes(self) -> dict:
        """Everything that affects compilation (appendAttributes: IR dumps and hashes)."""
        return {}

    def outline_attributes(self) -> dict:
        """What makes two instances outline-equivalent (appendOutlineAttributes)."""
        return self.attributes()

    def grad_ops(self) -> list["GradOp"]:
        """Grad ops computing the input gradients; [] for an op without gradient."""
        return []

    def inplace_variants(self) -> list[tuple[OperatorIdentifier, float]]:
        """In-place variants, best first: ``[(opid, priority)]`` (inplacePriorityDefault)."""
        return []

    def inplace_variant(self, opid: OperatorIdentifier) -> "Op":
        """The in-place op for ``opid`` (getInplaceVariant): by default the class registered
        for ``opid``, built with this op's attributes and settings."""
        entry = _CUSTOM.get(opid)
        if entry is None:
            raise popart_exception(
                f"custom op {self.opid}: in-place variant {opid} is not registered; register it "
                f"with @register_op({opid!r}).")
        return entry.user_class(opid, dict(self.attributes()), self.settings)

    def clone(self) -> "Op":
        return copy.copy(self)


class GradOp(Op):
    """Base of a custom grad op (F84): built by the forward op's ``grad_ops()``.

    ``grad_input_info``: ``[(iGrad, iNonGrad, GradOpInType)]``, grad op input ``iGrad`` is the
    forward input (``In``), forward output (``Out``) or output gradient (``GradOut``)
    ``iNonGrad``. ``grad_out_to_non_grad_in``: ``{grad op output: forward input}``.
    """

    grad_input_info: ClassVar[Sequence[tuple[int, int, GradOpInType]]] = ()
    grad_out_to_non_grad_in: ClassVar[dict[int, int]] = {}


# --- registration ---------------------------------------------------------------------------------


@dataclass
class _Entry:
    user_class: type
    adapter: type
    replaced: type | None  # the class this registration replaced, restored by unregister_op


_CUSTOM: dict[OperatorIdentifier, _Entry] = {}


def register_op(opid: OperatorIdentifier, definition: OpDefinition | None = None,
                public: bool = True):
    """Class decorator registering a custom ``Op`` subclass under ``opid`` (F88, F93).

    ``definition`` lets the backend check input/output dtypes and attribute values (a
    violation raises ``popart_exception`` when a session or ``getTensorShape`` imports the
    node). Registering an identifier that exists replaces it, with a warning.
    """
    return _decorator(opid, definition, public, grad=False)


def register_grad_op(opid: OperatorIdentifier):
    """Class decorator registering a custom ``GradOp`` subclass under ``opid`` (F89)."""
    return _decorator(opid, None, False, grad=True)


def _decorator(opid, definition, public, grad):
    if not isinstance(opid, OperatorIdentifier):
        raise popart_exception(
            f"register_op: the identifier must be a popart.OperatorIdentifier(domain, type, "
            f"version), not {type(opid).__name__} {opid!r}.")
    definition = _normalize_definition(opid, definition)

    def decorate(cls: type) -> type:
        base = GradOp if grad else Op
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise popart_exception(
                f"{'register_grad_op' if grad else 'register_op'}({opid}): {cls!r} must be a "
                f"subclass of popart.custom.{base.__name__}.")
        if grad:
            _check_grad_tables(opid, cls)
        adapter = _make_adapter(cls, opid, definition, public, grad)
        previous = registry.unregister_op(opid.type, opid.version, opid.domain)
        if previous is not None:
            message = (f"Custom op {opid} is already registered (by "
                       f"{previous.__module__}.{previous.__qualname__}); "
                       f"{cls.__module__}.{cls.__qualname__} replaces it.")
            _log.warning(message)
            warnings.warn(message, UserWarning, stacklevel=3)
        registry.register_op(opid.type, opid.version, opid.domain)(adapter)
        old = _CUSTOM.get(opid)
        replaced = old.replaced if old is not None else previous
        _CUSTOM[opid] = _Entry(cls, adapter, replaced)
        return cls

    return decorate


def unregister_op(opid: OperatorIdentifier) -> None:
    """Remove a custom op registration, restoring the op it replaced (if any)."""
    entry = _CUSTOM.pop(opid, None)
    if entry is None:
        raise popart_exception(f"unregister_op: {opid} is not a registered custom op.")
    registry.unregister_op(opid.type, opid.version, opid.domain)
    if entry.replaced is not None:
        registry.register_op(opid.type, opid.version, opid.domain)(entry.replaced)


def registered_custom_ops() -> dict[OperatorIdentifier, type]:
    """Identifier -> user class of every registered custom op and grad op."""
    return {opid: entry.user_class for opid, entry in _CUSTOM.items()}


def loadCustomOpModule(path) -> types.ModuleType:  # noqa: N802 - PopART-style name
    """Import the Python file at ``path``, whose decorators register its ops (the analogue of
    ``ctypes.cdll.LoadLibrary`` for a custom-op library). Returns the module."""
    path = Path(path)
    if not path.is_file():
        raise popart_exception(f"loadCustomOpModule: no file '{path}'. Give the path of a .py "
                               f"file that registers custom ops.")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    stem = re.sub(r"\W", "_", path.stem)
    name = f"popart_custom_ops_{stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise popart_exception(f"loadCustomOpModule: '{path}' is not a Python module (.py).")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise popart_exception(
            f"loadCustomOpModule('{path}') failed while importing it: {type(exc).__name__}: "
            f"{exc}") from exc
    return module


# --- running a custom op outside a session (frontends' eager CPU path) -------------------------


def _user_class(domain: str, op_type: str, version: int) -> type:
    cls, _ = registry.resolve(op_type, domain, version)
    if not issubclass(cls, CustomOpAdapter):
        raise popart_exception(f"{domain}::{op_type}-{version} is a built-in op, not a custom op.")
    return cls


def _eager_ctx(name: str) -> ComputeContext:
    return ComputeContext(name=name, replica=0, num_replicas=1, ipu=0, micro_batch=0, seed=None)


def run_forward(domain: str, op_type: str, version: int, attributes: dict,
                inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Outputs of the registered custom op on numpy inputs, on the host (no session).

    For frontends running a model eagerly on CPU; checked against ``setup`` like on device."""
    adapter = _user_class(domain, op_type, version)
    op = adapter(adapter.build_attrs(version, dict(attributes), op_type), OpSettings(name=op_type))
    infos = op.infer(*[IrTensorInfo.of(np.asarray(x)) for x in inputs])
    result = op.impl.compute(_eager_ctx(op_type), *[np.asarray(x) for x in inputs])
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    return [op._to_torch(i, r).numpy() for i, r in enumerate(results[:len(infos)])]


def run_backward(domain: str, op_type: str, version: int, attributes: dict,
                 inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                 output_grads: Sequence[np.ndarray]) -> list[np.ndarray | None]:
    """Input gradients from the op's registered grad ops, on the host (None: no gradient)."""
    adapter = _user_class(domain, op_type, version)
    impl = adapter(adapter.build_attrs(version, dict(attributes), op_type),
                   OpSettings(name=op_type)).impl
    grads: list[np.ndarray | None] = [None] * len(inputs)
    for grad_op in impl.grad_ops() or []:
        sources = {GradOpInType.In: inputs, GradOpInType.Out: outputs,
                   GradOpInType.GradOut: output_grads}
        args = [np.asarray(sources[GradOpInType(kind)][i]) for _, i, kind in
                sorted(tuple(m) for m in grad_op.grad_input_info)]
        result = grad_op.compute(_eager_ctx(op_type + "Grad"), *args)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        for grad_out, forward_in in grad_op.grad_out_to_non_grad_in.items():
            value = np.asarray(results[grad_out])
            grads[forward_in] = value if grads[forward_in] is None else grads[forward_in] + value
    return grads


# --- OpDefinition -----------------------------------------------------------------------------------


def _data_types(names, where: str) -> tuple[DataType, ...]:
    out = []
    for name in names:
        if isinstance(name, DataType):
            out.append(name)
            continue
        try:
            out.append(DataType[str(name).upper()])
        except KeyError:
            raise popart_exception(
                f"{where}: unknown data type {name!r}; use names like 'FLOAT', 'FLOAT16', "
                f"'INT32'.") from None
    return tuple(out)


def _normalize_definition(opid, definition) -> OpDefinition | None:
    """Accept §7.2's ``("name", ["FLOAT", ...])`` pairs as well as Input/Output objects."""
    if definition is None:
        return None
    if not isinstance(definition, OpDefinition):
        raise popart_exception(f"register_op({opid}): definition must be a popart.OpDefinition, "
                               f"not {type(definition).__name__}.")
    where = f"OpDefinition of {opid}"

    def slot(entry, kind):
        if isinstance(entry, (OpDefinition.Input, OpDefinition.Output)):
            return entry
        if isinstance(entry, str):
            entry = (entry, ())
        name, dtypes, *rest = entry
        types_ = _data_types(dtypes, where)
        if kind is OpDefinition.Input:
            return OpDefinition.Input(name, types_, bool(rest[0]) if rest else False)
        return OpDefinition.Output(name, types_)

    for regex in definition.attributes.values():
        _compile_regex(regex, where)
    return OpDefinition([slot(e, OpDefinition.Input) for e in definition.inputs],
                        [slot(e, OpDefinition.Output) for e in definition.outputs],
                        dict(definition.attributes))


def _compile_regex(regex: str, where: str) -> re.Pattern:
    # PopART writes "*" for "any value"; it is not a valid regular expression.
    if regex in ("*", ""):
        return re.compile(r"(?s).*")
    try:
        return re.compile(regex)
    except re.error as exc:
        raise popart_exception(f"{where}: attribute regex {regex!r} is invalid: {exc}") from None


def _check_attributes(definition: OpDefinition, values: dict, where: str) -> None:
    unknown = sorted(set(values) - set(definition.attributes))
    if unknown:
        raise popart_exception(
            f"{where}: attribute(s) {unknown} are not in the op's OpDefinition, which allows "
            f"{sorted(definition.attributes) or 'none'}.")
    for name, value in values.items():
        pattern = _compile_regex(definition.attributes[name], where)
        items = value if isinstance(value, (tuple, list)) else (value,)
        for item in items:
            if pattern.fullmatch(str(item)) is None:
                raise popart_exception(
                    f"{where}: attribute '{name}' = {value!r} does not match the OpDefinition's "
                    f"regex {definition.attributes[name]!r}.")


def _check_types(slots, infos, kind: str, where: str) -> None:
    for index, (slot, info) in enumerate(zip(slots, infos)):
        if info is None or not slot.supportedTensors:
            continue
        if info.dtype not in slot.supportedTensors:
            allowed = [t.name for t in slot.supportedTensors]
            raise popart_exception(
                f"{where}: {kind} {index} '{slot.name}' is {info.dtype.name}, but the op's "
                f"OpDefinition allows {allowed}. Cast it, or widen the definition.")


# --- the adapter: a user class as an IR op --------------------------------------------------------


class CustomAttrs(dict):
    """A custom op's attribute values (any names its OpDefinition allows)."""

    def __hash__(self) -> int:  # attrs are values; hash for IR hashing/caches
        return hash(tuple(sorted((k, repr(v)) for k, v in self.items())))


@dataclass(frozen=True)
class _GradAttrs:
    """A custom grad op's 'attributes': the user GradOp object ``grad_ops()`` built."""

    instance: GradOp


def _public_info(info):
    return None if info is None else TensorInfo.from_ir(info)


def _ir_info(info, where: str) -> IrTensorInfo:
    if isinstance(info, TensorInfo):
        return info.to_ir()
    if isinstance(info, IrTensorInfo):
        return info
    raise popart_exception(f"{where}: setup() must return popart.TensorInfo objects, got "
                           f"{type(info).__name__} {info!r}.")


class CustomOpAdapter(IrOp):
    """The IR op of a registered custom op; ``impl`` is the user's object."""

    user_class: ClassVar[type] = Op
    opid: ClassVar[OperatorIdentifier]
    definition: ClassVar[OpDefinition | None] = None
    is_grad: ClassVar[bool] = False
    # Constants never fold through user code: compute runs on the device, with a context.
    foldable = False
    # Every custom op reads randomSeed___ ([seed, micro-batch counter]): ctx needs it.
    requires_random_seed = True
    # Outputs are new arrays (read-only input views are copied), or, for in-place variants,
    # inputs that were themselves safe to overwrite: the InplaceVariants pass relies on it.
    fresh_outputs = True

    def __init__(self, attrs=None, settings: OpSettings | None = None, version: int | None = None,
                 impl: Op | None = None):
        super().__init__(attrs if attrs is not None else CustomAttrs(), settings, version)
        if impl is not None:
            self.impl = impl
        elif isinstance(self.attrs, _GradAttrs):
            self.impl = self.attrs.instance
        else:
            self.impl = self._construct(dict(self.attrs))
        self._num_inputs = 0
        self._out_infos: list[IrTensorInfo] = []
        self._num_replicas = 1
        self._ipus_per_replica = 1
        self._seed_modifier = 0

    @classmethod
    def build_attrs(cls, version: int, values: dict, where: str):
        if cls.is_grad:
            instance = values.get("instance")
            if set(values) != {"instance"} or not isinstance(instance, cls.user_class):
                raise popart_exception(
                    f"{where}: custom grad op {cls.opid} is created only by its forward op's "
                    f"grad_ops(); it cannot appear in a model.")
            return _GradAttrs(instance)
        if cls.definition is not None:
            _check_attributes(cls.definition, values, f"{where} (custom op {cls.opid})")
        return CustomAttrs(values)

    def _construct(self, attributes: dict):
        try:
            return self.user_class(self.opid, attributes, self.settings)
        except popart_exception:
            raise
        except Exception as exc:
            raise popart_exception(
                f"custom op {self.opid}: {self.user_class.__qualname__}(opid, attributes, "
                f"settings) failed with attributes {attributes}: {type(exc).__name__}: {exc}"
            ) from exc

    # --- contract of an IR op --------------------------------------------------------------------

    @property
    def debug_name(self) -> str:
        return f"{super().debug_name} [custom op {self.opid}, class {self.user_class.__qualname__}]"

    def attr_dict(self) -> dict:
        return dict(self.impl.attributes())

    def infer(self, *infos):
        tensors = list(self.inputs) + [None] * (len(infos) - len(self.inputs))
        user = [info for t, info in zip(tensors, infos)
                if not (t is not None and t.id == RANDOM_SEED_ID)]
        self._num_inputs = len(user)
        where = self.debug_name
        for index in self.modifies_inputs:
            tensor = self.inputs[index] if index < len(self.inputs) else None
            if tensor is not None and tensor.producer is None and tensor.kind is not TensorKind.VARIABLE:
                raise popart_exception(
                    f"{where}: writes input {index} '{tensor.id}' in place, but it is a "
                    f"{tensor.kind.value} tensor (a model input or constant), which must not "
                    f"change. Use the op's out-of-place form here.")
        if self.definition is not None:
            _check_types(self.definition.inputs, user, "input", where)
        try:
            result = self.impl.setup([_public_info(i) for i in user])
        except popart_exception:
            raise
        except Exception as exc:
            raise popart_exception(
                f"{where}: setup() failed on inputs {[str(i) for i in user]}: "
                f"{type(exc).__name__}: {exc}") from exc
        if isinstance(result, (TensorInfo, IrTensorInfo)):
            result = [result]
        if not isinstance(result, (list, tuple)):
            raise popart_exception(f"{where}: setup() must return a list of TensorInfo, got "
                                   f"{type(result).__name__}.")
        outs = [_ir_info(info, where) for info in result]
        expected = self._expected_outputs()
        if expected is not None and len(outs) != expected:
            raise popart_exception(
                f"{where}: setup() returned {len(outs)} output info(s), but the op has "
                f"{expected} output(s) ({self._expected_reason()}). Return one TensorInfo per "
                f"output.")
        if self.num_outputs is not None and self.num_outputs > len(outs):
            raise popart_exception(
                f"{where}: the node asks for {self.num_outputs} outputs, setup() returned "
                f"{len(outs)} output info(s).")
        if self.definition is not None:
            _check_types(self.definition.outputs, outs, "output", where)
        self._out_infos = outs
        return outs

    def _expected_outputs(self) -> int | None:
        if self.is_grad:
            return max(self.impl.grad_out_to_non_grad_in, default=-1) + 1
        if self.definition is not None and self.definition.outputs:
            return len(self.definition.outputs)
        return None

    def _expected_reason(self) -> str:
        if self.is_grad:
            return "grad_out_to_non_grad_in maps that many grad outputs"
        return "its OpDefinition lists that many outputs"

    def bind_program(self, program) -> None:
        """Called by the simulated device: the replica and IPU layout ``ctx`` reports."""
        self._num_replicas = int(program.replication_factor)
        self._ipus_per_replica = int(program.ipus_per_replica)
        self._seed_modifier = zlib.crc32((self.settings.name or str(self.id)).encode())

    def kernel(self, *xs):
        n = self._num_inputs
        seed = xs[n] if len(xs) > n else None
        counter = int(seed[1]) if seed is not None else 0
        replica = counter % self._num_replicas
        ctx = ComputeContext(
            name=self.settings.name,
            replica=replica,
            num_replicas=self._num_replicas,
            ipu=replica * self._ipus_per_replica + (self.settings.ipu or 0),
            micro_batch=counter // self._num_replicas,
            seed=(mix_seed(int(seed[0]), counter, self._seed_modifier)
                  if seed is not None and self.user_class.requires_random_seed else None),
        )
        arrays = []
        for index, x in enumerate(xs[:n]):
            if x is None:
                arrays.append(None)
                continue
            array = x.numpy()  # zero-copy view of the device tensor
            if index not in self.modifies_inputs:
                array.flags.writeable = False  # compute must not change inputs it only reads
            arrays.append(array)
        result = self.impl.compute(ctx, *arrays)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        wanted = len(self.outputs)
        if len(results) < wanted:
            raise popart_runtime_error(
                f"{self.debug_name}: compute() returned {len(results)} output(s), setup() "
                f"declared {len(self._out_infos)}; return a tuple with one array per output.")
        tensors = [self._to_torch(i, r) for i, r in enumerate(results[:wanted])]
        return tensors[0] if wanted == 1 else tuple(tensors)

    def _to_torch(self, index: int, value) -> torch.Tensor:
        info = self._out_infos[index]
        array = np.asarray(value)
        if array.shape != info.shape or array.dtype != info.dtype.numpy:
            raise popart_runtime_error(
                f"{self.debug_name}: compute() output {index} is {array.dtype}{list(array.shape)}, "
                f"but setup() declared {info.dtype.numpy}{list(info.shape)}. Return arrays of "
                f"exactly the declared shape and dtype (e.g. .astype(np.{info.dtype.numpy})).")
        if not array.flags.writeable or any(s < 0 for s in array.strides):
            # A read-only result is (a view of) an input: copy it so the output owns its data.
            array = np.array(array, order="C", copy=True)
        return torch.from_numpy(array)

    def grad(self, g) -> None:
        grad_ops = list(self.impl.grad_ops() or [])
        wanted = [i for i in range(self._num_inputs) if g.needs_input_grad(i)]
        if not grad_ops:
            raise popart_exception(
                f"{self.debug_name} has no grad ops (grad_ops() returned none), but the backward "
                f"pass needs the gradient of its input(s) {[g.input(i) for i in wanted]}. "
                f"Return GradOp instances from grad_ops() (registered with register_grad_op), or "
                f"detach the path.")
        parts: dict[int, list[str]] = {}
        for grad_op in grad_ops:
            entry = _CUSTOM.get(getattr(grad_op, "opid", None))
            if not isinstance(grad_op, GradOp) or entry is None or entry.user_class is not type(
                    grad_op):
                raise popart_exception(
                    f"{self.debug_name}: grad_ops() returned {grad_op!r}, which is not a GradOp "
                    f"registered with @register_grad_op under its opid "
                    f"({getattr(grad_op, 'opid', None)}).")
            inputs = []
            for position, (i_grad, i_non_grad, kind) in enumerate(
                    sorted(tuple(m) for m in grad_op.grad_input_info)):
                if i_grad != position:
                    raise popart_exception(
                        f"{self.debug_name}: grad op {grad_op.opid}: grad_input_info must cover "
                        f"grad inputs 0..n-1 once each, got {list(grad_op.grad_input_info)}.")
                kind = GradOpInType(kind)
                inputs.append(g.input(i_non_grad) if kind is GradOpInType.In
                              else g.output(i_non_grad) if kind is GradOpInType.Out
                              else g.output_grad(i_non_grad))
            count = max(grad_op.grad_out_to_non_grad_in) + 1
            outs = g.op(grad_op.opid.type, *inputs, domain=grad_op.opid.domain,
                        version=grad_op.opid.version, num_outputs=count, instance=grad_op)
            outs = [outs] if count == 1 else outs
            for grad_out, forward_in in grad_op.grad_out_to_non_grad_in.items():
                parts.setdefault(forward_in, []).append(outs[grad_out])
        missing = [g.input(i) for i in wanted if i not in parts]
        if missing:
            raise popart_exception(
                f"{self.debug_name}: no grad op output maps to input(s) {missing} "
                f"(grad_out_to_non_grad_in), but the backward pass needs their gradients.")
        for forward_in, grads in parts.items():
            total = grads[0] if len(grads) == 1 else g.op("Sum", *grads)
            g.set_input_grad(forward_in, total)

    def cost(self) -> tuple[int, int]:
        user_cost = getattr(self.impl, "cost", None)
        if user_cost is None:
            return super().cost()
        infos = [_public_info(t.info if t is not None else None)
                 for t in self.inputs[:self._num_inputs]]
        flops, num_bytes = user_cost(infos)
        return int(flops), int(num_bytes)

    def inplace_variants(self) -> list[tuple[OperatorIdentifier, float]]:
        return list(self.impl.inplace_variants() or [])

    def inplace_modifies(self, opid: OperatorIdentifier) -> tuple[int, ...]:
        """Inputs the in-place variant ``opid`` writes (for the InplaceVariants pass)."""
        return tuple(self._variant_entry(opid).adapter.modifies_inputs)

    def make_inplace(self, opid: OperatorIdentifier) -> None:
        """Become the in-place variant ``opid``: same node and edges, the variant's class and
        kernel (the user's ``inplace_variant(opid)``, by default built from this node's
        attributes)."""
        entry = self._variant_entry(opid)
        if type(self.impl).inplace_variant is not Op.inplace_variant:
            impl = self.impl.inplace_variant(opid)
        else:
            impl = entry.user_class(opid, dict(self.attrs), self.settings)
        self.__class__ = entry.adapter
        self.version = opid.version
        self.impl = impl

    def _variant_entry(self, opid: OperatorIdentifier) -> _Entry:
        entry = _CUSTOM.get(opid)
        if entry is None or entry.adapter.is_grad:
            raise popart_exception(
                f"{self.debug_name}: in-place variant {opid} (from inplace_variants()) is not a "
                f"registered custom op; register it with @register_op({opid!r}).")
        return entry


def _check_grad_tables(opid, cls) -> None:
    where = f"register_grad_op({opid}): {cls.__qualname__}"
    try:
        infos = [GradInOutMapper(int(a), int(b), GradOpInType(c))
                 for a, b, c in cls.grad_input_info]
    except (TypeError, ValueError) as exc:
        raise popart_exception(
            f"{where}.grad_input_info must be [(iGrad, iNonGrad, GradOpInType)], got "
            f"{cls.grad_input_info!r} ({exc}).") from None
    if sorted(i.iGrad for i in infos) != list(range(len(infos))):
        raise popart_exception(f"{where}.grad_input_info must cover grad inputs 0..n-1 once "
                               f"each, got {cls.grad_input_info!r}.")
    if not cls.grad_out_to_non_grad_in:
        raise popart_exception(f"{where}.grad_out_to_non_grad_in is empty; map each grad output "
                               f"to the forward input it is the gradient of, e.g. {{0: 0}}.")


def _make_adapter(cls, opid, definition, public, grad) -> type:
    return type(f"{cls.__name__}Adapter", (CustomOpAdapter,), {
        "__module__": cls.__module__,
        "__doc__": cls.__doc__ or f"Custom op {opid}.",
        "user_class": cls,
        "opid": opid,
        "definition": definition,
        "public": public,
        "is_grad": grad,
        "modifies_inputs": tuple(getattr(cls, "modifies_inputs", ())),
    })
