"""Op: the base class of every IR operation, and OpSettings, its placement and naming.

Each concrete op (in ``popart_backend.ops``) is one subclass holding its attributes
(``Attrs``), shape/dtype inference (``infer``), torch kernel (``kernel``) and, filled by later
issues, gradient (``grad``) and cost (``cost``).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Sequence

import numpy as np

from ..errors import ShapeError
from .signature import BuilderMethod

if TYPE_CHECKING:
    from .tensor import Tensor, TensorInfo


class RecomputeType(enum.Enum):
    """Per-op recomputation annotation."""

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
class DebugChecks:
    """Checks the execution plan wraps around an op's kernel (device/plan.py), marked by the
    check passes of transforms/numerics_options.py, last in the pass list."""

    # enableFloatingPointChecks: raise at the first NaN / inf computed from finite inputs.
    floating_point: bool = False
    # opxModifyChecking: raise when the kernel changes an input not in ``modifies_inputs``.
    modify: bool = False
    # opxAliasChecking: raise when the kernel returns an input's storage it may not alias.
    alias: bool = False


@dataclass(frozen=True)
class SerializeMatMul:
    """A MatMul's serialisation (the builder's ``setSerializeMatMul``, poptorch's
    ``serializedMatMul``): the product is computed in ``factor`` slices along ``mode``
    ("input_channels", "reducing_dim" or "output_channels"); ``keep_precision`` keeps the
    partial sums of the slices in float32. The values are those of the unsplit product; the
    device model (device/planner.py) divides the planner temporaries by the factor and charges
    one superstep per slice."""

    mode: str
    factor: int
    keep_precision: bool = False


@dataclass(frozen=True)
class OpSettings:
    """Where an op runs, what it is called, and how the session's options ask it to compute.
    Frozen: change it with ``dataclasses.replace``. Ops a pass derives from an op (gradients,
    fusions, recomputed clones) start from its settings."""

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
    # enableNonStableSoftmax (NonStableSoftmax pass): an op that ``supports_non_stable`` skips
    # subtracting the maximum, exp(x) / sum(exp(x)).
    non_stable: bool = False
    # partialsTypeMatMuls = "half" (HalfPartialMatMuls pass): an op that
    # ``supports_half_partials`` accumulates its float16 products in float16.
    half_partials: bool = False
    # enableStochasticRounding (StochasticRounding pass): an op that
    # ``supports_stochastic_rounding`` computes its float16 results in float32 and rounds them
    # to float16 stochastically, drawing from its last input, the ``randomSeed___`` tensor.
    stochastic_rounding: bool = False
    # automaticLossScalingSettings (AutomaticLossScaling pass): an optimizer update reads a
    # BOOL "gradients finite" flag as its last input (before a random seed) and skips the
    # weight update when it is False.
    skip_on_overflow: bool = False
    # The builder's setAvailableMemoryProportion (``__available_memory``) on a matmul or
    # convolution: the share of the IPU's memory its planner temporaries may take
    # (device/planner.py); None when not set.
    available_memory_proportion: float | None = None
    # The builder's setSerializeMatMul (``__serialize_matmul_*``) on a MatMul; None when not set.
    serialize_matmul: SerializeMatMul | None = None
    # The memory model's liveness order runs the op right after its inputs are made (the Adds
    # of a decomposed gradient sum, decomposeGradSum); the executed schedule is unchanged.
    early_in_liveness: bool = False
    # The builder's excludePatterns (``__exclude_patterns``): the pattern names that may not
    # rewrite this op (transforms/apply_patterns.py, transforms/inplace.py).
    excluded_patterns: frozenset[str] = frozenset()
    checks: DebugChecks = DebugChecks()


@dataclass(frozen=True)
class NoAttrs:
    """Attrs of an op without attributes."""


@dataclass
class TrainingForm:
    """What replaces an op in a TrainingSession (``Op.training_form``): ``op`` reading
    ``inputs`` (tensor ids, '' for absent) and writing ``outputs``, each a Tensor of the old op
    (kept under its id), a fresh tensor id, or None (absent)."""

    op: "Op"
    inputs: list[str]
    outputs: list["Tensor | str | None"]


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
    # True for ops whose outputs are elements of their inputs, moved but not computed (Gather,
    # Concat, Slice, Tile ...): enableStochasticRounding leaves them alone (nothing to round).
    moves_elements: ClassVar[bool] = False
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
    # Capabilities the passes and the device read off the class (per-instance choices are
    # OpSettings fields). True for ops that read ``randomSeed___`` as their last input: the
    # WireRandomSeed pass appends it, and recomputation never clones them.
    requires_random_seed: ClassVar[bool] = False
    # True for ops whose outputs carry no gradient (Detach): autodiff does not mark what they
    # produce as needing one, so ops fed only through them need no gradient of their own.
    stops_gradient: ClassVar[bool] = False
    # True for ops that run at the end of their stage's pipeline cycle, between cycles
    # (IpuCopy): lowering, the plan and the cost model put them after the stage's compute.
    runs_between_cycles: ClassVar[bool] = False
    # True for ops whose output keeps its value from one run to the next (pipeline stashes):
    # lowering lists them as persistent.
    output_persists: ClassVar[bool] = False
    # True for cross-replica ops (ops/collectives.py), which also define ``groups(replicas)``:
    # the plan runs every replica up to them, the cost model adds IPU-Link cycles.
    collective: ClassVar[bool] = False
    # True for the ops moving a tensor between an IPU and its streaming memory (RemoteLoad,
    # RemoteStore; ops/remote.py): the memory and cycle models charge their transfers.
    remote_transfer: ClassVar[bool] = False
    # True for ops whose outputs never alias an input, weight, constant or host buffer: the
    # InplaceVariants pass may then let a reader overwrite them.
    fresh_outputs: ClassVar[bool] = False
    # True for ops that only set up a buffer (Init): no work on the IPU's compute, so the cycle
    # model does not count them as compute a prefetch can hide behind (device/cost.py).
    allocates_only: ClassVar[bool] = False
    # True for the matrix products whose kernel can accumulate float16 products in float16
    # (OpSettings.half_partials; ops/matmul.py).
    supports_half_partials: ClassVar[bool] = False
    # True for the convolutions whose kernel can accumulate float16 products in float16
    # (OpSettings.half_partials, set by convolutionOptions or the builder; ops/conv.py).
    supports_conv_half_partials: ClassVar[bool] = False
    # True for the LSTMs (and their gradients) whose cell matmuls can accumulate float16
    # products in float16 (OpSettings.half_partials, set by lstmOptions; ops/rnn.py).
    supports_lstm_half_partials: ClassVar[bool] = False
    # enableStochasticRounding may make its float16 results round stochastically
    # (OpSettings.stochastic_rounding; ops/rounding.py).
    supports_stochastic_rounding: ClassVar[bool] = False
    # True for the softmaxes whose kernel has the form without the maximum subtracted
    # (OpSettings.non_stable; ops/softmax.py).
    supports_non_stable: ClassVar[bool] = False
    # Recomputation's NormOnly mode (transforms/recompute.py) recomputes normalisations and
    # the non-linearity that directly follows one.
    is_normalization: ClassVar[bool] = False
    is_nonlinearity: ClassVar[bool] = False
    # Ops the importer resolves into other ops instead of adding them to the graph (the static
    # sequence and optional ops, ops/sequences.py): see ``expands_at_import`` and ``expand``.
    import_time: ClassVar[bool] = False
    # True for ops with an into-kernel, ``kernel_into(out, *inputs)``, writing their one
    # output into a preallocated buffer (the static memory plan, device/arena.py).
    writes_into: ClassVar[bool] = False
    # Memory layouts (device/layout.py). True for ops whose kernel computes the same values
    # from inputs of any strides (a channels-last [N, C, H, W] included), its outputs taking
    # the layout torch gives them; every other op gets contiguous inputs. ``channels_last_inputs``:
    # the inputs a float32 2-D convolution runs fastest on in channels-last layout (no reorder
    # in oneDNN), which the plan hands over in that layout.
    strided_inputs: ClassVar[bool] = False
    channels_last_inputs: ClassVar[tuple[int, ...]] = ()
    # The ``builder.aiGraphcore`` method of an op without an ONNX schema (ir/signature.py); read
    # from the class that declares it, so a subclass does not inherit its base's method.
    builder_method: ClassVar[BuilderMethod | None] = None

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

    def clone_with(self, settings: OpSettings | None = None) -> "Op":
        """A fresh, unattached op computing what this one computes, with ``settings`` (this
        op's own when None). Passes that copy ops (recomputation, subgraph copies, training
        forms) call it; an op class whose constructor takes more than (attrs, settings,
        version) overrides it to hand its extra state on."""
        return type(self)(self.attrs, settings if settings is not None else self.settings,
                          self.version)

    def epilogue_flops(self) -> int:
        """The part of ``cost()``'s FLOPs that an AMP op (``uses_amp``) runs on the vector
        units rather than the matrix units: the bias, residual add and activation a fused
        matmul or convolution applies to its product (ops/fused.py). 0 by default."""
        return 0

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

    def kernel_into(self, out, *xs):
        """``kernel(*xs)`` written into ``out`` (a dense tensor of the output's shape and
        dtype, not overlapping any input: contiguous, or channels-last for a ``strided_inputs``
        op fed channels-last inputs) for ops declaring ``writes_into``; returns ``out``,
        or a fresh tensor when this call cannot write into it (the plan binds what it
        returns). The values must be bit-identical to ``kernel``'s."""
        raise NotImplementedError(f"{self.op_type} has no kernel_into()")

    def scratch_infos(self) -> tuple:
        """TensorInfos of the temporaries ``kernel_scratch`` writes (the static memory plan
        gives each a buffer of its arena, live during this op's step only); () for none."""
        return ()

    def kernel_scratch(self, out, *scratch_and_xs):
        """``kernel(*xs)`` computed with the scratch buffers ``scratch_infos`` asks for, given
        after ``out`` (the output's arena buffer, as for ``kernel_into``, or None when the
        output has none) and before the op's inputs. Bit-identical to ``kernel``."""
        raise NotImplementedError(f"{self.op_type} has no kernel_scratch()")

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

    def inplace_variants(self) -> list[tuple[object, float]]:
        """In-place variants as (operator id, priority); the InplaceVariants pass picks one and
        calls ``make_inplace``. Built-in ops have none (custom ops may, custom/adapter.py)."""
        return []

    def inplace_modifies(self, opid: object) -> tuple[int, ...]:
        """The inputs the in-place variant ``opid`` (from ``inplace_variants``) overwrites."""
        raise NotImplementedError(f"{self.op_type} has no in-place variants")

    def make_inplace(self, opid: object) -> None:
        """Turn this op into its in-place variant ``opid`` (from ``inplace_variants``)."""
        raise NotImplementedError(f"{self.op_type} has no in-place variants")

    # Read-only views of the per-op flags the numerics and check passes set in ``settings``
    # (kept so ``op.half_partials`` etc. read as before the flags moved there).
    @property
    def non_stable(self) -> bool:
        return self.settings.non_stable

    @property
    def half_partials(self) -> bool:
        return self.settings.half_partials

    @property
    def check_floating_point(self) -> bool:
        return self.settings.checks.floating_point

    @property
    def check_modify(self) -> bool:
        return self.settings.checks.modify

    @property
    def check_alias(self) -> bool:
        return self.settings.checks.alias

    def bind_program(self, program) -> None:
        """Called once by the simulated device before it runs the lowered ``program`` this op
        is part of, for ops whose kernel needs facts of the device (custom ops: the replica
        count). Nothing for the others."""

    def training_form(self, random_seed: Callable[[], str]) -> "TrainingForm | None":
        """The op replacing this one in a TrainingSession (transforms/training_semantics.py),
        None when it behaves the same in training. ``random_seed()`` is the id of the seed
        tensor random training forms read (created on first call)."""
        return None

    # --- resolved at import (static sequences and optionals) ----------------------------------

    @classmethod
    def expands_at_import(cls, node, values) -> bool:
        """Whether the importer expands ``node`` (an onnx.NodeProto of this op) with ``expand``
        instead of adding the op. ``values`` is the importer's ``StaticSequences`` of the graph
        (importer/sequences.py)."""
        return cls.import_time

    @classmethod
    def expand(cls, values, node, attrs, settings: OpSettings, where: str) -> None:
        """Resolve ``node`` into ops of ``values.graph`` (or static sequence / optional values)."""
        raise NotImplementedError(f"{cls.op_type} is not resolved at import")

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
        """The infos infer() takes: without the random seed that stochastic rounding appended
        to an op that does not round in its own kernel (ops/rounding.py)."""
        inputs = self.inputs
        if self.settings.stochastic_rounding and not self.supports_stochastic_rounding:
            inputs = inputs[:-1]
        return [t.info if t is not None else None for t in inputs]

    def __repr__(self) -> str:
        return f"<{self.debug_name}>"
