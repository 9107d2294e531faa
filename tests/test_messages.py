"""User-facing text stands alone: no error, warning or log message of either package cites our
internal spec sections, feature ids or issue numbers, which users don't have (issue #13 item 7).
Docstrings and comments are for developers and may."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INTERNAL = re.compile(r"spec §|§\s?\d|\b[FP]\d{1,3}\b|issue #\d")


def _strings(path: Path):
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value) for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings):
            yield node.lineno, node.value


def test_messages_cite_no_internal_references():
    found = [f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}"
             for package in ("popart_backend", "poptorch_lite")
             for path in sorted((ROOT / package).rglob("*.py"))
             for line, text in _strings(path) if INTERNAL.search(text)]
    assert found == []
