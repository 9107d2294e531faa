"""The classes a custom-op author uses: ``Op`` and ``GradOp`` to subclass,
``ComputeContext`` (what ``compute`` is told), ``GradOpInType`` and ``GradInOutMapper``, plus
the table of registered custom ops that ``custom.register_op`` fills."""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Sequence

import numpy as np

from ..errors import popart_exception
from ..ir.op import OpSettings
from ..supported_ops import OperatorIdentifier
from ..tensorinfo import TensorInfo

__all__ = ["ComputeContext", "GradInOutMapper", "GradOp", "GradOpInType", "Op"]

# --- the user-facing classes ---------------------------------------------------------------------


class GradOpInType(enum.Enum):
    """What a grad op input is: a forward input, a forward output, or an output's gradient."""

    In = 0
    Out = 1
    GradOut = 2


class GradInOutMapper(NamedTuple):
    """Grad op input ``iGrad`` is forward tensor ``iNonGrad`` of kind ``type``."""

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
    """Base of a custom op. Subclass, then ``@register_op(opid, definition=...)``.

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
    """Base of a custom grad op: built by the forward op's ``grad_ops()``.

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
