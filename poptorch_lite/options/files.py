"""Text forms of ``poptorch_lite.Options``: option values to and from plain JSON values
(enums as ``"OutputMode.All"``), and the literal-only setter lines of ``loadFromFile``.
"""

from __future__ import annotations

import ast
import enum

import torch

from .enums import _ENUMS


def _to_plain(value):
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, tuple):
        return [_to_plain(v) for v in value]
    if isinstance(value, list):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if hasattr(value, "__dict__") and not isinstance(value, (int, float, str)):
        return repr(value)
    return value


def _from_plain(value):
    if isinstance(value, str) and "." in value:
        cls_name, _, member = value.partition(".")
        if cls_name in _ENUMS:
            return _ENUMS[cls_name][member]
    if isinstance(value, list):
        return [_from_plain(v) for v in value]
    return value


def _apply_call(options: object, line: str) -> None:
    """Run one ``Group.setter(args)`` line against ``options`` with literal-only arguments.

    ``options`` is an ``Options``; only its attributes are used (``getattr`` along the dotted
    path), so this module needs no import of ``options.py``, which imports it."""
    tree = ast.parse(line, mode="eval").body
    if not isinstance(tree, ast.Call):
        raise SyntaxError("expected a setter call such as deviceIterations(4)")
    path = []
    func = tree.func
    while isinstance(func, ast.Attribute):
        path.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        raise SyntaxError("expected a setter call such as deviceIterations(4)")
    path.append(func.id)
    path.reverse()
    if path[0] in ("poptorch", "poptorch_lite", "options", "opts"):
        path = path[1:]
    target = options
    for name in path:
        if name.startswith("__"):
            raise AttributeError(f"invalid option name {name!r}")
        target = getattr(target, name)
    args = [_literal(a) for a in tree.args]
    kwargs = {k.arg: _literal(k.value) for k in tree.keywords}
    target(*args, **kwargs)


def _literal(node):
    """A literal, an enum member (``OutputMode.All``) or ``torch.float``/``torch.half``."""
    if isinstance(node, ast.Attribute):
        owner = node.value
        if isinstance(owner, ast.Attribute):
            owner = ast.Name(id=owner.attr)
        if isinstance(owner, ast.Name):
            if owner.id in _ENUMS:
                return _ENUMS[owner.id][node.attr]
            if owner.id == "torch" and node.attr in ("float", "float32", "half", "float16"):
                return getattr(torch, node.attr)
        raise ValueError(f"unsupported value {ast.unparse(node)}")
    return ast.literal_eval(node)
