"""``module_repr`` and ``print``: a module's text with its blocks (PopTorch's ``_printing``).

The text is torch's ``repr(module)``, line for line, with the submodules that start a block
(``BeginBlock``) marked at the end of their first line:
``(fc2): Linear(in_features=4, out_features=2, bias=True)  ==> BeginBlock(user_id='B', ipu_id=1)``.
"""

from __future__ import annotations

import builtins

import torch

__all__ = ["module_repr", "print"]


def _marker(module: torch.nn.Module) -> str:
    annotation = module.__dict__.get("_poptorch_lite_block")
    if annotation is None:
        return ""
    user_id, ipu_id = annotation
    return f"  ==> BeginBlock(user_id={user_id!r}, ipu_id={ipu_id!r})"


def _indent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    return "\n".join([lines[0]] + [" " * spaces + line for line in lines[1:]])


def _module_text(module: torch.nn.Module) -> str:
    """torch's Module.__repr__ layout, recursing through this function for children."""
    extra = module.extra_repr()
    lines = extra.split("\n") if extra else []
    for name, child in module._modules.items():
        child_text = "None" if child is None else _indent(_with_marker(child), 2)
        lines.append(f"({name}): {child_text}")
    text = module._get_name() + "("
    if lines:
        if len(lines) == 1 and not module._modules:
            text += lines[0]
        else:
            text += "\n  " + "\n  ".join(lines) + "\n"
    return text + ")"


def _with_marker(module: torch.nn.Module) -> str:
    if not any(_marker(sub) for sub in module.modules()):
        return repr(module)  # keeps the module's own __repr__ (e.g. ModuleList's)
    text = _module_text(module)
    marker = _marker(module)
    if not marker:
        return text
    first, _, rest = text.partition("\n")
    return first + marker + ("\n" + rest if rest else "")


def module_repr(m: torch.nn.Module) -> str:
    """``repr(m)`` with the BeginBlock of each submodule shown."""
    if not isinstance(m, torch.nn.Module):
        raise TypeError(f"module_repr: expected a torch.nn.Module, got {type(m).__name__}.")
    return _with_marker(m)


def print(m: torch.nn.Module) -> None:  # noqa: A001 - PopTorch's name
    """Print ``module_repr(m)``."""
    builtins.print(module_repr(m))
