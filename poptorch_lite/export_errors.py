"""Export failures as poptorch_lite Errors: the aten op and the user's source line of a failed
ONNX conversion, losses torch.export cannot capture, and the hint for capture failures."""

from __future__ import annotations

import re
import traceback

import torch

from .errors import Error, is_library_file, location_from_stack_trace

try:
    from torch.onnx._internal.exporter import _fx_passes, _registration
except ImportError:  # torch's exporter internals moved: only the failing op is reported
    _fx_passes = _registration = None

__all__ = [
    "conversion_error",
    "export_hint",
    "first_lines",
    "refuse_unsupported_loss",
    "untranslated_ops",
    "user_frame",
]


def export_hint(exc: Exception) -> str:
    """What to do about an export failure: data-dependent control flow, or else an error
    ``forward`` itself raised on inputs of the call's shapes and dtypes."""
    text = f"{type(exc).__name__} {exc}".lower()
    if any(word in text for word in ("data-dependent", "data dependent", "guard", "symbool",
                                     "symint", "unbacked")):
        return ("Data-dependent Python (.item(), int(t), `if t.sum() > 0`) cannot be compiled "
                "for the IPU: use torch.where or move it out of forward.")
    return ("forward raised this error when traced with inputs of the call's shapes and "
            "dtypes (one micro-batch each): check that the inputs fit the model.")


_FAILED_NODE = re.compile(r"Error when translating node %(\w+)\b")
_FAILED_OP = re.compile(r"<OpOverload\(op='([\w.]+)', overload='(\w+)'\)>")


def conversion_error(exc: Exception, ep, excludes, custom_table=None) -> Error:
    """The ONNX exporter's failure as an Error naming the aten op and the user's line, and
    every other op of the model that has no translation either (all at once)."""
    chain, seen = [], set()
    cause = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        chain.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    text = "\n".join(chain)
    node_match, op_match = _FAILED_NODE.search(text), _FAILED_OP.search(text)
    op = (f"{op_match.group(1)}.{op_match.group(2)}" if op_match else "")
    location = ""
    for node in ep.graph.nodes:
        target = str(node.target)
        if (node_match and node.name == node_match.group(1)) or (op and target == op):
            op = op or target
            location = location_from_stack_trace(node.meta.get("stack_trace") or "", excludes)
            break
    missing = untranslated_ops(ep, custom_table or {}, excludes)
    others = [(name, where) for name, where in missing if name != op or where != location]
    what = f"the op {op}" if op else "an op of the model"
    summary = first_lines(chain[-1], 3)
    listing = ""
    if others:
        listing = ("\nOps of the model with no ONNX translation:\n" + "\n".join(
            f"  {name} at {where or 'unknown source line'}" for name, where in missing))
    return Error(f"The ONNX export of the captured model failed at {what}: "
                 f"{type(exc).__name__}: {summary}{listing}\nThese ops have no ONNX form the "
                 f"IPU backend can compile; rewrite those lines with supported torch ops, or "
                 f"compute them outside the model.", type="unsupported_op",
                 location=location or (missing[0][1] if missing else ""))


def untranslated_ops(ep, custom_table: dict, excludes) -> list[tuple[str, str]]:
    """``(aten op, user line)`` of every op left without a translation once ``ep`` is
    decomposed as the exporter does it; empty when that cannot be worked out."""
    if _registration is None:
        return []
    try:
        registry = _registration.ONNXRegistry.from_torchlib()
        for target, function in custom_table.items():
            registry.register_op(target, function)
        decomposed = _fx_passes.decompose_with_registry(ep, registry)
    except Exception:  # noqa: BLE001 - the listing is best effort on an error path
        return []
    found = []
    for module in decomposed.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in (graph.nodes if graph is not None else ()):
            target = node.target
            if (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
                    and not registry.is_registered(target)):
                where = location_from_stack_trace(node.meta.get("stack_trace") or "", excludes)
                if (str(target), where) not in found:
                    found.append((str(target), where))
    return found


# aten ops torch.export cannot capture (their output shape depends on the data) that are
# losses: refused by name rather than with the generic data-dependence hint.
_UNSUPPORTED_LOSSES = {"aten._ctc_loss": "F.ctc_loss / nn.CTCLoss"}


def refuse_unsupported_loss(exc: Exception, excludes) -> None:
    text = str(exc)
    for aten, torch_name in _UNSUPPORTED_LOSSES.items():
        if aten in text:
            location = user_frame(exc, excludes)
            raise Error(f"{torch_name} is not supported on the IPU by poptorch_lite: "
                        f"torch.export cannot capture {aten} (its output shapes depend "
                        f"on the data). Compute the loss outside the model.",
                        type="unsupported_op", location=location) from exc


def user_frame(exc: BaseException, excludes) -> str:
    """``file:line (code)`` of the innermost user frame in ``exc``'s traceback or its causes."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            if not frame.filename.startswith("<") and not is_library_file(frame.filename,
                                                                          excludes):
                code = (frame.line or "").strip()
                return f"{frame.filename}:{frame.lineno}" + (f" ({code})" if code else "")
        exc = exc.__cause__ or exc.__context__
    return ""


def first_lines(text: str, count: int) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[:count]) + ("\n..." if len(lines) > count else "")
