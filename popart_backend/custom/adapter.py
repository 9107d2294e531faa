"""``CustomOpAdapter``: a registered user op class as an IR op (DESIGN decision
2). Shape inference calls ``setup``, the kernel calls ``compute`` on zero-copy numpy views, and
``grad`` inserts the user's grad ops; ``custom.register_op`` builds one adapter subclass per
registration."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..errors import popart_exception, popart_runtime_error
from ..ir.op import Op as IrOp
from ..ir.op import OpSettings
from ..ir.tensor import TensorInfo as IrTensorInfo
from ..ir.tensor import TensorKind
from ..ops.random import mix_seed
from ..supported_ops import OpDefinition, OperatorIdentifier
from ..tensorinfo import TensorInfo
from .api import _CUSTOM, ComputeContext, GradOp, GradOpInType, Op, _Entry
from .definitions import _check_attributes, _check_types

RANDOM_SEED_ID = "randomSeed___"  # transforms/random_seed.py


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
