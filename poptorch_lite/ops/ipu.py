"""IPU tensor ops inside ``forward`` (P62): run-time slicing, serialised matmuls, recomputation
checkpoints, IO overlap, CTC beam search (``fps`` / ``nearest`` live in ``cluster.py``).

Each traced op is a ``torch.library`` custom op (eager kernel, fake kernel, autograd) whose ONNX
translation writes the backend's node: ``ai.graphcore::DynamicSlice`` / ``DynamicUpdate``,
``MatMul`` with the ``__serialize_matmul_*`` annotations, ``ai.graphcore::Nop`` annotated
``__recompute_output_in_backward_pass = Checkpoint``, ``ai.graphcore::CtcBeamSearchDecoder``.
"""

from __future__ import annotations

import math

import onnx
import onnx.defs
import torch
from onnxscript import ir
from onnxscript import opset18 as op
from onnxscript import values as onnxscript_values

from ..blocks import isRunningOnIpu
from ..enums import MatMulSerializationMode, OverlapMode
from ..errors import Error

__all__ = [
    "ctc_beam_search_decoder",
    "dynamic_slice",
    "dynamic_update",
    "recomputationCheckpoint",
    "serializedMatMul",
    "set_overlap_for_input",
    "set_overlap_for_output",
]

GRAPHCORE = "ai.graphcore"
_GC = onnxscript_values.Opset(GRAPHCORE, 1)
_CHECKPOINT = 1  # the backend's RecomputeType.Checkpoint

_FLOATS = ["tensor(float)", "tensor(float16)", "tensor(double)", "tensor(bfloat16)"]
_INTS = ["tensor(int8)", "tensor(int16)", "tensor(int32)", "tensor(int64)", "tensor(uint8)"]


def _register_schemas() -> None:
    """ONNX schemas of the ai.graphcore nodes these translations emit (the exporter needs one
    per node type; the backend has its own op classes)."""
    formal = onnx.defs.OpSchema.FormalParameter
    attr = onnx.defs.OpSchema.Attribute
    kind = onnx.defs.OpSchema.AttrType
    window = [attr("axes", kind.INTS, ""), attr("sizes", kind.INTS, ""),
              attr("noOverlap", kind.INT, "")]
    schemas = {
        "DynamicSlice": dict(inputs=[formal("x", "T"), formal("offset", "I")],
                             outputs=[formal("y", "T")], attributes=window),
        "DynamicUpdate": dict(inputs=[formal("x", "T"), formal("offset", "I"),
                                      formal("update", "T")],
                              outputs=[formal("y", "T")], attributes=window),
        "Nop": dict(inputs=[formal("x", "T")], outputs=[formal("y", "T")], attributes=[]),
        "CtcBeamSearchDecoder": dict(
            inputs=[formal("log_probs", "T"), formal("lengths", "I")],
            outputs=[formal("probs", "T"), formal("lengths", "J"), formal("labels", "J")],
            attributes=[attr("blank", kind.INT, ""), attr("beam_width", kind.INT, ""),
                        attr("top_paths", kind.INT, "")]),
    }
    for name, parts in schemas.items():
        if onnx.defs.has(name, GRAPHCORE):
            continue
        constraints = [("T", _FLOATS + _INTS + ["tensor(bool)"], ""), ("I", _INTS, "")]
        if name == "CtcBeamSearchDecoder":
            constraints = [("T", _FLOATS, ""), ("I", _INTS, ""), ("J", ["tensor(int32)"], "")]
        onnx.defs.register_schema(onnx.defs.OpSchema(
            name, GRAPHCORE, 1, type_constraints=constraints, **parts))


_register_schemas()


def _annotate(value, **attributes):
    """Add ``__`` annotations to the node producing ``value`` (a traced ONNX value)."""
    node = value.producer()
    for key, item in attributes.items():
        name = f"__{key}"
        node.attributes[name] = (ir.AttrString(name, item) if isinstance(item, str)
                                 else ir.AttrInt64(name, int(item)))
    return value


def _check_int(what: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Error(f"{what}: {name} must be a Python int, got {value!r} "
                    f"({type(value).__name__}).")
    return value


# --- dynamic_slice / dynamic_update -----------------------------------------------------------


def _window_start(start: torch.Tensor, length: int, span: int) -> int:
    """The window's first index: clamped so the window fits (the backend's rule)."""
    return min(max(int(start.reshape(-1)[0]), 0), length - span)


@torch.library.custom_op("poptorch_lite::dynamic_slice", mutates_args=())
def _dynamic_slice(x: torch.Tensor, start: torch.Tensor, dim: int, size: int,
                   step: int) -> torch.Tensor:
    span = (size - 1) * step + 1
    first = _window_start(start, x.shape[dim], span)
    return x.narrow(dim, first, span)[(slice(None),) * dim + (slice(None, None, step),)].clone()


@_dynamic_slice.register_fake
def _(x, start, dim, size, step):
    shape = list(x.shape)
    shape[dim] = size
    return x.new_empty(shape)


def _dynamic_slice_setup(ctx, inputs, output):
    x, start, dim, size, step = inputs
    ctx.save_for_backward(start)
    ctx.shape, ctx.window = x.shape, (dim, size, step)


def _dynamic_slice_backward(ctx, grad):
    (start,) = ctx.saved_tensors
    dim, size, step = ctx.window
    zeros = grad.new_zeros(ctx.shape)
    return _scatter_window(zeros, grad, start, dim, size, step), None, None, None, None


def _scatter_window(x, src, start, dim, size, step):
    span = (size - 1) * step + 1
    first = _window_start(start, x.shape[dim], span)
    out = x.clone()
    index = [slice(None)] * x.dim()
    index[dim] = slice(first, first + span, step)
    out[tuple(index)] = src
    return out


_dynamic_slice.register_autograd(_dynamic_slice_backward, setup_context=_dynamic_slice_setup)


@torch.library.custom_op("poptorch_lite::dynamic_update", mutates_args=())
def _dynamic_update(x: torch.Tensor, src: torch.Tensor, start: torch.Tensor, dim: int,
                    size: int) -> torch.Tensor:
    return _scatter_window(x, src, start, dim, size, 1)


@_dynamic_update.register_fake
def _(x, src, start, dim, size):
    return torch.empty_like(x)


def _dynamic_update_setup(ctx, inputs, output):
    x, src, start, dim, size = inputs
    ctx.save_for_backward(start)
    ctx.window = (dim, size)


def _dynamic_update_backward(ctx, grad):
    (start,) = ctx.saved_tensors
    dim, size = ctx.window
    dx = _scatter_window(grad, grad.new_zeros(()).expand(_window_shape(grad, dim, size)),
                         start, dim, size, 1)
    dsrc = _dynamic_slice(grad, start, dim, size, 1)
    return dx, dsrc, None, None, None


def _window_shape(x, dim, size):
    shape = list(x.shape)
    shape[dim] = size
    return shape


_dynamic_update.register_autograd(_dynamic_update_backward, setup_context=_dynamic_update_setup)


def _offset(start):
    return op.Cast(op.Reshape(start, op.Constant(value_ints=[1])), to=onnx.TensorProto.INT32)


def _translate_dynamic_slice(x, start, dim: int, size: int, step: int):
    span = (size - 1) * step + 1
    window = _GC.DynamicSlice(x, _offset(start), axes=[dim], sizes=[span], noOverlap=0)
    if step == 1:
        return window
    return op.Slice(window, op.Constant(value_ints=[0]), op.Constant(value_ints=[span]),
                    op.Constant(value_ints=[dim]), op.Constant(value_ints=[step]))


def _translate_dynamic_update(x, src, start, dim: int, size: int):
    return _GC.DynamicUpdate(x, _offset(start), src, axes=[dim], sizes=[size], noOverlap=0)


def _check_window(what: str, tensor, dim, start, size, step) -> int:
    if not isinstance(tensor, torch.Tensor):
        raise Error(f"{what}: expected a tensor, got {type(tensor).__name__}.")
    dim = _check_int(what, "dim", dim)
    size = _check_int(what, "size", size)
    step = _check_int(what, "step", step)
    if not -tensor.dim() <= dim < tensor.dim():
        raise Error(f"{what}: dim {dim} is out of range for a tensor of shape "
                    f"{list(tensor.shape)}.")
    dim %= tensor.dim()
    span = (size - 1) * step + 1
    if size < 1 or step < 1 or span > tensor.shape[dim]:
        raise Error(f"{what}: size {size} with step {step} spans {span} elements, which must be "
                    f"at least 1 and at most dim {dim}'s length {tensor.shape[dim]}.")
    if (not isinstance(start, torch.Tensor) or start.numel() != 1
            or start.dtype.is_floating_point or start.dtype.is_complex):
        raise Error(f"{what}: start must be a one-element integer tensor (the run-time offset), "
                    f"got {start!r}.")
    return dim


def dynamic_slice(tensor: torch.Tensor, dim: int, start: torch.Tensor, size: int,
                  step: int) -> torch.Tensor:
    """``tensor`` sliced along ``dim`` from the run-time index ``start`` (a one-element integer
    tensor): ``size`` elements, ``step`` apart. A window that would run past the end starts
    earlier so that it fits (the IPU leaves that case undefined). Raises ``Error`` for a
    non-int dim/size/step or a window larger than the dimension."""
    dim = _check_window("dynamic_slice", tensor, dim, start, size, step)
    return _dynamic_slice(tensor, start, dim, size, step)


def dynamic_update(input: torch.Tensor, src: torch.Tensor, dim: int, start: torch.Tensor,
                   size: int) -> torch.Tensor:
    """A copy of ``input`` with ``src`` written along ``dim`` from the run-time index ``start``
    (``size`` elements; windows past the end start earlier so they fit)."""
    dim = _check_window("dynamic_update", input, dim, start, size, 1)
    if not isinstance(src, torch.Tensor) or list(src.shape) != _window_shape(input, dim, size) \
            or src.dtype != input.dtype:
        raise Error(f"dynamic_update: src must be {str(input.dtype).removeprefix('torch.')}"
                    f"{_window_shape(input, dim, size)} (input's shape with dim {dim} of size "
                    f"{size}), got {src!r:.80}.")
    return _dynamic_update(input, src, start, dim, size)


# --- serializedMatMul ---------------------------------------------------------------------------


@torch.library.custom_op("poptorch_lite::serialized_matmul", mutates_args=())
def _serialized_matmul(lhs: torch.Tensor, rhs: torch.Tensor, mode: str, factor: int,
                       keep_precision: bool) -> torch.Tensor:
    return torch.matmul(lhs, rhs)


@_serialized_matmul.register_fake
def _(lhs, rhs, mode, factor, keep_precision):
    return torch.matmul(lhs, rhs)


def _matmul_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])


def _matmul_backward(ctx, grad):
    lhs, rhs = ctx.saved_tensors
    with torch.enable_grad():
        a, b = lhs.detach().requires_grad_(), rhs.detach().requires_grad_()
        da, db = torch.autograd.grad(torch.matmul(a, b), (a, b), grad)
    return da, db, None, None, None


_serialized_matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup)


def _translate_serialized_matmul(lhs, rhs, mode: str, factor: int, keep_precision: bool):
    return _annotate(op.MatMul(lhs, rhs), serialize_matmul_mode=mode,
                     serialize_matmul_factor=factor,
                     serialize_matmul_precision=int(keep_precision))


def serializedMatMul(lhs: torch.Tensor, rhs: torch.Tensor, mode: MatMulSerializationMode,
                     factor: int = 0, keep_precision: bool = False) -> torch.Tensor:
    """``lhs @ rhs`` split ``factor`` ways along ``mode``'s dimension (InputChannels: lhs's
    rows, ReducingDim: the summed dimension, OutputChannels: rhs's columns). The numbers are
    the plain matmul's. The MatMul node carries PopART's ``__serialize_matmul_*`` annotations,
    which the backend's device model plans: the partials temporary divided by ``factor`` and
    one superstep per slice. Raises ``ValueError`` for a bad mode, ``Error`` for a factor that
    does not divide the dimension."""
    if not isinstance(mode, MatMulSerializationMode):
        raise ValueError(f"serializedMatMul: mode must be a poptorch_lite."
                         f"MatMulSerializationMode, got {mode!r}.")
    for name, value in (("lhs", lhs), ("rhs", rhs)):
        if not isinstance(value, torch.Tensor) or value.dim() < 2:
            raise Error(f"serializedMatMul: {name} must be a tensor of rank >= 2, got "
                        f"{value!r:.80}.")
    factor = _check_int("serializedMatMul", "factor", factor)
    if mode is not MatMulSerializationMode.Disabled:
        sizes = {MatMulSerializationMode.InputChannels: lhs.shape[-2],
                 MatMulSerializationMode.ReducingDim: lhs.shape[-1],
                 MatMulSerializationMode.OutputChannels: rhs.shape[-1]}
        size = sizes[mode]
        if factor < 1 or size % factor:
            raise Error(f"serializedMatMul: factor {factor} must be >= 1 and divide the "
                        f"{mode.name} dimension ({size}).")
    return _serialized_matmul(lhs, rhs, mode.value, factor, bool(keep_precision))


# --- recomputationCheckpoint ---------------------------------------------------------------


@torch.library.custom_op("poptorch_lite::recomputation_checkpoint", mutates_args=())
def _checkpoint(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_checkpoint.register_fake
def _(x):
    return torch.empty_like(x)


def _checkpoint_setup(ctx, inputs, output):
    pass


def _checkpoint_backward(ctx, grad):
    return grad


_checkpoint.register_autograd(_checkpoint_backward, setup_context=_checkpoint_setup)


def _translate_checkpoint(x):
    return _annotate(_GC.Nop(x), recompute_output_in_backward_pass=_CHECKPOINT)


def recomputationCheckpoint(*tensors):
    """Mark ``tensors`` as recomputation checkpoints: they are kept for the backward pass and
    the ops after them recompute from them (with ``autoRecomputation`` set). Returns the
    tensors (one tensor for one argument, else a tuple). A list or tuple argument is
    unpacked. Raises ``ValueError`` for a non-tensor."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        return type(tensors[0])(recomputationCheckpoint(*tensors[0])
                                if len(tensors[0]) != 1 else [recomputationCheckpoint(
                                    tensors[0][0])])
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"recomputationCheckpoint: argument {i} is a {type(t).__name__}; "
                             f"only tensors can be checkpoints.")
    outputs = tuple(_checkpoint(t) for t in tensors)
    return outputs[0] if len(outputs) == 1 else outputs


# --- IO overlap -----------------------------------------------------------------------------


_OVERLAP_ATTR = "__io_overlap"
# OverlapMode -> the backend's exchange strategy of a host stream on the IO tiles.
_STRATEGIES = {OverlapMode.OverlapAccumulationLoop: "OverlapInnerLoop",
               OverlapMode.OverlapDeviceIterationLoop: "OverlapLoops"}


@torch.library.custom_op("poptorch_lite::io_overlap", mutates_args=())
def _io_overlap(x: torch.Tensor, direction: str, mode: str) -> torch.Tensor:
    return x.clone()


@_io_overlap.register_fake
def _(x, direction, mode):
    return torch.empty_like(x)


_io_overlap.register_autograd(lambda ctx, grad: (grad, None, None),
                              setup_context=lambda ctx, inputs, output: None)


def _translate_io_overlap(x, direction: str, mode: str):
    return _annotate(_GC.Nop(x), io_overlap=f"{direction}:{mode}")


def _overlap(what: str, direction: str, tensors, mode):
    if not isinstance(mode, OverlapMode):
        raise ValueError(f"{what}: mode must be a poptorch_lite.OverlapMode, got {mode!r}.")
    single = isinstance(tensors, torch.Tensor)
    items = [tensors] if single else list(tensors) if isinstance(tensors, (list, tuple)) \
        else [tensors]
    for t in items:
        if not isinstance(t, torch.Tensor):
            raise Error(f"{what}: expected tensors, got a {type(t).__name__}.")
    if mode is OverlapMode.NoOverlap or not isRunningOnIpu():
        return tensors
    marked = [_io_overlap(t, direction, mode.name) for t in items]
    return marked[0] if single else type(tensors)(marked)


def set_overlap_for_input(input_tensors, mode: OverlapMode):
    """Stream the model inputs ``input_tensors`` through the IO tiles, prefetched while the
    compute tiles work: ``OverlapAccumulationLoop`` overlaps within the gradient-accumulation
    loop, ``OverlapDeviceIterationLoop`` across the device-iteration loop too (the backend's
    ``InputSettings(TileSet.IO, OverlapInnerLoop / OverlapLoops)``). Needs
    ``Options.TensorLocations.numIOTiles``. Returns the tensors; use the returned ones."""
    return _overlap("set_overlap_for_input", "input", input_tensors, mode)


def set_overlap_for_output(output_tensors, mode: OverlapMode):
    """Stream the model outputs ``output_tensors`` to the host through the IO tiles (the
    anchors' ``TileSet.IO`` and exchange strategy), as ``set_overlap_for_input``. Return the
    returned tensors from ``forward``."""
    return _overlap("set_overlap_for_output", "output", output_tensors, mode)


def apply_io_overlap(proto, num_io_tiles: int) -> tuple[dict[str, str], bool]:
    """Turn the traced overlap marks into backend settings: each input's as model metadata
    (``InputSettings``), each output's returned as {output name: exchange strategy} for its
    anchor, with whether any mark was found. The marks are removed; an overlap on a tensor that is not a model input or output,
    or without IO tiles, raises ``Error``."""
    inputs = {i.name for i in proto.graph.input}
    outputs = {o.name for o in proto.graph.output}
    anchors, found = {}, False
    for node in proto.graph.node:
        marks = [a for a in node.attribute if a.name == _OVERLAP_ATTR]
        if not marks:
            continue
        found = True
        node.attribute.remove(marks[0])
        direction, _, mode_name = marks[0].s.decode().partition(":")
        mode = OverlapMode[mode_name]
        what = f"set_overlap_for_{direction}(..., OverlapMode.{mode_name})"
        if not num_io_tiles:
            raise Error(f"{what}: no IO tiles are reserved to stream through. Reserve some "
                        f"with Options().TensorLocations.numIOTiles(32) (an even number).")
        strategy = _STRATEGIES[mode]
        if direction == "input":
            if node.input[0] not in inputs:
                raise Error(f"{what}: the tensor '{node.input[0]}' is not an input of the "
                            f"model; call it on forward's input tensors before using them.")
            entry = proto.metadata_props.add()
            entry.key = f"__input_settings:{node.input[0]}"
            entry.value = f"IO,{strategy}"
        else:
            if node.output[0] not in outputs:
                raise Error(f"{what}: the result is not an output of the model; return the "
                            f"tensors set_overlap_for_output gives back from forward.")
            anchors[node.output[0]] = strategy
    return anchors, found


# --- ctc_beam_search_decoder -----------------------------------------------------------------


def _logaddexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    return max(a, b) + math.log1p(math.exp(-abs(a - b)))


def _beam_search(steps: list[list[float]], blank: int, width: int):
    """Prefix beam search over [T][C] log-probabilities: [(prefix, log p)], best first."""
    beams = {(): (0.0, -math.inf)}  # prefix -> (log p ending in blank, in a label)
    for step in steps:
        grown: dict = {}
        for prefix, (p_blank, p_label) in beams.items():
            total = _logaddexp(p_blank, p_label)
            candidates = [(prefix, total + step[blank], -math.inf)]
            for c, lp in enumerate(step):
                if c == blank:
                    continue
                if prefix and prefix[-1] == c:
                    candidates.append((prefix, -math.inf, p_label + lp))
                    candidates.append((prefix + (c,), -math.inf, p_blank + lp))
                else:
                    candidates.append((prefix + (c,), -math.inf, total + lp))
            for key, b, lab in candidates:
                old = grown.get(key, (-math.inf, -math.inf))
                grown[key] = (_logaddexp(old[0], b), _logaddexp(old[1], lab))
        ranked = sorted(grown.items(), key=lambda kv: -_logaddexp(*kv[1]))[:width]
        beams = dict(ranked)
    return sorted(((p, _logaddexp(*v)) for p, v in beams.items()), key=lambda pv: -pv[1])


@torch.library.custom_op("poptorch_lite::ctc_beam_search_decoder", mutates_args=())
def _ctc_decoder(probs: torch.Tensor, lengths: torch.Tensor, blank: int, beam_width: int,
                 top_paths: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t, n, _ = probs.shape
    scores = torch.full((n, top_paths), -math.inf, dtype=probs.dtype)
    path_lengths = torch.zeros((n, top_paths), dtype=torch.int32)
    paths = torch.zeros((n, top_paths, t), dtype=torch.int32)
    for b, length in enumerate(lengths.tolist()):
        found = _beam_search(probs[:min(int(length), t), b].double().tolist(), blank, beam_width)
        for j, (prefix, score) in enumerate(found[:top_paths]):
            scores[b, j] = score
            path_lengths[b, j] = len(prefix)
            paths[b, j, :len(prefix)] = torch.tensor(prefix, dtype=torch.int32)
    return scores, path_lengths, paths


@_ctc_decoder.register_fake
def _(probs, lengths, blank, beam_width, top_paths):
    t, n, _ = probs.shape
    return (probs.new_empty((n, top_paths)), probs.new_empty((n, top_paths), dtype=torch.int32),
            probs.new_empty((n, top_paths, t), dtype=torch.int32))


def _translate_ctc_decoder(probs, lengths, blank: int, beam_width: int, top_paths: int):
    return _GC.CtcBeamSearchDecoder(probs, lengths, blank=blank, beam_width=beam_width,
                                    top_paths=top_paths, _num_outputs=3)


def ctc_beam_search_decoder(probs: torch.Tensor, lengths: torch.Tensor, blank: int = 0,
                            beam_width: int = 100, top_paths: int = 1):
    """CTC prefix beam search over log-probabilities ``probs`` [T, N, C] with per-sample input
    ``lengths`` [N]: returns (path log-probabilities [N, top_paths], path lengths
    [N, top_paths] int32, decoded paths [N, top_paths, T] int32 padded with 0), best first.
    Not differentiable (as in PopTorch)."""
    if not isinstance(probs, torch.Tensor) or probs.dim() != 3 \
            or not probs.dtype.is_floating_point:
        raise Error(f"ctc_beam_search_decoder: probs must be float log-probabilities [T, N, C], "
                    f"got {probs!r:.80}.")
    t, n, c = probs.shape
    if not isinstance(lengths, torch.Tensor) or list(lengths.shape) != [n] \
            or lengths.dtype.is_floating_point:
        raise Error(f"ctc_beam_search_decoder: lengths must be an integer tensor [{n}], got "
                    f"{lengths!r:.80}.")
    blank = _check_int("ctc_beam_search_decoder", "blank", blank)
    beam_width = _check_int("ctc_beam_search_decoder", "beam_width", beam_width)
    top_paths = _check_int("ctc_beam_search_decoder", "top_paths", top_paths)
    if not 0 <= blank < c or beam_width < 1 or not 1 <= top_paths <= beam_width:
        raise Error(f"ctc_beam_search_decoder: need 0 <= blank < {c} classes, beam_width >= 1 "
                    f"and 1 <= top_paths <= beam_width; got blank={blank}, "
                    f"beam_width={beam_width}, top_paths={top_paths}.")
    return _ctc_decoder(probs.detach(), lengths, blank, beam_width, top_paths)


def translation_table() -> dict:
    ops = torch.ops.poptorch_lite
    return {ops.dynamic_slice.default: _translate_dynamic_slice,
            ops.dynamic_update.default: _translate_dynamic_update,
            ops.serialized_matmul.default: _translate_serialized_matmul,
            ops.recomputation_checkpoint.default: _translate_checkpoint,
            ops.ctc_beam_search_decoder.default: _translate_ctc_decoder,
            ops.io_overlap.default: _translate_io_overlap}
