"""Op: the base class of every IR operation, and OpSettings, its placement and naming.

Each concrete op (in ``popart_backend.ops``) is one subclass holding its attributes
(``Attrs``), shape/dtype inference (``infer``), torch kernel (``kernel``) and, filled by later
issues, gradient (``grad``) and cost (``cost``).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np

from ..errors import ShapeError

if TYPE_CHECKING:
    from .tensor import Tensor, TensorInfo


class RecomputeType(enum.Enum):
    """Per-op recomputation annotation (spec §3.5)."""

    Undefined = 0
    Checkpoint = 1
    Recompute = 2
    Recomputed = 3


class ExecutionContext(enum.Enum):
    """Which fragment of the program runs an op (PopART's execution contexts).

    ``Normal`` ops run once per micro-batch; ``AccumulateOuterFragment`` ops run once per weight
    update, after the accumulation factor's micro-batches (optimizer steps with accumulation).
    """

    Normal = 0
    AccumulateOuterFragment = 1
    WeightsFromHostFragment = 2
    OptimizerFromHostFragment = 3


@dataclass(frozen=True)
class OpSettings:
    """Where an op runs and what it is called. Frozen: change it with ``dataclasses.replace``."""

    name: str = ""
    scope: str = ""
    ipu: int | None = None  # virtual graph id
    pipeline_stage: int | None = None
    execution_phase: int | None = None
    recompute: RecomputeType = RecomputeType.Undefined
    schedule_priority: float = 0.0
    # Source location of the user code that created the op (the frontend fills it).
    source: str = ""
    execution_context: ExecutionContext = ExecutionContext.Normal
    # Replica grouping of a collective op: (CommGroupType value, replicaGroupSize) from the
    # builder's ``commGroup`` annotation; None is all replicas (ops/collectives.py).
    comm_group: tuple[int, int] | None = None


@dataclass(frozen=True)
class NoAttrs:
    """Attrs of an op without attributes."""


class Op:
    """An operation in a Graph. Subclasses are registered with ``ops.registry.register_op``."""

    # Filled by the registry decorator.
    op_type: ClassVar[str] = "?"
    domain: ClassVar[str] = "ai.onnx"
    versions: ClassVar[tuple[int, ...]] = ()

    Attrs: ClassVar[type] = NoAttrs
    # Inputs whose values infer() needs (shape, axes, pads ...); they must be constants.
    const_inputs: ClassVar[tuple[int, ...]] = ()
    # False for ops whose result must not be computed at compile time (random ops).
    foldable: ClassVar[bool] = True
    # Inputs the kernel writes in place (variable updates, accumulators). The scheduler runs
    # such an op after every other reader of those inputs (Graph.add_op adds the constraints).
    modifies_inputs: ClassVar[tuple[int, ...]] = ()
    # True for ops whose kernel may return an input itself or a view of its storage
    # (Identity, Reshape ...): SessionOptions.opxAliasChecking allows their aliasing outputs.
    aliases_inputs: ClassVar[bool] = False
    # Listed by getSupportedOperations(False)? None: decided by supported_ops.is_public's rules.
    public: ClassVar[bool | None] = None
    # True for ops whose FLOPs run on the AMP (matrix) units: the cost model rates them at the
    # AMP peak instead of the vector units' rate (device/cost.py).
    uses_amp: ClassVar[bool] = False
    # STRING tensors (ops/string_tensors.py). True for ops whose kernel itself takes numpy
    # object arrays of str (the string ops, Cast) ...
    takes_strings: ClassVar[bool] = False
    # ... and for ops that only copy, select, reorder or compare elements for equality and pad
    # only with zeros: their one torch kernel runs on int64 codes of the strings.
    strings_as_codes: ClassVar[bool] = False

    def __init__(self, attrs=None, settings: OpSettings | None = None, version: int | None = None):
        self.attrs = attrs if attrs is not None else self.Attrs()
        self.settings = settings or OpSettings()
        self.version = version if version is not None else (self.versions[-1] if self.versions else 1)
        self.id = -1  # set by Graph.add_op
        self.graph = None
        self.inputs: list[Tensor | None] = []
        self.outputs: list[Tensor | None] = []
        # The forward op whose gradient this op computes (set by autodiff), for stage placement.
        self.grad_of: Op | None = None
        # Outputs the node asks for (ids, '' included), set by Graph.add_op before infer():
        # ops with a variable output count (Split) need it to infer their outputs.
        self.num_outputs: int | None = None

    @classmethod
    def attrs_type(cls, version: int) -> type:
        """The Attrs dataclass for ``version`` (ops whose attributes changed override this)."""
        return cls.Attrs

    @classmethod
    def attr_aliases(cls) -> dict[str, str]:
        """ONNX attribute names that are not valid Python field names -> Attrs field names."""
        return {}

    # --- the contract of an op ---------------------------------------------------------------

    def infer(self, *inputs: "TensorInfo | None") -> "TensorInfo | Sequence[TensorInfo]":
        """Output infos from input infos (None for an absent optional input). Never sees data."""
        raise NotImplementedError(f"{self.op_type} has no infer()")

    def kernel(self, *xs):
        """Compute outputs from torch CPU tensors (None for an absent optional input)."""
        raise NotImplementedError(f"{self.op_type} has no kernel()")

    def grad(self, g) -> None:
        """Add the ops computing this op's input gradients (training issue)."""
        raise NotImplementedError

    def cost(self) -> tuple[int, int]:
        """(FLOPs, bytes moved) of one execution, for the cycle model (device-model issue)."""
        flops = sum(t.info.nelms for t in self.outputs if t is not None)
        moved = sum(t.info.num_bytes for t in (*self.inputs, *self.outputs) if t is not None)
        return flops, moved

    def fold_from_infos(self) -> list[np.ndarray] | None:
        """Outputs computable from input infos alone (Shape, Size); None otherwise."""
        return None

    # --- helpers for subclasses ---------------------------------------------------------------

    def const_input(self, index: int) -> np.ndarray | None:
        """Value of input ``index`` if it is a constant; None if the input is absent.

        Raises ShapeError when a value is needed at compile time but the input is computed.
        """
        if index >= len(self.inputs) or self.inputs[index] is None:
            return None
        tensor = self.inputs[index]
        if not tensor.is_const:
            raise ShapeError(
                f"{self.debug_name}: input {index} '{tensor.id}' must be a constant known at "
                f"compile time (it sets a shape, axes or sizes), but it is computed "
                f"({tensor.kind.value}). Shapes on the simulated IPU are static: make it an "
                f"initializer or a Constant."
            )
        return tensor.data

    @property
    def debug_name(self) -> str:
        place = []
        if self.settings.ipu is not None:
            place.append(f"ipu {self.settings.ipu}")
        if self.settings.pipeline_stage is not None:
            place.append(f"stage {self.settings.pipeline_stage}")
        where = f" ({', '.join(place)})" if place else ""
        source = f" [{self.settings.source}]" if self.settings.source else ""
        return f"{self.op_type} '{self.settings.name or self.id}'{where}{source}"

    def attr_dict(self) -> dict:
        """Attributes as a plain dict (IR dump, printer)."""
        return dataclasses.asdict(self.attrs) if dataclasses.is_dataclass(self.attrs) else {}

    def input_infos(self) -> list["TensorInfo | None"]:
        return [t.info if t is not None else None for t in self.inputs]

    def __repr__(self) -> str:
        return f"<{self.debug_name}>"
